// Row-wise and elementwise kernels: embedding lookup, RMSNorm, RoPE (alone, or fused with the
// KV append), add/mul/silu, row gather. Every expression rounds as kernels/cpu/elementwise.hpp's.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace scr::kernels::cuda {

namespace detail {

template <int H, typename WT>
__global__ void embed_kernel(int rows, const int32_t* __restrict__ ids, const WT* __restrict__ table, float* __restrict__ out) {
    const int t = blockIdx.y;
    if (t >= rows) return;
    const WT* src = table + size_t(ids[t]) * H;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) out[size_t(t) * H + i] = to_f32(src[i]);
}

// One warp per row: sum of squares, then y = w * (x * inv). x and y may be the same buffer.
template <int D>
__global__ void rmsnorm_kernel(int rows, const float* x, const float* __restrict__ w, float eps, float* y) {
    const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (row >= rows) return;
    const float* xr = x + size_t(row) * D;
    float* yr = y + size_t(row) * D;
    float ss = 0.0f;
    for (int i = lane; i < D; i += kWarp) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / float(D) + eps);
    for (int i = lane; i < D; i += kWarp) yr[i] = w[i] * (xr[i] * inv);
}

template <int HALF>
struct RopeFreqs {
    float inv_freq[HALF];
};

// Rotates pair (i, i + ROT/2) of one head of one token. `src`/`dst` point at the head.
template <int ROT>
__device__ __forceinline__ void rotate_pair(const float* src, float* dst, int i, float cs, float sn) {
    constexpr int kHalf = ROT / 2;
    const float a = src[i], c = src[i + kHalf];
    dst[i] = a * cs - c * sn;
    dst[i + kHalf] = c * cs + a * sn;
}

// Grid: one block per token; threads over (head, pair). Q and K rotate into q_out / k_out (which
// may alias q / k). With kv != nullptr the rotated K and the V rows are written straight into the
// token's KV slot (layout of kernels/cpu/attention.hpp) instead of k_out.
template <int HQ, int HK, int D, int ROT, int BS, typename KVT>
__global__ void rope_kernel(int rows, const float* q, const float* k, float* q_out, float* k_out, const float* __restrict__ v,
                            const int32_t* __restrict__ positions, const int64_t* __restrict__ slots,
                            const __grid_constant__ RopeFreqs<ROT / 2> f, std::byte* kv, int64_t block_bytes, int64_t k_off,
                            int64_t v_off) {
    constexpr int kHalf = ROT / 2;
    const int t = blockIdx.x;
    if (t >= rows) return;
    const float pos = float(positions[t]);
    KVT* kd = nullptr;
    KVT* vd = nullptr;
    if (kv) {
        const int64_t slot = slots[t];
        if (slot >= 0) {
            std::byte* base = kv + (slot / BS) * block_bytes;
            const int off = int(slot % BS);
            kd = reinterpret_cast<KVT*>(base + k_off) + size_t(off) * D;  // + head * BS * D below
            vd = reinterpret_cast<KVT*>(base + v_off) + size_t(off) * D;
        }
    }
    for (int j = threadIdx.x; j < (HQ + HK) * kHalf; j += blockDim.x) {
        const int h = j / kHalf, i = j % kHalf;
        float sn, cs;
        sincosf(pos * f.inv_freq[i], &sn, &cs);
        if (h < HQ) {
            rotate_pair<ROT>(q + (size_t(t) * HQ + h) * D, q_out + (size_t(t) * HQ + h) * D, i, cs, sn);
        } else {
            const int hk = h - HQ;
            const float* s = k + (size_t(t) * HK + hk) * D;
            if (!kv) {
                rotate_pair<ROT>(s, k_out + (size_t(t) * HK + hk) * D, i, cs, sn);
            } else if (kd) {
                const float a = s[i], c = s[i + kHalf];
                KVT* dst = kd + size_t(hk) * BS * D;
                dst[i] = from_f32<KVT>(a * cs - c * sn);
                dst[i + kHalf] = from_f32<KVT>(c * cs + a * sn);
            }
        }
    }
    // Dimensions past the rotary part are copied (or stored), and V goes to the cache as is.
    if constexpr (ROT < D) {
        for (int j = threadIdx.x; j < (HQ + HK) * (D - ROT); j += blockDim.x) {
            const int h = j / (D - ROT), i = ROT + j % (D - ROT);
            if (h < HQ) {
                q_out[(size_t(t) * HQ + h) * D + i] = q[(size_t(t) * HQ + h) * D + i];
            } else {
                const int hk = h - HQ;
                const float val = k[(size_t(t) * HK + hk) * D + i];
                if (!kv) k_out[(size_t(t) * HK + hk) * D + i] = val;
                else if (kd) kd[size_t(hk) * BS * D + i] = from_f32<KVT>(val);
            }
        }
    }
    if (vd)
        for (int j = threadIdx.x; j < HK * D; j += blockDim.x)
            vd[size_t(j / D) * BS * D + j % D] = from_f32<KVT>(v[size_t(t) * HK * D + j]);
}

enum class Ew { add, mul, silu, scale, gelu_tanh, softcap };

// gelu(x, approximate="tanh") as PyTorch computes it (kernels/cpu/elementwise.hpp's gelu_tanh1).
__device__ __forceinline__ float gelu_tanh1(float x) {
    constexpr float kBeta = 0.7978845608028654f, kKappa = 0.044715f;  // sqrt(2/pi)
    const float cube = x * x * x;
    return 0.5f * x * (1.0f + tanhf(kBeta * (x + kKappa * cube)));
}

template <int W, Ew Op>
__global__ void elementwise_kernel(int64_t n, const float* a, const float* b, float f, float* out) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        if constexpr (Op == Ew::add) out[i] = a[i] + b[i];
        else if constexpr (Op == Ew::mul) out[i] = a[i] * b[i];
        else if constexpr (Op == Ew::silu) out[i] = a[i] * (1.0f / (1.0f + expf(-a[i])));
        else if constexpr (Op == Ew::scale) out[i] = a[i] * f;
        else if constexpr (Op == Ew::gelu_tanh) out[i] = gelu_tanh1(a[i]);
        else out[i] = f * tanhf(a[i] / f);
    }
}

template <int W>
__global__ void gather_rows_kernel(int rows, const int32_t* __restrict__ which, const float* __restrict__ in, float* __restrict__ out) {
    const int r = blockIdx.y;
    if (r >= rows) return;
    const float* src = in + size_t(which[r]) * W;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < W; i += gridDim.x * blockDim.x) out[size_t(r) * W + i] = src[i];
}

inline int elementwise_blocks(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 4096)); }

}  // namespace detail

template <int H, typename WT>
void embed(const Ctx& c, int rows, const WT* table, float* out) {
    if (rows <= 0) return;
    detail::embed_kernel<H, WT><<<dim3(ceil_div(H, 256 * 4) , rows), 256, 0, c.stream>>>(rows, c.step.token_ids, table, out);
}

template <int D>
void rmsnorm(const Ctx& c, int rows, const float* x, const float* w, float eps, float* y) {
    if (rows <= 0) return;
    detail::rmsnorm_kernel<D><<<ceil_div(rows, 8), 256, 0, c.stream>>>(rows, x, w, eps, y);
}

template <int HALF>
using RopeFreqs = detail::RopeFreqs<HALF>;

template <int HQ, int HK, int D, int ROT>
void rope(const Ctx& c, int rows, const float* q, const float* k, float* q_out, float* k_out, const RopeFreqs<ROT / 2>& f) {
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    if (rows <= 0) return;
    detail::rope_kernel<HQ, HK, D, ROT, 1, float><<<rows, 128, 0, c.stream>>>(rows, q, k, q_out, k_out, nullptr, c.step.positions,
                                                                             c.step.slot_mapping, f, nullptr, 0, 0, 0);
}

// RoPE fused with the KV append: rotated Q to q_out; rotated K and V into their KV slots.
template <int HQ, int HK, int D, int ROT, int BS, typename KVT>
void rope_append(const Ctx& c, int rows, const float* q, const float* k, const float* v, float* q_out,
                 const RopeFreqs<ROT / 2>& f, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off) {
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    if (rows <= 0) return;
    detail::rope_kernel<HQ, HK, D, ROT, BS, KVT><<<rows, 128, 0, c.stream>>>(rows, q, k, q_out, nullptr, v, c.step.positions,
                                                                            c.step.slot_mapping, f, kv, block_bytes, k_off, v_off);
}

namespace detail {
template <int W, Ew Op>
void elementwise(const Ctx& c, int rows, const float* a, const float* b, float f, float* out) {
    const int64_t n = int64_t(rows) * W;
    if (n > 0) elementwise_kernel<W, Op><<<elementwise_blocks(n), 256, 0, c.stream>>>(n, a, b, f, out);
}
}  // namespace detail

template <int W>
void add(const Ctx& c, int rows, const float* a, const float* b, float* out) { detail::elementwise<W, detail::Ew::add>(c, rows, a, b, 0, out); }
template <int W>
void mul(const Ctx& c, int rows, const float* a, const float* b, float* out) { detail::elementwise<W, detail::Ew::mul>(c, rows, a, b, 0, out); }
template <int W>
void silu(const Ctx& c, int rows, const float* x, float* out) { detail::elementwise<W, detail::Ew::silu>(c, rows, x, nullptr, 0, out); }
// out = x * factor (a model constant)
template <int W>
void scale(const Ctx& c, int rows, const float* x, float factor, float* out) {
    detail::elementwise<W, detail::Ew::scale>(c, rows, x, nullptr, factor, out);
}
template <int W>
void gelu_tanh(const Ctx& c, int rows, const float* x, float* out) {
    detail::elementwise<W, detail::Ew::gelu_tanh>(c, rows, x, nullptr, 0, out);
}
// out = cap * tanh(x / cap)
template <int W>
void softcap(const Ctx& c, int rows, const float* x, float cap, float* out) {
    detail::elementwise<W, detail::Ew::softcap>(c, rows, x, nullptr, cap, out);
}

template <int W>
void gather_rows(const Ctx& c, int rows, const float* in, float* out) {
    if (rows <= 0) return;
    detail::gather_rows_kernel<W><<<dim3(ceil_div(W, 256 * 4), rows), 256, 0, c.stream>>>(rows, c.step.logit_rows, in, out);
}

}  // namespace scr::kernels::cuda
