// Linear layers over quantized weights.
//
// MLX int4 (AffineW) quantizes the activations to int8 (per 32 elements) and takes exact integer dot
// products with the packed nibbles (quant_int4_dot.hpp has the math), as llama.cpp's Q4_0 x Q8_0
// does. int8 and fp8 (ChannelW) dequantize in registers inside an f32 dot product, below.
//
// Weight views (the preset's constants are template arguments):
//   AffineW<K, 4, G, ST>:   MLX affine — q uint32 [N][K/8], element 0 in the low nibble (little
//                           endian), scales/biases ST [N][K/G]; w = scale * q + bias.
//   ChannelW<K, QT, ST, T>: compressed-tensors symmetric — q int8_t or fp8e4m3 [N][K], scale ST
//                           [N][1] (or [1] when T, per tensor); w = scale * q.
// A ChannelW view hands out kLanes dequantized weights at a time; the dot product is then exactly the dense
// kernel's (linear.hpp): one lane-wise FMA chain over K in order, one fixed horizontal sum, so a
// row's result does not depend on the batch, and equals the dense f32 kernel run on the weights
// dequantized to f32 (scale * q is exact in f32 for 4/8-bit q and bf16 scales, so scale * q + bias
// is rounded once either way).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/linear.hpp"
#include "kernels/cpu/quant_int4_dot.hpp"

namespace scr::kernels::cpu {

struct fp8e4m3 { uint8_t bits; };

// OCP e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN.
inline float fp8e4m3_to_f32(uint8_t b) {
    const int exp = (b >> 3) & 15, man = b & 7;
    float v;
    if (exp == 0) v = std::ldexp(float(man), -9);  // subnormal: man/8 * 2^-6
    else if (exp == 15 && man == 7) v = std::numeric_limits<float>::quiet_NaN();
    else v = std::ldexp(1.0f + float(man) / 8.0f, exp - 7);
    return (b & 0x80) ? -v : v;
}

inline const float* fp8e4m3_table() {
    static const auto table = [] {
        struct T { float v[256]; } t;
        for (int i = 0; i < 256; ++i) t.v[i] = fp8e4m3_to_f32(uint8_t(i));
        return t;
    }();
    return table.v;
}

namespace detail {

inline vf int8_to_vf(const int8_t* p) {
#if defined(__AVX512F__)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(__AVX2__) && defined(__FMA__)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#else
    vf r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = float(p[i]);
    return r;
#endif
}

// e4m3 -> f32 in registers: the 7 magnitude bits shifted left by 7 are an f16 with the same
// exponent and mantissa fields, (1 + m/8) * 2^(e - 15) (or m/8 * 2^-14 when e = 0); F16C converts it
// exactly (subnormals included, no denormal f32 ever appears) and * 2^8 makes it (1 + m/8) * 2^(e - 7)
// (or m/8 * 2^-6). The sign bit moves to bit 15. NaN codes (S.1111.111, never written by a
// quantizer) read as +-480 here and NaN through the table.
inline vf fp8_to_vf(const fp8e4m3* p) {
#if defined(__AVX512F__)
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7f)), 7),
                                      _mm256_slli_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x80)), 8));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
#elif defined(__AVX2__) && defined(__FMA__)
    const __m128i v = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(v, _mm_set1_epi16(0x80)), 8));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
#else
    const float* table = fp8e4m3_table();
    vf r;
    for (int i = 0; i < kLanes; ++i) r.v[i] = table[p[i].bits];
    return r;
#endif
}

inline float q_to_f32(int8_t q) { return float(q); }
inline float q_to_f32(fp8e4m3 q) { return fp8e4m3_table()[q.bits]; }
inline vf q_to_vf(const int8_t* p) { return int8_to_vf(p); }
inline vf q_to_vf(const fp8e4m3* p) { return fp8_to_vf(p); }

}  // namespace detail

template <int K, int BITS, int G, typename ST>
struct AffineW {
    static_assert(BITS == 4, "MLX affine weights: 4 bits");
    static_assert(K % G == 0 && (G == 32 || G == 64 || G == 128), "MLX groups of 32, 64 or 128 that divide the input dim");
    static constexpr int kWords = K * BITS / 32;  // uint32 per row
    static constexpr int kGroups = K / G;
    static constexpr int kGroup = G;
    static constexpr int kTensors = 3;  // weight, scales, biases: adjacent in the weight table
    const uint32_t* q;
    const ST* scales;
    const ST* biases;

    static AffineW from(const void* const* t) {  // the view of a weight table's entries t[0..2]
        return {static_cast<const uint32_t*>(t[0]), static_cast<const ST*>(t[1]), static_cast<const ST*>(t[2])};
    }

    const uint8_t* bytes(int64_t n, int k) const {  // the packed byte holding element k of row n
        return reinterpret_cast<const uint8_t*>(q + size_t(n) * kWords) + k / 2;
    }
    float scale(int64_t n, int g) const { return to_f32(scales[size_t(n) * kGroups + size_t(g)]); }
    float bias(int64_t n, int g) const { return to_f32(biases[size_t(n) * kGroups + size_t(g)]); }
    float at(int64_t n, int k) const {  // the dequantized weight (embedding rows, tests)
        const uint32_t word = q[size_t(n) * kWords + size_t(k / 8)];
        return std::fma(float((word >> (4 * (k % 8))) & 15u), scale(n, k / G), bias(n, k / G));
    }
};

template <int K, typename QT, typename ST, bool PER_TENSOR>
struct ChannelW {
    static constexpr bool kHasTail = K % kLanes != 0;
    static constexpr int kGroup = 0;
    static constexpr int kTensors = 2;  // weight, scale: adjacent in the weight table
    const QT* q;
    const ST* scales;

    static ChannelW from(const void* const* t) { return {static_cast<const QT*>(t[0]), static_cast<const ST*>(t[1])}; }

    float scale(int64_t n) const { return to_f32(scales[PER_TENSOR ? 0 : n]); }
    vf load(int64_t n, int k) const { return vmul(detail::q_to_vf(q + size_t(n) * K + k), vset1(scale(n))); }
    vf load_n(int64_t n, int k, int count) const {  // the row's last count < kLanes weights, zero-padded
        alignas(64) float tmp[kLanes] = {};
        for (int i = 0; i < count; ++i) tmp[i] = at(n, k + i);
        return vload(tmp);
    }
    float at(int64_t n, int k) const { return detail::q_to_f32(q[size_t(n) * K + k]) * scale(n); }
};

namespace detail {

// dot_tile (linear.hpp) with the weight rows n..n+RN of a quantized view.
template <int RT, int RN, int K, typename QW>
inline void qdot_tile(const float* x, const QW& w, int64_t n, float (&out)[RT][RN]) {
    constexpr int kFull = K / kLanes * kLanes;
    constexpr int kTail = K - kFull;
    vf acc[RT][RN];
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = vzero();
    for (int k = 0; k < kFull; k += kLanes) {
        vf wv[RN];
        for (int j = 0; j < RN; ++j) wv[j] = w.load(n + j, k);
        for (int i = 0; i < RT; ++i) {
            const vf xv = vload(x + size_t(i) * K + k);
            for (int j = 0; j < RN; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
        }
    }
    if constexpr (kTail > 0) {
        vf wv[RN];
        for (int j = 0; j < RN; ++j) wv[j] = w.load_n(n + j, kFull, kTail);
        for (int i = 0; i < RT; ++i) {
            const vf xv = vload_n(x + size_t(i) * K + kFull, kTail);
            for (int j = 0; j < RN; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) out[i][j] = vsum(acc[i][j]);
}

// for_each_dot (linear.hpp) over a quantized view: same tiles, same order.
template <int K, typename QW, typename Fn>
inline void qfor_each_dot(const float* x, const QW& w, int t0, int t1, int64_t n0, int64_t n1, Fn&& fn) {
    for (int tb = t0; tb < t1; tb += kBlockT) {
        const int te = std::min(t1, tb + kBlockT);
        int64_t n = n0;
        for (; n + kTileN <= n1; n += kTileN) {
            int t = tb;
            for (; t + kTileT <= te; t += kTileT) {
                float r[kTileT][kTileN];
                qdot_tile<kTileT, kTileN, K>(x + size_t(t) * K, w, n, r);
                for (int i = 0; i < kTileT; ++i)
                    for (int j = 0; j < kTileN; ++j) fn(t + i, n + j, r[i][j]);
            }
            for (; t < te; ++t) {
                float r[1][kTileN];
                qdot_tile<1, kTileN, K>(x + size_t(t) * K, w, n, r);
                for (int j = 0; j < kTileN; ++j) fn(t, n + j, r[0][j]);
            }
        }
        for (; n < n1; ++n)
            for (int t = tb; t < te; ++t) {
                float r[1][1];
                qdot_tile<1, 1, K>(x + size_t(t) * K, w, n, r);
                fn(t, n, r[0][0]);
            }
    }
}

}  // namespace detail

// y[t][n] = sum_k x[t][k] * dequant(W)[n][k] (+ bias[n]) (+ residual[t][n]).
// MLX int4 (AffineW): x is quantized to int8 per 32 elements first (quant_int4_dot.hpp).
template <int N, int K, typename QW>
void qlinear(int rows, const float* x, const QW& w, const float* bias, const float* residual, float* y, ThreadPool& pool) {
    auto store = [&](int t, int64_t n, float v) {
        if (bias) v += bias[n];
        const size_t o = size_t(t) * N + size_t(n);
        if (residual) v = residual[o] + v;
        y[o] = v;
    };
    if constexpr (QW::kGroup > 0) {
        const uint8_t* xq = int4::quantize_rows<K>(rows, x, pool);
        pool.parallel_for(
            N, [&](int64_t n0, int64_t n1, int) { int4::for_each_dot<K, QW::kGroup>(xq, w, 0, rows, n0, n1, store); },
            int4::kTileN);
    } else {
        pool.parallel_for(
            N, [&](int64_t n0, int64_t n1, int) { detail::qfor_each_dot<K>(x, w, 0, rows, n0, n1, store); }, detail::kTileN);
    }
}

// y = act(x Wg^T) * (x Wu^T), as linear_glu.
template <int N, int K, Act ACT, typename QW>
void qlinear_glu(int rows, const float* x, const QW& wg, const QW& wu, float* y, ThreadPool& pool) {
    auto gate = [&](int t, int64_t n, float g) {
        y[size_t(t) * N + size_t(n)] = ACT == Act::silu ? g * (1.0f / (1.0f + std::exp(-g))) : gelu_tanh1(g);
    };
    auto up = [&](int t, int64_t n, float u) { y[size_t(t) * N + size_t(n)] *= u; };
    if constexpr (QW::kGroup > 0) {
        const uint8_t* xq = int4::quantize_rows<K>(rows, x, pool);  // once for both projections
        pool.parallel_for(
            N,
            [&](int64_t n0, int64_t n1, int) {
                int4::for_each_dot<K, QW::kGroup>(xq, wg, 0, rows, n0, n1, gate);
                int4::for_each_dot<K, QW::kGroup>(xq, wu, 0, rows, n0, n1, up);
            },
            int4::kTileN);
    } else {
        pool.parallel_for(
            N,
            [&](int64_t n0, int64_t n1, int) {
                detail::qfor_each_dot<K>(x, wg, 0, rows, n0, n1, gate);
                detail::qfor_each_dot<K>(x, wu, 0, rows, n0, n1, up);
            },
            detail::kTileN);
    }
}

// Embedding rows of a quantized table: one row dequantized per token.
template <int H, typename QW>
void qembed(int rows, const int32_t* ids, const QW& table, float* out, ThreadPool& pool) {
    pool.parallel_for(rows, [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) {
            float* dst = out + size_t(t) * H;
            for (int i = 0; i < H; ++i) dst[i] = table.at(ids[t], i);
        }
    });
}

}  // namespace scr::kernels::cpu
