// The quantized ops the generated code calls (the CUDA side of the IR's qlinear / qlinear_glu /
// qembed), over the checkpoints' own packed layouts, uploaded as they are (quant_linear.cuh has
// the layouts and the GEMV).
//
// Every row count goes through quant_linear: one token row on the one-row kernels, up to 256 rows on
// tensor cores (16 weight rows x up to 64 token rows per block, more rows in adjacent blocks whose
// weight reads hit L2), prefill-sized calls (257+ rows) on cuBLASLt over dequantized hi + lo bf16
// weights (quant_prefill.cuh). Within the decode regimes a row's result never depends on the other
// rows, so decode steps stay batch-invariant.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/linear.cuh"  // RmsIn, rmsnorm
#include "kernels/cuda/quant_linear.cuh"

namespace scr::kernels::cuda {

// A quantized weight's device tensors: packed q, scales, and (MLX affine) biases.
struct QuantW {
    const void* q = nullptr;
    const void* scales = nullptr;
    const void* biases = nullptr;
};

namespace qdetail {

// Dequantized rows of a quantized embedding table: w = fma(q, scale, bias) (MLX affine) or
// q * scale (int8 / fp8 per channel or per tensor), exactly as kernels/cpu/quant_linear.hpp's at().
template <int H, class F>
__global__ void qembed_kernel(int rows, const int32_t* __restrict__ ids, const QuantW w, float* __restrict__ out) {
    const int t = blockIdx.y;
    if (t >= rows) return;
    using ST = typename F::Scale;
    const size_t id = size_t(ids[t]);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) {
        float v;
        if constexpr (F::kAffine) {
            const uint32_t word = static_cast<const uint32_t*>(w.q)[id * (H / 8) + i / 8];
            const float q = float((word >> (4 * (i % 8))) & 15u);
            const size_t g = id * (H / F::kGroup) + i / F::kGroup;
            v = fmaf(q, to_f32(static_cast<const ST*>(w.scales)[g]), to_f32(static_cast<const ST*>(w.biases)[g]));
        } else if constexpr (F::kFp8) {
            const uint32_t byte = static_cast<const uint8_t*>(w.q)[id * H + i];
            uint32_t a[2];
            qunpack_fp8_bf16(byte, a);
            v = f32_from_bits(a[0] << 16) * qrow_scale<F>(w.scales, int(id));
        } else {
            v = float(static_cast<const int8_t*>(w.q)[id * H + i]) * qrow_scale<F>(w.scales, int(id));
        }
        out[size_t(t) * H + i] = v;
    }
}

// y = silu(g) * u, rounded as the CPU qlinear_glu's epilogue. (A template, so that every generated
// .cu may define it: a plain __global__ in a header is a duplicate symbol at link time.)
template <int N>
__global__ void silu_mul_kernel(int64_t n, const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ y) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float a = g[i];
        y[i] = a * (1.0f / (1.0f + expf(-a))) * u[i];
    }
}

// The fused launches (folded RMSNorm, grouped Q/K/V, SwiGLU in one pass) unless
// SCR_CUDA_QUANT_FUSED=0, which runs the unfused plan (standalone RMSNorm, one launch per matrix,
// gate + up + silu*mul) from the same binary, for A/B runs.
inline bool quant_fused_on() {
    static const bool on = env_flag_switch("SCR_CUDA_QUANT_FUSED", true);
    return on;
}

inline QuantMat mat_of(QuantW w, const float* bias, float* y, int n) { return QuantMat{w.q, w.scales, w.biases, bias, y, n}; }

// One fused launch if enabled and the tensor-core kernel takes it; else (returns false) the caller
// runs the unfused launches. With a norm, x_planned is where rmsnorm(norm.x) * norm.w is planned:
// the unfused path writes it there first.
// A fused launch's shape and input: K, the rows, and with a folded norm the norm's input and weight.
template <bool NORM>
void set_fused_input(QuantFusedArgs& a, int k, int rows, const RmsIn& norm) {
    a.k = k;
    a.rows = rows;
    if constexpr (NORM) {
        a.x = norm.x;
        a.norm_w = norm.w;
        a.eps = norm.eps;
    }
}
template <int K, class F, bool SWIGLU, bool NORM>
bool try_fused(const Ctx& c, int rows, QuantFusedArgs a, const RmsIn& norm) {
    if (!quant_fused_on()) return false;
    set_fused_input<NORM>(a, K, rows, norm);
    return quant_linear_fused<F, SWIGLU, NORM>(c, a);
}

}  // namespace qdetail

// y = x W^T (+ bias) (+ residual); residual may be y.
template <int N, int K, class F>
void qlinear(const Ctx& c, int rows, const float* x, QuantW w, const float* bias, const float* residual, float* y) {
    quant_linear<F>(c, QuantLinearArgs{w.q, w.scales, w.biases, bias, residual, x, y, N, K, rows});
}
// With a folded RMSNorm: x is where rmsnorm(norm.x) * norm.w is planned (written only unfused).
template <int N, int K, class F>
void qlinear(const Ctx& c, int rows, const float* x, QuantW w, const float* bias, const float* residual, float* y, RmsIn norm) {
    if (rows <= 0) return;
    QuantFusedArgs a;
    a.mat[0] = qdetail::mat_of(w, bias, y, N);
    a.residual = residual;
    if (qdetail::try_fused<K, F, false, true>(c, rows, a, norm)) return;
    rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
    qlinear<N, K, F>(c, rows, x, w, bias, residual, y);
}

// Two or three quantized linears of one input (Q, K, V) in one launch; N2 = 0 for two.
struct QuantOut {
    QuantW w;
    const float* bias = nullptr;
    float* y = nullptr;
};
template <int K, class F, int N0, int N1, int N2>
void qlinear_group(const Ctx& c, int rows, const float* x, QuantOut o0, QuantOut o1, QuantOut o2) {
    if (rows <= 0) return;
    QuantFusedArgs a;
    a.mat[0] = qdetail::mat_of(o0.w, o0.bias, o0.y, N0);
    a.mat[1] = qdetail::mat_of(o1.w, o1.bias, o1.y, N1);
    a.mat[2] = qdetail::mat_of(o2.w, o2.bias, o2.y, N2);
    a.nmat = N2 > 0 ? 3 : 2;
    a.x = x;
    if (qdetail::try_fused<K, F, false, false>(c, rows, a, RmsIn{})) return;
    qlinear<N0, K, F>(c, rows, x, o0.w, o0.bias, nullptr, o0.y);
    qlinear<N1, K, F>(c, rows, x, o1.w, o1.bias, nullptr, o1.y);
    if constexpr (N2 > 0) qlinear<N2, K, F>(c, rows, x, o2.w, o2.bias, nullptr, o2.y);
}
template <int K, class F, int N0, int N1, int N2>
void qlinear_group(const Ctx& c, int rows, const float* x, QuantOut o0, QuantOut o1, QuantOut o2, RmsIn norm) {
    if (rows <= 0) return;
    QuantFusedArgs a;
    a.mat[0] = qdetail::mat_of(o0.w, o0.bias, o0.y, N0);
    a.mat[1] = qdetail::mat_of(o1.w, o1.bias, o1.y, N1);
    a.mat[2] = qdetail::mat_of(o2.w, o2.bias, o2.y, N2);
    a.nmat = N2 > 0 ? 3 : 2;
    if (qdetail::try_fused<K, F, false, true>(c, rows, a, norm)) return;
    rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
    qlinear_group<K, F, N0, N1, N2>(c, rows, x, o0, o1, o2);
}

namespace qdetail {
// 2 token rows of MLX int4 (quant_swiglu_grouped): the gate and up rows (n each, K = k) as one
// grouped launch of quant_mma1_kernel into `tmp` (2 rows n floats; the norm folded when NORM), then
// silu * mul. False (nothing launched) when not taken, also when quant_mma1_kernel declines the
// launch (layout, shared memory, an A/B form): the caller then runs the fused launch, whose 2-row
// form on quant_mma_kernel is faster than a grouped launch there plus silu * mul. N only names the
// silu*mul instance (runtime shapes: tests).
template <int N, class F, bool NORM>
bool swiglu_grouped(const Ctx& c, int rows, int n, int k, const float* x, QuantW wg, QuantW wu, float* tmp, float* y,
                    const RmsIn& norm) {
    if constexpr (!F::kAffine) {
        return false;
    } else {
        if (!tmp || !quant_fused_on() || !quant_swiglu_grouped<F>(rows)) return false;
        float* g = tmp;
        float* u = tmp + size_t(rows) * n;
        QuantFusedArgs a;
        a.mat[0] = mat_of(wg, nullptr, g, n);
        a.mat[1] = mat_of(wu, nullptr, u, n);
        a.nmat = 2;
        a.x = x;
        set_fused_input<NORM>(a, k, rows, norm);
        if (!quant_mma1_fits<F>(a) || !launch_quant_mma1<F, false, NORM>(c, a)) return false;
        const int64_t total = int64_t(rows) * n;
        silu_mul_kernel<N><<<int(std::min<int64_t>((total + 255) / 256, 4096)), 256, 0, c.stream>>>(total, g, u, y);
        return true;
    }
}
}  // namespace qdetail

// y = silu(x Wg^T) * (x Wu^T): gate and up rows in one launch, silu(g) * u in its epilogue. `tmp`
// holds 2 * rows * N floats (the gate and up rows) where they go through memory: 2 rows of MLX int4
// (qdetail::swiglu_grouped: one grouped launch, then silu*mul), and unfused (SCR_CUDA_QUANT_FUSED=0,
// or a shape only the SIMT kernel takes: two GEMV launches, then silu*mul; the same bits as fused,
// since the gate and up sums are the plain kernel's and the epilogue the same expression).
template <int N, int K, class F>
void qlinear_swiglu(const Ctx& c, int rows, const float* x, QuantW wg, QuantW wu, float* tmp, float* y) {
    if (rows <= 0) return;
    if (qdetail::swiglu_grouped<N, F, false>(c, rows, N, K, x, wg, wu, tmp, y, RmsIn{})) return;
    QuantFusedArgs a;
    a.mat[0] = qdetail::mat_of(wg, nullptr, y, N);
    a.mat[1] = qdetail::mat_of(wu, nullptr, y, N);
    a.nmat = 2;
    a.x = x;
    if (qdetail::try_fused<K, F, true, false>(c, rows, a, RmsIn{})) return;
    float* g = tmp;
    float* u = tmp + size_t(rows) * N;
    quant_linear<F>(c, QuantLinearArgs{wg.q, wg.scales, wg.biases, nullptr, nullptr, x, g, N, K, rows});
    quant_linear<F>(c, QuantLinearArgs{wu.q, wu.scales, wu.biases, nullptr, nullptr, x, u, N, K, rows});
    const int64_t n = int64_t(rows) * N;
    qdetail::silu_mul_kernel<N><<<int(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0, c.stream>>>(n, g, u, y);
}

template <int N, int K, class F>
void qlinear_swiglu(const Ctx& c, int rows, const float* x, QuantW wg, QuantW wu, float* tmp, float* y, RmsIn norm) {
    if (rows <= 0) return;
    if (qdetail::swiglu_grouped<N, F, true>(c, rows, N, K, x, wg, wu, tmp, y, norm)) return;
    QuantFusedArgs a;
    a.mat[0] = qdetail::mat_of(wg, nullptr, y, N);
    a.mat[1] = qdetail::mat_of(wu, nullptr, y, N);
    a.nmat = 2;
    if (qdetail::try_fused<K, F, true, true>(c, rows, a, norm)) return;
    rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
    qlinear_swiglu<N, K, F>(c, rows, x, wg, wu, tmp, y);
}

template <int H, class F>
void qembed(const Ctx& c, int rows, QuantW w, float* out) {
    if (rows <= 0) return;
    qdetail::qembed_kernel<H, F><<<dim3(ceil_div(H, 256 * 4), rows), 256, 0, c.stream>>>(rows, c.step.token_ids, w, out);
}

}  // namespace scr::kernels::cuda
