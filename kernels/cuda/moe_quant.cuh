// Sparse MoE MLP over quantized experts (MLX affine int4 g32 / g64 / g128, int8 per channel, fp8
// e4m3 per channel or per tensor: the formats of quant_linear.cuh), the CUDA side of
// kernels/cpu/moe.hpp's moe_quant. The routing and the combine are moe.cuh's (the same kernels as
// the bf16 experts, so the same picks and the same summation order); the experts' SwiGLU MLPs run
// as GEMVs that dequantize each expert row in registers, per (row, pick) pair; a grouped form
// (moe_gemm.cuh's grouping, up to 8 pairs of an expert sharing each weight row's loads; the same
// bits) runs only when forced, as it measured slower. No tensor-core GEMM over quantized experts
// yet, so batches of quantized experts run far below the bf16 experts' grouped GEMMs.
//
// The experts' table: expert e's gate, up and down projections at experts[(3 e + j) P], each as
// its P adjacent weight-table entries (codes, scales, and MLX's biases: P = 3, else 2), the order
// compiler/quant/apply.cpp writes and the CPU kernel reads.
#pragma once

#include <algorithm>
#include <cstring>

#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/quant_ops.cuh"

namespace scr::kernels::cuda {

namespace qdetail {

// Tensors per quantized projection in the weight table: codes, scales (and MLX's biases).
template <class F>
constexpr int kQuantTensors = F::kAffine ? 3 : 2;

__host__ __device__ __forceinline__ uint4 qdot_load16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return load_stream16(p);  // expert rows are streamed: keep L1 for the x rows
#else
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
#endif
}

__host__ __device__ __forceinline__ float4 qdot_x4(const float* p) {
#ifdef __CUDA_ARCH__
    return __ldg(reinterpret_cast<const float4*>(p));
#else
    return float4{p[0], p[1], p[2], p[3]};
#endif
}

// Lane `lane`'s parts of the dot products of row n of a quantized [N][K] matrix with the rows
// x[0 .. nr) (nr <= R): the row's 16-byte chunks lane, lane + 32, ... (4 loads in flight), each
// loaded and unpacked once for all the rows. MLX affine: s * sum(x q) + b * sum(x) per chunk (a
// chunk lies inside one group, G >= 32); one scale per row (or tensor): sum(x q), the scale applied
// to the warp's sum (qdot_finish). The warp's sum of the 32 lanes' parts is a dot. Every product
// that meets an addition is an explicit fmaf, so a row's arithmetic, and its bits, are the same
// for any R and whichever other rows share the call (the grouped and per-pair kernels agree bit for
// bit). Host and device: the host self-test runs it lane by lane (so no `#pragma unroll`, which the
// host compiler warns of; nvcc unrolls these constant trip counts).
template <int K, class F, int R>
__host__ __device__ __forceinline__ void qdot_lanes(const QuantW& w, int n, const float* const (&x)[R], int nr, int lane, float (&acc)[R]) {
    using ST = typename F::Scale;
    constexpr int PW = F::kPerWord, kChunks = K / F::kElems, kBatch = 4;
    static_assert(K % F::kElems == 0, "K must be a whole number of 16-byte chunks of the packed row");
    static_assert(K % (F::kAffine ? F::kGroup : 1) == 0, "K must be a whole number of groups");
    const uint8_t* row = static_cast<const uint8_t*>(w.q) + size_t(n) * (size_t(kChunks) * 16);
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int c0 = 0; c0 < kChunks; c0 += 32 * kBatch) {
        uint4 wv[kBatch];
        for (int b = 0; b < kBatch; ++b) {
            const int c = c0 + b * 32 + lane;
            if (c < kChunks) wv[b] = qdot_load16(row + size_t(c) * 16);
        }
        for (int b = 0; b < kBatch; ++b) {
            const int c = c0 + b * 32 + lane;
            if (c >= kChunks) continue;
            const uint32_t words[4] = {wv[b].x, wv[b].y, wv[b].z, wv[b].w};
            float aq[R], xs[R];
            for (int r = 0; r < R; ++r) aq[r] = xs[r] = 0.0f;
            for (int j = 0; j < 4; ++j) {
                float q[PW];
                F::unpack(words[j], q);
                for (int r = 0; r < R; ++r) {
                    if (r >= nr) break;
                    for (int i = 0; i < PW; i += 4) {
                        const float4 f = qdot_x4(x[r] + size_t(c) * F::kElems + j * PW + i);
                        aq[r] = fmaf(f.x, q[i], aq[r]);
                        aq[r] = fmaf(f.y, q[i + 1], aq[r]);
                        aq[r] = fmaf(f.z, q[i + 2], aq[r]);
                        aq[r] = fmaf(f.w, q[i + 3], aq[r]);
                        if constexpr (F::kAffine) xs[r] += (f.x + f.y) + (f.z + f.w);
                    }
                }
            }
            if constexpr (F::kAffine) {
                const size_t g = size_t(n) * (K / F::kGroup) + size_t(c) * F::kElems / F::kGroup;
                const float sc = to_f32(static_cast<const ST*>(w.scales)[g]), bi = to_f32(static_cast<const ST*>(w.biases)[g]);
                for (int r = 0; r < R; ++r) {
                    if (r >= nr) break;
                    acc[r] += fmaf(sc, aq[r], bi * xs[r]);
                }
            } else {
                for (int r = 0; r < R; ++r) {
                    if (r >= nr) break;
                    acc[r] += aq[r];
                }
            }
        }
    }
}

// One row's part: qdot_lanes of one x row, as the per-pair kernels (CR = 1) run it (the host
// self-test's reference form for the grouped one).
template <int K, class F>
__host__ __device__ __forceinline__ float qdot_lane(const QuantW& w, int n, const float* x, int lane) {
    const float* const xs[1] = {x};
    float acc[1];
    qdot_lanes<K, F, 1>(w, n, xs, 1, lane, acc);
    return acc[0];
}

// The dot product from the warp's sum of qdot_lane: times the row's (or tensor's) scale for the
// one-scale formats.
template <class F>
__host__ __device__ __forceinline__ float qdot_finish(const QuantW& w, int n, float sum) {
    if constexpr (F::kAffine) {
        return sum;
    } else {
        return sum * to_f32(static_cast<const typename F::Scale*>(w.scales)[F::kPerTensor ? 0 : n]);
    }
}

// Projection j of expert e in the experts' table.
template <class F>
__host__ __device__ __forceinline__ QuantW qexpert(const void* const* experts, int e, int j) {
    constexpr int P = kQuantTensors<F>;
    const void* const* t = experts + size_t(3 * P) * size_t(e) + size_t(j) * P;
    return QuantW{t[0], t[1], P == 3 ? t[2] : nullptr};
}

// Chunk size of the grouped form: up to this many pairs of one expert share each weight row's loads
// and unpacking.
constexpr int kMoeQuantChunk = 8;

// Where a block of the experts' kernels finds its (row, pick) pairs p = row * TOPK + pick: per pair
// (CR == 1), pair blockIdx.x alone, its expert top_id[p]; grouped (CR == kMoeQuantChunk), chunk
// blockIdx.x of moe_gemm.cuh's grouping, up to CR pairs of one expert in `order`. Blocks past the
// grouping's chunk count exit (the grid is sized for the most chunks, so a captured graph stays
// valid whatever the routing).
struct MoeQuantPairs {
    const int32_t* top_id;
    const int32_t* order;     // grouped form only
    const MoeChunk* chunks;   // grouped form only
    const int32_t* n_chunks;  // grouped form only
};

template <int CR>
__device__ __forceinline__ bool moe_quant_block_pairs(const MoeQuantPairs& src, int& expert, int& count, int (&pair)[CR]) {
    if constexpr (CR == 1) {
        pair[0] = int(blockIdx.x);
        expert = src.top_id[pair[0]];
        count = 1;
    } else {
        if (int(blockIdx.x) >= *src.n_chunks) return false;
        const MoeChunk ch = src.chunks[blockIdx.x];
        expert = ch.expert;
        count = ch.count;
        for (int r = 0; r < CR; ++r) pair[r] = src.order[ch.first + (r < ch.count ? r : 0)];
    }
    return true;
}

// act[p][f] = silu(x[row] . Wg_e[f]) * (x[row] . Wu_e[f]) for the block's pairs p of expert e: block
// (pairs, 8 rows f), one warp per f. A pair's value has the same bits in either form (qdot_lanes).
template <int H, int FF, int TOPK, class F, int CR>
__global__ void __launch_bounds__(256) moe_quant_up_kernel(const float* __restrict__ x, const void* const* __restrict__ experts,
                                                           MoeQuantPairs src, float* __restrict__ act) {
    const int f = blockIdx.y * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    int e, count, pair[CR];
    if (f >= FF || !moe_quant_block_pairs<CR>(src, e, count, pair)) return;
    const float* xr[CR];
    for (int r = 0; r < CR; ++r) xr[r] = x + size_t(pair[r] / TOPK) * H;
    const QuantW gate = qexpert<F>(experts, e, 0), up = qexpert<F>(experts, e, 1);
    float g[CR], u[CR];
    qdot_lanes<H, F, CR>(gate, f, xr, count, lane, g);
    qdot_lanes<H, F, CR>(up, f, xr, count, lane, u);
    for (int r = 0; r < CR; ++r) {
        if (r >= count) break;
        const float gs = qdot_finish<F>(gate, f, warp_sum(g[r])), us = qdot_finish<F>(up, f, warp_sum(u[r]));
        if (lane == 0) act[size_t(pair[r]) * FF + f] = silu(gs) * us;
    }
}

// y[p][h] = act[p] . Wd_e[h] for the block's pairs: block (pairs, 8 rows h), one warp per h.
template <int H, int FF, class F, int CR>
__global__ void __launch_bounds__(256) moe_quant_down_kernel(const float* __restrict__ act, const void* const* __restrict__ experts,
                                                             MoeQuantPairs src, float* __restrict__ y) {
    const int h = blockIdx.y * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    int e, count, pair[CR];
    if (h >= H || !moe_quant_block_pairs<CR>(src, e, count, pair)) return;
    const float* ar[CR];
    for (int r = 0; r < CR; ++r) ar[r] = act + size_t(pair[r]) * FF;
    const QuantW down = qexpert<F>(experts, e, 2);
    float v[CR];
    qdot_lanes<FF, F, CR>(down, h, ar, count, lane, v);
    for (int r = 0; r < CR; ++r) {
        if (r >= count) break;
        const float s = qdot_finish<F>(down, h, warp_sum(v[r]));
        if (lane == 0) y[size_t(pair[r]) * H + h] = s;
    }
}

}  // namespace qdetail

// The experts of every (row, pick) pair and their weighted sum per row (+ residual), given the
// routing; ws as moe_experts (moe_experts_floats: activations, expert outputs).
template <int H, int FF, int E, int TOPK, class F>
void moe_quant_experts(const Ctx& c, int rows, const float* x, const void* const* experts, const int32_t* top_id, const float* top_w,
                       const float* residual, float* out, float* ws) {
    // 16-byte aligned rows for the vector loads of act (FF is a multiple of 16 elements here)
    float* act = ws + (4 - (reinterpret_cast<uintptr_t>(ws) / 4) % 4) % 4;
    float* y = act + size_t(rows) * TOPK * FF;
    const int pairs = rows * TOPK;
    // Per pair unless the grouped form is forced (SCR_CUDA_MOE_GEMM=1, moe_gemm_override() = 1): on
    // the H100 the grouped GEMVs were slower than the per-pair ones at every batch measured (1-2,048
    // rows at Qwen3-30B-A3B's shape, int8 and MLX int4 g64: docs/CUDA.md "Session 39"); they stay
    // for the A/B and the bit-for-bit check. The two forms give the same bits.
    if (moe_gemm_mode() == 1) {
        constexpr int CR = qdetail::kMoeQuantChunk;
        const MoeGroupScratch gs = moe_group_scratch(y + size_t(pairs) * H, pairs);
        const int max_chunks = std::min(pairs, pairs / CR + E);
        detail::moe_group_kernel<E, CR><<<1, 1024, 0, c.stream>>>(pairs, top_id, gs.order, gs.chunks, gs.n_chunks);
        const qdetail::MoeQuantPairs src{top_id, gs.order, gs.chunks, gs.n_chunks};
        qdetail::moe_quant_up_kernel<H, FF, TOPK, F, CR><<<dim3(max_chunks, ceil_div(FF, 8)), 256, 0, c.stream>>>(x, experts, src, act);
        qdetail::moe_quant_down_kernel<H, FF, F, CR><<<dim3(max_chunks, ceil_div(H, 8)), 256, 0, c.stream>>>(act, experts, src, y);
    } else {
        const qdetail::MoeQuantPairs src{top_id, nullptr, nullptr, nullptr};
        qdetail::moe_quant_up_kernel<H, FF, TOPK, F, 1><<<dim3(pairs, ceil_div(FF, 8)), 256, 0, c.stream>>>(x, experts, src, act);
        qdetail::moe_quant_down_kernel<H, FF, F, 1><<<dim3(pairs, ceil_div(H, 8)), 256, 0, c.stream>>>(act, experts, src, y);
    }
    detail::moe_combine_kernel<H, TOPK><<<dim3(ceil_div(H, 128), rows), 128, 0, c.stream>>>(rows, top_id, top_w, y, residual, out);
}

// moe() with quantized experts in format F (the CUDA emitter's call for a quantized preset).
template <int H, int FF, int E, int TOPK, bool NORMALIZE, class F, typename RT>
void moe_quant(const Ctx& c, int rows, const float* x, const RT* router, const void* const* experts, const float* residual,
               float* out, float* ws) {
    if (rows <= 0) return;
    const MoeRouted r = moe_route<H, E, TOPK, NORMALIZE>(c, rows, x, router, ws);
    moe_quant_experts<H, FF, E, TOPK, F>(c, rows, x, experts, r.top_id, r.top_w, residual, out, r.rest);
}

}  // namespace scr::kernels::cuda
