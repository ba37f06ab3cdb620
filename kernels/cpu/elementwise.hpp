// Row-wise and elementwise kernels: embedding lookup, RMSNorm, RoPE, add/mul/silu, row gather.
#pragma once

#include <cmath>
#include <cstring>

#include "kernels/cpu/attn_batch.hpp"
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

// out = w * (x / sqrt(mean(x^2) + eps)), over the last dim D, as transformers' RMSNorm computes it;
// UNIT_OFFSET: (1 + w) instead of w (Gemma's RMSNorm).
template <int D, bool UNIT_OFFSET = false>
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
            for (int i = 0; i < D; ++i) yr[i] = (UNIT_OFFSET ? 1.0f + w[i] : w[i]) * (xr[i] * inv);
        }
    }, 4);
}

// What a rope op needs beyond its inverse frequencies (all compile-time constants of the model).
struct RopeExtras {
    const float* long_inv_freq = nullptr;  // longrope: used for a sequence longer than long_after tokens
    int long_after = 0;
    float mscale = 1.0f;                   // yarn / longrope attention factor: multiplies cos and sin
};

// Rotates the first ROT dims of each head, in place or not. Neox layout: pairs (i, i + ROT/2).
// INTERLEAVED: pairs (2i, 2i+1), written de-interleaved (rotated evens, then odds) exactly as
// transformers' rope_interleave does, so q.k products see the same layout. Longrope picks its
// frequencies by the length of the token's sequence after this step (transformers' seq_len).
template <int HQ, int HK, int D, int ROT, bool INTERLEAVED>
void rope(int rows, const float* q, const float* k, float* q_out, float* k_out, const AttnBatch& ab,
          const float* inv_freq, const RopeExtras& x, ThreadPool& pool) {
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    constexpr int kHalf = ROT / 2;
    pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
        float cs[kHalf], sn[kHalf], tmp[ROT];
        for (int64_t t = b; t < e; ++t) {
            const float pos = float(ab.positions[t]);
            const float* freq = inv_freq;
            if (x.long_inv_freq && ab.seq_lens[ab.seq_of_token[t]] > x.long_after) freq = x.long_inv_freq;
            for (int i = 0; i < kHalf; ++i) {
                const float angle = pos * freq[i];
                cs[i] = std::cos(angle) * x.mscale;
                sn[i] = std::sin(angle) * x.mscale;
            }
            auto rotate = [&](const float* src, float* dst, int heads) {
                for (int h = 0; h < heads; ++h) {
                    const float* s = src + (size_t(t) * heads + h) * D;
                    float* d = dst + (size_t(t) * heads + h) * D;
                    for (int i = 0; i < kHalf; ++i) {
                        const float a = INTERLEAVED ? s[2 * i] : s[i], c = INTERLEAVED ? s[2 * i + 1] : s[i + kHalf];
                        tmp[i] = a * cs[i] - c * sn[i];
                        tmp[i + kHalf] = c * cs[i] + a * sn[i];
                    }
                    std::memcpy(d, tmp, sizeof tmp);
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

// gelu(x, approximate="tanh") as PyTorch computes it (transformers' gelu_pytorch_tanh).
inline float gelu_tanh1(float x) {
    constexpr float kBeta = float(M_SQRT2 * M_2_SQRTPI * 0.5), kKappa = 0.044715f;
    const float cube = x * x * x;
    const float inner = kBeta * (x + kKappa * cube);
    return 0.5f * x * (1.0f + std::tanh(inner));
}

template <int W>
void gelu_tanh(int rows, const float* x, float* out, ThreadPool& pool) {
    pool.parallel_for(int64_t(rows) * W, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) out[i] = gelu_tanh1(x[i]);
    }, 1024);
}

// cap * tanh(x / cap)
template <int W>
void softcap(int rows, const float* x, float cap, float* out, ThreadPool& pool) {
    pool.parallel_for(int64_t(rows) * W, [&](int64_t s, int64_t e, int) {
        for (int64_t i = s; i < e; ++i) out[i] = cap * std::tanh(x[i] / cap);
    }, 1024);
}

// One piece of split(): per row of IN floats, OUTER runs of LEN floats, STRIDE apart, from OFFSET.
template <int IN, int OUTER, int STRIDE, int OFFSET, int LEN>
void slice(int rows, const float* x, float* out, ThreadPool& pool) {
    static_assert(OUTER * STRIDE == IN && OFFSET + LEN <= STRIDE, "a slice stays inside its rows");
    pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
        for (int64_t r = b; r < e; ++r)
            for (int o = 0; o < OUTER; ++o)
                std::memcpy(out + (size_t(r) * OUTER + o) * LEN, x + size_t(r) * IN + size_t(o) * STRIDE + OFFSET,
                            sizeof(float) * LEN);
    }, 16);
}

template <int W>
void gather_rows(int rows, const int32_t* which, const float* in, float* out) {
    for (int r = 0; r < rows; ++r) std::memcpy(out + size_t(r) * W, in + size_t(which[r]) * W, sizeof(float) * W);
}

}  // namespace scr::kernels::cpu
