// Sparse MoE MLP: softmax router over E experts, top-k per row (optionally renormalized), and the
// chosen experts' SwiGLU MLPs run on the rows routed to them, one expert at a time, as grouped
// GEMMs. A row's expert outputs are summed in expert order, so its result does not depend on the
// other rows in the step.
//
// Workspace (floats), for R rows: logits R*E | top-k ids R*K | top-k weights R*K | sum R*H |
// gathered rows R*H | activations R*F | expert output R*H | row lists R*K | counts E+1.
// The compiler reserves R*(3H + 2F + E + 2K + 2) + 2E + 64 floats, which covers it.
#pragma once

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/linear.hpp"

namespace scr::kernels::cpu {

template <int H, int F, int E, int TOPK, bool NORMALIZE, typename WT, typename RT>
void moe(int rows, const float* x, const RT* router, const void* const* experts, const float* residual, float* out,
         float* ws, ThreadPool& pool) {
    static_assert(TOPK >= 1 && TOPK <= E, "top_k must be within the expert count");
    float* logits = ws;
    int32_t* top_id = reinterpret_cast<int32_t*>(logits + size_t(rows) * E);
    float* top_w = reinterpret_cast<float*>(top_id + size_t(rows) * TOPK);
    float* sum = top_w + size_t(rows) * TOPK;
    float* xg = sum + size_t(rows) * H;
    float* act = xg + size_t(rows) * H;
    float* yg = act + size_t(rows) * F;
    int32_t* list = reinterpret_cast<int32_t*>(yg + size_t(rows) * H);
    int32_t* count = list + size_t(rows) * TOPK;

    linear<E, H, RT>(rows, x, router, nullptr, nullptr, logits, pool);
    // Routing, as transformers does it: softmax in f32, top-k, optional renormalization.
    std::memset(count, 0, sizeof(int32_t) * (E + 1));
    for (int r = 0; r < rows; ++r) {
        float* lg = logits + size_t(r) * E;
        float mx = -std::numeric_limits<float>::infinity();
        for (int e = 0; e < E; ++e) mx = std::max(mx, lg[e]);
        float z = 0;
        for (int e = 0; e < E; ++e) z += (lg[e] = std::exp(lg[e] - mx));
        for (int e = 0; e < E; ++e) lg[e] /= z;
        float wsum = 0;
        for (int j = 0; j < TOPK; ++j) {
            int best = -1;
            for (int e = 0; e < E; ++e) {
                bool taken = false;
                for (int i = 0; i < j; ++i) taken |= top_id[size_t(r) * TOPK + i] == e;
                if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
            }
            top_id[size_t(r) * TOPK + j] = best;
            top_w[size_t(r) * TOPK + j] = lg[best];
            wsum += lg[best];
            ++count[best + 1];
        }
        if (NORMALIZE)
            for (int j = 0; j < TOPK; ++j) top_w[size_t(r) * TOPK + j] /= wsum;
    }
    // Rows of each expert, in row order (a counting sort).
    for (int e = 0; e < E; ++e) count[e + 1] += count[e];
    {
        int32_t fill[E];
        for (int e = 0; e < E; ++e) fill[e] = count[e];
        for (int r = 0; r < rows; ++r)
            for (int j = 0; j < TOPK; ++j) list[fill[top_id[size_t(r) * TOPK + j]]++] = r * TOPK + j;
    }
    std::memset(sum, 0, sizeof(float) * size_t(rows) * H);
    for (int e = 0; e < E; ++e) {
        const int n = count[e + 1] - count[e];
        if (n == 0) continue;
        const int32_t* mine = list + count[e];
        for (int i = 0; i < n; ++i) std::memcpy(xg + size_t(i) * H, x + size_t(mine[i] / TOPK) * H, sizeof(float) * H);
        const WT* wg = static_cast<const WT*>(experts[3 * e + 0]);
        const WT* wu = static_cast<const WT*>(experts[3 * e + 1]);
        const WT* wd = static_cast<const WT*>(experts[3 * e + 2]);
        linear_swiglu<F, H, WT>(n, xg, wg, wu, act, pool);
        linear<H, F, WT>(n, act, wd, nullptr, nullptr, yg, pool);
        for (int i = 0; i < n; ++i) {
            const int r = mine[i] / TOPK;
            const float w = top_w[mine[i]];
            float* s = sum + size_t(r) * H;
            const float* y = yg + size_t(i) * H;
            for (int c = 0; c < H; ++c) s[c] = s[c] + y[c] * w;
        }
    }
    for (size_t i = 0; i < size_t(rows) * H; ++i) out[i] = residual ? residual[i] + sum[i] : sum[i];
}

}  // namespace scr::kernels::cpu
