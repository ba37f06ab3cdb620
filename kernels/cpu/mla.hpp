// Multi-head latent attention (DeepSeek-V2/V3) over a compressed paged KV cache.
//
// Per token the cache holds one row [c (L floats), k_rot (R floats)]: the normalized KV latent and
// the rotated key part shared by all heads — (L + R) floats instead of H * (K + V). kv_b_proj
// (W: [H * (NOPE + V)][L]) expands a latent to head h's key (rows h*(NOPE+V) + [0, NOPE)) and value
// (rows h*(NOPE+V) + NOPE + [0, V)). Both are folded around the attention instead (vLLM's MLA
// decode path): the query becomes [W_k,h^T q_nope (L), q_rot (R)], attention runs as multi-query
// attention over the cached rows with the latents as values, and W_v,h maps the attended latent to
// the head's output. Same products as expanding every cached token, in a different order.
#pragma once

#include "kernels/cpu/attention.hpp"

namespace scr::kernels::cpu {

template <int H, int NOPE, int R, int L, int V, int BS, typename WT, typename KVT>
void mla(const AttnBatch& b, const float* q_nope, const float* q_rot, const float* c, const float* k_rot, const WT* w,
         std::byte* kv, int64_t block_bytes, int64_t off, float scale, int window, float* out, float* ws, ThreadPool& pool) {
    constexpr int D = L + R;
    constexpr int kRow = NOPE + V;  // rows of W per head
    const int T = b.num_tokens;
    // 1. Append [c, k_rot] to each token's slot ([1][BS][D] per block).
    pool.parallel_for(T, [&](int64_t s, int64_t e, int) {
        for (int64_t t = s; t < e; ++t) {
            const int64_t slot = b.slot_mapping[t];
            KVT* dst = reinterpret_cast<KVT*>(kv + (slot / BS) * block_bytes + off) + size_t(slot % BS) * D;
            for (int i = 0; i < L; ++i) dst[i] = from_f32<KVT>(c[size_t(t) * L + i]);
            for (int i = 0; i < R; ++i) dst[L + i] = from_f32<KVT>(k_rot[size_t(t) * R + i]);
        }
    });
    // 2. Absorbed queries: qf[t][h] = [sum_i q_nope[t][h][i] * W[h*kRow + i][:], q_rot[t][h]].
    float* qf = ws;
    float* latent_out = ws + size_t(T) * H * D;
    constexpr int kCols = 4 * kLanes;
    pool.parallel_for(int64_t(T) * H, [&](int64_t s, int64_t e, int) {
        for (int64_t th = s; th < e; ++th) {
            const int h = int(th % H);
            const float* qn = q_nope + size_t(th) * NOPE;
            float* dst = qf + size_t(th) * D;
            for (int j0 = 0; j0 < L; j0 += kCols) {
                vf acc[4] = {vzero(), vzero(), vzero(), vzero()};
                for (int i = 0; i < NOPE; ++i) {
                    const vf qv = vset1(qn[i]);
                    const WT* wr = w + size_t(h * kRow + i) * L + j0;
                    for (int j = 0; j < 4; ++j) {
                        const int rem = L - j0 - j * kLanes;
                        if (rem <= 0) break;
                        acc[j] = vfma(qv, rem >= kLanes ? vload(wr + j * kLanes) : vload_n(wr + j * kLanes, rem), acc[j]);
                    }
                }
                for (int j = 0; j < 4; ++j) {
                    const int rem = L - j0 - j * kLanes;
                    if (rem <= 0) break;
                    if (rem >= kLanes) vstore(dst + j0 + j * kLanes, acc[j]);
                    else vstore_n(dst + j0 + j * kLanes, acc[j], rem);
                }
            }
            std::memcpy(dst + L, q_rot + size_t(th) * R, sizeof(float) * R);
        }
    });
    // 3. Multi-query attention over the cached rows; values are their first L floats.
    attend<H, 1, D, L, D, BS, KVT>(b, qf, kv, block_bytes, off, off, scale, AttnExtras{0.0f, window, nullptr}, latent_out, pool);
    // 4. out[t][h][v] = W[h*kRow + NOPE + v] . latent_out[t][h]
    pool.parallel_for(int64_t(T) * H, [&](int64_t s, int64_t e, int) {
        for (int64_t th = s; th < e; ++th) {
            const int h = int(th % H);
            const float* lat = latent_out + size_t(th) * L;
            for (int v = 0; v < V; ++v) out[size_t(th) * V + v] = dot_q<L>(lat, w + size_t(h * kRow + NOPE + v) * L);
        }
    });
}

}  // namespace scr::kernels::cpu
