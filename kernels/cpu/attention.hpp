// Paged attention over the KV pool: append this step's K and V to their slots, then for every
// (token, query head) stream the sequence's blocks with an online softmax (one pass, no score
// buffer). Causal: a token sees positions 0..its own (or the last `window` of them). Grouped-query:
// query head h reads kv head h / (HQ / HKV). Each (token, head) is computed the same way whatever
// else is in the step. Blocks wholly before a token's window are never read, so the engine may
// free them (vLLM's SlidingWindowManager).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

#include "kernels/cpu/attn_batch.hpp"
#include "kernels/cpu/simd.hpp"
#include "runtime/core/thread_pool.hpp"

namespace scr::kernels::cpu {

template <int D, typename KVT>
inline float dot_q(const float* q, const KVT* k) {
    constexpr int kFull = D / kLanes * kLanes;
    vf acc = vzero();
    for (int i = 0; i < kFull; i += kLanes) acc = vfma(vload(q + i), vload(k + i), acc);
    if constexpr (kFull < D) acc = vfma(vload_n(q + kFull, D - kFull), vload_n(k + kFull, D - kFull), acc);
    return vsum(acc);
}

// What a layer's attention adds to plain causal softmax(q k^T * scale) v. All off by default.
struct AttnExtras {
    float softcap = 0.0f;           // > 0: a score s becomes softcap * tanh(s / softcap) (Gemma 2)
    int window = 0;                 // > 0: a token sees itself and the window - 1 tokens before it
    const float* sinks = nullptr;   // [HQ]: a logit per head that joins the softmax with no value (GPT-OSS)
};

// Writes this step's rows of a [H][D] tensor into their KV slots: [H][block_size][D] per block.
template <int H, int D, int BS, typename KVT>
void kv_append(const AttnBatch& b, const float* x, std::byte* kv, int64_t block_bytes, int64_t off, ThreadPool& pool) {
    pool.parallel_for(b.num_tokens, [&](int64_t s, int64_t e, int) {
        for (int64_t t = s; t < e; ++t) {
            const int64_t slot = b.slot_mapping[t];
            KVT* dst = reinterpret_cast<KVT*>(kv + (slot / BS) * block_bytes + off);
            const int o = int(slot % BS);
            for (int h = 0; h < H; ++h)
                for (int i = 0; i < D; ++i) dst[(size_t(h) * BS + o) * D + i] = from_f32<KVT>(x[(size_t(t) * H + h) * D + i]);
        }
    });
}

// For every (token, query head): stream the sequence's cached blocks (only those inside the window)
// with an online softmax. Keys are [HKV][BS][D] at k_off; values are the first DV floats of
// [HKV][BS][VS] rows at v_off (VS = DV for separate values; MLA reads its values from the keys).
template <int HQ, int HKV, int D, int DV, int VS, int BS, typename KVT>
void attend(const AttnBatch& b, const float* q, const std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off,
            float scale, const AttnExtras& x, float* out, ThreadPool& pool) {
    static_assert(HQ % HKV == 0, "query heads must be a multiple of kv heads");
    static_assert(DV <= VS, "values are a prefix of their rows");
    constexpr int kGroup = HQ / HKV;
    pool.parallel_for(int64_t(b.num_tokens) * HQ, [&](int64_t s, int64_t e, int) {
        constexpr int kVec = (DV + kLanes - 1) / kLanes;
        for (int64_t i = s; i < e; ++i) {
            const int t = int(i / HQ), h = int(i % HQ), kvh = h / kGroup;
            const int ctx = b.positions[t] + 1;
            const int first = x.window > 0 ? std::max(0, ctx - x.window) : 0;  // oldest visible position
            const int32_t* table = b.block_tables + size_t(b.seq_of_token[t]) * b.block_table_stride;
            const float* qh = q + (size_t(t) * HQ + h) * D;
            // A sink is one more logit in the softmax: start the running max there with weight 1.
            float m = x.sinks ? x.sinks[h] : -std::numeric_limits<float>::infinity();
            float l = x.sinks ? 1.0f : 0.0f;
            vf acc[kVec];
            for (auto& a : acc) a = vzero();
            for (int blk = first / BS; blk * BS < ctx; ++blk) {
                const int j0 = std::max(0, first - blk * BS), n = std::min(BS, ctx - blk * BS);
                const std::byte* base = kv + int64_t(table[blk]) * block_bytes;
                const KVT* kb = reinterpret_cast<const KVT*>(base + k_off) + size_t(kvh) * BS * D;
                const KVT* vb = reinterpret_cast<const KVT*>(base + v_off) + size_t(kvh) * BS * VS;
                float sc[BS];
                float bm = -std::numeric_limits<float>::infinity();
                for (int j = j0; j < n; ++j) {
                    float v = dot_q<D>(qh, kb + size_t(j) * D) * scale;
                    if (x.softcap > 0.0f) v = x.softcap * std::tanh(v / x.softcap);
                    sc[j] = v;
                    bm = std::max(bm, v);
                }
                const float m_new = std::max(m, bm);
                const float alpha = std::exp(m - m_new);  // 0 on the first block without sinks (m = -inf)
                l *= alpha;
                const vf va = vset1(alpha);
                for (auto& a : acc) a = vmul(a, va);
                for (int j = j0; j < n; ++j) {
                    const float p = std::exp(sc[j] - m_new);
                    l += p;
                    const vf vp = vset1(p);
                    const KVT* vr = vb + size_t(j) * VS;
                    for (int c = 0; c < kVec; ++c) {
                        const int rem = DV - c * kLanes;
                        vf vv = rem >= kLanes ? vload(vr + c * kLanes) : vload_n(vr + c * kLanes, rem);
                        acc[c] = vfma(vp, vv, acc[c]);
                    }
                }
                m = m_new;
            }
            float* o = out + (size_t(t) * HQ + h) * DV;
            const vf inv = vset1(1.0f / l);
            for (int c = 0; c < kVec; ++c) {
                const int rem = DV - c * kLanes;
                if (rem >= kLanes) vstore(o + c * kLanes, vmul(acc[c], inv));
                else vstore_n(o + c * kLanes, vmul(acc[c], inv), rem);
            }
        }
    });
}

// Paged attention of one layer: append K and V, then attend.
template <int HQ, int HKV, int D, int BS, typename KVT>
void attention(const AttnBatch& b, const float* q, const float* k, const float* v, std::byte* kv, int64_t block_bytes,
               int64_t k_off, int64_t v_off, float scale, const AttnExtras& x, float* out, ThreadPool& pool) {
    kv_append<HKV, D, BS, KVT>(b, k, kv, block_bytes, k_off, pool);
    kv_append<HKV, D, BS, KVT>(b, v, kv, block_bytes, v_off, pool);
    attend<HQ, HKV, D, D, D, BS, KVT>(b, q, kv, block_bytes, k_off, v_off, scale, x, out, pool);
}

}  // namespace scr::kernels::cpu
