// The quantized ops the generated code calls (the CUDA side of the IR's qlinear / qlinear_glu /
// qembed), over the checkpoints' own packed layouts, uploaded as they are (quant_linear.cuh has
// the layouts and the GEMV).
//
// Every row count goes through quant_linear (tensor cores: 16 weight rows x up to 64 token rows per
// block, more rows in adjacent blocks whose weight reads hit L2): decode is the fast case; prefill is
// correct, re-reading each weight once per 64 rows. A row's result never depends on the other rows,
// so decode steps stay batch-invariant.
#pragma once

#include <algorithm>

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
// q * scale (int8 per channel), exactly as kernels/cpu/quant_linear.hpp's at().
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
        } else {
            v = float(static_cast<const int8_t*>(w.q)[id * H + i]) * to_f32(static_cast<const ST*>(w.scales)[id]);
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

}  // namespace qdetail

// y = x W^T (+ bias) (+ residual); residual may be y.
template <int N, int K, class F>
void qlinear(const Ctx& c, int rows, const float* x, QuantW w, const float* bias, const float* residual, float* y) {
    quant_linear<F>(c, QuantLinearArgs{w.q, w.scales, w.biases, bias, residual, x, y, N, K, rows});
}

// y = silu(x Wg^T) * (x Wu^T). `tmp` holds 2 * rows * N floats (the gate and up rows) between the
// two GEMV launches and the epilogue: the quantized GEMV has no two-matrix variant yet.
template <int N, int K, class F>
void qlinear_swiglu(const Ctx& c, int rows, const float* x, QuantW wg, QuantW wu, float* tmp, float* y) {
    if (rows <= 0) return;
    float* g = tmp;
    float* u = tmp + size_t(rows) * N;
    quant_linear<F>(c, QuantLinearArgs{wg.q, wg.scales, wg.biases, nullptr, nullptr, x, g, N, K, rows});
    quant_linear<F>(c, QuantLinearArgs{wu.q, wu.scales, wu.biases, nullptr, nullptr, x, u, N, K, rows});
    const int64_t n = int64_t(rows) * N;
    qdetail::silu_mul_kernel<N><<<int(std::min<int64_t>((n + 255) / 256, 4096)), 256, 0, c.stream>>>(n, g, u, y);
}

template <int H, class F>
void qembed(const Ctx& c, int rows, QuantW w, float* out) {
    if (rows <= 0) return;
    qdetail::qembed_kernel<H, F><<<dim3(ceil_div(H, 256 * 4), rows), 256, 0, c.stream>>>(rows, c.step.token_ids, w, out);
}

}  // namespace scr::kernels::cuda
