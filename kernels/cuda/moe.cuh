// Sparse MoE MLP on the GPU: the router linear, a routing kernel (softmax in f32, top-k in expert
// order with the CPU kernel's tie-breaking, optional renormalization), the chosen experts'
// SwiGLU MLPs as per-(row, expert) GEMVs that read each expert's weights through the device
// pointer table, and a combine that sums a row's expert outputs in expert order (as
// kernels/cpu/moe.hpp does), adding the residual.
//
// With bf16 experts the MLPs run as grouped GEMMs instead (kernels/cuda/moe_gemm.cuh).
//
// Workspace (floats, model-owned, sized by the compiler for max_batch_tokens rows; the CUDA
// emitter's copy of this formula must agree): logits R*E | top-k ids R*K | top-k weights R*K |
// activations R*K*F | expert outputs R*K*H | grouping (moe_group_floats).
#pragma once

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/moe_gemm.cuh"

namespace scr::kernels::cuda {

template <int H, int F, int E, int TOPK>
constexpr int64_t moe_workspace_floats(int64_t rows) {
    // logits, ids, weights, then moe_experts_floats (activations, outputs, grouping), with slack
    return rows * (E + 2 * TOPK + int64_t(TOPK) * F + int64_t(TOPK) * H) + 64 + moe_group_floats<E>(rows * TOPK);
}

namespace detail {

// The dot product of one weight row with one float row, summed over the warp (every lane gets it).
template <int K, typename WT>
__device__ __forceinline__ float warp_dot(const WT* __restrict__ w, const float* __restrict__ x, int lane) {
    using V = Vec16<WT>;
    constexpr int kVec = V::n;
    static_assert(K % kVec == 0, "K must be a whole number of 16-byte chunks");
    constexpr int kChunks = K / kVec, kBatch = 4;
    float acc = 0.0f;
    for (int c0 = 0; c0 < kChunks; c0 += kWarp * kBatch) {
        uint4 wv[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int c = c0 + b * kWarp + lane;
            if (c < kChunks) wv[b] = load_stream16(w + size_t(c) * kVec);
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
            const int c = c0 + b * kWarp + lane;
            if (c >= kChunks) continue;
            float wf[kVec];
            V::unpack(wv[b], wf);
#pragma unroll
            for (int i = 0; i < kVec; i += 4) {
                const float4 f = __ldg(reinterpret_cast<const float4*>(x + size_t(c) * kVec + i));
                acc += f.x * wf[i] + f.y * wf[i + 1] + f.z * wf[i + 2] + f.w * wf[i + 3];
            }
        }
    }
    return warp_sum(acc);
}

template <int E, int TOPK, bool NORMALIZE>
__global__ void moe_route_kernel(int rows, float* logits, int32_t* top_id, float* top_w) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    float* lg = logits + size_t(r) * E;
    float mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = fmaxf(mx, lg[e]);
    float z = 0.0f;
    for (int e = 0; e < E; ++e) z += (lg[e] = expf(lg[e] - mx));
    for (int e = 0; e < E; ++e) lg[e] /= z;
    float wsum = 0.0f;
    int32_t* ids = top_id + size_t(r) * TOPK;
    float* ws = top_w + size_t(r) * TOPK;
    for (int j = 0; j < TOPK; ++j) {
        int best = -1;
        for (int e = 0; e < E; ++e) {
            bool taken = false;
            for (int i = 0; i < j; ++i) taken |= ids[i] == e;
            if (!taken && (best < 0 || lg[e] > lg[best])) best = e;
        }
        ids[j] = best;
        ws[j] = lg[best];
        wsum += lg[best];
    }
    if (NORMALIZE)
        for (int j = 0; j < TOPK; ++j) ws[j] /= wsum;
}

// The same routing with one warp per row (moe_route_warp_kernel; moe_route_kernel above, one
// thread per row, is kept for A/B runs: SCR_CUDA_MOE_ROUTE=serial). The serial kernel walks 128
// experts x 8 picks through global memory on one thread per row, tens of microseconds per layer at
// batch 1. Here the row's probabilities sit in shared memory, the max is a warp reduction (order
// free), the softmax's sum stays one lane's sum in expert order, and each pick is a warp argmax
// (larger probability, ties to the lower expert id: the serial loop's first strictly greater one).
// Same ids, same weights, bit for bit (NaN probabilities are never picked here while a number is
// left; the serial loop's choice among NaNs depended on where they stood).
constexpr int kRouteWarps = 4;  // rows per block

template <int E, int TOPK, bool NORMALIZE>
__global__ void __launch_bounds__(kRouteWarps * kWarp) moe_route_warp_kernel(int rows, float* logits, int32_t* top_id, float* top_w) {
    __shared__ float sp[kRouteWarps][E];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int r = blockIdx.x * kRouteWarps + warp;
    if (r >= rows) return;  // warp-uniform
    float* lg = logits + size_t(r) * E;
    float* p = sp[warp];
    float mx = -INFINITY;
    for (int e = lane; e < E; e += kWarp) {
        p[e] = lg[e];
        mx = fmaxf(mx, p[e]);
    }
    mx = warp_max(mx);
    for (int e = lane; e < E; e += kWarp) p[e] = expf(p[e] - mx);
    __syncwarp();
    float z = 0.0f;
    if (lane == 0)
        for (int e = 0; e < E; ++e) z += p[e];
    z = __shfl_sync(0xffffffffu, z, 0);
    __syncwarp();
    for (int e = lane; e < E; e += kWarp) lg[e] = p[e] = p[e] / z;
    __syncwarp();
    constexpr int kPer = (E + kWarp - 1) / kWarp;  // experts per lane: lane + 32 i
    static_assert(kPer <= 32, "the per-lane `taken` mask holds 32 experts per lane (E <= 1024)");
    uint32_t taken = 0;                             // bit i: expert lane + 32 i is picked
    float wsum = 0.0f;
    for (int j = 0; j < TOPK; ++j) {
        float bv = 0.0f;
        int be = -1;
        for (int i = 0; i < kPer; ++i) {
            const int e = lane + i * kWarp;
            if (e >= E || (taken >> i & 1u) || p[e] != p[e]) continue;
            if (be < 0 || p[e] > bv) {
                bv = p[e];
                be = e;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) {
                bv = ov;
                be = oe;
            }
        }
        if (be < 0) {  // every remaining probability is NaN: the lowest expert not yet taken
            for (int e = 0; e < E && be < 0; ++e) {
                bool t = false;
                for (int i = 0; i < j; ++i) t |= top_id[size_t(r) * TOPK + i] == e;
                if (!t) be = e;
            }
            bv = p[be];
        }
        if ((be % kWarp) == lane) taken |= 1u << (be / kWarp);
        if (lane == 0) {
            top_id[size_t(r) * TOPK + j] = be;
            top_w[size_t(r) * TOPK + j] = bv;
            wsum += bv;
        }
        __syncwarp();
    }
    if (NORMALIZE && lane == 0)
        for (int j = 0; j < TOPK; ++j) top_w[size_t(r) * TOPK + j] /= wsum;
}

// act[p][f] = silu(x[row] . Wg_e[f]) * (x[row] . Wu_e[f]) for pair p = row * TOPK + j.
template <int H, int F, int TOPK, typename WT>
__global__ void __launch_bounds__(256) moe_up_kernel(const float* __restrict__ x, const void* const* __restrict__ experts,
                                                     const int32_t* __restrict__ top_id, float* __restrict__ act) {
    const int pair = blockIdx.y, f = blockIdx.x * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (f >= F) return;
    const int e = top_id[pair];
    const float* xr = x + size_t(pair / TOPK) * H;
    const float g = warp_dot<H>(static_cast<const WT*>(experts[3 * e + 0]) + size_t(f) * H, xr, lane);
    const float u = warp_dot<H>(static_cast<const WT*>(experts[3 * e + 1]) + size_t(f) * H, xr, lane);
    if (lane == 0) act[size_t(pair) * F + f] = silu(g) * u;
}

// y[p][h] = act[p] . Wd_e[h]
template <int H, int F, typename WT>
__global__ void __launch_bounds__(256) moe_down_kernel(const float* __restrict__ act, const void* const* __restrict__ experts,
                                                       const int32_t* __restrict__ top_id, float* __restrict__ y) {
    const int pair = blockIdx.y, h = blockIdx.x * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (h >= H) return;
    const int e = top_id[pair];
    const float v = warp_dot<F>(static_cast<const WT*>(experts[3 * e + 2]) + size_t(h) * F, act + size_t(pair) * F, lane);
    if (lane == 0) y[size_t(pair) * H + h] = v;
}

template <int H, int TOPK>
__global__ void moe_combine_kernel(int rows, const int32_t* __restrict__ top_id, const float* __restrict__ top_w,
                                   const float* __restrict__ y, const float* residual, float* out) {
    const int r = blockIdx.y;
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows || h >= H) return;
    // The row's experts in expert order (the CPU kernel's summation order).
    int order[TOPK];
    for (int j = 0; j < TOPK; ++j) order[j] = j;
    for (int j = 1; j < TOPK; ++j)
        for (int i = j; i > 0 && top_id[size_t(r) * TOPK + order[i]] < top_id[size_t(r) * TOPK + order[i - 1]]; --i) {
            const int tmp = order[i];
            order[i] = order[i - 1];
            order[i - 1] = tmp;
        }
    float s = 0.0f;
    for (int j = 0; j < TOPK; ++j) {
        const int p = r * TOPK + order[j];
        s = s + y[size_t(p) * H + h] * top_w[p];
    }
    const size_t at = size_t(r) * H + h;
    out[at] = residual ? residual[at] + s : s;
}

}  // namespace detail

// SCR_CUDA_MOE_ROUTE=serial: the one-thread-per-row routing kernel (for A/B runs; same results),
// or the tests' moe_route_override().
inline bool moe_route_serial() {
    if (moe_route_override() >= 0) return moe_route_override() == 1;
    static const bool serial = env_choice_switch("SCR_CUDA_MOE_ROUTE", false, {{"warp", false}, {"serial", true}}, "warp");
    return serial;
}

// The experts' SwiGLU MLPs of every (row, pick) pair and their weighted sum per row (+ residual),
// given the routing: grouped GEMMs (bf16 experts, from half a pair per expert) or per-pair GEMVs. `ws` holds the
// activations, the expert outputs and the grouping scratch (moe_experts_floats).
template <int H, int F, int E, int TOPK>
constexpr int64_t moe_experts_floats(int64_t rows) {
    return rows * TOPK * (int64_t(F) + H) + 4 + moe_group_floats<E>(rows * TOPK);
}

template <int H, int F, int E, int TOPK, typename WT>
void moe_experts(const Ctx& c, int rows, const float* x, const void* const* experts, const int32_t* top_id, const float* top_w,
                 const float* residual, float* out, float* ws) {
    // 16-byte aligned rows for the vector loads
    float* act = ws + (4 - (reinterpret_cast<uintptr_t>(ws) / 4) % 4) % 4;
    float* y = act + size_t(rows) * TOPK * F;
    float* group = y + size_t(rows) * TOPK * H;
    bool grouped = false;
    if constexpr (moe_gemm_fits<H, F, WT>()) grouped = moe_gemm_wanted(rows * TOPK, E);
    if (grouped) {
        if constexpr (moe_gemm_fits<H, F, WT>()) moe_experts_grouped<H, F, E, TOPK>(c, rows, x, experts, top_id, act, y, group);
    } else {
        detail::moe_up_kernel<H, F, TOPK, WT><<<dim3(ceil_div(F, 8), rows * TOPK), 256, 0, c.stream>>>(x, experts, top_id, act);
        detail::moe_down_kernel<H, F, WT><<<dim3(ceil_div(H, 8), rows * TOPK), 256, 0, c.stream>>>(act, experts, top_id, y);
    }
    detail::moe_combine_kernel<H, TOPK><<<dim3(ceil_div(H, 128), rows), 128, 0, c.stream>>>(rows, top_id, top_w, y, residual, out);
}

// The router linear and the top-k routing of `rows` rows: ws holds the logits, then the picks'
// expert ids and weights (their addresses are returned); the experts' workspace follows them.
struct MoeRouted {
    const int32_t* top_id;
    const float* top_w;
    float* rest;  // the experts' workspace (moe_experts_floats)
};
template <int H, int E, int TOPK, bool NORMALIZE, typename RT>
MoeRouted moe_route(const Ctx& c, int rows, const float* x, const RT* router, float* ws) {
    static_assert(TOPK >= 1 && TOPK <= E && TOPK <= 32, "top_k must be within the expert count (and at most 32)");
    float* logits = ws;
    int32_t* top_id = reinterpret_cast<int32_t*>(logits + size_t(rows) * E);
    float* top_w = reinterpret_cast<float*>(top_id + size_t(rows) * TOPK);
    linear<E, H, RT>(c, rows, x, router, nullptr, nullptr, logits);
    if (moe_route_serial())
        detail::moe_route_kernel<E, TOPK, NORMALIZE><<<ceil_div(rows, 128), 128, 0, c.stream>>>(rows, logits, top_id, top_w);
    else
        detail::moe_route_warp_kernel<E, TOPK, NORMALIZE>
            <<<ceil_div(rows, detail::kRouteWarps), detail::kRouteWarps * kWarp, 0, c.stream>>>(rows, logits, top_id, top_w);
    return {top_id, top_w, top_w + size_t(rows) * TOPK};
}

template <int H, int F, int E, int TOPK, bool NORMALIZE, typename WT, typename RT>
void moe(const Ctx& c, int rows, const float* x, const RT* router, const void* const* experts, const float* residual, float* out,
         float* ws) {
    if (rows <= 0) return;
    const MoeRouted r = moe_route<H, E, TOPK, NORMALIZE>(c, rows, x, router, ws);
    moe_experts<H, F, E, TOPK, WT>(c, rows, x, experts, r.top_id, r.top_w, residual, out, r.rest);
}

}  // namespace scr::kernels::cuda
