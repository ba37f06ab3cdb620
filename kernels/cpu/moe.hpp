// Sparse MoE MLP: a router picks TOPK of E experts per row, the chosen experts' MLPs run on the
// rows routed to them, one expert at a time, as grouped GEMMs, and a row's expert outputs are
// summed in expert order — so its result does not depend on the other rows in the step.
//
// Routing (MoeRouting), as transformers computes it:
//   softmax: softmax over all logits, top-k (Qwen3-MoE, Mixtral, GPT-OSS: top-k of the logits then
//            a softmax over them is the same as NORMALIZE over the top-k of the softmax);
//   sigmoid: DeepSeek-V3 — sigmoid scores; choose with scores + choice_bias (e_score_correction_bias)
//            inside the topk_groups groups whose two best choice scores sum highest; weight by the
//            plain scores; then NORMALIZE (+1e-20) and multiply by scale (routed_scaling_factor).
// Experts:
//   moe():     per-expert SwiGLU, gate/up [F][H], down [H][F] (experts[3e + 0..2]);
//   moe_oai(): GPT-OSS, stacked: gate_up [E][H][2F] (gate, up interleaved) + bias [E][2F],
//              down [E][F][H] + bias [E][H]; act = (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
//
// Workspace (floats), for R rows: logits R*E | top-k ids R*K | top-k weights R*K | sum R*H |
// gathered rows R*H | activations R*A | expert output R*H | row lists R*K | counts E+1, where A = 2F
// (moe, moe_quant) or 3F (moe_oai): moe_workspace_floats. The compiler reserves it for the most rows
// of a step (compiler/bind/binder.cpp), and the generated code asserts that at compile time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/quant_linear.hpp"

namespace scr::kernels::cpu {

enum class Scoring { softmax, sigmoid };

struct MoeRouting {
    Scoring scoring = Scoring::softmax;
    const float* router_bias = nullptr;  // [E] added to the router logits (GPT-OSS)
    const float* choice_bias = nullptr;  // [E] added to the scores for choosing only (DeepSeek)
    int groups = 1, topk_groups = 1;     // grouped top-k (DeepSeek n_group, topk_group)
    float scale = 1.0f;                  // routed_scaling_factor
};

// y[t][n] = sum_k x[t][k] * W[k][n] (+ bias[n]) for weights stored input-major ([K][N]); each
// output is one FMA chain over k in order (batch invariant).
template <int N, int K, typename WT>
void linear_kn(int rows, const float* x, const WT* w, const float* bias, float* y, ThreadPool& pool) {
    constexpr int kCols = 4 * kLanes;  // output columns per task
    pool.parallel_for(
        (N + kCols - 1) / kCols,
        [&](int64_t c0, int64_t c1, int) {
            for (int64_t c = c0; c < c1; ++c) {
                const int n0 = int(c) * kCols, nn = std::min(kCols, N - n0);
                for (int t = 0; t < rows; ++t) {
                    vf acc[4] = {vzero(), vzero(), vzero(), vzero()};
                    const float* xr = x + size_t(t) * K;
                    for (int k = 0; k < K; ++k) {
                        const vf xv = vset1(xr[k]);
                        const WT* wr = w + size_t(k) * N + n0;
                        for (int j = 0; j < 4; ++j) {
                            const int rem = nn - j * kLanes;
                            if (rem <= 0) break;
                            acc[j] = vfma(xv, rem >= kLanes ? vload(wr + j * kLanes) : vload_n(wr + j * kLanes, rem), acc[j]);
                        }
                    }
                    float* yr = y + size_t(t) * N + n0;
                    for (int j = 0; j < 4; ++j) {
                        const int rem = nn - j * kLanes;
                        if (rem <= 0) break;
                        if (rem >= kLanes) vstore(yr + j * kLanes, acc[j]);
                        else vstore_n(yr + j * kLanes, acc[j], rem);
                    }
                    if (bias)
                        for (int i = 0; i < nn; ++i) yr[i] += bias[n0 + i];
                }
            }
        },
        1);
}

// The workspace's floats for `rows` rows (the layout above; moe_work places it).
constexpr int64_t moe_workspace_floats(int64_t rows, int64_t hidden, int64_t experts, int64_t top_k, int64_t act_width) {
    return rows * (experts + 3 * top_k + 3 * hidden + act_width) + experts + 1;
}

namespace detail {

struct MoeWork {
    float* logits;
    int32_t* top_id;
    float* top_w;
    float* sum;
    float* xg;
    float* act;
    float* yg;
    int32_t* list;
    int32_t* count;
};

template <int H, int E, int TOPK>
MoeWork moe_work(float* ws, int rows, int act_width) {
    MoeWork w;
    w.logits = ws;
    w.top_id = reinterpret_cast<int32_t*>(w.logits + size_t(rows) * E);
    w.top_w = reinterpret_cast<float*>(w.top_id + size_t(rows) * TOPK);
    w.sum = w.top_w + size_t(rows) * TOPK;
    w.xg = w.sum + size_t(rows) * H;
    w.act = w.xg + size_t(rows) * H;
    w.yg = w.act + size_t(rows) * act_width;
    w.list = reinterpret_cast<int32_t*>(w.yg + size_t(rows) * H);
    w.count = w.list + size_t(rows) * TOPK;
    return w;
}

// Index of the best not-yet-taken entry of v[0..n) (the first on ties, as torch.topk).
template <int N>
inline int best_untaken(const float* v, const bool* taken) {
    int best = -1;
    for (int e = 0; e < N; ++e)
        if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
    return best;
}

// Router logits -> top-k ids and weights per row, then the rows of each expert (a counting sort).
template <int H, int E, int TOPK, bool NORMALIZE, typename RT>
void moe_route(int rows, const float* x, const RT* router, const MoeRouting& r, MoeWork& w, ThreadPool& pool) {
    static_assert(TOPK >= 1 && TOPK <= E, "top_k must be within the expert count");
    linear<E, H, RT>(rows, x, router, r.router_bias, nullptr, w.logits, pool);
    std::memset(w.count, 0, sizeof(int32_t) * (E + 1));
    for (int row = 0; row < rows; ++row) {
        float* lg = w.logits + size_t(row) * E;
        float choice[E];
        bool taken[E] = {};
        if (r.scoring == Scoring::softmax) {
            float mx = -std::numeric_limits<float>::infinity();
            for (int e = 0; e < E; ++e) mx = std::max(mx, lg[e]);
            float z = 0;
            for (int e = 0; e < E; ++e) z += (lg[e] = std::exp(lg[e] - mx));
            for (int e = 0; e < E; ++e) choice[e] = lg[e] /= z;
        } else {
            for (int e = 0; e < E; ++e) {
                lg[e] = 1.0f / (1.0f + std::exp(-lg[e]));
                choice[e] = r.choice_bias ? lg[e] + r.choice_bias[e] : lg[e];
            }
            if (r.groups > 1) {
                // Keep the topk_groups groups whose two best choice scores sum highest.
                const int per = E / r.groups;
                float gscore[E];
                bool gtaken[E] = {};
                for (int gi = 0; gi < r.groups; ++gi) {
                    const int first = gi * per;
                    int b1 = -1, b2 = -1;
                    for (int e = first; e < first + per; ++e)
                        if (b1 < 0 || choice[e] > choice[b1]) b1 = e;
                    for (int e = first; e < first + per; ++e)
                        if (e != b1 && (b2 < 0 || choice[e] > choice[b2])) b2 = e;
                    gscore[gi] = choice[b1] + (b2 >= 0 ? choice[b2] : 0.0f);
                }
                for (int j = 0; j < r.topk_groups; ++j) {
                    int best = -1;
                    for (int gi = 0; gi < r.groups; ++gi)
                        if (!gtaken[gi] && (best < 0 || gscore[gi] > gscore[best])) best = gi;
                    gtaken[best] = true;
                }
                for (int e = 0; e < E; ++e)
                    if (!gtaken[e / per]) taken[e] = true;  // masked out: never chosen
            }
        }
        float wsum = 0;
        for (int j = 0; j < TOPK; ++j) {
            const int best = best_untaken<E>(choice, taken);
            taken[best] = true;
            w.top_id[size_t(row) * TOPK + j] = best;
            w.top_w[size_t(row) * TOPK + j] = lg[best];
            wsum += lg[best];
            ++w.count[best + 1];
        }
        const float denom = r.scoring == Scoring::sigmoid ? wsum + 1e-20f : wsum;
        for (int j = 0; j < TOPK; ++j) {
            float& tw = w.top_w[size_t(row) * TOPK + j];
            if (NORMALIZE) tw /= denom;
            tw *= r.scale;
        }
    }
    for (int e = 0; e < E; ++e) w.count[e + 1] += w.count[e];
    int32_t fill[E];
    for (int e = 0; e < E; ++e) fill[e] = w.count[e];
    for (int row = 0; row < rows; ++row)
        for (int j = 0; j < TOPK; ++j) w.list[fill[w.top_id[size_t(row) * TOPK + j]]++] = row * TOPK + j;
}

// Runs expert(n rows gathered in xg -> yg) for every expert with rows, and sums weighted outputs.
template <int H, int E, int TOPK, typename Expert>
void moe_experts(int rows, const float* x, const float* residual, float* out, MoeWork& w, Expert&& expert) {
    std::memset(w.sum, 0, sizeof(float) * size_t(rows) * H);
    for (int e = 0; e < E; ++e) {
        const int n = w.count[e + 1] - w.count[e];
        if (n == 0) continue;
        const int32_t* mine = w.list + w.count[e];
        for (int i = 0; i < n; ++i) std::memcpy(w.xg + size_t(i) * H, x + size_t(mine[i] / TOPK) * H, sizeof(float) * H);
        expert(e, n);
        for (int i = 0; i < n; ++i) {
            const float wt = w.top_w[mine[i]];
            float* s = w.sum + size_t(mine[i] / TOPK) * H;
            const float* y = w.yg + size_t(i) * H;
            for (int c = 0; c < H; ++c) s[c] = s[c] + y[c] * wt;
        }
    }
    for (size_t i = 0; i < size_t(rows) * H; ++i) out[i] = residual ? residual[i] + w.sum[i] : w.sum[i];
}

}  // namespace detail

template <int H, int F, int E, int TOPK, bool NORMALIZE, typename WT, typename RT>
void moe(int rows, const float* x, const RT* router, const void* const* experts, const float* residual, float* out,
         float* ws, ThreadPool& pool, const MoeRouting& routing = {}) {
    auto w = detail::moe_work<H, E, TOPK>(ws, rows, 2 * F);
    detail::moe_route<H, E, TOPK, NORMALIZE>(rows, x, router, routing, w, pool);
    detail::moe_experts<H, E, TOPK>(rows, x, residual, out, w, [&](int e, int n) {
        const WT* wg = static_cast<const WT*>(experts[3 * e + 0]);
        const WT* wu = static_cast<const WT*>(experts[3 * e + 1]);
        const WT* wd = static_cast<const WT*>(experts[3 * e + 2]);
        linear_swiglu<F, H, WT>(n, w.xg, wg, wu, w.act, pool);
        linear<H, F, WT>(n, w.act, wd, nullptr, nullptr, w.yg, pool);
    });
}

// moe over quantized experts (issue 9): expert e's gate, up and down projections are views (QG:
// K = H, QD: K = F; AffineW or ChannelW, quant_linear.hpp) of the weight table's entries from
// experts[3 P e], P tensors per projection (its weight, then its scales and MLX biases), as
// compiler/quant/apply.cpp places them. The router stays dense (RT). Each expert's rows run the
// quantized linear kernels the dense layers use, so an expert's output is what qlinear_glu and
// qlinear give for those rows.
template <int H, int F, int E, int TOPK, bool NORMALIZE, typename QG, typename QD, typename RT>
void moe_quant(int rows, const float* x, const RT* router, const void* const* experts, const float* residual, float* out,
               float* ws, ThreadPool& pool, const MoeRouting& routing = {}) {
    static_assert(QG::kTensors == QD::kTensors, "one format for every expert projection");
    constexpr int P = QG::kTensors;
    auto w = detail::moe_work<H, E, TOPK>(ws, rows, 2 * F);
    detail::moe_route<H, E, TOPK, NORMALIZE>(rows, x, router, routing, w, pool);
    detail::moe_experts<H, E, TOPK>(rows, x, residual, out, w, [&](int e, int n) {
        const void* const* t = experts + size_t(3 * P) * size_t(e);
        qlinear_glu<F, H, Act::silu>(n, w.xg, QG::from(t), QG::from(t + P), w.act, pool);
        qlinear<H, F>(n, w.act, QD::from(t + 2 * P), nullptr, nullptr, w.yg, pool);
    });
}

// GPT-OSS experts: experts = {gate_up [E][H][2F], gate_up_bias [E][2F], down [E][F][H], down_bias [E][H]}.
template <int H, int F, int E, int TOPK, bool NORMALIZE, typename WT, typename RT>
void moe_oai(int rows, const float* x, const RT* router, const void* const* experts, const float* residual, float* out,
             float* ws, ThreadPool& pool, const MoeRouting& routing, float alpha, float limit) {
    auto w = detail::moe_work<H, E, TOPK>(ws, rows, 3 * F);
    detail::moe_route<H, E, TOPK, NORMALIZE>(rows, x, router, routing, w, pool);
    const WT* gate_up = static_cast<const WT*>(experts[0]);
    const float* gate_up_bias = static_cast<const float*>(experts[1]);
    const WT* down = static_cast<const WT*>(experts[2]);
    const float* down_bias = static_cast<const float*>(experts[3]);
    detail::moe_experts<H, E, TOPK>(rows, x, residual, out, w, [&](int e, int n) {
        float* gu = w.act + size_t(n) * F;  // [n][2F] after the [n][F] activations
        linear_kn<2 * F, H, WT>(n, w.xg, gate_up + size_t(e) * H * 2 * F, gate_up_bias + size_t(e) * 2 * F, gu, pool);
        for (int i = 0; i < n; ++i)
            for (int j = 0; j < F; ++j) {
                const float g = std::min(gu[size_t(i) * 2 * F + 2 * j], limit);
                const float u = std::clamp(gu[size_t(i) * 2 * F + 2 * j + 1], -limit, limit);
                const float glu = g * (1.0f / (1.0f + std::exp(-(g * alpha))));
                w.act[size_t(i) * F + j] = (u + 1.0f) * glu;
            }
        linear_kn<H, F, WT>(n, w.act, down + size_t(e) * F * H, down_bias + size_t(e) * H, w.yg, pool);
    });
}

}  // namespace scr::kernels::cpu
