// A thin SIMD layer so each kernel is written once: AVX-512 (16 lanes) when the build targets it,
// else AVX2+FMA (8 lanes), else a portable 8-lane struct the compiler vectorizes as it can.
// The lane count is a build constant; within one build every reduction has one fixed order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "runtime/core/dtype.hpp"

namespace scr::kernels::cpu {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline vf vload(const bf16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline vf vload(const f16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline float vsum(vf v) { return _mm512_reduce_add_ps(v); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int kLanes = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline vf vload(const bf16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline vf vload(const f16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline float vsum(vf v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}
#else
constexpr int kLanes = 8;
struct vf { float v[8]; };
inline vf vzero() { return vf{}; }
inline vf vset1(float x) { vf r; for (auto& e : r.v) e = x; return r; }
inline vf vload(const float* p) { vf r; std::memcpy(r.v, p, sizeof r.v); return r; }
inline vf vload(const bf16_t* p) { vf r; for (int i = 0; i < 8; ++i) r.v[i] = bf16_to_f32(p[i].bits); return r; }
inline vf vload(const f16_t* p) { vf r; for (int i = 0; i < 8; ++i) r.v[i] = f16_to_f32(p[i].bits); return r; }
inline void vstore(float* p, vf a) { std::memcpy(p, a.v, sizeof a.v); }
inline vf vfma(vf a, vf b, vf c) { for (int i = 0; i < 8; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return c; }
inline vf vmul(vf a, vf b) { for (int i = 0; i < 8; ++i) a.v[i] *= b.v[i]; return a; }
inline vf vadd(vf a, vf b) { for (int i = 0; i < 8; ++i) a.v[i] += b.v[i]; return a; }
inline float vsum(vf a) {
    float s[4];
    for (int i = 0; i < 4; ++i) s[i] = a.v[i] + a.v[i + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
}
#endif

// Scalar conversions of the weight types.
inline float to_f32(float x) { return x; }
inline float to_f32(bf16_t x) { return bf16_to_f32(x.bits); }
inline float to_f32(f16_t x) { return f16_to_f32(x.bits); }
template <typename T> T from_f32(float x);
template <> inline float from_f32<float>(float x) { return x; }
template <> inline bf16_t from_f32<bf16_t>(float x) { return bf16_t{f32_to_bf16(x)}; }
template <> inline f16_t from_f32<f16_t>(float x) { return f16_t{f32_to_f16(x)}; }

// The first n (< kLanes) elements, zero-padded: the tail of a row whose length is not a
// multiple of the lane count (a compile-time fact of the shape).
template <typename T>
inline vf vload_n(const T* p, int n) {
    alignas(64) T tmp[kLanes] = {};
    std::memcpy(tmp, p, sizeof(T) * size_t(n));
    return vload(tmp);
}
inline void vstore_n(float* p, vf v, int n) {
    alignas(64) float tmp[kLanes];
    vstore(tmp, v);
    std::memcpy(p, tmp, sizeof(float) * size_t(n));
}

}  // namespace scr::kernels::cpu
