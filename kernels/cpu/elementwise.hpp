// Row-wise and elementwise kernels: embedding lookup, RMSNorm, RoPE, add/mul/silu, row gather.
#pragma once

#include <cmath>
#include <cstring>

#include "kernels/cpu/simd.hpp"
#include "runtime/core/thread_pool.hpp"

namespace scr::kernels::cpu {

template <int H, typename WT>
void embed(int rows, const int32_t* ids, const WT* table, float* out, ThreadPool& pool) {
    pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
            const WT* src = table + size_t(ids[t]) * H;
            float* dst = out + size_t(t) * H;
            for (int i = 0; i < H; ++i) dst[i] = to_f32(src[i]);
        }
    });
}

// out = w * (x / sqrt(mean(x^2) + eps)), over the last dim D, as transformers' RMSNorm computes it.
template <int D>
void rmsnorm(int rows, const float* x, const float* w, float eps, float* out, ThreadPool& pool) {
    constexpr int kFull = D / kLanes * kLanes;
    pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r) {
            const float* xr = x + size_t(r) * D;
            float* yr = out + size_t(r) * D;
            vf acc = vzero();
            for (int i = 0; i < kFull; i += kLanes) {
                vf v = vload(xr + i);
                acc = vfma(v, v, acc);
            }
            if constexpr (kFull < D) {
                vf v = vload_n(xr + kFull, D - kFull);
                acc = vfma(v, v, acc);
            }
            const float inv = 1.0f / std::sqrt(vsum(acc) / float(D) + eps);
            for (int i = 0; i < D; ++i) yr[i] = w[i] * (xr[i] * inv);
        }
    }, 4);
}

// Rotates the first ROT dims of each head (neox layout: pairs (i, i + ROT/2)), in place or not.
template <int HQ, int HK, int D, int ROT>
void rope(int rows, const float* q, const float* k, float* q_out, float* k_out, const int32_t* positions,
          const float* inv_freq, ThreadPool& pool) {
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    constexpr int kHalf = ROT / 2;
    pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
        float cs[kHalf], sn[kHalf];
        for (int64_t t = b; t < e; ++t) {
            const float pos = float(positions[t]);
            for (int i = 0; i < kHalf; ++i) {
                const float angle = pos * inv_freq[i];
                cs[i] = std::cos(angle);
                sn[i] = std::sin(angle);
            }
            auto rotate = [&](const float* src, float* dst, int heads) {
                for (int h = 0; h < heads; ++h) {
                    const float* s = src + (size_t(t) * heads + h) * D;
                    float* d = dst + (size_t(t) * heads + h) * D;
                    for (int i = 0; i < kHalf; ++i) {
                        const float a = s[i], c = s[i + kHalf];
                        d[i] = a * cs[i] - c * sn[i];
                        d[i + kHalf] = c * cs[i] + a * sn[i];
                    }
                    if (d != s)
                        for (int i = ROT; i < D; ++i) d[i] = s[i];
                }
            };
            rotate(q, q_out, HQ);
            rotate(k, k_out, HK);
        }
    });
}

template <int W>
void add(int rows, const float* a, const float* b, float* out, ThreadPool& pool) {
    pool.parallel_for(int64_t(rows) * W, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
    }, 1024);
}

template <int W>
void mul(int rows, const float* a, const float* b, float* out, ThreadPool& pool) {
    pool.parallel_for(int64_t(rows) * W, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) out[i] = a[i] * b[i];
    }, 1024);
}

template <int W>
void silu(int rows, const float* x, float* out, ThreadPool& pool) {
    pool.parallel_for(int64_t(rows) * W, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) out[i] = x[i] * (1.0f / (1.0f + std::exp(-x[i])));
    }, 1024);
}

// out = x * factor (a model constant).
template <int W>
void scale(int rows, const float* x, float factor, float* out, ThreadPool& pool) {
    pool.parallel_for(int64_t(rows) * W, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) out[i] = x[i] * factor;
    }, 1024);
}

template <int W>
void gather_rows(int rows, const int32_t* which, const float* in, float* out) {
    for (int r = 0; r < rows; ++r) std::memcpy(out + size_t(r) * W, in + size_t(which[r]) * W, sizeof(float) * W);
}

}  // namespace scr::kernels::cpu
