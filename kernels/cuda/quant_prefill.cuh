// Prefill-sized quantized linears on cuBLASLt (issue #9): the quantized kernels re-read every weight
// once per 64 token rows and were 4x slower than the bf16 build at prefill. From
// quant_prefill_min_rows<F>() rows on, quant_linear / quant_linear_fused hand a call to
// cuda_rt::prefill_linears_bf16 (runtime/cuda/prefill_gemm.hpp) with a WeightExpander that writes
// each matrix right before its GEMMs:
//  * MLX int4: the dequantized weight, w = fma(q, s, b) in float32 as the CPU's at(), as two bf16
//    matrices hi + lo (|w - hi - lo| <= 2^-18 |w|), both multiplied by [x_hi; x_lo];
//  * int8 / fp8: the codes, exact in bf16, in one GEMM, their row scales applied by the closing pass.
// Every output keeps float32-level accuracy (the tensor-core kernels' bound, checked by
// tests/cuda/quant_gemv_test.cu). The folded RMSNorm, Q/K/V grouping, bias, residual and SwiGLU are
// prefill_linears_bf16's own.
//
// Decode batches come here from quant_prefill_min_rows<F>() rows (MLX int4 65, int8 and fp8 33),
// except those quant_wide_kernel takes first (quant_wide.cuh: MLX int4 g32 / g64 up to 128 rows by
// default since session 33, so those formats come here from 129).
// cuBLASLt's decode buckets (33-64, 65-256 rows: one
// algorithm per shape each, prefill_gemm.hpp) keep those rows batch-invariant inside a bucket;
// above 256 rows (prefill) results may depend on the call's row count.
#pragma once
// Included by quant_linear.cuh (after quant_mma1.cuh), not on its own.

#include <cuda_bf16.h>

#include "runtime/cuda/prefill_gemm.hpp"

namespace scr::kernels::cuda::qdetail {

// Token rows from which quantized linears of format F go to cuBLASLt. Measured on the H200
// (docs/CUDA.md "Session 30" and "Session 31", decode tok/s against the quantized kernels):
//  * MLX int4 from 65 rows, the first row past the staged kernel's passes (quant_staged.cuh): 8B
//    batch 128 4,172 against 2,500, 256 5,836 against 2,562; 1B 1.55x / 2.41x. At 64 rows the
//    passes are faster (each expanded weight costs its hi + lo writes every step);
//  * int8 and fp8 from 33 rows, cuBLASLt's first decode bucket (a code is exact in bf16: one GEMM):
//    8B int8 batch 64 4,743-4,765 against 3,287-3,298, 128 7,496 against 3,240-3,249, 256 10.9k
//    against 3.17k; 8B fp8 batch 64 4,728-4,733 against 3,268-3,273, 128 7,438-7,444 against
//    3,226-3,228, 256 10.9k against 3.15k.
// SCR_CUDA_QUANT_PREFILL_MIN_ROWS=n sets every format's (0 turns the path off; A/B runs).
constexpr int kQuantPrefillMinRowsInt4 = 65, kQuantPrefillMinRowsCodes = 33;
inline int quant_prefill_min_rows_env() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_PREFILL_MIN_ROWS", -1, [](long long r) { return r >= 0 && r <= (1 << 30); },
        "a row count (0: the path off)", "each format's default"));
    return v;
}
template <class F>
int quant_prefill_min_rows() {
    const int forced = quant_prefill_min_rows_env();
    if (forced >= 0) return forced;
    if constexpr (F::kAffine) return kQuantPrefillMinRowsInt4;
    else return kQuantPrefillMinRowsCodes;
}

// MLX int4 matrix `m` ([n][k]) dequantized as bf16 hi + lo: one thread per 8 consecutive weights of
// a row (one word), 16-byte stores.
template <class F>
__global__ void qexpand_hi_lo_kernel(QuantMat m, int k, __nv_bfloat16* __restrict__ hi, __nv_bfloat16* __restrict__ lo) {
    using ST = typename F::Scale;
    const int64_t units = int64_t(m.n) * (k / 8);
    for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
        const int row = int(u / (k / 8));
        const int k0 = int(u % (k / 8)) * 8;
        const uint32_t word = static_cast<const uint32_t*>(m.q)[u];
        const size_t g = size_t(row) * (k / F::kGroup) + k0 / F::kGroup;  // 8 weights never straddle a group
        const float s = to_f32(static_cast<const ST*>(m.scales)[g]), b = to_f32(static_cast<const ST*>(m.biases)[g]);
        __align__(16) __nv_bfloat16 h[8], l[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float w = fmaf(float((word >> (4 * i)) & 15u), s, b);  // as the CPU's at()
            h[i] = __float2bfloat16_rn(w);
            l[i] = __float2bfloat16_rn(w - __bfloat162float(h[i]));
        }
        reinterpret_cast<uint4*>(hi)[u] = *reinterpret_cast<const uint4*>(h);
        reinterpret_cast<uint4*>(lo)[u] = *reinterpret_cast<const uint4*>(l);
    }
}

// int8 / fp8 matrix `m` as its codes in bf16 (exact: |q| <= 127, e4m3's 4 significant bits) and
// its row scales as float32 (per tensor: the one scale in every row), 8 codes per thread.
template <class F>
__global__ void qexpand_codes_kernel(QuantMat m, int k, __nv_bfloat16* __restrict__ codes, float* __restrict__ scale) {
    const int64_t units = int64_t(m.n) * (k / 8);
    for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < units; u += int64_t(gridDim.x) * blockDim.x) {
        const uint2 bytes = static_cast<const uint2*>(m.q)[u];
        __align__(16) __nv_bfloat16 c[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t byte = ((i < 4 ? bytes.x : bytes.y) >> (8 * (i % 4))) & 0xffu;
            if constexpr (F::kFp8) {
                uint32_t a[2];
                qunpack_fp8_bf16(byte, a);
                c[i] = __ushort_as_bfloat16(uint16_t(a[0]));
            } else {
                c[i] = __float2bfloat16_rn(float(int8_t(byte)));
            }
        }
        reinterpret_cast<uint4*>(codes)[u] = *reinterpret_cast<const uint4*>(c);
        if (u % (k / 8) == 0) scale[u / (k / 8)] = qrow_scale<F>(m.scales, int(u / (k / 8)));
    }
}

// The WeightExpander callback: output i is matrix i, or (SwiGLU) the gate / the up matrix.
template <class F, bool SWIGLU>
void qexpand(const void* ctx, int output, bool up, void* a_out, void* b_out, cudaStream_t stream) {
    const QuantFusedArgs& a = *static_cast<const QuantFusedArgs*>(ctx);
    const QuantMat& m = a.mat[SWIGLU ? (up ? 1 : 0) : output];
    const int64_t units = int64_t(m.n) * (a.k / 8);
    const int blocks = int(std::min<int64_t>((units + 255) / 256, 132 * 16));
    if constexpr (F::kAffine)
        qexpand_hi_lo_kernel<F><<<blocks, 256, 0, stream>>>(m, a.k, static_cast<__nv_bfloat16*>(a_out), static_cast<__nv_bfloat16*>(b_out));
    else
        qexpand_codes_kernel<F><<<blocks, 256, 0, stream>>>(m, a.k, static_cast<__nv_bfloat16*>(a_out), static_cast<float*>(b_out));
}

// Calls this thread ran on cuBLASLt in full (the tests check that the path really ran).
inline int& quant_prefill_calls() {
    static thread_local int n = 0;
    return n;
}

// The call on cuBLASLt: how many of its matrices were written (a.nmat, or 1 for SwiGLU, when all
// were; 0 when cuBLASLt declined: nothing written). Fewer only if a cuBLASLt call failed midway.
template <class F, bool SWIGLU, bool NORM>
int quant_prefill(const Ctx& c, const QuantFusedArgs& a) {
    const int min_rows = quant_prefill_min_rows<F>();
    if (min_rows == 0 || a.rows < min_rows || a.k % 16 != 0) return 0;
    cuda_rt::GemmOut outs[cuda_rt::kMaxGemmOuts];
    const int count = SWIGLU ? 1 : a.nmat;
    for (int i = 0; i < a.nmat; ++i)
        if (reinterpret_cast<uintptr_t>(a.mat[i].q) % 8 != 0) return 0;  // qexpand_kernel's 8-byte loads
    for (int i = 0; i < count; ++i) {
        const QuantMat& m = a.mat[i];
        outs[i].swiglu = SWIGLU;
        outs[i].bias = m.bias;
        outs[i].residual = count == 1 ? a.residual : nullptr;
        outs[i].y = m.y;
        outs[i].n = m.n;
    }
    const cuda_rt::WeightExpander ex{&qexpand<F, SWIGLU>, &a, !F::kAffine};
    const int done = cuda_rt::prefill_linears_bf16(c.stream, a.rows, a.k, a.x, NORM ? a.norm_w : nullptr, a.eps, outs, count, &ex);
    if (done == count) ++quant_prefill_calls();
    return done;
}

}  // namespace scr::kernels::cuda::qdetail
