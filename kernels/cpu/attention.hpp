// Paged attention over the KV pool: append this step's K and V to their slots, then for every
// (token, query head) stream the sequence's blocks with an online softmax (one pass, no score
// buffer). Causal: a token sees positions 0..its own. Grouped-query: query head h reads kv head
// h / (HQ / HKV). Each (token, head) is computed the same way whatever else is in the step.
#pragma once

#include <cmath>
#include <cstddef>
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

template <int HQ, int HKV, int D, int BS, typename KVT>
void attention(const AttnBatch& b, const float* q, const float* k, const float* v, std::byte* kv, int64_t block_bytes,
               int64_t k_off, int64_t v_off, float scale, float* out, ThreadPool& pool) {
    static_assert(HQ % HKV == 0, "query heads must be a multiple of kv heads");
    constexpr int kGroup = HQ / HKV;
    // 1. Append K and V: [kv_heads][block_size][head_dim] per layer inside each block.
    pool.parallel_for(b.num_tokens, [&](int64_t s, int64_t e, int) {
        for (int64_t t = s; t < e; ++t) {
            const int64_t slot = b.slot_mapping[t];
            std::byte* base = kv + (slot / BS) * block_bytes;
            const int off = int(slot % BS);
            KVT* kd = reinterpret_cast<KVT*>(base + k_off);
            KVT* vd = reinterpret_cast<KVT*>(base + v_off);
            for (int h = 0; h < HKV; ++h)
                for (int i = 0; i < D; ++i) {
                    kd[(size_t(h) * BS + off) * D + i] = from_f32<KVT>(k[(size_t(t) * HKV + h) * D + i]);
                    vd[(size_t(h) * BS + off) * D + i] = from_f32<KVT>(v[(size_t(t) * HKV + h) * D + i]);
                }
        }
    });
    // 2. Attend.
    pool.parallel_for(int64_t(b.num_tokens) * HQ, [&](int64_t s, int64_t e, int) {
        constexpr int kVec = (D + kLanes - 1) / kLanes;
        for (int64_t i = s; i < e; ++i) {
            const int t = int(i / HQ), h = int(i % HQ), kvh = h / kGroup;
            const int ctx = b.positions[t] + 1;
            const int32_t* table = b.block_tables + size_t(b.seq_of_token[t]) * b.block_table_stride;
            const float* qh = q + (size_t(t) * HQ + h) * D;
            float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
            vf acc[kVec];
            for (auto& a : acc) a = vzero();
            for (int blk = 0; blk * BS < ctx; ++blk) {
                const int n = std::min(BS, ctx - blk * BS);
                const std::byte* base = kv + int64_t(table[blk]) * block_bytes;
                const KVT* kb = reinterpret_cast<const KVT*>(base + k_off) + size_t(kvh) * BS * D;
                const KVT* vb = reinterpret_cast<const KVT*>(base + v_off) + size_t(kvh) * BS * D;
                float sc[BS];
                float bm = -std::numeric_limits<float>::infinity();
                for (int j = 0; j < n; ++j) {
                    sc[j] = dot_q<D>(qh, kb + size_t(j) * D) * scale;
                    bm = std::max(bm, sc[j]);
                }
                const float m_new = std::max(m, bm);
                const float alpha = std::exp(m - m_new);  // 0 on the first block (m = -inf)
                l *= alpha;
                const vf va = vset1(alpha);
                for (auto& a : acc) a = vmul(a, va);
                for (int j = 0; j < n; ++j) {
                    const float p = std::exp(sc[j] - m_new);
                    l += p;
                    const vf vp = vset1(p);
                    const KVT* vr = vb + size_t(j) * D;
                    for (int c = 0; c < kVec; ++c) {
                        const int rem = D - c * kLanes;
                        vf vv = rem >= kLanes ? vload(vr + c * kLanes) : vload_n(vr + c * kLanes, rem);
                        acc[c] = vfma(vp, vv, acc[c]);
                    }
                }
                m = m_new;
            }
            float* o = out + (size_t(t) * HQ + h) * D;
            const vf inv = vset1(1.0f / l);
            for (int c = 0; c < kVec; ++c) {
                const int rem = D - c * kLanes;
                if (rem >= kLanes) vstore(o + c * kLanes, vmul(acc[c], inv));
                else vstore_n(o + c * kLanes, vmul(acc[c], inv), rem);
            }
        }
    });
}

}  // namespace scr::kernels::cpu
