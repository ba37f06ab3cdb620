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

// The decode attention's context split (detail::part_slot and below).
constexpr int kAttentionMaxParts = 4;    // the default most parts (SCR_CUDA_ATTN_PARTS: 1 .. kAttentionPartsLimit)
constexpr int kAttentionPartsLimit = 8;  // what the workspace is sized for
constexpr int kAttentionPartsRows = 1;   // rows a launch with parts may have (linear.cuh: kMmaMinRows - 1)

// Floats of the workspace (Ctx::attn_ws) for a model of hq query heads of head_dim d: the tickets
// (kAttentionPartsRows * hq unsigned ints, zero between launches), then the partials, (d + 2) floats
// each, [row][query head][part]. The CUDA emitter sizes the model's workspace with the same formula.
__host__ __device__ constexpr int64_t attention_workspace_floats(int hq, int d) {
    return int64_t(kAttentionPartsRows) * hq * (1 + int64_t(kAttentionPartsLimit) * (d + 2));
}

// How many parts a token's nvis visible KV blocks take: one more per NW blocks, at most max (each
// virtual warp has at least one KV block, or P = 1).
__host__ __device__ constexpr int attention_parts(int nvis, int nw, int max_parts) {
    const int p = nvis / nw;
    return p < 1 ? 1 : (p > max_parts ? max_parts : p);
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

// The merge's second half: out of every warp's (m, l, acc[D]) per head in shared memory, the
// block's output o [G][D] (warps in order; a sink joins the softmax with no value).
template <int G, int D, int NW>
__device__ __forceinline__ void merge_combine(const float (&sm_m)[NW][G], const float (&sm_l)[NW][G], const float (&sm_acc)[NW][G][D],
                                              const float* sinks, float* o) {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        const float sink = sinks ? sinks[h] : -INFINITY;
        float mx = sink;
#pragma unroll
        for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w][h]);
        float sum = sinks ? expf(__fsub_rn(sink, mx)) : 0.0f, val = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {  // explicit roundings, as in warp_attend_vec
            const float f = sm_l[w][h] > 0.0f ? expf(__fsub_rn(sm_m[w][h], mx)) : 0.0f;
            sum = __fmaf_rn(sm_l[w][h], f, sum);
            val = __fmaf_rn(sm_acc[w][h][d], f, val);
        }
        o[idx] = __fdiv_rn(val, sum);
    }
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
    merge_combine<G, D, NW>(sm_m, sm_l, sm_acc, sinks, o);
}

// ---- The context split of the decode launches (flash-decoding's idea).
// vLLM: vllm/attention/ops/triton_decode_attention.py:L57 (_fwd_kernel_stage1: a program per
// sequence, head and KV split, each a contiguous range, its output normalized with its log-sum-exp;
// _fwd_kernel_stage2, a second kernel, merges the splits). Ours: interleaved KV blocks per virtual
// warp, unnormalized partials with their max and sum, merged by the last block (no second launch),
// and a part count set by the context alone. A token's NW warps of online softmax
// become P(ctx) * NW "virtual" warps, P blocks per query-head block, each walking every
// (P * NW)-th visible KV block: a long context's chain of KV blocks per warp is P times shorter,
// on P times the SMs. Each block merges its warps into one partial per head (max, sum, unscaled
// weighted V) in a workspace; the last of the P blocks to finish (a ticket per block group, reset by
// it) merges the P partials in order. P is a function of the token's context alone (never of the
// batch or of the launch's shape), and with P = 1 nothing changes: the single-block merge as before.
// Launches of one row only (the bf16 GEMV's regime, which already sets a sequence's bits apart from
// the 2-32-row MMA linears): a head's result depends on its context, not on the head split or the
// launch (fused or not). Launches of more rows keep the single-block merge (P = 1): parts reaching
// past the regime would make a sequence's bits depend on the batch inside the MMA linears' regime,
// and at 16 rows, where the blocks fill the SMs anyway, the parts taken in turn cost 3 % (8B) / 5 %
// (1B) at 2k context (docs/CUDA.md, "Session 26"). The parts of several rows and of graph padding
// rows were checked at up to 8 rows in session 26; with one row they are not exercised now.

// One block's place in a split token: its parts (part, part + step, ... below parts), its heads'
// partials (head h of the block, part p at partials + h * stride + p * (D + 2): D unscaled
// weighted-V dims, max, sum), and, where more than one block shares the token's parts, their ticket
// and how many take one.
struct PartSlot {
    int part = 0, parts = 1, step = 1;
    float* partials = nullptr;
    int stride = 0;
    unsigned* ticket = nullptr;
    int arrivals = 1;
};

// A block's warps' (m, l, acc) per head (shared memory) merged into the block's partial: the max of
// the warps' maxima, the sum and the weighted V rows rescaled to it (merge_combine's arithmetic, no
// sink, not divided).
template <int G, int D, int NW>
__device__ __forceinline__ void part_combine(const float (&sm_m)[NW][G], const float (&sm_l)[NW][G], const float (&sm_acc)[NW][G][D],
                                             float* part, int stride) {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w][h]);
        float sum = 0.0f, val = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float f = sm_l[w][h] > 0.0f ? expf(__fsub_rn(sm_m[w][h], mx)) : 0.0f;
            sum = __fmaf_rn(sm_l[w][h], f, sum);
            val = __fmaf_rn(sm_acc[w][h][d], f, val);
        }
        float* ph = part + size_t(h) * stride;
        ph[d] = val;
        if (d == 0) {
            ph[D] = mx;
            ph[D + 1] = sum;
        }
    }
}

// The last block's merge of its token's `parts` partials (in part order; a sink joins here, once)
// into o [G][D]. The partials were written by other blocks: read through L2 (__ldcg).
template <int G, int D>
__device__ __forceinline__ void parts_merge(const float* partials, int stride, int parts, const float* sinks, float* o) {
    for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        const float* ph = partials + size_t(h) * stride;
        const float sink = sinks ? sinks[h] : -INFINITY;
        float mx = sink;
        for (int p = 0; p < parts; ++p) mx = fmaxf(mx, __ldcg(ph + p * (D + 2) + D));
        float sum = sinks ? expf(__fsub_rn(sink, mx)) : 0.0f, val = 0.0f;
        for (int p = 0; p < parts; ++p) {
            const float* pp = ph + p * (D + 2);
            const float l = __ldcg(pp + D + 1);
            const float f = l > 0.0f ? expf(__fsub_rn(__ldcg(pp + D), mx)) : 0.0f;
            sum = __fmaf_rn(l, f, sum);
            val = __fmaf_rn(__ldcg(pp + d), f, val);
        }
        o[idx] = __fdiv_rn(val, sum);
    }
}

// The launch's side of the split: the workspace, the most parts a token takes, and gridDim.z, the
// blocks that share a token's parts (block z takes parts z, z + blocks, ...; 1: one block takes them
// all in turn, which spreads nothing but keeps the bits of a launch that has the SMs for more).
struct AttnParts {
    float* ws = nullptr;
    int max = 1;
    int blocks = 1;
    int every_token = 0;  // > 0: every token takes this many parts (attention_parts_every_token_override)
};

// Block (t, heads hq0 .. hq0 + GH - 1, blockIdx.z) of a launch with ap: its PartSlot for a token of
// nvis visible KV blocks, or parts = 0 when this block has no part (z >= P).
template <int HQ, int D, int NW>
__device__ __forceinline__ PartSlot part_slot(const AttnParts& ap, int t, int hq0, int nvis) {
    PartSlot ps;
    if (ap.max <= 1) return ps;
    ps.parts = ap.every_token > 0 ? min(ap.every_token, ap.max) : attention_parts(nvis, NW, ap.max);
    ps.part = blockIdx.z;
    ps.step = ap.blocks;
    if (ps.part >= ps.parts) {
        ps.parts = 0;
        return ps;
    }
    if (ps.parts == 1) return ps;
    ps.stride = ap.max * (D + 2);
    ps.partials = ap.ws + size_t(kAttentionPartsRows) * HQ + (size_t(t) * HQ + hq0) * size_t(ps.stride);
    ps.arrivals = min(ap.blocks, ps.parts);
    if (ps.arrivals > 1) ps.ticket = reinterpret_cast<unsigned*>(ap.ws) + size_t(t) * HQ + hq0;
    return ps;
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

// ---- Decode attention in the vector layout (the launches of at most kAttentionDecodeMaxRows rows).
// A KV row is read as 16-byte pieces: LPR lanes per row, lane c of a row holding head dims
// c * Vn .. c * Vn + Vn - 1, RPL = 32 / LPR rows per load instruction, so a warp asks for whole
// rows at once and all of a KV block's K and V rows are in flight together (one memory latency
// per block, where the scalar loop of attend_group had one per 8 keys and a 5-step butterfly per
// key). Shapes whose rows do not split that way keep attend_group.
template <int D, typename KVT>
struct KvVec {
    static constexpr int Vn = Vec16<KVT>::n;  // head dims per 16-byte piece
    static constexpr int LPR = D % Vn == 0 ? D / Vn : 0;
    static constexpr bool row_fits = LPR >= 1 && LPR <= kWarp && (LPR & (LPR - 1)) == 0;
    static constexpr int RPL = row_fits ? kWarp / LPR : 1;  // rows per load instruction
};
template <int D, int BS, typename KVT>
__host__ __device__ constexpr bool attend_vec_fits() {
    return KvVec<D, KVT>::row_fits && BS % KvVec<D, KVT>::RPL == 0;
}
// Whether a model's decode launches take attend_group_vec: its rows split that way, and a whole
// query group's q and acc pieces fit in 64 registers (a lane holds Vn dims of each head, where the
// scalar loop holds D / 32). A function of the group (G), never of a block's share of it, so a
// head's bits do not depend on the head split.
template <int G, int D, int BS, typename KVT>
__host__ __device__ constexpr bool attend_vec_on() {
    return attend_vec_fits<D, BS, KVT>() && G * KvVec<D, KVT>::Vn <= 32;
}

// rows per lane per softmax step of warp_attend_vec (a function of D and KVT only: it sets the bits)
template <int D, int BS, typename KVT>
__host__ __device__ constexpr int vec_step_rows() {
    constexpr int NL = BS / KvVec<D, KVT>::RPL;
    return NL < 4 ? NL : 4;
}

// One warp's K and V pieces of a whole KV block, held in registers ahead of use where that leaves
// room (`on`: 8 registers per row a lane holds, besides GH heads' q and acc pieces). The caller may
// fill it before pdl_wait() for the warp's first block: rows of earlier steps are in the cache by
// then, and the current position, which this launch writes, is taken from cur_k / cur_v anyway.
template <int GH, int D, int BS, typename KVT>
struct VecAhead {
    static constexpr int NL = BS / KvVec<D, KVT>::RPL;
    static constexpr bool on = NL * 8 + GH * (2 * KvVec<D, KVT>::Vn + vec_step_rows<D, BS, KVT>()) <= 96;
    uint4 k[on ? NL : 1], v[on ? NL : 1];
    int blk = -1;  // the KV block (index into the sequence's table) they hold, or -1

    // Loads block blk of kv head g (rows outside first .. ctx - 1 as zeros).
    __device__ __forceinline__ void load(int g, int ctx, int first, const int32_t* table, int b, const std::byte* kv, int64_t block_bytes,
                                         int64_t k_off, int64_t v_off) {
        using L = KvVec<D, KVT>;
        const int lane = threadIdx.x % kWarp, c = lane % L::LPR, r = lane / L::LPR;
        const std::byte* base = kv + int64_t(table[b]) * block_bytes;
        const KVT* kb = reinterpret_cast<const KVT*>(base + k_off) + size_t(g) * BS * D + c * L::Vn;
        const KVT* vb = reinterpret_cast<const KVT*>(base + v_off) + size_t(g) * BS * D + c * L::Vn;
        const int j0 = max(0, first - b * BS), n = min(BS, ctx - b * BS);
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int j = i * L::RPL + r;
            k[i] = j >= j0 && j < n ? *reinterpret_cast<const uint4*>(kb + size_t(j) * D) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int j = i * L::RPL + r;
            v[i] = j >= j0 && j < n ? *reinterpret_cast<const uint4*>(vb + size_t(j) * D) : make_uint4(0, 0, 0, 0);
        }
        blk = b;
    }
};

// One warp's online softmax over KV blocks blk0, blk0 + stride, ... of kv head g, for the GH query
// heads at qg [GH][D] (shared or global memory). A lane holds rows i * RPL + lane / LPR (i < NL) of
// a block. Per block: K and V pieces loaded (all of the block's at once where registers allow,
// else each step's), then in steps of SR rows per lane: the partial dot products summed over a
// row's LPR lanes, the step's max over the warp, the running max/sum rescaled, p and p * V over
// the lane's own rows. At the end l and acc are summed over the warp's row groups. cur_k / cur_v
// (float [D], or null): position ctx - 1 taken from there (rounded to KVT, as the cache holds it)
// instead of its cache row, which this launch is writing. Out: m (max), l (sum), acc[h][e] = head
// dim (lane % LPR) * Vn + e, the same in every lane. SR depends on D and KVT only, and every
// rounding is an explicit intrinsic (no contraction left to the compiler: its choices followed the
// code's shape, and a head's bits differed between GH = 1 and 4 without them), so a head's bits
// depend neither on GH nor on what is loaded ahead.
template <int GH, int D, int BS, typename KVT>
__device__ __forceinline__ void warp_attend_vec(int g, int ctx, int first, const int32_t* table, int blk0, int stride,
                                                const float* qg, const std::byte* kv, int64_t block_bytes, int64_t k_off,
                                                int64_t v_off, float scale, float softcap, const float* cur_k, const float* cur_v,
                                                VecAhead<GH, D, BS, KVT>& ahead, float (&m)[GH], float (&l)[GH],
                                                float (&acc)[GH][KvVec<D, KVT>::Vn]) {
    using L = KvVec<D, KVT>;
    using V = Vec16<KVT>;
    constexpr int Vn = L::Vn, LPR = L::LPR, RPL = L::RPL, NL = BS / RPL;
    static_assert(attend_vec_fits<D, BS, KVT>(), "warp_attend_vec: KV rows do not split into 16-byte pieces over a warp");
    constexpr int SR = vec_step_rows<D, BS, KVT>();
    constexpr bool kAhead = VecAhead<GH, D, BS, KVT>::on;  // a whole block's pieces loaded at once
    const int lane = threadIdx.x % kWarp, c = lane % LPR, r = lane / LPR;
    float q[GH][Vn];
#pragma unroll
    for (int h = 0; h < GH; ++h) {
#pragma unroll
        for (int e = 0; e < Vn; e += 4) {
            const float4 v4 = *reinterpret_cast<const float4*>(qg + h * D + c * Vn + e);
            q[h][e] = v4.x, q[h][e + 1] = v4.y, q[h][e + 2] = v4.z, q[h][e + 3] = v4.w;
        }
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < Vn; ++e) acc[h][e] = 0.0f;
    }
    const int nblocks = (ctx + BS - 1) / BS;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int blk = blk0; blk < nblocks; blk += stride) {
        const std::byte* base = kv + int64_t(table[blk]) * block_bytes;
        const KVT* kb = reinterpret_cast<const KVT*>(base + k_off) + size_t(g) * BS * D + c * Vn;
        const KVT* vb = reinterpret_cast<const KVT*>(base + v_off) + size_t(g) * BS * D + c * Vn;
        const int j0 = max(0, first - blk * BS), n = min(BS, ctx - blk * BS);
        const int jcur = ctx - 1 - blk * BS;  // the current position's row in this block (or outside it)
        auto live = [&](int i) { const int j = i * RPL + r; return j >= j0 && j < n; };
        auto load = [&](const KVT* p, int i) { return live(i) ? *reinterpret_cast<const uint4*>(p + size_t(i * RPL + r) * D) : zero; };
        auto piece = [&](const float* cur, int i, uint4 raw, float (&f)[Vn]) {
            V::unpack(raw, f);
            if (cur && i * RPL + r == jcur) {
#pragma unroll
                for (int e = 0; e < Vn; ++e) f[e] = to_f32(from_f32<KVT>(cur[c * Vn + e]));
            }
        };
        if constexpr (kAhead) {
            if (ahead.blk != blk) ahead.load(g, ctx, first, table, blk, kv, block_bytes, k_off, v_off);
        }
#pragma unroll
        for (int i0 = 0; i0 < NL; i0 += SR) {
            uint4 kr[SR];
#pragma unroll
            for (int ii = 0; ii < SR; ++ii) kr[ii] = kAhead ? ahead.k[i0 + ii] : load(kb, i0 + ii);
            float s[GH][SR];
#pragma unroll
            for (int ii = 0; ii < SR; ++ii) {
                float kf[Vn];
                piece(cur_k, i0 + ii, kr[ii], kf);
#pragma unroll
                for (int h = 0; h < GH; ++h) {
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < Vn; ++e) d = __fmaf_rn(q[h][e], kf[e], d);
                    s[h][ii] = d;
                }
            }
#pragma unroll
            for (int h = 0; h < GH; ++h) {
                float mb = -INFINITY;
#pragma unroll
                for (int ii = 0; ii < SR; ++ii) {
                    float d = s[h][ii];
#pragma unroll
                    for (int o = 1; o < LPR; o <<= 1) d = __fadd_rn(d, __shfl_xor_sync(0xffffffffu, d, o));
                    d = __fmul_rn(d, scale);
                    if (softcap > 0.0f) d = __fmul_rn(softcap, tanhf(__fdiv_rn(d, softcap)));
                    s[h][ii] = live(i0 + ii) ? d : -INFINITY;
                    mb = fmaxf(mb, s[h][ii]);
                }
#pragma unroll
                for (int o = LPR; o < kWarp; o <<= 1) mb = fmaxf(mb, __shfl_xor_sync(0xffffffffu, mb, o));
                const float m_new = fmaxf(m[h], mb);
                const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no live key seen yet: p = 0, no NaN
                const float alpha = expf(__fsub_rn(m[h], m_ref));       // 0 while m = -inf
                l[h] = __fmul_rn(l[h], alpha);
#pragma unroll
                for (int e = 0; e < Vn; ++e) acc[h][e] = __fmul_rn(acc[h][e], alpha);
                m[h] = m_new;
#pragma unroll
                for (int ii = 0; ii < SR; ++ii) {
                    s[h][ii] = expf(__fsub_rn(s[h][ii], m_ref));  // p; 0 for rows that are not live
                    l[h] = __fadd_rn(l[h], s[h][ii]);
                }
            }
            uint4 vr[SR];  // (without kAhead: loaded once the scores are done, to spare registers)
#pragma unroll
            for (int ii = 0; ii < SR; ++ii) vr[ii] = kAhead ? ahead.v[i0 + ii] : load(vb, i0 + ii);
#pragma unroll
            for (int ii = 0; ii < SR; ++ii) {
                float vf[Vn];
                piece(cur_v, i0 + ii, vr[ii], vf);
#pragma unroll
                for (int h = 0; h < GH; ++h)
#pragma unroll
                    for (int e = 0; e < Vn; ++e) acc[h][e] = __fmaf_rn(s[h][ii], vf[e], acc[h][e]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < GH; ++h) {
#pragma unroll
        for (int o = LPR; o < kWarp; o <<= 1) {
            l[h] = __fadd_rn(l[h], __shfl_xor_sync(0xffffffffu, l[h], o));
#pragma unroll
            for (int e = 0; e < Vn; ++e) acc[h][e] = __fadd_rn(acc[h][e], __shfl_xor_sync(0xffffffffu, acc[h][e], o));
        }
    }
}

// attend_group's work in the vector layout: the block's NW warps over the visible KV blocks, then
// merge_combine into o [G][D]. ahead: the warp's first block, if the caller loaded it already.
template <int G, int D, int BS, typename KVT, int NW>
__device__ __forceinline__ void attend_group_vec(int g, int ctx, int first, const int32_t* table, const float* qg, const std::byte* kv,
                                                 int64_t block_bytes, int64_t k_off, int64_t v_off, float scale, const AttnExtras& x,
                                                 const float* sinks, const float* cur_k, const float* cur_v, VecAhead<G, D, BS, KVT>& ahead,
                                                 float* o, const PartSlot& ps = {}) {
    using L = KvVec<D, KVT>;
    constexpr int Vn = L::Vn;
    static_assert(G * D <= 8192, "grouped heads x head_dim too large for one thread block's merge buffer");
    __shared__ float sm_m[NW][G], sm_l[NW][G];
    __shared__ __align__(16) float sm_acc[NW][G][D];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    float m[G], l[G], acc[G][Vn];
    for (int p = ps.part; p < ps.parts; p += ps.step) {  // (one pass unless this block takes several parts)
        if (p != ps.part) __syncthreads();               // the previous part's combine has read the buffers
        warp_attend_vec<G, D, BS, KVT>(g, ctx, first, table, first / BS + p * NW + warp, NW * ps.parts, qg, kv, block_bytes, k_off, v_off,
                                       scale, x.softcap, cur_k, cur_v, ahead, m, l, acc);
        if (lane < L::LPR) {
#pragma unroll
            for (int h = 0; h < G; ++h) {
#pragma unroll
                for (int e = 0; e < Vn; e += 4)
                    *reinterpret_cast<float4*>(&sm_acc[warp][h][lane * Vn + e]) =
                        make_float4(acc[h][e], acc[h][e + 1], acc[h][e + 2], acc[h][e + 3]);
                if (lane == 0) {
                    sm_m[warp][h] = m[h];
                    sm_l[warp][h] = l[h];
                }
            }
        }
        if constexpr (VecAhead<G, D, BS, KVT>::on) {  // the next part's first KV block, in flight over the barrier and the combine
            const int next = first / BS + (p + ps.step) * NW + warp;
            if (p + ps.step < ps.parts && next < (ctx + BS - 1) / BS) ahead.load(g, ctx, first, table, next, kv, block_bytes, k_off, v_off);
        }
        __syncthreads();
        if (ps.parts > 1) part_combine<G, D, NW>(sm_m, sm_l, sm_acc, ps.partials + p * (D + 2), ps.stride);
    }
    if (ps.parts <= 1) {
        merge_combine<G, D, NW>(sm_m, sm_l, sm_acc, sinks, o);
        return;
    }
    // The split: the last of the token's blocks to be done merges all the parts' partials.
    if (ps.arrivals > 1) {
        __shared__ int sm_last;
        const bool last = last_block_to_arrive(sm_last, [&] {
            const bool is_last = atomicAdd(ps.ticket, 1u) == unsigned(ps.arrivals - 1);
            if (is_last) *ps.ticket = 0u;  // every other block of the group has taken its ticket
            return is_last;
        });
        if (!last) return;
    } else {
        __syncthreads();  // this block's own partials (global memory) are visible to all its threads
    }
    parts_merge<G, D>(ps.partials, ps.stride, ps.parts, sinks, o);
}

// VEC: attend_group_vec (the decode launches) where the shape allows, else attend_group.
template <int HQ, int HKV, int D, int BS, typename KVT, int NW = attention_warps<HQ / HKV, D>(), bool VEC = false>
__global__ void __launch_bounds__(NW * kWarp, attention_min_blocks(NW))
attention_kernel(int rows, const DevStep st, const float* __restrict__ q, const std::byte* __restrict__ kv, int64_t block_bytes,
                 int64_t k_off, int64_t v_off, float scale, const AttnExtras x, float* __restrict__ out,
                 const __grid_constant__ L2Plan pf, const AttnParts ap) {
    constexpr int G = HQ / HKV;
    const int t = blockIdx.x, g = blockIdx.y;
    if (t >= rows) {  // the blocks past the tokens prefetch upcoming weights (read-only: no wait needed)
        if (blockIdx.z > 0) return;
        if (pf.after_wait) pdl_wait();
        l2_prefetch_part(pf, int64_t(t - rows) * gridDim.y + g, int64_t(gridDim.x - rows) * gridDim.y);
        return;
    }
    pdl_wait();
    pdl_trigger();
    float* o = out + (size_t(t) * HQ + size_t(g) * G) * D;
    if (t >= st.header[kHeaderTokens]) {  // graph padding: a defined output, no reads
        if (blockIdx.z == 0)
            for (int i = threadIdx.x; i < G * D; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    const auto [ctx, first, table] = attn_token(st, t, x);
    const float* qg = q + (size_t(t) * HQ + size_t(g) * G) * D;
    const float* sinks = x.sinks ? x.sinks + g * G : nullptr;
    if constexpr (VEC && attend_vec_on<G, D, BS, KVT>()) {
        const PartSlot ps = part_slot<HQ, D, NW>(ap, t, g * G, (ctx + BS - 1) / BS - first / BS);
        if (ps.parts == 0) return;  // a part this token's context does not have
        VecAhead<G, D, BS, KVT> ahead;  // (empty: the loop loads every block)
        attend_group_vec<G, D, BS, KVT, NW>(g, ctx, first, table, qg, kv, block_bytes, k_off, v_off, scale, x, sinks, nullptr, nullptr, ahead, o,
                                            ps);
    } else {
        attend_group<G, D, BS, KVT, NW>(g, ctx, first, table, qg, kv, block_bytes, k_off, v_off, scale, x, sinks, o);
    }
}


// Decode attention with RoPE and the KV append folded in, for steps where every sequence has one
// token (Ctx::one_token_per_seq): then only this block reads its token's new K/V row, so nothing
// has to reach memory before the attention starts. Before pdl_wait() (the step arrays and earlier
// steps' KV rows are readable then) the block computes the rotation's sines and cosines for its
// position (sincosf as rope_kernel does) and prefetches its warps' KV blocks into L2. After it,
// the block rotates its G query heads and its key head exactly as rope_kernel does, straight from
// the projections into shared memory, and writes K and V to the slot. With VEC (attend_group_vec)
// the key loop takes the current position from shared memory, rounded as the cache holds it, so
// it needs no barrier behind that write; attend_group reads it back from the cache after one.
// Same keys, same order, same arithmetic as rope_append + attention_kernel<VEC>.
// GS > 1 splits the group's query heads over GS blocks (blockIdx.y = kv head * GS + split): a
// few-token step then spreads over GS times more SMs (each block's score and merge arithmetic is
// what bounds it: 8 blocks of an 8B batch-1 step issued for ~15 us). Every split rotates the key
// and writes the same K/V row to the slot (the same bits, so the row is defined whichever write
// lands last); the per-head bits do not change.
template <int HQ, int HKV, int D, int ROT, int BS, typename KVT, int NW = attention_warps<HQ / HKV, D>(), int GS = 1, bool VEC = false>
__global__ void __launch_bounds__(NW * kWarp, attention_min_blocks(NW))
rope_attention_kernel(int rows, const DevStep st, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                      const __grid_constant__ RopeFreqs<ROT / 2> f, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off,
                      float scale, const AttnExtras x, float* __restrict__ out, const __grid_constant__ L2Plan pf, PdlTrigger trig,
                      const AttnParts ap) {
    constexpr int G = HQ / HKV;
    static_assert(G % GS == 0, "the head split must divide the query group");
    constexpr int GH = G / GS;  // query heads of this block
    constexpr int kHalf = ROT / 2;
    constexpr bool kVec = VEC && attend_vec_on<G, D, BS, KVT>();
    __shared__ __align__(16) float sm_q[GH + 1][D];  // this block's query heads of the token, then its key head (rotated)
    __shared__ __align__(16) float sm_v[D];
    __shared__ float sm_cos[kHalf], sm_sin[kHalf];

    if (trig == PdlTrigger::start) pdl_trigger();
    const int t = blockIdx.x, g = blockIdx.y / GS, h0 = (blockIdx.y % GS) * GH;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (t >= rows) {  // the blocks past the tokens prefetch upcoming weights (read-only: no wait needed)
        if (blockIdx.z > 0) return;
        if (pf.after_wait) pdl_wait();
        l2_prefetch_part(pf, int64_t(t - rows) * gridDim.y + g, int64_t(gridDim.x - rows) * gridDim.y);
        return;
    }
    // The step arrays were copied before the step's first kernel: readable before pdl_wait().
    const bool padding = t >= st.header[kHeaderTokens];
    const auto [ctx, first, table] = attn_token(st, t, x);
    const int nblocks = (ctx + BS - 1) / BS;
    // This block's part of the token's context (kVec only: the launcher passes no split otherwise).
    const PartSlot ps = padding ? PartSlot{} : part_slot<HQ, D, NW>(ap, t, g * G + h0, nblocks - first / BS);
    if (ps.parts == 0 || (padding && blockIdx.z > 0)) return;  // a part this token does not have
    VecAhead<GH, D, BS, KVT> ahead;  // (with kVec: the warp's first KV block, loaded before the wait)
    if (!padding) {
        const float pos = float(ctx - 1);
        for (int i = threadIdx.x; i < kHalf; i += blockDim.x) sincosf(pos * f.inv_freq[i], &sm_sin[i], &sm_cos[i]);
        const int blk0 = first / BS + ps.part * NW + warp, stride = NW * ps.parts;
        if constexpr (kVec && VecAhead<GH, D, BS, KVT>::on) {
            if (blk0 < nblocks) ahead.load(g, ctx, first, table, blk0, kv, block_bytes, k_off, v_off);
        }
        constexpr int kRowBytes = BS * D * int(sizeof(KVT));
        for (int p = ps.part; p < ps.parts; p += ps.step)  // the warp's KV blocks of each of the block's parts
            for (int blk = first / BS + p * NW + warp + (p == ps.part && ahead.blk >= 0 ? stride : 0); blk < nblocks; blk += stride) {
                const std::byte* base = kv + int64_t(table[blk]) * block_bytes + size_t(g) * kRowBytes;
                for (int off = lane * 32; off < kRowBytes; off += kWarp * 32) {
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + k_off + off));
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(base + v_off + off));
                }
            }
    }
    __syncthreads();  // sm_cos / sm_sin
    pdl_wait();
    if (trig != PdlTrigger::start) pdl_trigger();
    float* o = out + (size_t(t) * HQ + size_t(g) * G + h0) * D;
    if (padding) {  // graph padding: a defined output, no reads, no KV write
        for (int i = threadIdx.x; i < GH * D; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    // Rotated pairs (rope_kernel's arithmetic) and the dims past ROT straight into shared memory.
    for (int w = threadIdx.x; w < (GH + 1) * kHalf; w += blockDim.x) {
        const int h = w / kHalf, i = w % kHalf;
        const float* src = h < GH ? q + (size_t(t) * HQ + size_t(g) * G + h0 + h) * D : k + (size_t(t) * HKV + g) * D;
        rotate_pair<ROT>(src, sm_q[h], i, sm_cos[i], sm_sin[i]);
    }
    if constexpr (D > ROT) {
        for (int w = threadIdx.x; w < (GH + 1) * (D - ROT); w += blockDim.x) {
            const int h = w / (D - ROT), i = ROT + w % (D - ROT);
            sm_q[h][i] = h < GH ? q[(size_t(t) * HQ + size_t(g) * G + h0 + h) * D + i] : k[(size_t(t) * HKV + g) * D + i];
        }
    }
    for (int i = threadIdx.x; i < D; i += blockDim.x) sm_v[i] = v[(size_t(t) * HKV + g) * D + i];
    __syncthreads();
    const int64_t slot = st.slot_mapping[t];
    if (slot >= 0 && ps.part == 0) {  // (the other parts take the row from shared memory; a load of its
                                      // cache row racing with this write is discarded by the key loop)
        std::byte* base = kv + (slot / BS) * block_bytes;
        KVT* kd_out = reinterpret_cast<KVT*>(base + k_off) + (size_t(g) * BS + slot % BS) * D;
        KVT* vd_out = reinterpret_cast<KVT*>(base + v_off) + (size_t(g) * BS + slot % BS) * D;
        for (int i = threadIdx.x; i < D; i += blockDim.x) {
            kd_out[i] = from_f32<KVT>(sm_q[GH][i]);
            vd_out[i] = from_f32<KVT>(sm_v[i]);
        }
    }
    const float* sinks = x.sinks ? x.sinks + g * G + h0 : nullptr;
    if constexpr (kVec) {
        attend_group_vec<GH, D, BS, KVT, NW>(g, ctx, first, table, &sm_q[0][0], kv, block_bytes, k_off, v_off, scale, x, sinks, sm_q[GH],
                                             sm_v, ahead, o, ps);
    } else {
        // The block's own global writes are visible to all its threads after the barrier: the key
        // loop then reads this position from the cache like any other.
        __syncthreads();
        attend_group<GH, D, BS, KVT, NW>(g, ctx, first, table, &sm_q[0][0], kv, block_bytes, k_off, v_off, scale, x, sinks, o);
    }
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

// SCR_CUDA_ATTN_VEC=0 (or attention_vec_override() = 0): the decode launches (at most
// kAttentionDecodeMaxRows rows) keep the scalar key loop (attend_group, sessions 3-13) instead of
// attend_group_vec, for A/B runs. The fused and the plain decode launches both follow it, so a
// token's bits do not depend on which of them ran (the persistent decode1 kernel follows the
// default only).
inline bool attention_vec_on() {
    if (attention_vec_override() >= 0) return attention_vec_override() == 1;
    static const bool on = env_flag_switch("SCR_CUDA_ATTN_VEC", true);
    return on;
}

// The context split's most parts per token (AttnParts::max): kAttentionMaxParts, or what
// SCR_CUDA_ATTN_PARTS asks (1: no split, for A/B runs; at most kAttentionPartsLimit), or the tests'
// attention_parts_override(). Bits depend on it (a head's arithmetic follows its part count).
inline int attention_max_parts() {
    if (attention_parts_override() >= 1) return std::min(attention_parts_override(), kAttentionPartsLimit);
    static const int v = int(env_int_switch(
        "SCR_CUDA_ATTN_PARTS", kAttentionMaxParts, [](long long n) { return n >= 1 && n <= kAttentionPartsLimit; }, "1 to 8 parts"));
    static_assert(kAttentionPartsLimit == 8, "the message above names the limit");
    return v;
}

// The split for a decode launch of `rows` rows of `row_blocks` blocks each: where the model gave a
// workspace (Ctx::attn_ws) and the launch takes the vector layout (attend_group_vec), else none.
// A token's parts go to as many blocks as leave the launch within one wave of blocks on the SMs
// (batch 1 of the Llamas: 32 query-head blocks x 4), the rest to fewer blocks in turn (the same
// bits: a model of many query-head blocks has fewer SMs to spare; launches of several rows, which
// had fewer too, keep one part since session 27).
template <int HQ, int HKV, int D, int BS, typename KVT>
detail::AttnParts attention_parts_for(const Ctx& c, int rows, int row_blocks, bool vec) {
    if (!c.attn_ws || !vec || !detail::attend_vec_on<HQ / HKV, D, BS, KVT>() || rows > kAttentionPartsRows) return {};
    const int max = attention_max_parts();
    int blocks = std::clamp(device_sm_count() / std::max(1, rows * row_blocks), 1, max);
    if (attention_part_blocks_override() >= 1) blocks = std::min(attention_part_blocks_override(), max);
    return {c.attn_ws, max, blocks, std::max(0, attention_parts_every_token_override())};
}

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
               block_bytes, k_off, v_off, scale, extras, out, L2Plan{}, detail::AttnParts{});
    } else if (rows <= kAttentionDecodeMaxRows) {
        // Decode attention reads little from HBM: with SCR_CUDA_L2_PREFETCH=1, extra columns of
        // blocks prefetch the next launches' weights into L2 (Ctx::l2, from the emitter; off: none).
        const L2Plan pf = l2_plan(c.l2, L2Site::attention);
        const int extra = ceil_div(l2_prefetch_blocks(pf, NW * kWarp), HKV);
        constexpr bool kVec = detail::attend_vec_on<HQ / HKV, D, BS, KVT>();  // (else one kernel for both settings)
        const bool vec = attention_vec_on();
        auto kernel = vec ? detail::attention_kernel<HQ, HKV, D, BS, KVT, NW, kVec> : detail::attention_kernel<HQ, HKV, D, BS, KVT, NW, false>;
        const detail::AttnParts ap = attention_parts_for<HQ, HKV, D, BS, KVT>(c, rows, HKV, vec);
        launch(c, kernel, dim3(rows + extra, HKV, ap.blocks), dim3(NW * kWarp), rows, c.step, q, kv, block_bytes, k_off, v_off, scale, extras,
               out, pf, ap);
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
        return int(env_int_switch(
            "SCR_CUDA_ATTN_SPLIT", device_sm_count(), [](long long n) { return n >= 0 && n <= (1 << 20); }, "a block count (0: never split)",
            "the SM count"));
    }();
    return blocks;
}

// SCR_CUDA_ROPE_ATTN=0: RoPE + KV append and attention as two launches in every step (kept for
// A/B runs); by default one launch (rope_attention_kernel) where every sequence has one token.
inline bool rope_attention_fused_on() {
    static const bool on = env_flag_switch("SCR_CUDA_ROPE_ATTN", true);
    return on;
}

// Where the fused decode attention calls pdl_trigger() (PdlTrigger): after its pdl_wait(), so the
// o projection's blocks start once the QKV launch is done, not beside it. H200, one call, device ms
// per token against the start (sessions 4-18; SCR_CUDA_ATTN_TRIGGER=start): 1B MLX int4 0.526 /
// 0.528, 1B bf16 0.792 / 0.797, 8B MLX int4 2.086 / 2.096, 8B bf16 4.105 / 4.115 (docs/CUDA.md
// "Session 19"); the same bits.
inline PdlTrigger rope_attention_trigger() {
    static const PdlTrigger v = pdl_trigger_choice("SCR_CUDA_ATTN_TRIGGER", PdlTrigger::after_wait);
    return v;
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
               v, f, kv, block_bytes, k_off, v_off, scale, extras, out, L2Plan{}, rope_attention_trigger(), detail::AttnParts{});
        return;
    }
    if (c.one_token_per_seq && rows <= kAttentionDecodeMaxRows && rope_attention_fused_on()) {
        constexpr int NW = detail::attention_warps<HQ / HKV, D>();
        const L2Plan pf = l2_plan(c.l2, L2Site::attention);  // as in attention() above
        constexpr bool kVec = detail::attend_vec_on<HQ / HKV, D, BS, KVT>();  // (else one kernel for both settings)
        const bool vec = attention_vec_on();
        if (rows * HQ <= attention_split_max_blocks()) {
            const detail::AttnParts ap = attention_parts_for<HQ, HKV, D, BS, KVT>(c, rows, HQ, vec);  // one block per query head (same bits, more SMs)
            constexpr int GS = HQ / HKV;
            const int extra = ceil_div(l2_prefetch_blocks(pf, NW * kWarp), HKV * GS);
            auto kernel = vec ? detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT, NW, GS, kVec>
                              : detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT, NW, GS, false>;
            launch(c, kernel, dim3(rows + extra, HKV * GS, ap.blocks), dim3(NW * kWarp), rows, c.step, q, k, v, f, kv, block_bytes, k_off, v_off,
                   scale, extras, out, pf, rope_attention_trigger(), ap);
            return;
        }
        const int extra = ceil_div(l2_prefetch_blocks(pf, NW * kWarp), HKV);
        auto kernel = vec ? detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT, NW, 1, kVec>
                          : detail::rope_attention_kernel<HQ, HKV, D, ROT, BS, KVT, NW, 1, false>;
        const detail::AttnParts ap = attention_parts_for<HQ, HKV, D, BS, KVT>(c, rows, HKV, vec);
        launch(c, kernel, dim3(rows + extra, HKV, ap.blocks), dim3(NW * kWarp), rows, c.step, q, k, v, f, kv, block_bytes, k_off, v_off, scale,
               extras, out, pf, rope_attention_trigger(), ap);
        return;
    }
    rope_append<HQ, HKV, D, ROT, BS, KVT>(c, rows, q, k, v, q_out, f, kv, block_bytes, k_off, v_off);
    attention<HQ, HKV, D, BS, KVT>(c, rows, q_out, kv, block_bytes, k_off, v_off, scale, out, extras);
}

}  // namespace scr::kernels::cuda
