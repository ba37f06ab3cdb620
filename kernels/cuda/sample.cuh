// Sampling on the GPU: one thread block per logit row turns the row into a token id, so only 4 bytes
// per row leave the device. The same pipeline as the engine's CPU sampler (runtime/engine/sampler.cpp,
// vLLM's order) for the parameters it covers:
//   greedy (temperature < 1e-5): argmax, the lowest id among equal maxima, NaNs ignored (all -inf: 0);
//   else x = logit * (1/T) (float, as the CPU) -> min_p (x >= max + log(min_p)) -> top_k (x >= the k-th
//   largest, ties kept) -> top_p (a token survives if the better-ranked tokens hold less than p of the
//   mass) -> one draw: the CDF of the kept tokens in id order inverted at the row's uniform.
// No sort: top_k and top_p are found by a radix descent over a 32-bit order key of x (3 digits of
// 11/11/10 bits): histogram the survivors by the next digit (counts for top_k, masses for top_p), pick the
// digit where the weight from the top reaches the rank, recurse into it. 1 + 3 + 3 + 1 passes at most.
// Masses are exp(x - max) in fixed point (x 2^42, rounded) summed in 64-bit integers: sums do not
// depend on the order of addition, so a row's token is deterministic; a token whose probability
// relative to the top one is below 2^-43 (x < max - 29.8) has mass 0 and is never drawn (at most
// vocab x 2^-43 ~ 1.5e-7 of the total for a 128k vocabulary).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "kernels/cuda/sample.hpp"

namespace scr::kernels::cuda {

namespace sample_detail {

using u64 = unsigned long long;
#ifdef SCR_SAMPLE_THREADS  // a host emulation of the kernel (tests) runs smaller blocks
constexpr int kThreads = SCR_SAMPLE_THREADS;
#else
constexpr int kThreads = 1024;
#endif
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && kWarps <= 32, "a block is 1 to 32 whole warps");
constexpr float kMassScale = 0x1p42f;
constexpr float kMassCutoff = -30.0f;     // exp(-30) * 2^42 = 0.41: rounds to 0
constexpr uint32_t kMinFiniteKey = 0x00800000u;  // order_key(-FLT_MAX); -inf and NaN sort below it
constexpr int kMaxBins = 2048;
// The three digits of a key, from the top: bits 31..21, 20..10, 9..0.
__device__ __forceinline__ int digit_bits(int d) { return d == 2 ? 10 : 11; }
__device__ __forceinline__ int digit_shift(int d) { return d == 0 ? 21 : d == 1 ? 10 : 0; }

// A map of floats to unsigned integers that preserves order (-0 and +0 map alike, as they compare
// equal); NaN maps to 0, below everything.
__host__ __device__ inline uint32_t order_key(float x) {
    if (x != x) return 0u;
    x += 0.0f;  // -0 -> +0
    uint32_t b;
    memcpy(&b, &x, 4);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u64 mass_of(float x, float max_x) {
    const float d = x - max_x;
    if (!(d >= kMassCutoff)) return 0;  // also -inf and NaN
    return __float2ull_rn(expf(d) * kMassScale);
}

// Calls f(id, x) for every element of the row, x already scaled by inv_t. Every thread runs the same
// number of iterations (invalid lanes see -inf at id -1), so f may use warp-synchronous intrinsics.
template <typename F>
__device__ __forceinline__ void for_each_uniform(const float* row, int vocab, float inv_t, F&& f) {
    const bool vec = (vocab & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
    if (vec) {
        const float4* r4 = reinterpret_cast<const float4*>(row);
        const int n = vocab / 4;
        for (int j0 = 0; j0 < n; j0 += kThreads) {
            const int j = j0 + int(threadIdx.x);
            float4 v = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            if (j < n) v = r4[j];
            const bool ok = j < n;
            f(ok ? 4 * j : -1, v.x * inv_t);
            f(ok ? 4 * j + 1 : -1, v.y * inv_t);
            f(ok ? 4 * j + 2 : -1, v.z * inv_t);
            f(ok ? 4 * j + 3 : -1, v.w * inv_t);
        }
    } else {
        for (int i0 = 0; i0 < vocab; i0 += kThreads) {
            const int i = i0 + int(threadIdx.x);
            f(i < vocab ? i : -1, i < vocab ? row[i] * inv_t : -INFINITY);
        }
    }
}

template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }

__device__ __forceinline__ float block_max(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
    __syncthreads();
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x % 32 < kWarps ? red[threadIdx.x % 32] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
    return v;
}

// Inclusive scan of a u64 across the block (thread order); *total gets the sum.
__device__ __forceinline__ u64 block_inclusive_scan(u64 v, u64* red, u64* total) {
    const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
    for (int o = 1; o < 32; o <<= 1) {
        const u64 up = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += up;
    }
    __syncthreads();
    if (lane == 31) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u64 w = lane < kWarps ? red[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 up = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += up;
        }
        if (lane < kWarps) red[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    if (warp > 0) v += red[warp - 1];
    *total = red[kWarps - 1];
    return v;
}

struct Shared {
    u64 hist[kMaxBins];
    u64 red[kWarps];
    float redf[kWarps];
    float best_val[kWarps];
    int best_id[kWarps];
    u64 rank;      // weight still to reach inside the chosen digit
    uint32_t digit;
    u64 total;     // all weight of the first histogram
    int32_t token;
};

// One digit of a radix descent. Among the elements with key >= keep_lo whose key matches `prefix` on
// the bits above this digit, histogram their weight (1 for counts, the mass for masses) by the digit.
template <bool kMass>
__device__ void histogram_digit(const float* row, int vocab, float inv_t, float max_x, uint32_t keep_lo, uint32_t prefix,
                                uint32_t above_mask, int shift, int bits, Shared& sh) {
    const int bins = 1 << bits;
    for (int i = int(threadIdx.x); i < bins; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    const int lane = int(threadIdx.x % 32);
    for_each_uniform(row, vocab, inv_t, [&](int, float x) {
        const uint32_t k = order_key(x);
        bool in = k >= keep_lo && (k & above_mask) == prefix;
        u64 w = 0;
        if (in) w = kMass ? mass_of(x, max_x) : 1;
        in = in && w > 0;
        if (!__any_sync(0xffffffffu, in)) return;
        // Lanes with the same digit add their weights first: one shared atomic per distinct digit
        // (logits cluster in a few exponents, so plain atomics would serialize on the same bins).
        const uint32_t digit = in ? (k >> shift) & uint32_t(bins - 1) : 0xffffffffu;
        const unsigned peers = __match_any_sync(0xffffffffu, digit);
        const unsigned lo = __reduce_add_sync(peers, unsigned(w & 0x1fffffu));  // w <= 2^42: two 21-bit halves
        const unsigned hi = __reduce_add_sync(peers, unsigned(w >> 21));
        if (in && __ffs(peers) - 1 == lane) atomicAdd(&sh.hist[digit], (u64(hi) << 21) + u64(lo));
    });
    __syncthreads();
}

// Warp 0: the highest digit at which the weight of the bins from the top reaches sh.rank (when
// top_p >= 0, the rank is first set to ceil(top_p * total)); sh.rank becomes the weight still to reach
// inside that digit, sh.total the histogram's total.
__device__ void select_digit(int bits, float top_p, Shared& sh) {
    if (threadIdx.x >= 32) return;
    const int lane = int(threadIdx.x);
    const int bins = 1 << bits, per = bins / 32;
    const int hi_bin = bins - 1 - lane * per;  // lane 0 owns the top bins
    u64 own = 0;
    for (int b = 0; b < per; ++b) own += sh.hist[hi_bin - b];
    u64 incl = own;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    const u64 total = __shfl_sync(0xffffffffu, incl, 31);
    u64 rank = sh.rank;
    if (top_p >= 0) {
        rank = u64(ceil(double(top_p) * double(total)));
        if (rank < 1) rank = 1;
        if (rank > total) rank = total;
    }
    const unsigned reach = __ballot_sync(0xffffffffu, incl >= rank);
    const int first = reach ? __ffs(reach) - 1 : 31;
    if (lane == first) {
        u64 cum = incl - own;
        int digit = hi_bin - per + 1;  // fallback: the lowest bin of the lane (rank > total cannot happen)
        for (int b = 0; b < per; ++b) {
            const u64 h = sh.hist[hi_bin - b];
            if (cum + h >= rank) { digit = hi_bin - b; break; }
            cum += h;
        }
        sh.digit = uint32_t(digit);
        sh.rank = rank - cum;
        sh.total = total;
    }
}

// Radix descent: the order key of the element whose (count or mass) rank from the top is `rank`
// (top_p < 0), or where the mass from the top first reaches ceil(top_p * total mass) (top_p >= 0).
// Counts: returns 0 without descending when the survivors number `rank` or fewer (*total = their number).
template <bool kMass>
__device__ uint32_t radix_select(const float* row, int vocab, float inv_t, float max_x, uint32_t keep_lo, u64 rank,
                                 float top_p, Shared& sh, u64* total) {
    uint32_t prefix = 0, above = 0;
    if (threadIdx.x == 0) sh.rank = rank;
    for (int d = 0; d < 3; ++d) {
        histogram_digit<kMass>(row, vocab, inv_t, max_x, keep_lo, prefix, above, digit_shift(d), digit_bits(d), sh);
        select_digit(digit_bits(d), d == 0 ? top_p : -1.0f, sh);
        __syncthreads();
        if (d == 0) {
            *total = sh.total;
            if (!kMass && sh.total <= rank) return 0;
        }
        prefix |= sh.digit << digit_shift(d);
        above |= uint32_t((1 << digit_bits(d)) - 1) << digit_shift(d);
        __syncthreads();  // sh.digit / sh.rank are rewritten by the next digit
    }
    return prefix;
}

}  // namespace sample_detail

__global__ void __launch_bounds__(sample_detail::kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int vocab, const SampleParams* __restrict__ params,
                       int32_t* __restrict__ tokens, SampleTrace* __restrict__ trace, int32_t* __restrict__ tokens_also = nullptr) {
    using namespace sample_detail;
    __shared__ Shared sh;
    const int r = int(blockIdx.x);
    const float* row = logits + size_t(r) * size_t(vocab);
    const SampleParams p = params[r];
    const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;

    auto greedy = [&]() {
        // Lowest id among equal maxima: each thread sees its ids in ascending order and keeps the first
        // strict improvement; the reduction prefers the lower id on equal values. NaN never improves.
        float best = -INFINITY;
        int best_id = INT32_MAX;
        for_each_uniform(row, vocab, 1.0f, [&](int id, float x) {
            if (id >= 0 && x > best) { best = x; best_id = id; }
        });
        for (int o = 16; o > 0; o >>= 1) {
            const float v = shfl_xor(best, o);
            const int i = shfl_xor(best_id, o);
            if (v > best || (v == best && i < best_id)) { best = v; best_id = i; }
        }
        if (lane == 0) { sh.best_val[warp] = best; sh.best_id[warp] = best_id; }
        __syncthreads();
        if (warp == 0) {
            best = lane < kWarps ? sh.best_val[lane] : -INFINITY;
            best_id = lane < kWarps ? sh.best_id[lane] : INT32_MAX;
            for (int o = 16; o > 0; o >>= 1) {
                const float v = shfl_xor(best, o);
                const int i = shfl_xor(best_id, o);
                if (v > best || (v == best && i < best_id)) { best = v; best_id = i; }
            }
            if (lane == 0) sh.token = best_id == INT32_MAX ? 0 : best_id;  // nothing above -inf: 0, as the CPU
        }
        __syncthreads();
    };

    if (!(p.temperature >= kSampleGreedyBelow)) {
        greedy();
        if (tid == 0) {
            tokens[r] = sh.token;
            if (tokens_also) tokens_also[r] = sh.token;
            if (trace) trace[r] = SampleTrace{0, sh.token, 0, 0.0f, 1};
        }
        return;
    }

    const float inv_t = 1.0f / p.temperature;  // as the CPU sampler: logits * (1 / T) in float
    float max_x = -INFINITY;
    for_each_uniform(row, vocab, inv_t, [&](int, float x) { max_x = fmaxf(max_x, x); });
    max_x = block_max(max_x, sh.redf);
    if (!(max_x > -INFINITY) || max_x == INFINITY) {
        // Nothing finite (the CPU draws id 0), or an infinite logit (the limit of the distribution: the
        // infinite logits, lowest id first): the greedy choice.
        greedy();
        if (tid == 0) {
            tokens[r] = sh.token;
            if (tokens_also) tokens_also[r] = sh.token;
            if (trace) trace[r] = SampleTrace{0, sh.token, 0, max_x, 1};
        }
        return;
    }

    // min_p, in logit space as the CPU: x >= max + log(min_p).
    uint32_t keep_lo = kMinFiniteKey;
    if (p.min_p > 0.0f) keep_lo = max(keep_lo, order_key(max_x + logf(p.min_p)));
    // top_k among the min_p survivors: x >= the k-th largest.
    if (p.top_k > 0 && p.top_k < vocab) {
        u64 survivors = 0;
        const uint32_t kth = radix_select<false>(row, vocab, inv_t, max_x, keep_lo, u64(p.top_k), -1.0f, sh, &survivors);
        if (survivors > u64(p.top_k)) keep_lo = max(keep_lo, kth);
    }
    // top_p among those: down to the value where the mass from the top reaches p of the total.
    if (p.top_p < 1.0f) {
        u64 z = 0;
        const uint32_t boundary = radix_select<true>(row, vocab, inv_t, max_x, keep_lo, 0, p.top_p, sh, &z);
        keep_lo = max(keep_lo, boundary);
    }

    // The draw: thread t owns ids [t * seg, (t + 1) * seg); masses summed per thread, scanned across
    // the block, and the thread whose range holds the target walks its ids again.
    const int seg = (((vocab + kThreads - 1) / kThreads) + 3) & ~3;
    const int begin = min(vocab, tid * seg), end = min(vocab, begin + seg);
    u64 own = 0;
    for (int i = begin; i < end; ++i) {
        const float x = row[i] * inv_t;
        if (order_key(x) >= keep_lo) own += mass_of(x, max_x);
    }
    u64 z = 0;
    const u64 incl = block_inclusive_scan(own, sh.red, &z);
    u64 target = u64(p.uniform * double(z));
    if (target >= z) target = z - 1;  // u < 1, but u * z may round up to z
    if (tid == 0) sh.token = -1;
    __syncthreads();
    const u64 excl = incl - own;
    if (own > 0 && excl <= target && target < incl) {
        u64 cum = excl;
        for (int i = begin; i < end; ++i) {
            const float x = row[i] * inv_t;
            if (order_key(x) < keep_lo) continue;
            cum += mass_of(x, max_x);
            if (cum > target) { sh.token = i; break; }
        }
    }
    __syncthreads();
    if (tid == 0) {
        const int32_t token = sh.token >= 0 ? sh.token : 0;  // z > 0 always holds (the top token is kept)
        tokens[r] = token;
        if (tokens_also) tokens_also[r] = token;
        if (trace) trace[r] = SampleTrace{keep_lo, token, z, max_x, 0};
    }
}

#if defined(__CUDACC__)  // (a host-only compile of the kernel, e.g. an emulation, has no launch syntax)
inline void launch_sample_rows(cudaStream_t stream, const float* logits, int vocab, int rows, const SampleParams* params,
                               int32_t* tokens, SampleTrace* trace, int32_t* tokens_also = nullptr) {
    if (vocab < 1 || vocab > kSampleMaxVocab) throw std::invalid_argument("sample_rows: vocabulary size out of range");
    if (rows <= 0) return;
    if (!logits || !params || !tokens) throw std::invalid_argument("sample_rows: null pointer");
    sample_rows_kernel<<<rows, sample_detail::kThreads, 0, stream>>>(logits, vocab, params, tokens, trace, tokens_also);
}
#endif

}  // namespace scr::kernels::cuda
