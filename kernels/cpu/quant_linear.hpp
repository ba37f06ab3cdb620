// Linear layers over quantized weights, dequantized in registers inside the dot product.
//
// Weight views (the preset's constants are template arguments):
//   AffineW<K, 4, G, ST>:   MLX affine — q uint32 [N][K/8], element 0 in the low nibble (little
//                           endian), scales/biases ST [N][K/G]; w = scale * q + bias.
//   ChannelW<K, QT, ST, T>: compressed-tensors symmetric — q int8_t or fp8e4m3 [N][K], scale ST
//                           [N][1] (or [1] when T, per tensor); w = scale * q.
// A view hands out kLanes dequantized weights at a time; the dot product is then exactly the dense
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

// kLanes 4-bit values from kLanes/2 bytes, low nibble first, as floats.
inline vf nibbles_to_vf(const uint8_t* p) {
#if defined(__AVX512F__)
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
#elif defined(__AVX2__) && defined(__FMA__)
    int32_t word;
    std::memcpy(&word, p, 4);
    const __m128i v = _mm_cvtsi32_si128(word);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
#else
    vf r;
    for (int i = 0; i < kLanes / 2; ++i) {
        r.v[2 * i] = float(p[i] & 15);
        r.v[2 * i + 1] = float(p[i] >> 4);
    }
    return r;
#endif
}

// 2 * kLanes 4-bit values from kLanes bytes, low nibble first, as two vectors of floats.
inline void nibbles_to_vf2(const uint8_t* p, vf& first, vf& second) {
#if defined(__AVX512F__)
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(v, mask), hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
    first = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
    second = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)));
#elif defined(__AVX2__) && defined(__FMA__)
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i inter = _mm_unpacklo_epi8(_mm_and_si128(v, mask), _mm_and_si128(_mm_srli_epi16(v, 4), mask));
    first = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(inter));
    second = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(inter, 8)));
#else
    first = nibbles_to_vf(p);
    second = nibbles_to_vf(p + kLanes / 2);
#endif
}

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
    static_assert(K % G == 0 && G % kLanes == 0, "the input dim divides by the group, the group by the lanes");
    static constexpr int kWords = K * BITS / 32;  // uint32 per row
    static constexpr int kGroups = K / G;
    static constexpr bool kHasTail = false;
    static constexpr int kGroup = G;  // qdot_tile hoists scale and bias out of a group
    const uint32_t* q;
    const ST* scales;
    const ST* biases;

    void group(int64_t n, int g, vf& scale, vf& bias) const {
        const size_t at = size_t(n) * kGroups + size_t(g);
        scale = vset1(to_f32(scales[at]));
        bias = vset1(to_f32(biases[at]));
    }
    const uint8_t* bytes(int64_t n, int k) const {  // the packed byte holding element k of row n
        return reinterpret_cast<const uint8_t*>(q + size_t(n) * kWords) + k / 2;
    }
    void load_q2(int64_t n, int k, vf& first, vf& second) const {  // 2 * kLanes raw 4-bit values
        detail::nibbles_to_vf2(reinterpret_cast<const uint8_t*>(q + size_t(n) * kWords) + k / 2, first, second);
    }

    vf load(int64_t n, int k) const {  // k % kLanes == 0: within one group
        const size_t g = size_t(n) * kGroups + size_t(k / G);
        const uint8_t* bytes = reinterpret_cast<const uint8_t*>(q + size_t(n) * kWords) + k / 2;
        return vfma(detail::nibbles_to_vf(bytes), vset1(to_f32(scales[g])), vset1(to_f32(biases[g])));
    }
    vf load_n(int64_t, int, int) const { return vzero(); }  // never called: no tail
    float at(int64_t n, int k) const {
        const size_t g = size_t(n) * kGroups + size_t(k / G);
        const uint32_t word = q[size_t(n) * kWords + size_t(k / 8)];
        return std::fma(float((word >> (4 * (k % 8))) & 15u), to_f32(scales[g]), to_f32(biases[g]));
    }
};

template <int K, typename QT, typename ST, bool PER_TENSOR>
struct ChannelW {
    static constexpr bool kHasTail = K % kLanes != 0;
    static constexpr int kGroup = 0;
    const QT* q;
    const ST* scales;

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

#if defined(__AVX512F__)
inline constexpr bool kAffineTableLookup = true;  // qdot_tile: int4 through vpermps tables
#else
inline constexpr bool kAffineTableLookup = false;
#endif

// dot_tile (linear.hpp) with the weight rows n..n+RN of a quantized view.
template <int RT, int RN, int K, typename QW>
inline void qdot_tile(const float* x, const QW& w, int64_t n, float (&out)[RT][RN]) {
    constexpr int kFull = K / kLanes * kLanes;
    constexpr int kTail = K - kFull;
    vf acc[RT][RN];
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = vzero();
    if constexpr (QW::kGroup > 0 && kAffineTableLookup) {
#if defined(__AVX512F__)
        // AVX-512: per group and weight row, a 16-entry table fma(q, scale, bias) for q = 0..15 (the
        // same fma as the generic path, so every weight dequantizes to the same f32), looked up by
        // vpermps, which reads only the low 4 bits of each 32-bit index: 16 packed bytes widened to
        // int32 index the even elements, the same shifted right by 4 the odd ones. x is split into
        // its even and odd columns to match (once per token row, shared by the RN weight rows). Per
        // 32 weights: widen, shift, two lookups, two FMAs, against 13 vector ops converting nibbles
        // to floats. The sum runs over each 32 columns' evens then odds: a fixed order, whatever the
        // batch, within fp32 rounding of the dense order.
        constexpr int G = QW::kGroup;
        static_assert(G % 32 == 0, "32 weights per 16-byte load");
        const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        for (int g = 0; g < K / G; ++g) {
            __m512 table[RN];
            for (int j = 0; j < RN; ++j) {
                vf scale, bias;
                w.group(n + j, g, scale, bias);
                table[j] = _mm512_fmadd_ps(iota, scale, bias);
            }
            for (int k = g * G; k < (g + 1) * G; k += 32) {
                __m512 xe[RT], xo[RT];
                for (int i = 0; i < RT; ++i) {
                    const __m512 x0 = _mm512_loadu_ps(x + size_t(i) * K + k), x1 = _mm512_loadu_ps(x + size_t(i) * K + k + 16);
                    xe[i] = _mm512_permutex2var_ps(x0, even, x1);
                    xo[i] = _mm512_permutex2var_ps(x0, odd, x1);
                }
                for (int j = 0; j < RN; ++j) {
                    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.bytes(n + j, k))));
                    const __m512 we = _mm512_permutexvar_ps(b, table[j]);
                    const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table[j]);
                    for (int i = 0; i < RT; ++i) acc[i][j] = _mm512_fmadd_ps(xo[i], wo, _mm512_fmadd_ps(xe[i], we, acc[i][j]));
                }
            }
        }
#endif
    } else if constexpr (QW::kGroup > 0) {
        // Affine groups: scale and bias broadcast once per group and row; w = fma(q, scale, bias).
        constexpr int G = QW::kGroup;
        for (int g = 0; g < K / G; ++g) {
            vf scale[RN], bias[RN];
            for (int j = 0; j < RN; ++j) w.group(n + j, g, scale[j], bias[j]);
            static_assert(G % (2 * kLanes) == 0, "two vectors per 16-byte (8-byte) load");
            for (int k = g * G; k < (g + 1) * G; k += 2 * kLanes) {
                vf w0[RN], w1[RN];
                for (int j = 0; j < RN; ++j) {
                    w.load_q2(n + j, k, w0[j], w1[j]);
                    w0[j] = vfma(w0[j], scale[j], bias[j]);
                    w1[j] = vfma(w1[j], scale[j], bias[j]);
                }
                for (int i = 0; i < RT; ++i) {  // columns k.. then k + kLanes..: the dense order
                    const vf x0 = vload(x + size_t(i) * K + k), x1 = vload(x + size_t(i) * K + k + kLanes);
                    for (int j = 0; j < RN; ++j) acc[i][j] = vfma(x1, w1[j], vfma(x0, w0[j], acc[i][j]));
                }
            }
        }
    } else {
        for (int k = 0; k < kFull; k += kLanes) {
            vf wv[RN];
            for (int j = 0; j < RN; ++j) wv[j] = w.load(n + j, k);
            for (int i = 0; i < RT; ++i) {
                const vf xv = vload(x + size_t(i) * K + k);
                for (int j = 0; j < RN; ++j) acc[i][j] = vfma(xv, wv[j], acc[i][j]);
            }
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
template <int N, int K, typename QW>
void qlinear(int rows, const float* x, const QW& w, const float* bias, const float* residual, float* y, ThreadPool& pool) {
    pool.parallel_for(
        N,
        [&](int64_t n0, int64_t n1, int) {
            detail::qfor_each_dot<K>(x, w, 0, rows, n0, n1, [&](int t, int64_t n, float v) {
                if (bias) v += bias[n];
                const size_t o = size_t(t) * N + size_t(n);
                if (residual) v = residual[o] + v;
                y[o] = v;
            });
        },
        detail::kTileN);
}

// y = act(x Wg^T) * (x Wu^T), as linear_glu.
template <int N, int K, Act ACT, typename QW>
void qlinear_glu(int rows, const float* x, const QW& wg, const QW& wu, float* y, ThreadPool& pool) {
    pool.parallel_for(
        N,
        [&](int64_t n0, int64_t n1, int) {
            detail::qfor_each_dot<K>(x, wg, 0, rows, n0, n1, [&](int t, int64_t n, float g) {
                y[size_t(t) * N + size_t(n)] = ACT == Act::silu ? g * (1.0f / (1.0f + std::exp(-g))) : gelu_tanh1(g);
            });
            detail::qfor_each_dot<K>(x, wu, 0, rows, n0, n1, [&](int t, int64_t n, float u) {
                y[size_t(t) * N + size_t(n)] *= u;
            });
        },
        detail::kTileN);
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
