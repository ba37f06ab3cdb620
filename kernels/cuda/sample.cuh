// Sampling on the GPU: a cluster of C thread blocks per logit row (C = 1, 2, 4 or 8, more for fewer
// rows: sample_cluster_size) turns the row into a token id, so only 4 bytes per row leave the device.
// The same pipeline as the engine's CPU sampler (runtime/engine/sampler.cpp, vLLM's order) for the
// parameters it covers:
//   greedy (temperature < 1e-5): argmax, the lowest id among equal maxima, NaNs ignored (all -inf: 0);
//   else x = logit * (1/T) (float, as the CPU) -> min_p (x >= max + log(min_p)) -> top_k (x >= the k-th
//   largest, ties kept) -> top_p (a token survives if the better-ranked tokens hold less than p of the
//   mass) -> one draw: the CDF of the kept tokens in id order inverted at the row's uniform.
// No sort: top_k and top_p each come down to a boundary key K (x >= K survives), the one key with
// weight(> K) < rank <= weight(>= K) (counts for top_k, masses for top_p). Three ways, the same K:
//   * radix descent over a 32-bit order key of x, 3 digits of 11/11/10 bits: histogram the survivors
//     by the next digit, pick the digit where the weight from the top reaches the rank, recurse;
//   * value bins (top_k): one histogram over bins 1/64 wide below the maximum, then one pass
//     gathering the chosen bin's elements (at most kCand over the cluster), whose keys give K
//     directly; a fuller bin (ties) falls back to the radix descent;
//   * gathered (top_p after a value-bin top_k that left at most kCand survivors): all of them, no
//     histogram;
//   * a window (top_p alone): one pass sums the mass and count within 3, 6, 12 and 24 below the
//     maximum; if the narrowest window holding the rank has at most kCand elements (a peaked row),
//     they are gathered; else (a flat row) the radix descent. Value bins for top_p were tried: on
//     flat rows the boundary bin held too many elements (docs/CUDA.md "Session 18").
// Passes at most: 1 (max) + 2 (top_k; 3 more when its bin is too full) + 1 or 2 or 4 (top_p) + 1 (the draw).
// Masses are exp(x - max) in fixed point (x 2^42, rounded) summed in 64-bit integers: sums do not
// depend on the order of addition, so a row's token is deterministic; a token whose probability
// relative to the top one is below 2^-43 (x < max - 29.8) has mass 0 and is never drawn (at most
// vocab x 2^-43 ~ 1.5e-7 of the total for a 128k vocabulary).
// The cluster: block rank b of a row's C blocks owns a contiguous slice of the ids; every pass reads
// only its slice, and the blocks combine through distributed shared memory at cluster barriers: the
// maximum, the histograms (every block reads every peer's bins, so all pick the same digit), the
// draw's prefix of block masses. Integer sums and an exact maximum make the token independent of C:
// the same bits as one block per row (tested for every C). One SM reading a 128k row up to 8 times
// cost up to ~0.7 ms per step at batch 1 (docs/CUDA.md, "Sampling on the GPU").
#pragma once

#include <cuda_runtime.h>
#if !defined(SCR_SAMPLE_HOST_EMULATION)
#include <cooperative_groups.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cuda/env_switch.hpp"
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
// Value bins: bin 2047 - floor((max - x) * 64), the last one clamped (its x lie 32 or more below the
// maximum, where the masses are already 0); so the highest bin holds the largest x, like a radix digit.
constexpr float kValueScale = 64.0f;
// The most elements gather_select resolves directly (over the cluster); at most one per thread, as it
// sums them with one block scan.
constexpr int kCand = kThreads < 256 ? kThreads : 256;
// top_p's windows below the maximum (x units): window_select takes the narrowest that holds the rank.
constexpr int kWindows = 4;
__host__ __device__ constexpr float window_width(int j) { return j == 0 ? 3.0f : j == 1 ? 6.0f : j == 2 ? 12.0f : 24.0f; }
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

// x's value bin (x <= max_x, both finite): non-decreasing in x.
__device__ __forceinline__ uint32_t value_bin(float x, float max_x) {
    const float below = (max_x - x) * kValueScale;  // exact scaling; +inf for a huge range
    return uint32_t(kMaxBins - 1) - (below < float(kMaxBins - 1) ? uint32_t(below) : uint32_t(kMaxBins - 1));
}

__device__ __forceinline__ u64 mass_of(float x, float max_x) {
    const float d = x - max_x;
    if (!(d >= kMassCutoff)) return 0;  // also -inf and NaN
    return __float2ull_rn(expf(d) * kMassScale);
}

// The ids [lo, hi) one block of a row's cluster owns: slices of a multiple of 4 ids, so a slice of a
// 16-byte aligned row starts 16-byte aligned; the last slices may be short or empty.
struct Slice {
    int lo, hi;
};
__device__ __forceinline__ Slice slice_of(int vocab, int rank, int blocks) {
    const int per = ((vocab + 4 * blocks - 1) / (4 * blocks)) * 4;
    const int lo = min(vocab, rank * per);
    return Slice{lo, min(vocab, lo + per)};
}

// Calls f(id, x) for every element of the slice, x already scaled by inv_t. Every thread runs the same
// number of iterations (invalid lanes see -inf at id -1), so f may use warp-synchronous intrinsics.
template <typename F>
__device__ __forceinline__ void for_each_uniform(const float* row, int vocab, Slice s, float inv_t, F&& f) {
    const bool vec = (vocab & 3) == 0 && (reinterpret_cast<uintptr_t>(row) & 15) == 0;
    if (vec) {
        // Four loads in flight per thread before any use (f may hold warp collectives, which keep the
        // compiler from moving the next iteration's load above them); the same ids in the same order.
        constexpr int kBatch = 4;
        const float4* r4 = reinterpret_cast<const float4*>(row + s.lo);  // s.lo % 4 == 0
        const int n = (s.hi - s.lo) / 4;
        for (int j0 = 0; j0 < n; j0 += kBatch * kThreads) {
            float4 v[kBatch];
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
                const int j = j0 + u * kThreads + int(threadIdx.x);
                v[u] = j < n ? r4[j] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            }
#pragma unroll
            for (int u = 0; u < kBatch; ++u) {
                const int j = j0 + u * kThreads + int(threadIdx.x);
                const bool ok = j < n;
                const int id = s.lo + 4 * j;
                f(ok ? id : -1, v[u].x * inv_t);
                f(ok ? id + 1 : -1, v[u].y * inv_t);
                f(ok ? id + 2 : -1, v[u].z * inv_t);
                f(ok ? id + 3 : -1, v[u].w * inv_t);
            }
        }
    } else {
        for (int i0 = s.lo; i0 < s.hi; i0 += kThreads) {
            const int i = i0 + int(threadIdx.x);
            f(i < s.hi ? i : -1, i < s.hi ? row[i] * inv_t : -INFINITY);
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

struct Shared {
    // This block's histogram of its slice, each bin a 64-bit sum kept as two 32-bit words, low then
    // high (the low word carries into the high one): 32-bit shared atomics are native, 64-bit ones a
    // compare-and-swap loop that 32 warps on a few hot bins made the slowest part of the sampler
    // (docs/CUDA.md, "Sampling on the GPU"); a peer reads a pair of bins as one 16-byte load. Two of
    // them, alternating from digit to digit, so that a block may clear one for the next digit while its
    // peers still read the other: one cluster barrier per digit.
    alignas(16) uint32_t hist[2][2 * kMaxBins];
    u64 red[kWarps];
    float redf[kWarps];
    float best_val[kWarps];
    int best_id[kWarps];
    u64 rank;      // weight still to reach inside the chosen digit
    uint32_t digit;
    u64 total;     // all weight of the first histogram
    int32_t token;
    // What this block publishes to the others of its cluster.
    float part_val;  // its best (value, id) for greedy
    int32_t part_id;
    float part_max;  // its slice's maximum of x
    u64 part_z;      // its slice's kept mass (the draw)
    // gather_select's candidates: this block's (read by the peers), then the cluster's.
    unsigned cand_n;
    uint32_t cand_key[kCand];
    u64 cand_w[kCand];
    uint32_t all_key[kCand];
    u64 all_w[kCand];
    uint32_t result_key;
    u64 result_kept;
    // top_p's windows (window_select): each warp's sums, this block's, the cluster's.
    u64 win_warp[kWarps][2 * kWindows + 1];
    u64 win_block[2 * kWindows + 1];
    u64 win_all[2 * kWindows + 1];
};

// The row's cluster of C blocks: rank = blockIdx.x % C (a one-dimensional cluster), a barrier over all
// of its threads (release / acquire: shared-memory writes before it are visible to the peers after it),
// and a peer's copy of a shared variable. C = 1: the block alone.
template <int C>
struct RowCluster {
    __device__ static int rank() { return C == 1 ? 0 : int(blockIdx.x % unsigned(C)); }
    __device__ static int row() { return int(blockIdx.x / unsigned(C)); }
    __device__ static void sync() {
        if constexpr (C == 1) __syncthreads();
#if defined(SCR_SAMPLE_HOST_EMULATION)
        else emu::cluster_sync();
#else
        else cooperative_groups::this_cluster().sync();
#endif
    }
    template <typename T>
    __device__ static T* peer(T* local, int r) {
        if constexpr (C == 1) return local;
#if defined(SCR_SAMPLE_HOST_EMULATION)
        else return emu::cluster_peer(local, r);
#else
        else return cooperative_groups::this_cluster().map_shared_rank(local, unsigned(r));
#endif
    }
};

// Adds w to bin b of a histogram kept as 32-bit halves (h[2b] low, h[2b + 1] high): the low word's carry
// goes to the high word, so the pair holds the exact 64-bit sum.
__device__ __forceinline__ void hist_add(uint32_t* h, uint32_t b, u64 w) {
    const uint32_t low = uint32_t(w), high = uint32_t(w >> 32);
    const uint32_t old = atomicAdd(&h[2 * b], low);
    const uint32_t carry = old > 0xffffffffu - low ? 1u : 0u;
    if (high + carry) atomicAdd(&h[2 * b + 1], high + carry);
}
__device__ __forceinline__ u64 bin_value(uint2 v) { return u64(v.y) << 32 | v.x; }

// Inclusive scan of a u64 across the block in thread order; *total gets the block's sum.
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

// One digit of a radix descent. Among the elements with key >= keep_lo whose key matches `prefix` on
// the bits above this digit, histogram their weight (1 for counts, the mass for masses) by the digit
// (the slice's, into histogram `parity`); then, over the cluster's histogram (every block's summed),
// the highest digit at which the weight of the bins from the top reaches sh.rank (when top_p >= 0,
// the rank is first set to ceil(top_p * total)): sh.digit; sh.rank becomes the weight still to reach
// inside that digit, sh.total the histogram's total. Every block finds the same.
// digit_of(key, x) gives an element's digit (a radix digit of the key, or value_bin).
template <int C, bool kMass, typename DigitOf>
__device__ void histogram_digit(const float* row, int vocab, Slice s, float inv_t, float max_x, uint32_t keep_lo,
                                uint32_t prefix, uint32_t above_mask, int bits, DigitOf digit_of, float top_p, int parity, Shared& sh) {
    const int bins = 1 << bits;
    uint32_t* h = sh.hist[parity];
    for (int i = int(threadIdx.x); i < 2 * bins; i += kThreads) h[i] = 0;
    __syncthreads();
    const int lane = int(threadIdx.x % 32);
    for_each_uniform(row, vocab, s, inv_t, [&](int, float x) {
        const uint32_t k = order_key(x);
        bool in = k >= keep_lo && (k & above_mask) == prefix;
        u64 w = 0;
        if (in) w = kMass ? mass_of(x, max_x) : 1;
        in = in && w > 0;
        const unsigned act = __ballot_sync(0xffffffffu, in);
        if (!act) return;
        // The lanes sharing the first active lane's digit (logits cluster in a few exponents: often most
        // of the warp) add their weights first, one atomic for all of them; the others add their own.
        // Integer sums: the order does not matter.
        const uint32_t digit = in ? digit_of(k, x) : 0xffffffffu;
        const uint32_t lead = __shfl_sync(0xffffffffu, digit, __ffs(act) - 1);
        const bool group = in && digit == lead;
        const unsigned gmask = __ballot_sync(0xffffffffu, group);
        u64 sum = u64(__popc(gmask));
        if constexpr (kMass) {  // every lane reduces, over its side of the partition (the others' sum is unused)
            const unsigned side = group ? gmask : ~gmask;
            const unsigned lo = __reduce_add_sync(side, group ? unsigned(w & 0x1fffffu) : 0u);  // w <= 2^42: two 21-bit halves
            const unsigned hi = __reduce_add_sync(side, group ? unsigned(w >> 21) : 0u);
            sum = (u64(hi) << 21) + u64(lo);
        }
        if (group) {
            if (__ffs(gmask) - 1 == lane) hist_add(h, lead, sum);
        } else if (in) {
            hist_add(h, digit, w);
        }
    });
    RowCluster<C>::sync();  // every block's histogram is complete (C = 1: this block's)

    // Thread t owns bins top - t * per .. top - t * per - per + 1 (thread 0 the highest); each sums its
    // bins over the cluster, the block scans the sums in thread order, and the thread whose range
    // reaches the rank walks its bins.
    const int per = (bins + kThreads - 1) / kThreads;
    const int top = bins - 1 - int(threadIdx.x) * per;
    const uint2* peer_h[C];  // each peer's histogram, mapped once
    for (int r = 0; r < C; ++r) peer_h[r] = reinterpret_cast<const uint2*>(RowCluster<C>::peer(h, r));
    auto bin = [&](int b) -> u64 {
        u64 v = 0;
        for (int r = 0; r < C; ++r) v += bin_value(peer_h[r][b]);
        return v;
    };
    u64 own = 0;
    if (per == 2) {  // 1,024 threads, 2,048 bins: the pair (top - 1, top) as one 16-byte load per peer
        uint4 q[C];
        for (int r = 0; r < C; ++r) q[r] = reinterpret_cast<const uint4*>(peer_h[r])[(top - 1) / 2];
        for (int r = 0; r < C; ++r) own += bin_value(make_uint2(q[r].x, q[r].y)) + bin_value(make_uint2(q[r].z, q[r].w));
    } else {
        for (int j = 0; j < per && top - j >= 0; ++j) own += bin(top - j);
    }
    u64 total = 0;
    const u64 incl = block_inclusive_scan(own, sh.red, &total);
    u64 rank = sh.rank;
    if (top_p >= 0) {
        rank = u64(ceil(double(top_p) * double(total)));
        if (rank < 1) rank = 1;
        if (rank > total) rank = total;
    }
    __syncthreads();  // every thread has read sh.rank
    if (threadIdx.x == 0) sh.total = total;
    if (incl >= rank && incl - own < rank) {  // exactly one thread when 1 <= rank <= total
        u64 cum = incl - own;
        for (int j = 0; j < per && top - j >= 0; ++j) {
            const u64 h = bin(top - j);
            if (cum + h >= rank) {
                sh.digit = uint32_t(top - j);
                sh.rank = rank - cum;
                break;
            }
            cum += h;
        }
    }
    __syncthreads();
}

// Radix descent: the order key of the element whose (count or mass) rank from the top is `rank`
// (top_p < 0), or where the mass from the top first reaches ceil(top_p * total mass) (top_p >= 0).
// Counts: returns 0 without descending when the survivors number `rank` or fewer (*total = their number).
// Every block of the cluster takes the same decisions (from the same summed histograms). `digits`
// counts the digits histogrammed so far (the histogram buffers alternate with it).
template <int C, bool kMass>
__device__ uint32_t radix_select(const float* row, int vocab, Slice s, float inv_t, float max_x, uint32_t keep_lo, u64 rank,
                                 float top_p, Shared& sh, u64* total, int& digits) {
    uint32_t prefix = 0, above = 0;
    if (threadIdx.x == 0) sh.rank = rank;
    __syncthreads();
    for (int d = 0; d < 3; ++d) {
        const int shift = digit_shift(d), bits = digit_bits(d);
        histogram_digit<C, kMass>(row, vocab, s, inv_t, max_x, keep_lo, prefix, above, bits,
                                  [=](uint32_t k, float) { return (k >> shift) & uint32_t((1 << bits) - 1); },
                                  d == 0 ? top_p : -1.0f, digits++ % 2, sh);
        if (d == 0) {
            *total = sh.total;
            if (!kMass && sh.total <= rank) return 0;
        }
        prefix |= sh.digit << digit_shift(d);
        above |= uint32_t((1 << digit_bits(d)) - 1) << digit_shift(d);
    }
    return prefix;
}

// Gathers the elements with key >= keep_lo, a non-zero weight (1, or the mass) and in(key, x) over the
// cluster (at most kCand), and finds among them the key K with weight(> K) < need <= weight(>= K),
// need = the argument, or (top_p >= 0) ceil(top_p * their total weight) clamped to [1, total]: *key,
// and *kept = base + weight(>= K). Returns false, having decided nothing, when they number more than
// kCand (every block sees the same counts, so all blocks return the same). Ends at a cluster barrier.
template <int C, bool kMass, typename In>
__device__ bool gather_select(const float* row, int vocab, Slice s, float inv_t, float max_x, uint32_t keep_lo, In in, u64 need,
                              float top_p, u64 base, Shared& sh, uint32_t* key, u64* kept) {
    using Cl = RowCluster<C>;
    const int lane = int(threadIdx.x % 32);
    if (threadIdx.x == 0) {
        sh.cand_n = 0;
        sh.result_key = 0;
        sh.result_kept = 0;
    }
    __syncthreads();
    for_each_uniform(row, vocab, s, inv_t, [&](int, float x) {
        const uint32_t k = order_key(x);
        u64 w = 0;
        if (k >= keep_lo && in(k, x)) w = kMass ? mass_of(x, max_x) : 1;
        // One counter update per warp and step (all lanes get here: for_each_uniform).
        const unsigned take = __ballot_sync(0xffffffffu, w > 0);
        if (!take) return;
        const int leader = __ffs(take) - 1;
        unsigned at = 0;
        if (lane == leader) at = atomicAdd(&sh.cand_n, unsigned(__popc(take)));
        at = __shfl_sync(0xffffffffu, at, leader) + unsigned(__popc(take & ((1u << lane) - 1u)));
        if (w > 0 && at < unsigned(kCand)) {
            sh.cand_key[at] = k;
            sh.cand_w[at] = w;
        }
    });
    Cl::sync();  // every block's candidates are in
    unsigned counts[C], n = 0;
    bool over = false;
    for (int r = 0; r < C; ++r) {
        counts[r] = *Cl::peer(&sh.cand_n, r);
        over = over || counts[r] > unsigned(kCand);
        n += counts[r];
    }
    if (over || n > unsigned(kCand)) {
        Cl::sync();  // the peers have read this block's count
        return false;
    }
    for (unsigned i = threadIdx.x; i < n; i += kThreads) {
        unsigned r = 0, j = i;
        while (j >= counts[r]) j -= counts[r++];
        sh.all_key[i] = Cl::peer(sh.cand_key, int(r))[j];
        sh.all_w[i] = Cl::peer(sh.cand_w, int(r))[j];
    }
    if (top_p >= 0) {  // the rank from the candidates' total weight
        u64 total = 0;
        (void)block_inclusive_scan(threadIdx.x < n ? sh.all_w[threadIdx.x] : 0, sh.red, &total);  // n <= kCand <= kThreads
        need = u64(ceil(double(top_p) * double(total)));
        if (need < 1) need = 1;
        if (need > total) need = total;
    }
    __syncthreads();
    // Candidate i's weight above and equal to its key, summed by 4 lanes (j = part, part + 4, ...) and
    // a butterfly over them; every lane runs the same steps (the shuffles see whole warps).
    constexpr int kLanesPer = 4;
    for (unsigned i0 = 0; i0 < n; i0 += kThreads / kLanesPer) {
        const unsigned i = i0 + threadIdx.x / kLanesPer, part = threadIdx.x % kLanesPer;
        const uint32_t ki = i < n ? sh.all_key[i] : 0u;
        u64 above = 0, equal = 0;
        if (i < n)
            for (unsigned j = part; j < n; j += kLanesPer) {
                const uint32_t kj = sh.all_key[j];
                if (kj > ki) above += sh.all_w[j];
                else if (kj == ki) equal += sh.all_w[j];
            }
        for (int o = 1; o < kLanesPer; o <<= 1) {
            above += shfl_xor(above, o);
            equal += shfl_xor(equal, o);
        }
        if (i < n && part == 0 && above < need && need <= above + equal) {  // every such i has the same key
            sh.result_key = ki;
            sh.result_kept = base + above + equal;
        }
    }
    __syncthreads();
    *key = sh.result_key;
    *kept = sh.result_kept;
    Cl::sync();  // every thread has read the result (the next selection resets it); the peers are done with the candidates
    return true;
}

// top_k's key (radix_select<C, false>'s, with the same *total and the same 0 when the survivors
// number `rank` or fewer) from one histogram of counts over value bins plus gather_select over the
// chosen bin. *kept: the survivors of the cut (elements with key >= the result). Returns false,
// having decided nothing, when the bin holds more than kCand elements.
template <int C>
__device__ bool value_select_count(const float* row, int vocab, Slice s, float inv_t, float max_x, uint32_t keep_lo, u64 rank,
                                   Shared& sh, u64* total, int& digits, uint32_t* key, u64* kept) {
    if (threadIdx.x == 0) sh.rank = rank;
    __syncthreads();
    histogram_digit<C, false>(row, vocab, s, inv_t, max_x, keep_lo, 0u, 0u, 11, [=](uint32_t, float x) { return value_bin(x, max_x); },
                              -1.0f, digits++ % 2, sh);
    *total = sh.total;
    if (sh.total <= rank) {
        *key = 0;
        *kept = sh.total;
        return true;
    }
    const uint32_t bin = sh.digit;
    const u64 need = sh.rank;  // count still to reach inside the bin, 1 <= need <= the bin's count
    return gather_select<C, false>(row, vocab, s, inv_t, max_x, keep_lo, [=](uint32_t, float x) { return value_bin(x, max_x) == bin; },
                                   need, -1.0f, rank - need, sh, key, kept);
}

// top_p alone, when the row is peaked: one pass sums, over the cluster, the total mass Z of the
// survivors (key >= keep_lo, mass > 0) and the count and mass of those within each window below the
// maximum (max - x <= window_width(j)). If the narrowest window whose mass reaches rank =
// ceil(top_p Z) (clamped to [1, Z]) holds at most kCand elements, gather_select finds the key among
// them (every element above it lies in the window, so it is radix_select's key). Returns false,
// having decided nothing, otherwise (a flat row: the caller runs the radix descent).
template <int C>
__device__ bool window_select(const float* row, int vocab, Slice s, float inv_t, float max_x, uint32_t keep_lo, float top_p,
                              Shared& sh, uint32_t* key) {
    using Cl = RowCluster<C>;
    constexpr int N = 2 * kWindows + 1;  // Z, then (count, mass) per window
    u64 v[N] = {};
    for_each_uniform(row, vocab, s, inv_t, [&](int, float x) {
        if (order_key(x) < keep_lo) return;
        const u64 w = mass_of(x, max_x);
        const float below = max_x - x;
        v[0] += w;
#pragma unroll
        for (int j = 0; j < kWindows; ++j)
            if (w > 0 && below <= window_width(j)) {
                v[1 + 2 * j] += 1;
                v[2 + 2 * j] += w;
            }
    });
    const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
#pragma unroll
    for (int i = 0; i < N; ++i)
        for (int o = 16; o > 0; o >>= 1) v[i] += shfl_xor(v[i], o);
    if (lane == 0)
        for (int i = 0; i < N; ++i) sh.win_warp[warp][i] = v[i];
    __syncthreads();
    if (threadIdx.x < unsigned(N)) {
        u64 t = 0;
        for (int w = 0; w < kWarps; ++w) t += sh.win_warp[w][threadIdx.x];
        sh.win_block[threadIdx.x] = t;
    }
    Cl::sync();  // every block's sums are in
    if (threadIdx.x < unsigned(N)) {
        u64 t = 0;
        for (int r = 0; r < C; ++r) t += Cl::peer(sh.win_block, r)[threadIdx.x];
        sh.win_all[threadIdx.x] = t;
    }
    __syncthreads();
    const u64 z = sh.win_all[0];
    u64 rank = u64(ceil(double(top_p) * double(z)));  // as histogram_digit
    if (rank < 1) rank = 1;
    if (rank > z) rank = z;
    int j = 0;
    while (j < kWindows && sh.win_all[2 + 2 * j] < rank) ++j;
    const bool fits = j < kWindows && sh.win_all[1 + 2 * j] <= u64(kCand);
    Cl::sync();  // every thread has read the sums; the peers are done with this block's
    if (!fits) return false;
    const float width = window_width(j);
    u64 kept = 0;
    return gather_select<C, true>(row, vocab, s, inv_t, max_x, keep_lo, [=](uint32_t, float x) { return max_x - x <= width; }, rank,
                                  -1.0f, 0, sh, key, &kept);
}

}  // namespace sample_detail

// Grid: rows x C blocks, clusters of C (C > 1); block b serves row b / C.
template <int C>
__global__ void __launch_bounds__(sample_detail::kThreads)
    sample_rows_kernel(const float* __restrict__ logits, int vocab, const SampleParams* __restrict__ params,
                       int32_t* __restrict__ tokens, SampleTrace* __restrict__ trace, int32_t* __restrict__ tokens_also = nullptr,
                       int radix_only = 0) {
    using namespace sample_detail;
    using Cl = RowCluster<C>;
#if defined(SCR_SAMPLE_HOST_EMULATION)
    Shared& sh = emu::block_shared<Shared>();
#else
    __shared__ Shared sh;
#endif
    const int r = Cl::row(), rank = Cl::rank();
    const Slice s = slice_of(vocab, rank, C);
    const float* row = logits + size_t(r) * size_t(vocab);
    const SampleParams p = params[r];
    const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
    // Rank 0 writes the row's results, after the cluster's last barrier (a block's shared memory must
    // outlive its peers' reads of it, so every path ends at one).
    int radix_path = 0;
    auto emit = [&](int32_t token, uint32_t keep_lo, u64 z, float max_x, int32_t greedy) {
        if (tid == 0 && rank == 0) {
            tokens[r] = token;
            if (tokens_also) tokens_also[r] = token;
            if (trace) trace[r] = SampleTrace{keep_lo, token, z, max_x, greedy, radix_path};
        }
    };

    // Lowest id among equal maxima: each thread sees its ids in ascending order and keeps the first
    // strict improvement; the reductions (warps, then blocks in rank order, i.e. id order) prefer the
    // lower id on equal values. NaN never improves. Leaves the token in sh.token; ends at a cluster barrier.
    auto greedy = [&]() {
        float best = -INFINITY;
        int best_id = INT32_MAX;
        for_each_uniform(row, vocab, s, 1.0f, [&](int id, float x) {
            if (id >= 0 && x > best) { best = x; best_id = id; }
        });
        auto merge = [&](float v, int i) {
            if (v > best || (v == best && i < best_id)) { best = v; best_id = i; }
        };
        for (int o = 16; o > 0; o >>= 1) merge(shfl_xor(best, o), shfl_xor(best_id, o));
        if (lane == 0) { sh.best_val[warp] = best; sh.best_id[warp] = best_id; }
        __syncthreads();
        if (warp == 0) {
            best = lane < kWarps ? sh.best_val[lane] : -INFINITY;
            best_id = lane < kWarps ? sh.best_id[lane] : INT32_MAX;
            for (int o = 16; o > 0; o >>= 1) merge(shfl_xor(best, o), shfl_xor(best_id, o));
            if (lane == 0) { sh.part_val = best; sh.part_id = best_id; }
        }
        Cl::sync();
        if (tid == 0) {
            best = -INFINITY;
            best_id = INT32_MAX;
            for (int b = 0; b < C; ++b) merge(*Cl::peer(&sh.part_val, b), *Cl::peer(&sh.part_id, b));
            sh.token = best_id == INT32_MAX ? 0 : best_id;  // nothing above -inf: 0, as the CPU
        }
        Cl::sync();
    };

    if (!(p.temperature >= kSampleGreedyBelow)) {
        greedy();
        emit(sh.token, 0, 0, 0.0f, 1);
        return;
    }

    const float inv_t = 1.0f / p.temperature;  // as the CPU sampler: logits * (1 / T) in float
    float max_x = -INFINITY;
    for_each_uniform(row, vocab, s, inv_t, [&](int, float x) { max_x = fmaxf(max_x, x); });
    max_x = block_max(max_x, sh.redf);
    if constexpr (C > 1) {
        if (tid == 0) sh.part_max = max_x;
        Cl::sync();
        for (int b = 0; b < C; ++b) max_x = fmaxf(max_x, *Cl::peer(&sh.part_max, b));
    }
    if (!(max_x > -INFINITY) || max_x == INFINITY) {
        // Nothing finite (the CPU draws id 0), or an infinite logit (the limit of the distribution: the
        // infinite logits, lowest id first): the greedy choice.
        greedy();
        emit(sh.token, 0, 0, max_x, 1);
        return;
    }

    // min_p, in logit space as the CPU: x >= max + log(min_p).
    uint32_t keep_lo = kMinFiniteKey;
    if (p.min_p > 0.0f) keep_lo = max(keep_lo, order_key(max_x + logf(p.min_p)));
    int digits = 0;  // radix digits histogrammed (the histogram buffers alternate)
    // top_k among the min_p survivors: x >= the k-th largest.
    bool few = false;  // at most kCand survivors (known after a value-bin top_k): top_p gathers them all
    if (p.top_k > 0 && p.top_k < vocab) {
        u64 survivors = 0, kept = 0;
        uint32_t kth = 0;
        if (!radix_only &&
            value_select_count<C>(row, vocab, s, inv_t, max_x, keep_lo, u64(p.top_k), sh, &survivors, digits, &kth, &kept)) {
            few = kept <= u64(kCand);
        } else {
            kth = radix_select<C, false>(row, vocab, s, inv_t, max_x, keep_lo, u64(p.top_k), -1.0f, sh, &survivors, digits);
            radix_path |= 1;
        }
        if (survivors > u64(p.top_k)) keep_lo = max(keep_lo, kth);
    }
    // top_p among those: down to the value where the mass from the top reaches p of the total. After a
    // top_k that left few survivors, straight from them; else from a window below the maximum when
    // the row is peaked enough; else the radix descent. On a flat row the window's pass is lost
    // (~8 us at one row of 128k: docs/CUDA.md "Session 18").
    if (p.top_p < 1.0f) {
        u64 z = 0, kept = 0;
        uint32_t boundary = 0;
        const bool done = few ? gather_select<C, true>(row, vocab, s, inv_t, max_x, keep_lo, [](uint32_t, float) { return true; }, 0,
                                                       p.top_p, 0, sh, &boundary, &kept)
                              : !radix_only && window_select<C>(row, vocab, s, inv_t, max_x, keep_lo, p.top_p, sh, &boundary);
        if (!done) {
            boundary = radix_select<C, true>(row, vocab, s, inv_t, max_x, keep_lo, 0, p.top_p, sh, &z, digits);
            radix_path |= 2;
        }
        keep_lo = max(keep_lo, boundary);
    }

    // The draw: warp w owns a contiguous range of the block's slice (steps of 32 ids, one per lane, so
    // every load is coalesced); the warps' masses are added in warp order, the blocks' in rank order
    // (both id order), and the warp whose range holds the target walks it again, 32 ids at a time,
    // with a scan across its lanes.
    const int wspan = ((s.hi - s.lo + kWarps * 32 - 1) / (kWarps * 32)) * 32;
    const int wlo = min(s.hi, s.lo + warp * wspan), whi = min(s.hi, wlo + wspan);
    auto kept_mass = [&](float logit) -> u64 {  // a raw logit's mass if it is kept, else 0
        const float x = logit * inv_t;
        return order_key(x) >= keep_lo ? mass_of(x, max_x) : 0;
    };
    u64 own = 0;  // the warp's kept mass, on every lane
    for (int i = wlo + lane; i < whi; i += 32) own += kept_mass(row[i]);
    for (int o = 16; o > 0; o >>= 1) own += shfl_xor(own, o);
    if (lane == 0) sh.red[warp] = own;
    __syncthreads();
    u64 zb = 0, excl = 0;  // the block's mass; the mass before this warp's range
    for (int w = 0; w < kWarps; ++w) {
        const u64 v = sh.red[w];
        zb += v;
        if (w < warp) excl += v;
    }
    if (tid == 0) {
        sh.part_z = zb;
        sh.token = -1;
    }
    Cl::sync();  // every block's total published; rank 0's token cleared before anyone writes it
    u64 z = 0;   // the cluster's kept mass
    for (int b = 0; b < C; ++b) {
        const u64 zp = *Cl::peer(&sh.part_z, b);
        z += zp;
        if (b < rank) excl += zp;
    }
    u64 target = u64(p.uniform * double(z));
    if (target >= z) target = z - 1;  // u < 1, but u * z may round up to z
    if (own > 0 && excl <= target && target < excl + own) {  // the same on every lane of the warp
        // 8 steps of 32 ids loaded at once, then scanned one step after the other.
        constexpr int kSteps = 8;
        u64 cum = excl;
        bool found = false;
        for (int i0 = wlo; i0 < whi && !found; i0 += 32 * kSteps) {
            float xs[kSteps];
#pragma unroll
            for (int u = 0; u < kSteps; ++u) {
                const int i = i0 + 32 * u + lane;
                xs[u] = i < whi ? row[i] : -INFINITY;
            }
#pragma unroll
            for (int u = 0; u < kSteps; ++u) {
                if (found) break;
                const int i = i0 + 32 * u + lane;
                const u64 m = i < whi ? kept_mass(xs[u]) : 0;
                u64 incl = m;
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 up = __shfl_up_sync(0xffffffffu, incl, o);
                    if (lane >= o) incl += up;
                }
                const u64 before = cum + incl - m;
                const bool hit = m > 0 && before <= target && target < before + m;
                if (hit) *Cl::peer(&sh.token, 0) = i;
                found = __ballot_sync(0xffffffffu, hit) != 0;
                cum += __shfl_sync(0xffffffffu, incl, 31);
            }
        }
    }
    Cl::sync();
    const int32_t token = sh.token >= 0 ? sh.token : 0;  // z > 0 always holds (the top token is kept)
    emit(token, keep_lo, z, max_x, 0);
}

// Blocks per row: enough rows fill the GPU with one block each; fewer rows split theirs, up to 8 (the
// portable cluster size), so that ~128 SMs read them. Small vocabularies are not worth a cluster.
// SCR_CUDA_SAMPLE_CLUSTER=1/2/4/8 forces one size (A/B runs); the token does not depend on it. (16, a
// non-portable size, measured slower at every case on the H200: docs/CUDA.md "Session 18".)
inline int sample_cluster_size(int rows, int vocab) {
    static const int forced = [] {
        return int(env_int_switch(
            "SCR_CUDA_SAMPLE_CLUSTER", 0, [](long long v) { return v == 1 || v == 2 || v == 4 || v == 8; }, "1, 2, 4 or 8", "the rule"));
    }();
    if (forced) return forced;
    if (vocab < 8192) return 1;
    return rows <= 16 ? 8 : rows <= 32 ? 4 : rows <= 64 ? 2 : 1;
}

// SCR_CUDA_SAMPLE_SELECT=radix: top_k and top_p by the radix descent alone (the sampler before the
// value bins; A/B runs); the same tokens.
inline bool sample_radix_only() {
    static const bool on = env_choice_switch("SCR_CUDA_SAMPLE_SELECT", false, {{"bins", false}, {"radix", true}}, "bins");
    return on;
}

#if defined(__CUDACC__)  // (a host-only compile of the kernel, e.g. an emulation, has no launch syntax)
// blocks_per_row: 0 picks sample_cluster_size; else 1, 2, 4 or 8 (tests). radix_only: -1 as
// sample_radix_only(), else 0 or 1 (tests).
inline void launch_sample_rows(cudaStream_t stream, const float* logits, int vocab, int rows, const SampleParams* params,
                               int32_t* tokens, SampleTrace* trace, int32_t* tokens_also = nullptr, int blocks_per_row = 0,
                               int radix_only = -1) {
    const int radix = radix_only >= 0 ? radix_only : int(sample_radix_only());
    if (vocab < 1 || vocab > kSampleMaxVocab) throw std::invalid_argument("sample_rows: vocabulary size out of range");
    if (rows <= 0) return;
    if (!logits || !params || !tokens) throw std::invalid_argument("sample_rows: null pointer");
    const int C = blocks_per_row ? blocks_per_row : sample_cluster_size(rows, vocab);
    if (C == 1) {
        sample_rows_kernel<1><<<rows, sample_detail::kThreads, 0, stream>>>(logits, vocab, params, tokens, trace, tokens_also, radix);
        return;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(rows * C));
    cfg.blockDim = dim3(sample_detail::kThreads);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(C);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t e = cudaErrorInvalidValue;
    switch (C) {
        case 2: e = cudaLaunchKernelEx(&cfg, sample_rows_kernel<2>, logits, vocab, params, tokens, trace, tokens_also, radix); break;
        case 4: e = cudaLaunchKernelEx(&cfg, sample_rows_kernel<4>, logits, vocab, params, tokens, trace, tokens_also, radix); break;
        case 8: e = cudaLaunchKernelEx(&cfg, sample_rows_kernel<8>, logits, vocab, params, tokens, trace, tokens_also, radix); break;
        default: throw std::invalid_argument("sample_rows: blocks per row must be 1, 2, 4 or 8");
    }
    if (e == cudaSuccess) return;
    // A GPU (or a MIG slice) that cannot co-schedule C blocks of this size: one block per row, the same
    // tokens. Any other error is the caller's to see.
    if (e != cudaErrorInvalidClusterSize)
        throw std::runtime_error(std::string("sample_rows: cluster launch failed: ") + cudaGetErrorString(e));
    (void)cudaGetLastError();
    sample_rows_kernel<1><<<rows, sample_detail::kThreads, 0, stream>>>(logits, vocab, params, tokens, trace, tokens_also, radix);
}
#endif

}  // namespace scr::kernels::cuda
