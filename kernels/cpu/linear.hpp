// y[t][n] = sum_k x[t][k] * W[n][k] (+ bias[n]) (+ residual[t][n]), W in the checkpoint's
// [out, in] layout, any of f32/bf16/f16, accumulated in f32.
//
// Batch invariance: every output is one lane-wise FMA chain over K in order, then one fixed
// horizontal sum, whatever the number of rows or the tile it falls in. So a row's result does
// not depend on what else is in the batch (the engine's batched == alone guarantee).
#pragma once

#include <algorithm>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/simd.hpp"
#include "runtime/core/thread_pool.hpp"

namespace scr::kernels::cpu {

// RT rows of x against RN rows of W.
template <int RT, int RN, int K, typename WT>
inline void dot_tile(const float* x, const WT* w, float (&out)[RT][RN]) {
    constexpr int kFull = K / kLanes * kLanes;
    constexpr int kTail = K - kFull;
    vf acc[RT][RN];
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = vzero();
    for (int k = 0; k < kFull; k += kLanes) {
        vf wv[RN];
        for (int j = 0; j < RN; ++j) wv[j] = vload(w + size_t(j) * K + k);
        for (int i = 0; i < RT; ++i) {
            vf xv = vload(x + size_t(i) * K + k);
            for (int j = 0; j < RN; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
        }
    }
    if constexpr (kTail > 0) {
        vf wv[RN];
        for (int j = 0; j < RN; ++j) wv[j] = vload_n(w + size_t(j) * K + kFull, kTail);
        for (int i = 0; i < RT; ++i) {
            vf xv = vload_n(x + size_t(i) * K + kFull, kTail);
            for (int j = 0; j < RN; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) out[i][j] = vsum(acc[i][j]);
}

namespace detail {

constexpr int kTileN = 4;    // weight rows per tile
constexpr int kTileT = 4;    // token rows per tile
constexpr int kBlockT = 32;  // token rows kept hot in L2 while a thread sweeps its weight rows

// Calls fn(t, n, value) for every output of rows [t0, t1) x weight rows [n0, n1).
template <int K, typename WT, typename Fn>
inline void for_each_dot(const float* x, const WT* w, int t0, int t1, int64_t n0, int64_t n1, Fn&& fn) {
    for (int tb = t0; tb < t1; tb += kBlockT) {
        const int te = std::min(t1, tb + kBlockT);
        int64_t n = n0;
        for (; n + kTileN <= n1; n += kTileN) {
            const WT* wn = w + size_t(n) * K;
            int t = tb;
            for (; t + kTileT <= te; t += kTileT) {
                float r[kTileT][kTileN];
                dot_tile<kTileT, kTileN, K>(x + size_t(t) * K, wn, r);
                for (int i = 0; i < kTileT; ++i)
                    for (int j = 0; j < kTileN; ++j) fn(t + i, n + j, r[i][j]);
            }
            for (; t < te; ++t) {
                float r[1][kTileN];
                dot_tile<1, kTileN, K>(x + size_t(t) * K, wn, r);
                for (int j = 0; j < kTileN; ++j) fn(t, n + j, r[0][j]);
            }
        }
        for (; n < n1; ++n) {
            for (int t = tb; t < te; ++t) {
                float r[1][1];
                dot_tile<1, 1, K>(x + size_t(t) * K, w + size_t(n) * K, r);
                fn(t, n, r[0][0]);
            }
        }
    }
}

}  // namespace detail

template <int N, int K, typename WT>
void linear(int rows, const float* x, const WT* w, const float* bias, const float* residual, float* y, ThreadPool& pool) {
    pool.parallel_for(
        N,
        [&](int64_t n0, int64_t n1, int) {
            detail::for_each_dot<K>(x, w, 0, rows, n0, n1, [&](int t, int64_t n, float v) {
                if (bias) v += bias[n];
                const size_t o = size_t(t) * N + size_t(n);
                if (residual) v = residual[o] + v;
                y[o] = v;
            });
        },
        detail::kTileN);
}

enum class Act { silu, gelu_tanh };

// y = act(x Wg^T) * (x Wu^T): the gate and up projections of a gated MLP (SwiGLU, GeGLU), never stored.
template <int N, int K, typename WT, Act ACT>
void linear_glu(int rows, const float* x, const WT* wg, const WT* wu, float* y, ThreadPool& pool) {
    pool.parallel_for(
        N,
        [&](int64_t n0, int64_t n1, int) {
            // Gate first into y, then multiply by up in place: each y element is owned by one thread.
            detail::for_each_dot<K>(x, wg, 0, rows, n0, n1, [&](int t, int64_t n, float g) {
                y[size_t(t) * N + size_t(n)] = ACT == Act::silu ? g * (1.0f / (1.0f + std::exp(-g))) : gelu_tanh1(g);
            });
            detail::for_each_dot<K>(x, wu, 0, rows, n0, n1, [&](int t, int64_t n, float u) {
                y[size_t(t) * N + size_t(n)] *= u;
            });
        },
        detail::kTileN);
}

template <int N, int K, typename WT>
void linear_swiglu(int rows, const float* x, const WT* wg, const WT* wu, float* y, ThreadPool& pool) {
    linear_glu<N, K, WT, Act::silu>(rows, x, wg, wu, y, pool);
}

}  // namespace scr::kernels::cpu
