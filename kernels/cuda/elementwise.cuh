// Row-wise and elementwise kernels: embedding lookup, RMSNorm, RoPE (alone, or fused with the
// KV append), add/mul/silu, row gather. Every expression rounds as kernels/cpu/elementwise.hpp's.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace scr::kernels::cuda {

namespace detail {

template <int H, typename WT>
__global__ void embed_kernel(int rows, const int32_t* __restrict__ ids, const WT* __restrict__ table, float* __restrict__ out) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.y;
    if (t >= rows) return;
    const WT* src = table + size_t(ids[t]) * H;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) out[size_t(t) * H + i] = to_f32(src[i]);
}

// One block per row: the row is read once into registers (16-byte loads, all issued before the sum),
// the sum of squares reduced in a fixed order (lanes, then warps), then y = w * (x * inv). x and y
// may be the same buffer (a row is read whole before any of it is written). The earlier warp-per-row
// loop waited on one load per iteration: 50 us for 64 rows of 4096 on the H200 (docs/CUDA.md).
constexpr int kNormThreads = 256;

template <int D>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(int rows, const float* x, const float* __restrict__ w, float eps,
                                                               float* y) {
    constexpr int kVec = D % 4 == 0 ? 4 : 1;
    constexpr int kChunks = D / kVec;
    constexpr int kPer = (kChunks + kNormThreads - 1) / kNormThreads;
    using Chunk = std::conditional_t<kVec == 4, float4, float>;
    pdl_wait();
    pdl_trigger();
    const int row = blockIdx.x;
    if (row >= rows) return;
    const Chunk* xr = reinterpret_cast<const Chunk*>(x + size_t(row) * D);
    Chunk v[kPer];
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int c = threadIdx.x + j * kNormThreads;
        if (c < kChunks) v[j] = xr[c];
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        if (threadIdx.x + j * kNormThreads >= kChunks) continue;
        if constexpr (kVec == 4) ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
        else ss += v[j] * v[j];
    }
    __shared__ float part[kNormThreads / kWarp];
    ss = warp_sum(ss);
    if (threadIdx.x % kWarp == 0) part[threadIdx.x / kWarp] = ss;
    __syncthreads();
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormThreads / kWarp; ++i) total += part[i];
    const float inv = 1.0f / sqrtf(total / float(D) + eps);
    Chunk* yr = reinterpret_cast<Chunk*>(y + size_t(row) * D);
    const Chunk* wc = reinterpret_cast<const Chunk*>(w);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
        const int c = threadIdx.x + j * kNormThreads;
        if (c >= kChunks) continue;
        const Chunk g = wc[c];
        if constexpr (kVec == 4) yr[c] = make_float4(g.x * (v[j].x * inv), g.y * (v[j].y * inv), g.z * (v[j].z * inv), g.w * (v[j].w * inv));
        else yr[c] = g * (v[j] * inv);
    }
}

// The earlier warp-per-row kernel, kept for A/B runs (SCR_CUDA_FUSED_SPLIT=0).
template <int D>
__global__ void rmsnorm_warp_kernel(int rows, const float* x, const float* __restrict__ w, float eps, float* y) {
    pdl_wait();
    pdl_trigger();
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

// SCR_CUDA_FUSED_SPLIT=0: the batched-decode / prefill path as it was before the fused norm + split
// (docs/CUDA.md): the warp-per-row RMSNorm, and one hi/lo split and closing pass per cuBLASLt matrix.
inline bool fused_split_on() {
    static const bool on = env_flag_switch("SCR_CUDA_FUSED_SPLIT", true);
    return on;
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
    pdl_wait();
    pdl_trigger();
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
    // One flat range of work per token: rotary pairs, then pass-through dimensions, then V; the
    // token's blocks (grid.y) share it, so a decode step is one wave of short threads.
    constexpr int kPairs = (HQ + HK) * kHalf;
    constexpr int kPass = (HQ + HK) * (D - ROT);
    constexpr int kWork = kPairs + kPass + HK * D;
    for (int w = blockIdx.y * blockDim.x + threadIdx.x; w < kWork; w += gridDim.y * blockDim.x) {
        if (w < kPairs) {
            const int h = w / kHalf, i = w % kHalf;
            float sn, cs;
            sincosf(pos * f.inv_freq[i], &sn, &cs);
            if (h < HQ) {
                rotate_pair<ROT>(q + (size_t(t) * HQ + h) * D, q_out + (size_t(t) * HQ + h) * D, i, cs, sn);
            } else {
                const int hk = h - HQ;
                const float* src = k + (size_t(t) * HK + hk) * D;
                if (!kv) {
                    rotate_pair<ROT>(src, k_out + (size_t(t) * HK + hk) * D, i, cs, sn);
                } else if (kd) {
                    const float a = src[i], c = src[i + kHalf];
                    KVT* dst = kd + size_t(hk) * BS * D;
                    dst[i] = from_f32<KVT>(a * cs - c * sn);
                    dst[i + kHalf] = from_f32<KVT>(c * cs + a * sn);
                }
            }
        } else if (w < kPairs + kPass) {
            // Dimensions past the rotary part are copied (or stored).
            constexpr int kPassDims = D - ROT > 0 ? D - ROT : 1;  // (never 0 where this branch runs)
            const int j = w - kPairs;
            const int h = j / kPassDims, i = ROT + j % kPassDims;
            if (h < HQ) {
                q_out[(size_t(t) * HQ + h) * D + i] = q[(size_t(t) * HQ + h) * D + i];
            } else {
                const int hk = h - HQ;
                const float val = k[(size_t(t) * HK + hk) * D + i];
                if (!kv) k_out[(size_t(t) * HK + hk) * D + i] = val;
                else if (kd) kd[size_t(hk) * BS * D + i] = from_f32<KVT>(val);
            }
        } else if (vd) {
            // V goes to the cache as is.
            const int j = w - kPairs - kPass;
            vd[size_t(j / D) * BS * D + j % D] = from_f32<KVT>(v[size_t(t) * HK * D + j]);
        }
    }
}

// Blocks per token for rope_kernel: one 128-thread block per 128 work items.
template <int HQ, int HK, int D, int ROT>
constexpr int rope_blocks() {
    return ceil_div((HQ + HK) * (ROT / 2) + (HQ + HK) * (D - ROT) + HK * D, 128);
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
    pdl_wait();
    pdl_trigger();
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
    pdl_wait();
    pdl_trigger();
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
    launch(c, detail::embed_kernel<H, WT>, dim3(ceil_div(H, 256 * 4), rows), dim3(256), rows, c.step.token_ids, table, out);
}

template <int D>
void rmsnorm(const Ctx& c, int rows, const float* x, const float* w, float eps, float* y) {
    if (rows <= 0) return;
    if (detail::fused_split_on())
        launch(c, detail::rmsnorm_kernel<D>, dim3(rows), dim3(detail::kNormThreads), rows, x, w, eps, y);
    else
        launch(c, detail::rmsnorm_warp_kernel<D>, dim3(ceil_div(rows, 8)), dim3(256), rows, x, w, eps, y);
}

template <int HALF>
using RopeFreqs = detail::RopeFreqs<HALF>;

template <int HQ, int HK, int D, int ROT>
void rope(const Ctx& c, int rows, const float* q, const float* k, float* q_out, float* k_out, const RopeFreqs<ROT / 2>& f) {
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    if (rows <= 0) return;
    launch(c, detail::rope_kernel<HQ, HK, D, ROT, 1, float>, dim3(rows, detail::rope_blocks<HQ, HK, D, ROT>()), dim3(128), rows, q, k, q_out, k_out, nullptr,
           c.step.positions, c.step.slot_mapping, f, nullptr, int64_t(0), int64_t(0), int64_t(0));
}

// RoPE fused with the KV append: rotated Q to q_out; rotated K and V into their KV slots.
template <int HQ, int HK, int D, int ROT, int BS, typename KVT>
void rope_append(const Ctx& c, int rows, const float* q, const float* k, const float* v, float* q_out,
                 const RopeFreqs<ROT / 2>& f, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off) {
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    if (rows <= 0) return;
    launch(c, detail::rope_kernel<HQ, HK, D, ROT, BS, KVT>, dim3(rows, detail::rope_blocks<HQ, HK, D, ROT>()), dim3(128), rows, q, k, q_out, nullptr, v, c.step.positions,
           c.step.slot_mapping, f, kv, block_bytes, k_off, v_off);
}

namespace detail {
template <int W, Ew Op>
void elementwise(const Ctx& c, int rows, const float* a, const float* b, float f, float* out) {
    const int64_t n = int64_t(rows) * W;
    if (n > 0) launch(c, elementwise_kernel<W, Op>, dim3(elementwise_blocks(n)), dim3(256), n, a, b, f, out);
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
    launch(c, detail::gather_rows_kernel<W>, dim3(ceil_div(W, 256 * 4), rows), dim3(256), rows, c.step.logit_rows, in, out);
}

}  // namespace scr::kernels::cuda
