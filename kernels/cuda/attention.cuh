// Paged attention over the device KV pool (layout of kernels/cpu/attention.hpp: per block, per
// layer, K then V, each [kv_heads][block_size][head_dim]). One thread block per (token, kv head)
// serves the whole grouped-query group, so each K/V row is read once for all its query heads.
// The block's warps split the sequence's KV blocks between them, each keeping an online softmax
// (running max, sum, weighted V), and merge at the end: one pass, no score buffer, any mix of
// prefill and decode tokens. Causal: a token sees positions 0..its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"

namespace scr::kernels::cuda {

// What a layer's attention adds to plain causal softmax(q k^T * scale) v (kernels/cpu/attention.hpp's
// AttnExtras). All off by default.
struct AttnExtras {
    float softcap = 0.0f;          // > 0: a score s becomes softcap * tanh(s / softcap) (Gemma 2)
    int window = 0;                // > 0: a token sees itself and the window - 1 tokens before it
    const float* sinks = nullptr;  // [HQ]: a logit per head that joins the softmax with no value
};

// What every attention block first reads about its token t (the step arrays are on the device
// before the step's first kernel, so this may run before pdl_wait()).
struct AttnToken {
    int ctx;               // positions 0 .. ctx - 1 exist, the token's own included
    int first;             // the oldest position it sees: ctx - window with a sliding window, else 0
    const int32_t* table;  // its sequence's KV block ids
};
__device__ __forceinline__ AttnToken attn_token(const DevStep& st, int t, const AttnExtras& x) {
    const int ctx = st.positions[t] + 1;
    return {ctx, x.window > 0 ? max(0, ctx - x.window) : 0, st.block_tables + size_t(st.seq_of_token[t]) * st.header[kHeaderTableStride]};
}

namespace detail {

template <int HKV, int D, int BS, typename KVT>
__global__ void kv_append_kernel(int rows, const int64_t* __restrict__ slots, const float* __restrict__ k,
                                 const float* __restrict__ v, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    if (t >= rows) return;
    const int64_t slot = slots[t];
    if (slot < 0) return;  // graph padding
    std::byte* base = kv + (slot / BS) * block_bytes;
    const int off = int(slot % BS);
    KVT* kd = reinterpret_cast<KVT*>(base + k_off);
    KVT* vd = reinterpret_cast<KVT*>(base + v_off);
    for (int j = threadIdx.x; j < HKV * D; j += blockDim.x) {
        const int h = j / D, i = j % D;
        kd[(size_t(h) * BS + off) * D + i] = from_f32<KVT>(k[size_t(t) * HKV * D + j]);
        vd[(size_t(h) * BS + off) * D + i] = from_f32<KVT>(v[size_t(t) * HKV * D + j]);
    }
}

// Blocks per SM the register budget is set for: the few-warp blocks of many-row decode steps run
// several to an SM (16 warps in all, at most 128 registers per thread).
__host__ __device__ constexpr int attention_min_blocks(int warps) { return warps <= 4 ? 16 / warps : 1; }

template <int G, int D>
__host__ __device__ constexpr int attention_warps() {
    constexpr int w = 8192 / (G * D);
    return w >= 16 ? 16 : (w < 1 ? 1 : w);
}

// Merges the warps' partial softmaxes (per head: running max m, sum l, weighted V rows acc; lane
// holds head dims lane + 32 i) into the block's output o [G][D]. A sink is one more logit in the
// softmax, with no value (sinks: the group's G logits, or null).
template <int G, int D, int NW, int DPL>
__device__ __forceinline__ void merge_warps(const float (&m)[G], const float (&l)[G], const float (&acc)[G][DPL], float (&sm_m)[NW][G],
                                            float (&sm_l)[NW][G], float (&sm_acc)[NW][G][D], const float* sinks, float* o) {
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll
    for (int h = 0; h < G; ++h) {
        if (lane == 0) {
            sm_m[warp][h] = m[h];
            sm_l[warp][h] = l[h];
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int d = lane + i * kWarp;
            if (d < D) sm_acc[warp][h][d] = acc[h][i];
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        const float sink = sinks ? sinks[h] : -INFINITY;
        float mx = sink;
        for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w][h]);
        float sum = sinks ? expf(sink - mx) : 0.0f, val = 0.0f;
        for (int w = 0; w < NW; ++w) {
            const float f = sm_l[w][h] > 0.0f ? expf(sm_m[w][h] - mx) : 0.0f;
            sum += sm_l[w][h] * f;
            val += sm_acc[w][h][d] * f;
        }
        o[idx] = val / sum;
    }
}

// One block's work for token t and kv head g: its warps walk the visible KV blocks with an online
// softmax each (keys in groups of 8, all loads of a group issued first), then merge into o [G][D].
// qg: G query heads of the group (all of it, or a split's share), rotated (global or shared
// memory); sinks: those heads' sink logits or null. Each head's arithmetic depends on NW, never on
// G, so a head gets the same bits whether its block serves the whole group or part of it.
template <int G, int D, int BS, typename KVT, int NW>
__device__ __forceinline__ void attend_group(int g, int ctx, int first, const int32_t* table, const float* qg, const std::byte* kv,
                                             int64_t block_bytes, int64_t k_off, int64_t v_off, float scale, const AttnExtras& x,
                                             const float* sinks, float* o) {
    constexpr int DPL = (D + kWarp - 1) / kWarp;  // head dims per lane
    static_assert(G * D <= 8192, "grouped heads x head_dim too large for one thread block's merge buffer");
    __shared__ float sm_m[NW][G], sm_l[NW][G];
    __shared__ float sm_acc[NW][G][D];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

    float qr[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int d = lane + i * kWarp;
            qr[h][i] = d < D ? qg[h * D + d] : 0.0f;
            acc[h][i] = 0.0f;
        }
    }
    const int nblocks = (ctx + BS - 1) / BS;
    for (int blk = first / BS + warp; blk < nblocks; blk += NW) {
        const std::byte* base = kv + int64_t(table[blk]) * block_bytes;
        const KVT* kb = reinterpret_cast<const KVT*>(base + k_off) + size_t(g) * BS * D;
        const KVT* vb = reinterpret_cast<const KVT*>(base + v_off) + size_t(g) * BS * D;
        const int j0 = max(0, first - blk * BS), n = min(BS, ctx - blk * BS);
        // Keys in groups of kKeys: all their loads are issued before any is used (one memory
        // latency per group, not per key), and the running max/sum is rescaled once per group.
        constexpr int kKeys = BS % 8 == 0 ? 8 : (BS % 4 == 0 ? 4 : 1);
        for (int jg = 0; jg < BS; jg += kKeys) {
            if (jg >= n) break;
            if (jg + kKeys <= j0) continue;
            float kd[kKeys][DPL], vd[kKeys][DPL];
#pragma unroll
            for (int jj = 0; jj < kKeys; ++jj) {
                const int j = jg + jj;
                const bool live = j >= j0 && j < n;
#pragma unroll
                for (int i = 0; i < DPL; ++i) {
                    const int d = lane + i * kWarp;
                    kd[jj][i] = live && d < D ? to_f32(kb[size_t(j) * D + d]) : 0.0f;
                    vd[jj][i] = live && d < D ? to_f32(vb[size_t(j) * D + d]) : 0.0f;
                }
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {
                float sc[kKeys];
                float m_grp = m[h];
#pragma unroll
                for (int jj = 0; jj < kKeys; ++jj) {
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) s += qr[h][i] * kd[jj][i];
                    s = warp_sum(s) * scale;
                    if (x.softcap > 0.0f) s = x.softcap * tanhf(s / x.softcap);
                    const int j = jg + jj;
                    sc[jj] = (j >= j0 && j < n) ? s : -INFINITY;
                    m_grp = fmaxf(m_grp, sc[jj]);
                }
                const float alpha = expf(m[h] - m_grp);  // 0 on the first keys (m = -inf)
                l[h] *= alpha;
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[h][i] *= alpha;
#pragma unroll
                for (int jj = 0; jj < kKeys; ++jj) {
                    const float p = expf(sc[jj] - m_grp);  // 0 for keys outside [j0, n)
                    l[h] += p;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) acc[h][i] += p * vd[jj][i];
                }
                m[h] = m_grp;
            }
        }
    }
    merge_warps<G, D, NW, DPL>(m, l, acc, sm_m, sm_l, sm_acc, sinks, o);
}

template <int HQ, int HKV, int D, int BS, typename KVT, int NW = attention_warps<HQ / HKV, D>()>
__global__ void __launch_bounds__(NW * kWarp, attention_min_blocks(NW))
attention_kernel(int rows, const DevStep st, const float* __restrict__ q, const std::byte* __restrict__ kv, int64_t block_bytes,
                 int64_t k_off, int64_t v_off, float scale, const AttnExtras x, float* __restrict__ out,
                 const __grid_constant__ L2Plan pf) {
    constexpr int G = HQ / HKV;
    const int t = blockIdx.x, g = blockIdx.y;
    if (t >= rows) {  // the blocks past the tokens prefetch upcoming weights (read-only: no wait needed)
        if (pf.after_wait) pdl_wait();
        l2_prefetch_part(pf, int64_t(t - rows) * gridDim.y + g, int64_t(gridDim.x - rows) * gridDim.y);
        return;
    }
    pdl_wait();
    pdl_trigger();
    float* o = out + (size_t(t) * HQ + size_t(g) * G) * D;
    if (t >= st.header[kHeaderTokens]) {  // graph padding: a defined output, no reads
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    const auto [ctx, first, table] = attn_token(st, t, x);
    attend_group<G, D, BS, KVT, NW>(g, ctx, first, table, q + (size_t(t) * HQ + size_t(g) * G) * D, kv, block_bytes, k_off, v_off,
                                    scale, x, x.sinks ? x.sinks + g * G : nullptr, o);
}


// Decode attention with RoPE and the KV append folded in, for steps where every sequence has one
// token (Ctx::one_token_per_seq): then only this block reads its token's new K/V row, so nothing
// has to reach memory before the attention starts. The block rotates its G query heads and its key
// head exactly as rope_kernel does, writes K and V to the slot, and reads the current position back
// from the cache after a barrier, like every other position (earlier ones were written by kernels
// of earlier steps, so this warp's KV blocks are prefetched into L2 before pdl_wait()). Same keys,
// same order, same arithmetic as rope_append + attention_kernel.
// GS > 1 splits the group's query heads over GS blocks (blockIdx.y = kv head * GS + split): a
// few-token step then spreads over GS times more SMs (each block's score and merge arithmetic is
// what bounds it: 8 blocks of an 8B batch-1 step issued for ~15 us). Every split rotates the key
// and writes the same K/V row to the slot (the same bits, so the row is defined whichever write
// lands last) and reads it back like the other positions; the per-head bits do not change.
template <int HQ, int HKV, int D, int ROT, int BS, typename KVT, int NW = attention_warps<HQ / HKV, D>(), int GS = 1>
__global__ void __launch_bounds__(NW * kWarp, attention_min_blocks(NW))
rope_attention_kernel(int rows, const DevStep st, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                      const __grid_constant__ RopeFreqs<ROT / 2> f, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off,
                      float scale, const AttnExtras x, float* __restrict__ out, const __grid_constant__ L2Plan pf) {
    constexpr int G = HQ / HKV;
    static_assert(G % GS == 0, "the head split must divide the query group");
    constexpr int GH = G / GS;  // query heads of this block
    constexpr int kHalf = ROT / 2;
    __shared__ float sm_q[GH + 1][D];  // this block's query heads of the token, then its key head (rotated)
    __shared__ float sm_v[D];

    pdl_trigger();
    const int t = blockIdx.x, g = blockIdx.y / GS, h0 = (blockIdx.y % GS) * GH;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (t >= rows) {  // the blocks past the tokens prefetch upcoming weights (read-only: no wait needed)
        if (pf.after_wait) pdl_wait();
        l2_prefetch_part(pf, int64_t(t - rows) * gridDim.y + g, int64_t(gridDim.x - rows) * gridDim.y);
        return;
    }
    // The step arrays were copied before the step's first kernel: readable before pdl_wait().
    const bool padding = t >= st.header[kHeaderTokens];
    const auto [ctx, first, table] = attn_token(st, t, x);
    const int nblocks = (ctx + BS - 1) / BS;
    if (!padding) {
        constexpr int kRowBytes = BS * D * int(sizeof(KVT));
        for (int blk = first / BS + warp; blk < nblocks; blk += NW) {
            const std::byte* base = kv + int64_t(table[blk]) * block_bytes + size_t(g) * kRowBytes;
            for (int off = lane * 32; off < kRowBytes; off += kWarp * 32) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(base + k_off + off));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(base + v_off + off));
            }
        }
    }
    pdl_wait();
    float* o = out + (size_t(t) * HQ + size_t(g) * G + h0) * D;
    if (padding) {  // graph padding: a defined output, no reads, no KV write
        for (int i = threadIdx.x; i < GH * D; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    for (int i = threadIdx.x; i < GH * D; i += blockDim.x) sm_q[i / D][i % D] = q[(size_t(t) * HQ + size_t(g) * G + h0) * D + i];
    for (int i = threadIdx.x; i < D; i += blockDim.x) {
        sm_q[GH][i] = k[(size_t(t) * HKV + g) * D + i];
        sm_v[i] = v[(size_t(t) * HKV + g) * D + i];
    }
    __syncthreads();
    const float pos = float(ctx - 1);
    for (int w = threadIdx.x; w < (GH + 1) * kHalf; w += blockDim.x) {
        const int h = w / kHalf, i = w % kHalf;
        float sn, cs;
        sincosf(pos * f.inv_freq[i], &sn, &cs);
        rotate_pair<ROT>(sm_q[h], sm_q[h], i, cs, sn);
    }
    __syncthreads();
    const int64_t slot = st.slot_mapping[t];
    KVT* kd_out = nullptr;
    KVT* vd_out = nullptr;
    if (slot >= 0) {
        std::byte* base = kv + (slot / BS) * block_bytes;
        kd_out = reinterpret_cast<KVT*>(base + k_off) + (size_t(g) * BS + slot % BS) * D;
        vd_out = reinterpret_cast<KVT*>(base + v_off) + (size_t(g) * BS + slot % BS) * D;
    }
    if (kd_out) {
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            kd_out[i] = from_f32<KVT>(sm_q[GH][i]);
            vd_out[i] = from_f32<KVT>(sm_v[i]);
        }
    }
    // The block's own global writes are visible to all its threads after the barrier: the key
    // loop then reads this position from the cache like any other.
    __syncthreads();
    attend_group<GH, D, BS, KVT, NW>(g, ctx, first, table, &sm_q[0][0], kv, block_bytes, k_off, v_off, scale, x,
                                     x.sinks ? x.sinks + g * G + h0 : nullptr, o);
}

// The same attention with one key per lane (tiles of 32 keys per warp): a lane scores its key
// against the group's queries alone, with no reduction across lanes, and the warp rescales once per
// tile. Fewer dependent steps per key than attention_kernel, but a warp needs 32 keys of context to
// be busy: used for prefill-sized launches, whose tokens see long contexts.
template <int HQ, int HKV, int D, int BS, typename KVT>
__global__ void __launch_bounds__(attention_warps<HQ / HKV, D>() * kWarp)
attention_keys_kernel(int rows, const DevStep st, const float* __restrict__ q, const std::byte* __restrict__ kv, int64_t block_bytes,
                      int64_t k_off, int64_t v_off, float scale, const AttnExtras x, float* __restrict__ out) {
    constexpr int G = HQ / HKV;
    constexpr int NW = attention_warps<G, D>();
    constexpr int DPL = (D + kWarp - 1) / kWarp;  // head dims per lane
    __shared__ float sm_m[NW][G], sm_l[NW][G];
    __shared__ float sm_acc[NW][G][D];
    __shared__ float sm_q[G * D];
    __shared__ float sm_p[NW][kWarp][G];
    static_assert(sizeof(float) * (NW * G * (2 + D + kWarp) + G * D) <= 48 * 1024,
                  "attention_keys_kernel: grouped heads x head_dim need more than 48 KiB of shared memory");

    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, g = blockIdx.y;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (t >= rows) return;
    float* o = out + (size_t(t) * HQ + size_t(g) * G) * D;
    if (t >= st.header[kHeaderTokens]) {  // graph padding: a defined output, no reads
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    const auto [ctx, first, table] = attn_token(st, t, x);
    for (int i = threadIdx.x; i < G * D; i += blockDim.x) sm_q[i] = q[(size_t(t) * HQ + size_t(g) * G) * D + i];
    __syncthreads();

    float acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;  // this lane's keys only; summed over the warp at the end
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[h][i] = 0.0f;
    }
    const int tiles = (ctx + kWarp - 1) / kWarp;
    for (int tile = first / kWarp + warp; tile < tiles; tile += NW) {
        const int j = tile * kWarp + lane;
        const bool live = j >= first && j < ctx;
        const int jj = live ? j : max(first, tile * kWarp);  // a valid key to read when not live
        const std::byte* base = kv + int64_t(table[jj / BS]) * block_bytes;
        const KVT* krow = reinterpret_cast<const KVT*>(base + k_off) + (size_t(g) * BS + jj % BS) * D;
        float s[G];
#pragma unroll
        for (int h = 0; h < G; ++h) s[h] = 0.0f;
        using V = Vec16<KVT>;
        static_assert(D % V::n == 0, "head_dim must be a whole number of 16-byte chunks");
#pragma unroll 4
        for (int c = 0; c < D / V::n; ++c) {
            float kd[V::n];
            V::unpack(*reinterpret_cast<const uint4*>(krow + c * V::n), kd);
#pragma unroll
            for (int e = 0; e < V::n; ++e)
#pragma unroll
                for (int h = 0; h < G; ++h) s[h] += sm_q[h * D + c * V::n + e] * kd[e];
        }
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float sc = s[h] * scale;
            if (x.softcap > 0.0f) sc = x.softcap * tanhf(sc / x.softcap);
            sc = live ? sc : -INFINITY;
            const float m_new = fmaxf(m[h], warp_max(sc));  // finite: a tile holds at least one live key
            const float alpha = expf(m[h] - m_new);          // 0 on the first tile (m = -inf)
            const float p = expf(sc - m_new);                // 0 for keys that are not live
            l[h] = l[h] * alpha + p;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[h][i] *= alpha;
            m[h] = m_new;
            sm_p[warp][lane][h] = p;
        }
        __syncwarp();
        // V rows 8 keys at a time, all loads issued before use (keys that are not live weigh 0).
        constexpr int kAhead = 8;
        const int n = min(kWarp, ctx - tile * kWarp);
        for (int k0 = max(0, first - tile * kWarp); k0 < n; k0 += kAhead) {
            float vd[kAhead][DPL];
#pragma unroll
            for (int u = 0; u < kAhead; ++u) {
                const int jk = tile * kWarp + min(k0 + u, n - 1);
                const std::byte* vbase = kv + int64_t(table[jk / BS]) * block_bytes;
                const KVT* vrow = reinterpret_cast<const KVT*>(vbase + v_off) + (size_t(g) * BS + jk % BS) * D;
#pragma unroll
                for (int i = 0; i < DPL; ++i) {
                    const int d = lane + i * kWarp;
                    vd[u][i] = d < D ? to_f32(vrow[d]) : 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < kAhead; ++u) {
                if (k0 + u >= n) break;
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    const float p = sm_p[warp][k0 + u][h];
#pragma unroll
                    for (int i = 0; i < DPL; ++i) acc[h][i] += p * vd[u][i];
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int h = 0; h < G; ++h) l[h] = warp_sum(l[h]);
    merge_warps<G, D, NW, DPL>(m, l, acc, sm_m, sm_l, sm_acc, x.sinks ? x.sinks + g * G : nullptr, o);
}

}  // namespace detail

}  // namespace scr::kernels::cuda

#include "kernels/cuda/attention_prefill.cuh"  // after AttnExtras and attn_token; picked in attention() below

namespace scr::kernels::cuda {

// Writes this step's K and V rows into their KV slots.
template <int HKV, int D, int BS, typename KVT>
void kv_append(const Ctx& c, int rows, const float* k, const float* v, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off) {
    if (rows <= 0) return;
    launch(c, detail::kv_append_kernel<HKV, D, BS, KVT>, dim3(rows), dim3(128), rows, c.step.slot_mapping, k, v, kv, block_bytes, k_off, v_off);
}

constexpr int kAttentionDecodeMaxRows = 64;

// Decode steps of many sequences (from kAttentionManyRows rows, one token per sequence, up to
// kAttentionFusedMaxRows) run the per-key-group kernels with kAttentionManyRowsWarps warps per block
// instead of 16: at 128 registers per thread a 16-warp block fills an SM's register file, so the
// 512 blocks of an 8B step at B = 64 ran in four waves (60 us per layer, docs/CUDA.md); 4-warp blocks
// run four to an SM. The warp count changes the order a token's keys are summed in, so it is a
// function of the row count's regime only (1-32 / 33 and up, as the linears' regimes), never of the
// exact batch: a sequence's bits do not depend on the other rows of its regime. No L2 prefetch
// blocks here (the step's GEMMs keep HBM busy).
constexpr int kAttentionManyRows = 33;
constexpr int kAttentionFusedMaxRows = 256;
constexpr int kAttentionManyRowsWarps = 4;

// Causal attention of every token's query heads over its sequence's KV blocks (already appended).
template <int HQ, int HKV, int D, int BS, typename KVT>
void attention(const Ctx& c, int rows, const float* q, const std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off,
               float scale, float* out, const AttnExtras& extras = {}) {
    static_assert(HQ % HKV == 0, "query heads must be a multiple of kv heads");
    if (rows <= 0) return;
    constexpr int NW = detail::attention_warps<HQ / HKV, D>();
    // Decode-sized launches (short contexts per token) take the per-key-group kernel; prefill-sized
    // ones the key-per-lane kernel (docs/CUDA.md has both measured).
    if (c.one_token_per_seq && rows >= kAttentionManyRows && rows <= kAttentionFusedMaxRows) {
        constexpr int NWM = std::min(NW, kAttentionManyRowsWarps);
        launch(c, detail::attention_kernel<HQ, HKV, D, BS, KVT, NWM>, dim3(rows, HKV), dim3(NWM * kWarp), rows, c.step, q, kv,
               block_bytes, k_off, v_off, scale, extras, out, L2Plan{});
    } else if (rows <= kAttentionDecodeMaxRows) {
        // Decode attention reads little from HBM: with SCR_CUDA_L2_PREFETCH=1, extra columns of
        // blocks prefetch the next launches' weights into L2 (Ctx::l2, from the emitter; off: none).
        const L2Plan pf = l2_plan(c.l2, L2Site::attention);
        const int extra = ceil_div(l2_prefetch_blocks(pf, NW * kWarp), HKV);
        launch(c, detail::attention_kernel<HQ, HKV, D, BS, KVT>, dim3(rows + extra, HKV), dim3(NW * kWarp), rows, c.step, q, kv,
               block_bytes, k_off, v_off, scale, extras, out, pf);
    } else {
        if constexpr (attention_prefill_mma_fits<HQ, HKV, D, KVT>()) {
            if (attention_prefill_mma_on()) {
                launch(c, detail::attention_prefill_mma_kernel<HQ, HKV, D, BS>, dim3(ceil_div(rows, detail::kPrefillRows), HKV),
                       dim3(HQ / HKV * kWarp), rows, c.step, q, kv, block_bytes, k_off, v_off, scale, extras, out);
                return;
            }
        }
        launch(c, detail::attention_keys_kernel<HQ, HKV, D, BS, KVT>, dim3(rows, HKV), dim3(NW * kWarp), rows, c.step, q, kv,
               block_bytes, k_off, v_off, scale, extras, out);
    }
}

// Decode steps of so few tokens that one block per query head still fits on the GPU at once split
// each group's heads over their own blocks (rope_attention_kernel's GS): the SM count, or what
// SCR_CUDA_ATTN_SPLIT asks (0: never split, for A/B runs), or the tests' attention_split_override().
inline int attention_split_max_blocks() {
    if (attention_split_override() >= 0) return attention_split_override();
    static const int blocks = [] {
        if (const char* e = std::getenv("SCR_CUDA_ATTN_SPLIT"); e && *e) return std::atoi(e);
        int dev = 0, sms = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        return sms;
    }();
    return blocks;
}

// SCR_CUDA_ROPE_ATTN=0: RoPE + KV append and attention as two launches in every step (kept for
// A/B runs); by default one launch (rope_attention_kernel) where every sequence has one token.
inline bool rope_attention_fused_on() {
    static const bool on = [] {
        const char* e = std::getenv("SCR_CUDA_ROPE_ATTN");
        return !(e && e[0] == '0');
    }();
    return on;
}

// RoPE on q and k, this step's K and V into their KV slots, then attention (what rope_append
// followed by attention does): one launch for decode steps with one token per sequence and at most
// kAttentionFusedMaxRows rows, otherwise those two launches (rotated q goes to q_out).
template <int HQ, int HKV, int D, int ROT, int BS, typename KVT>
void rope_attention(const Ctx& c, int rows, const float* q, const float* k, const float* v, float* q_out,
                    const RopeFreqs<ROT / 2>& f, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off, float scale,
                    float* out, const AttnExtras& extras = {}) {
    static_assert(HQ % HKV == 0, "query heads must be a multiple of kv heads");
    static_assert(ROT % 2 == 0 && ROT <= D, "rotary dims must be even and within head_dim");
    if (rows <= 0) return;
    if (c.one_token_per_seq && rows >= kAttentionManyRows && rows <= kAttentionFusedMaxRows && rope_attention_fused_on()) {
        constexpr int NWM = std::min(detail::attention_warps<HQ / HKV, D>(), kAttentionManyRowsWarps);
        launch(c, detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT, NWM>, dim3(rows, HKV), dim3(NWM * kWarp), rows, c.step, q, k,
               v, f, kv, block_bytes, k_off, v_off, scale, extras, out, L2Plan{});
        return;
    }
    if (c.one_token_per_seq && rows <= kAttentionDecodeMaxRows && rope_attention_fused_on()) {
        constexpr int NW = detail::attention_warps<HQ / HKV, D>();
        const L2Plan pf = l2_plan(c.l2, L2Site::attention);  // as in attention() above
        if (rows * HQ <= attention_split_max_blocks()) {  // one block per query head (same bits, more SMs)
            constexpr int GS = HQ / HKV;
            const int extra = ceil_div(l2_prefetch_blocks(pf, NW * kWarp), HKV * GS);
            launch(c, detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT, NW, GS>, dim3(rows + extra, HKV * GS), dim3(NW * kWarp), rows,
                   c.step, q, k, v, f, kv, block_bytes, k_off, v_off, scale, extras, out, pf);
            return;
        }
        const int extra = ceil_div(l2_prefetch_blocks(pf, NW * kWarp), HKV);
        launch(c, detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT>, dim3(rows + extra, HKV), dim3(NW * kWarp), rows, c.step, q, k,
               v, f, kv, block_bytes, k_off, v_off, scale, extras, out, pf);
        return;
    }
    rope_append<HQ, HKV, D, ROT, BS, KVT>(c, rows, q, k, v, q_out, f, kv, block_bytes, k_off, v_off);
    attention<HQ, HKV, D, BS, KVT>(c, rows, q_out, kv, block_bytes, k_off, v_off, scale, out, extras);
}

}  // namespace scr::kernels::cuda
