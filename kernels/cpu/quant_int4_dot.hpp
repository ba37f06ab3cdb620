// MLX affine int4 weights times int8 activations: the arithmetic behind quant_linear.hpp's qlinear /
// qlinear_glu for AffineW (docs/QUANT.md, "CPU kernels").
//
// The math, one formula for every ISA (AVX-512, AVX2, portable give the same bits):
//  1. Each activation row is quantized once per call, per block of 32 elements (llama.cpp's Q8_0
//     block; weight groups are 32/64/128, so a block never straddles a group):
//       amax = max |x|,  d = amax / 127,  q = round_half_even(x * (127 / amax))  (|q| <= 127),
//     and per block sx = d * sum(q). A block with amax < 2^-100 (zeros) gets d = 0, q = 0; a block
//     holding inf or NaN gets d = NaN, so the outputs it feeds are NaN, never a silent number.
//  2. The weights stay packed: w = s_g * qw + b_g with qw the nibble 0..15. Then
//       sum_k w_k x_k  ~  sum over blocks b:  s_g * d_b * I_b  +  b_g * d_b * Q_b
//     where I = sum(qw * qx) over 8 consecutive elements is an exact integer dot (vpdpbusd: unsigned
//     nibbles times signed activation bytes) and d_b * Q_b = sx_b.
//  3. The f32 combine runs in one fixed order over 16 lanes: a chunk of 128 elements puts the
//     integer dot of its elements 8j..8j+7 in lane j. Per 16 groups: for each chunk of them
//       acc[j] = fma(float(I_cj), s_g(j) * d_b(j), acc[j]),
//     then for each 16 blocks of them acc[j] = fma(b_g(j), sx_j, acc[j]); finally the fixed tree
//     ((acc[j] + acc[j+8]) -> (+ [j+4]) -> (+ [j+2]) -> [0] + [1]). Lanes past K hold zeros and add
//     nothing (an accumulator that starts at +0 never becomes -0, so skipping them is the same).
// A row's result depends only on that row: batch invariant by construction, whatever the tiling.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>

#include "kernels/cpu/simd.hpp"
#include "runtime/core/thread_pool.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define SCR_INT4_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define SCR_INT4_AVX2 1
#endif

namespace scr::kernels::cpu::int4 {

constexpr int kChunk = 128;  // elements per chunk: 64 packed bytes, 16 lanes of 8 elements
constexpr int kBlock = 32;   // elements per activation scale

// One quantized activation row of K elements:
//   q:   [chunks][128] int8; within a chunk the even elements first (byte i = element 2i, beside the
//        low nibble of packed byte i), then the odd ones (byte 64 + i = element 2i + 1, high nibble);
//   dx:  [chunks][16] f32, lane j of a chunk = d of the block holding its elements 8j..8j+7;
//   sx:  [ceil(blocks / 16)][16] f32, d * sum(q) per block.
// Everything past K is zero.
template <int K>
struct ActLayout {
    static_assert(K % kBlock == 0, "MLX groups (32/64/128) make K a multiple of 32");
    static constexpr int kChunks = (K + kChunk - 1) / kChunk;
    static constexpr int kBlocks = K / kBlock;
    static constexpr int kSxVecs = (kBlocks + 15) / 16;
    static constexpr size_t kDxOffset = size_t(kChunks) * kChunk;
    static constexpr size_t kSxOffset = kDxOffset + size_t(kChunks) * 16 * sizeof(float);
    static constexpr size_t kRowBytes = kSxOffset + size_t(kSxVecs) * 16 * sizeof(float);  // a multiple of 64
};

// Position of element k in the q part of a row.
inline int q_pos(int k) { return k / kChunk * kChunk + (k % 2) * 64 + (k % kChunk) / 2; }

// d and 127/d for a block whose largest magnitude has the bits amax_bits (sign cleared).
struct BlockScale {
    float d, inv;
    bool quantize;  // false: q = 0 (zeros, or a non-finite block whose d is NaN)
};
inline BlockScale block_scale(uint32_t amax_bits) {
    float amax;
    std::memcpy(&amax, &amax_bits, 4);
    if (amax_bits >= 0x7f800000u) return {std::numeric_limits<float>::quiet_NaN(), 0.0f, false};  // inf/NaN
    if (amax < 0x1p-100f) return {0.0f, 0.0f, false};
    return {amax / 127.0f, 127.0f / amax, true};
}

inline uint32_t abs_bits(float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    return b & 0x7fffffffu;
}

// The portable quantizer (the definition; the SIMD one below must equal it byte for byte).
template <int K>
inline void quantize_row_portable(const float* x, uint8_t* dst) {
    using L = ActLayout<K>;
    std::memset(dst, 0, L::kRowBytes);
    auto* q = reinterpret_cast<int8_t*>(dst);
    auto* dx = reinterpret_cast<float*>(dst + L::kDxOffset);
    auto* sx = reinterpret_cast<float*>(dst + L::kSxOffset);
    for (int b = 0; b < L::kBlocks; ++b) {
        const float* xb = x + b * kBlock;
        uint32_t amax = 0;
        for (int i = 0; i < kBlock; ++i) amax = std::max(amax, abs_bits(xb[i]));
        const BlockScale s = block_scale(amax);
        int sum = 0;
        if (s.quantize)
            for (int i = 0; i < kBlock; ++i) {
                const int v = int(std::nearbyint(xb[i] * s.inv));  // round half to even (default mode)
                q[q_pos(b * kBlock + i)] = int8_t(v);
                sum += v;
            }
        const int c = b * kBlock / kChunk, lane0 = (b * kBlock % kChunk) / 8;
        for (int j = 0; j < 4; ++j) dx[c * 16 + lane0 + j] = s.d;
        sx[b] = s.d * float(sum);
    }
}

template <int K>
inline void quantize_row(const float* x, uint8_t* dst) {
#if defined(SCR_INT4_AVX512)
    using L = ActLayout<K>;
    auto* q = reinterpret_cast<int8_t*>(dst);
    auto* dx = reinterpret_cast<float*>(dst + L::kDxOffset);
    auto* sx = reinterpret_cast<float*>(dst + L::kSxOffset);
    if constexpr (K % kChunk != 0) {  // the padding of the last chunk
        std::memset(q + (L::kChunks - 1) * kChunk, 0, kChunk);
        std::memset(dx + (L::kChunks - 1) * 16, 0, 64);
    }
    if constexpr (L::kBlocks % 16 != 0) std::memset(sx + (L::kSxVecs - 1) * 16, 0, 64);
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff);
    for (int b = 0; b < L::kBlocks; ++b) {
        const __m512 x0 = _mm512_loadu_ps(x + b * kBlock), x1 = _mm512_loadu_ps(x + b * kBlock + 16);
        // (the maskz forms with a full mask: GCC 12 warns about the plain ones' undefined source)
        const __m512i m = _mm512_maskz_max_epu32(0xffff, _mm512_and_si512(_mm512_castps_si512(x0), magnitude),
                                                 _mm512_and_si512(_mm512_castps_si512(x1), magnitude));
        const BlockScale s = block_scale(uint32_t(_mm512_reduce_max_epu32(m)));
        const int c = b * kBlock / kChunk, half = (b * kBlock % kChunk) / 2;
        int sum = 0;
        if (s.quantize) {
            const __m512 inv = _mm512_set1_ps(s.inv);
            const __m512i qe = _mm512_maskz_cvtps_epi32(0xffff, _mm512_mul_ps(_mm512_permutex2var_ps(x0, even, x1), inv));
            const __m512i qo = _mm512_maskz_cvtps_epi32(0xffff, _mm512_mul_ps(_mm512_permutex2var_ps(x0, odd, x1), inv));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c * kChunk + half), _mm512_maskz_cvtepi32_epi8(0xffff, qe));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c * kChunk + 64 + half), _mm512_maskz_cvtepi32_epi8(0xffff, qo));
            sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qe, qo));
        } else {
            std::memset(q + c * kChunk + half, 0, 16);
            std::memset(q + c * kChunk + 64 + half, 0, 16);
        }
        _mm_storeu_ps(dx + c * 16 + half / 4, _mm_set1_ps(s.d));
        sx[b] = s.d * float(sum);
    }
#else
    quantize_row_portable<K>(x, dst);
#endif
}

// The weight's 4-bit value k of row n.
template <typename QW>
inline int nibble(const QW& w, int64_t n, int k) {
    return (w.bytes(n, k)[0] >> (4 * (k % 2))) & 15;
}

// The portable dot of one quantized activation row with weight row n (the definition).
template <int K, int G, typename QW>
inline float dot_portable(const uint8_t* xrow, const QW& w, int64_t n) {
    using L = ActLayout<K>;
    const auto* q = reinterpret_cast<const int8_t*>(xrow);
    const auto* dx = reinterpret_cast<const float*>(xrow + L::kDxOffset);
    const auto* sx = reinterpret_cast<const float*>(xrow + L::kSxOffset);
    constexpr int kGroups = K / G;
    float acc[16] = {};
    for (int g0 = 0; g0 < kGroups; g0 += 16) {  // 16 groups: their chunks, then their blocks' bias terms
        const int e0 = g0 * G, e1 = std::min(K, (g0 + 16) * G);
        for (int c0 = e0; c0 < e1; c0 += kChunk)
            for (int j = 0; j < 16 && c0 + 8 * j < K; ++j) {
                const int k0 = c0 + 8 * j;
                int dot = 0;
                for (int e = 0; e < 8; ++e) dot += nibble(w, n, k0 + e) * int(q[q_pos(k0 + e)]);
                const float p = w.scale(n, k0 / G) * dx[k0 / kChunk * 16 + j];
                acc[j] = std::fma(float(dot), p, acc[j]);
            }
        for (int v0 = e0; v0 < e1; v0 += 16 * kBlock)
            for (int j = 0; j < 16 && v0 + kBlock * j < K; ++j) {
                const int b = (v0 + kBlock * j) / kBlock;
                acc[j] = std::fma(w.bias(n, b * kBlock / G), sx[b], acc[j]);
            }
    }
    float s8[8], s4[4];
    for (int j = 0; j < 8; ++j) s8[j] = acc[j] + acc[j + 8];
    for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
    const float s2a = s4[0] + s4[2], s2b = s4[1] + s4[3];
    return s2a + s2b;
}

#if defined(SCR_INT4_AVX512)

// 16 scales (or biases) of one row as f32, the first `count` of them loaded, the rest zero.
template <typename ST>
inline __m512 load16(const ST* p, int count) {
    const __mmask16 m = count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1);
    if constexpr (std::is_same_v<ST, bf16_t>)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
    else if constexpr (std::is_same_v<ST, f16_t>)
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    else
        return _mm512_maskz_loadu_ps(m, p);
}

// u8 x s8 dot of 4 bytes per lane, added to acc (exact: |sum| <= 4 * 15 * 127 per call).
inline __m512i dot4(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(acc, u, s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

inline float hsum16(__m512 a) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// RT activation rows (stride ActLayout<K>::kRowBytes) against weight rows n..n+RN.
template <int RT, int RN, int K, int G, typename QW>
inline void dot_tile(const uint8_t* xq, const QW& w, int64_t n, float (&out)[RT][RN]) {
    using L = ActLayout<K>;
    constexpr int kGroups = K / G;
    constexpr int kChunksPer16 = 16 * G / kChunk, kVecsPer16 = 16 * G / (16 * kBlock);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512 acc[RT][RN];
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int g0 = 0; g0 < kGroups; g0 += 16) {
        __m512 scale16[RN], bias16[RN];
        for (int j = 0; j < RN; ++j) {
            const size_t at = size_t(n + j) * kGroups + size_t(g0);
            scale16[j] = load16(w.scales + at, kGroups - g0);
            bias16[j] = load16(w.biases + at, kGroups - g0);
        }
        for (int cc = 0; cc < kChunksPer16; ++cc) {
            const int k0 = g0 * G + cc * kChunk;
            if (k0 >= K) break;
            const int valid = std::min(kChunk, K - k0);
            // Lane j of this chunk belongs to group (cc * 128 + 8 j) / G of the 16.
            const __m512i group = _mm512_srli_epi32(_mm512_add_epi32(_mm512_set1_epi32(cc * kChunk), _mm512_slli_epi32(lane, 3)),
                                                    __builtin_ctz(G));
            __m512i lo[RN], hi[RN];
            __m512 scale[RN];
            for (int j = 0; j < RN; ++j) {
                const uint8_t* p = w.bytes(n + j, k0);
                const __m512i v = valid == kChunk ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8((1ull << (valid / 2)) - 1, p);
                lo[j] = _mm512_and_si512(v, low4);
                hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
                scale[j] = _mm512_permutexvar_ps(group, scale16[j]);
            }
            for (int i = 0; i < RT; ++i) {
                const uint8_t* xr = xq + size_t(i) * L::kRowBytes;
                const __m512i xe = _mm512_loadu_si512(xr + k0 / kChunk * kChunk);
                const __m512i xo = _mm512_loadu_si512(xr + k0 / kChunk * kChunk + 64);
                const __m512 dx = _mm512_loadu_ps(reinterpret_cast<const float*>(xr + L::kDxOffset) + k0 / kChunk * 16);
                for (int j = 0; j < RN; ++j) {
                    const __m512i d = dot4(dot4(_mm512_setzero_si512(), lo[j], xe), hi[j], xo);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(scale[j], dx), acc[i][j]);
                }
            }
        }
        for (int vv = 0; vv < kVecsPer16; ++vv) {
            const int k0 = g0 * G + vv * 16 * kBlock;
            if (k0 >= K) break;
            // Lane j is block k0/32 + j, in group (vv * 512 + 32 j) / G of the 16.
            const __m512i group = _mm512_srli_epi32(_mm512_add_epi32(_mm512_set1_epi32(vv * 16 * kBlock), _mm512_slli_epi32(lane, 5)),
                                                    __builtin_ctz(G));
            __m512 bias[RN];
            for (int j = 0; j < RN; ++j) bias[j] = _mm512_permutexvar_ps(group, bias16[j]);
            for (int i = 0; i < RT; ++i) {
                const __m512 sx = _mm512_loadu_ps(reinterpret_cast<const float*>(xq + size_t(i) * L::kRowBytes + L::kSxOffset) + k0 / kBlock);
                for (int j = 0; j < RN; ++j) acc[i][j] = _mm512_fmadd_ps(bias[j], sx, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) out[i][j] = hsum16(acc[i][j]);
}

#elif defined(SCR_INT4_AVX2)

// u8 x s8 dot of 4 bytes per lane, added to acc (exact).
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// The 16 lanes as two halves (lanes 0-7: elements 0..63 of a chunk, lanes 8-15: 64..127).
template <int RT, int RN, int K, int G, typename QW>
inline void dot_tile(const uint8_t* xq, const QW& w, int64_t n, float (&out)[RT][RN]) {
    using L = ActLayout<K>;
    constexpr int kGroups = K / G;
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[RT][RN][2];
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    for (int g0 = 0; g0 < kGroups; g0 += 16) {
        const int e0 = g0 * G, e1 = std::min(K, (g0 + 16) * G);
        for (int k0 = e0; k0 < e1; k0 += 64) {  // half a chunk
            const int h = k0 % kChunk / 64, valid = std::min(64, K - k0);
            __m256i lo[RN], hi[RN];
            __m256 scale[RN];
            for (int j = 0; j < RN; ++j) {
                const uint8_t* p = w.bytes(n + j, k0);
                const __m256i v = valid == 64 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                                              : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
                lo[j] = _mm256_and_si256(v, low4);
                hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                if constexpr (G == 32)
                    scale[j] = _mm256_setr_m128(_mm_set1_ps(w.scale(n + j, k0 / G)), _mm_set1_ps(w.scale(n + j, std::min(k0 + 32, K - 1) / G)));
                else
                    scale[j] = _mm256_set1_ps(w.scale(n + j, k0 / G));
            }
            for (int i = 0; i < RT; ++i) {
                const uint8_t* xr = xq + size_t(i) * L::kRowBytes;
                const size_t at = size_t(k0 / kChunk * kChunk + h * 32);
                const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + at));
                const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + at + 64));
                const __m256 dx = _mm256_loadu_ps(reinterpret_cast<const float*>(xr + L::kDxOffset) + k0 / kChunk * 16 + h * 8);
                for (int j = 0; j < RN; ++j) {
                    const __m256i d = dot4(dot4(_mm256_setzero_si256(), lo[j], xe), hi[j], xo);
                    acc[i][j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(scale[j], dx), acc[i][j][h]);
                }
            }
        }
        for (int k0 = e0; k0 < e1; k0 += 8 * kBlock) {  // half of 16 blocks
            const int h = k0 % (16 * kBlock) / (8 * kBlock);
            alignas(32) float bias[RN][8];
            for (int j = 0; j < RN; ++j)
                for (int l = 0; l < 8; ++l) bias[j][l] = k0 + l * kBlock < K ? w.bias(n + j, (k0 + l * kBlock) / G) : 0.0f;
            for (int i = 0; i < RT; ++i) {
                const __m256 sx = _mm256_loadu_ps(reinterpret_cast<const float*>(xq + size_t(i) * L::kRowBytes + L::kSxOffset) + k0 / kBlock);
                for (int j = 0; j < RN; ++j) acc[i][j][h] = _mm256_fmadd_ps(_mm256_load_ps(bias[j]), sx, acc[i][j][h]);
            }
        }
    }
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) {
            const __m256 s8 = _mm256_add_ps(acc[i][j][0], acc[i][j][1]);
            const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
            const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            out[i][j] = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
        }
}

#else

template <int RT, int RN, int K, int G, typename QW>
inline void dot_tile(const uint8_t* xq, const QW& w, int64_t n, float (&out)[RT][RN]) {
    for (int i = 0; i < RT; ++i)
        for (int j = 0; j < RN; ++j) out[i][j] = dot_portable<K, G>(xq + size_t(i) * ActLayout<K>::kRowBytes, w, n + j);
}

#endif

constexpr int kTileN = 4;  // weight rows per tile
constexpr int kTileT = 4;  // activation rows per tile
constexpr int kBlockT = 32;

// fn(t, n, value) for rows [t0, t1) x weight rows [n0, n1), as linear.hpp's for_each_dot.
template <int K, int G, typename QW, typename Fn>
inline void for_each_dot(const uint8_t* xq, const QW& w, int t0, int t1, int64_t n0, int64_t n1, Fn&& fn) {
    constexpr size_t kRow = ActLayout<K>::kRowBytes;
    for (int tb = t0; tb < t1; tb += kBlockT) {
        const int te = std::min(t1, tb + kBlockT);
        int64_t n = n0;
        for (; n + kTileN <= n1; n += kTileN) {
            int t = tb;
            for (; t + kTileT <= te; t += kTileT) {
                float r[kTileT][kTileN];
                dot_tile<kTileT, kTileN, K, G>(xq + size_t(t) * kRow, w, n, r);
                for (int i = 0; i < kTileT; ++i)
                    for (int j = 0; j < kTileN; ++j) fn(t + i, n + j, r[i][j]);
            }
            for (; t < te; ++t) {
                float r[1][kTileN];
                dot_tile<1, kTileN, K, G>(xq + size_t(t) * kRow, w, n, r);
                for (int j = 0; j < kTileN; ++j) fn(t, n + j, r[0][j]);
            }
        }
        for (; n < n1; ++n)
            for (int t = tb; t < te; ++t) {
                float r[1][1];
                dot_tile<1, 1, K, G>(xq + size_t(t) * kRow, w, n, r);
                fn(t, n, r[0][0]);
            }
    }
}

// The calling thread's buffer for the quantized rows of one call (grows, never shrinks: no
// allocation per token once the largest call has been seen).
inline uint8_t* act_buffer(size_t bytes) {
    struct Buffer {
        uint8_t* data = nullptr;
        size_t size = 0;
        ~Buffer() { ::operator delete[](data, std::align_val_t(64)); }
    };
    thread_local Buffer buf;
    if (buf.size < bytes) {
        ::operator delete[](buf.data, std::align_val_t(64));
        buf.data = static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t(64)));
        buf.size = bytes;
    }
    return buf.data;
}

// Quantizes rows of x (K wide) into the calling thread's buffer; many rows in parallel.
template <int K>
inline const uint8_t* quantize_rows(int rows, const float* x, ThreadPool& pool) {
    constexpr size_t kRow = ActLayout<K>::kRowBytes;
    uint8_t* xq = act_buffer(std::max<size_t>(1, size_t(rows)) * kRow);
    auto run = [&](int64_t b, int64_t e, int) {
        for (int64_t t = b; t < e; ++t) quantize_row<K>(x + size_t(t) * K, xq + size_t(t) * kRow);
    };
    if (rows >= 8) pool.parallel_for(rows, run);
    else run(0, rows, 0);
    return xq;
}

}  // namespace scr::kernels::cpu::int4
