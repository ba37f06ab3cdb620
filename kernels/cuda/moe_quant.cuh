// Sparse MoE MLP over quantized experts (MLX affine int4 g32 / g64 / g128, int8 per channel, fp8
// e4m3 per channel or per tensor: the formats of quant_linear.cuh), the CUDA side of
// kernels/cpu/moe.hpp's moe_quant. The routing and the combine are moe.cuh's (the same kernels as
// the bf16 experts, so the same picks and the same summation order); the experts' SwiGLU MLPs run
// as per-(row, pick) GEMVs that dequantize each expert row in registers, as moe.cuh's GEMV path
// does for bf16 (no grouped GEMM over quantized experts yet: a prefill re-reads an expert's
// weights once per pair that picked it, from L2 when they fit).
//
// The experts' table: expert e's gate, up and down projections at experts[(3 e + j) P], each as
// its P adjacent weight-table entries (codes, scales, and MLX's biases: P = 3, else 2), the order
// compiler/quant/apply.cpp writes and the CPU kernel reads.
#pragma once

#include <cstring>

#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/quant_ops.cuh"

namespace scr::kernels::cuda {

namespace qdetail {

// Tensors per quantized projection in the weight table: codes, scales (and MLX's biases).
template <class F>
constexpr int kQuantTensors = F::kAffine ? 3 : 2;

__host__ __device__ __forceinline__ float qscale_f32(float v) { return v; }
__host__ __device__ __forceinline__ float qscale_f32(bf16_t v) { return f32_from_bits(uint32_t(v.bits) << 16); }
__host__ __device__ __forceinline__ float qscale_f32(f16_t v) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(v.bits));
#else
    return f16_to_f32(v.bits);
#endif
}

__host__ __device__ __forceinline__ uint4 qdot_load16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return load_stream16(p);  // expert rows are read once per pair: keep L1 for x
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

// A packed word's weights as exact floats: the format's unpack (F::unpack), through the host and
// device functions it calls, so that the host self-test runs the same code.
template <class F>
__host__ __device__ __forceinline__ void qdot_unpack(uint32_t w, float (&q)[F::kPerWord]) {
    if constexpr (F::kAffine) unpack_u4x8(w, q);
    else if constexpr (F::kFp8) unpack_fp8x4(w, q);
    else unpack_s8x4(w, q);
}

// Lane `lane`'s part of the dot product of row n of a quantized [N][K] matrix with x[K]: the row's
// 16-byte chunks lane, lane + 32, ... (4 loads in flight), each dequantized in registers. MLX
// affine: s * sum(x q) + b * sum(x) per chunk (a chunk lies inside one group, G >= 32); one scale
// per row (or tensor): sum(x q), the scale applied to the warp's sum (qdot_finish). The warp's sum
// of the 32 lanes' parts is the dot. Host and device: the host self-test runs it lane by lane (so no
// `#pragma unroll`, which the host compiler warns of; nvcc unrolls these constant trip counts).
template <int K, class F>
__host__ __device__ __forceinline__ float qdot_lane(const QuantW& w, int n, const float* __restrict__ x, int lane) {
    using ST = typename F::Scale;
    constexpr int PW = F::kPerWord, kChunks = K / F::kElems, kBatch = 4;
    static_assert(K % F::kElems == 0, "K must be a whole number of 16-byte chunks of the packed row");
    static_assert(K % (F::kAffine ? F::kGroup : 1) == 0, "K must be a whole number of groups");
    const uint8_t* row = static_cast<const uint8_t*>(w.q) + size_t(n) * (size_t(kChunks) * 16);
    float acc = 0.0f;
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
            float aq = 0.0f, xs = 0.0f;
            for (int j = 0; j < 4; ++j) {
                float q[PW];
                qdot_unpack<F>(words[j], q);
                for (int i = 0; i < PW; i += 4) {
                    const float4 f = qdot_x4(x + size_t(c) * F::kElems + j * PW + i);
                    aq = fmaf(f.x, q[i], aq);
                    aq = fmaf(f.y, q[i + 1], aq);
                    aq = fmaf(f.z, q[i + 2], aq);
                    aq = fmaf(f.w, q[i + 3], aq);
                    if constexpr (F::kAffine) xs += (f.x + f.y) + (f.z + f.w);
                }
            }
            if constexpr (F::kAffine) {
                const size_t g = size_t(n) * (K / F::kGroup) + size_t(c) * F::kElems / F::kGroup;
                acc += qscale_f32(static_cast<const ST*>(w.scales)[g]) * aq + qscale_f32(static_cast<const ST*>(w.biases)[g]) * xs;
            } else {
                acc += aq;
            }
        }
    }
    return acc;
}

// The dot product from the warp's sum of qdot_lane: times the row's (or tensor's) scale for the
// one-scale formats.
template <class F>
__host__ __device__ __forceinline__ float qdot_finish(const QuantW& w, int n, float sum) {
    if constexpr (F::kAffine) {
        return sum;
    } else {
        return sum * qscale_f32(static_cast<const typename F::Scale*>(w.scales)[F::kPerTensor ? 0 : n]);
    }
}

// Projection j of expert e in the experts' table.
template <class F>
__host__ __device__ __forceinline__ QuantW qexpert(const void* const* experts, int e, int j) {
    constexpr int P = kQuantTensors<F>;
    const void* const* t = experts + size_t(3 * P) * size_t(e) + size_t(j) * P;
    return QuantW{t[0], t[1], P == 3 ? t[2] : nullptr};
}

// act[p][f] = silu(x[row] . Wg_e[f]) * (x[row] . Wu_e[f]) for pair p = row * TOPK + j: one warp per f.
template <int H, int FF, int TOPK, class F>
__global__ void __launch_bounds__(256) moe_quant_up_kernel(const float* __restrict__ x, const void* const* __restrict__ experts,
                                                           const int32_t* __restrict__ top_id, float* __restrict__ act) {
    const int pair = blockIdx.y, f = blockIdx.x * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (f >= FF) return;
    const int e = top_id[pair];
    const float* xr = x + size_t(pair / TOPK) * H;
    const QuantW gate = qexpert<F>(experts, e, 0), up = qexpert<F>(experts, e, 1);
    const float g = qdot_finish<F>(gate, f, warp_sum(qdot_lane<H, F>(gate, f, xr, lane)));
    const float u = qdot_finish<F>(up, f, warp_sum(qdot_lane<H, F>(up, f, xr, lane)));
    if (lane == 0) act[size_t(pair) * FF + f] = silu(g) * u;
}

// y[p][h] = act[p] . Wd_e[h]: one warp per h.
template <int H, int FF, class F>
__global__ void __launch_bounds__(256) moe_quant_down_kernel(const float* __restrict__ act, const void* const* __restrict__ experts,
                                                             const int32_t* __restrict__ top_id, float* __restrict__ y) {
    const int pair = blockIdx.y, h = blockIdx.x * 8 + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (h >= H) return;
    const QuantW down = qexpert<F>(experts, top_id[pair], 2);
    const float v = qdot_finish<F>(down, h, warp_sum(qdot_lane<FF, F>(down, h, act + size_t(pair) * FF, lane)));
    if (lane == 0) y[size_t(pair) * H + h] = v;
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
    qdetail::moe_quant_up_kernel<H, FF, TOPK, F><<<dim3(ceil_div(FF, 8), pairs), 256, 0, c.stream>>>(x, experts, top_id, act);
    qdetail::moe_quant_down_kernel<H, FF, F><<<dim3(ceil_div(H, 8), pairs), 256, 0, c.stream>>>(act, experts, top_id, y);
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
