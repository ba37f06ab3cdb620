// Paged attention over the device KV pool (layout of kernels/cpu/attention.hpp: per block, per
// layer, K then V, each [kv_heads][block_size][head_dim]). One thread block per (token, kv head)
// serves the whole grouped-query group, so each K/V row is read once for all its query heads.
// The block's warps split the sequence's KV blocks between them, each keeping an online softmax
// (running max, sum, weighted V), and merge at the end: one pass, no score buffer, any mix of
// prefill and decode tokens. Causal: a token sees positions 0..its own.
#pragma once

#include <cstddef>

#include "kernels/cuda/common.cuh"

namespace scr::kernels::cuda {

// What a layer's attention adds to plain causal softmax(q k^T * scale) v (kernels/cpu/attention.hpp's
// AttnExtras). All off by default.
struct AttnExtras {
    float softcap = 0.0f;          // > 0: a score s becomes softcap * tanh(s / softcap) (Gemma 2)
    int window = 0;                // > 0: a token sees itself and the window - 1 tokens before it
    const float* sinks = nullptr;  // [HQ]: a logit per head that joins the softmax with no value
};

namespace detail {

template <int HKV, int D, int BS, typename KVT>
__global__ void kv_append_kernel(int rows, const int64_t* __restrict__ slots, const float* __restrict__ k,
                                 const float* __restrict__ v, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off) {
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

template <int G, int D>
__host__ __device__ constexpr int attention_warps() {
    constexpr int w = 8192 / (G * D);
    return w >= 16 ? 16 : (w < 1 ? 1 : w);
}

template <int HQ, int HKV, int D, int BS, typename KVT>
__global__ void __launch_bounds__(attention_warps<HQ / HKV, D>() * kWarp)
attention_kernel(int rows, const DevStep st, const float* __restrict__ q, const std::byte* __restrict__ kv, int64_t block_bytes,
                 int64_t k_off, int64_t v_off, float scale, const AttnExtras x, float* __restrict__ out) {
    constexpr int G = HQ / HKV;
    constexpr int NW = attention_warps<G, D>();
    constexpr int DPL = (D + kWarp - 1) / kWarp;  // head dims per lane
    static_assert(G * D <= 8192, "grouped heads x head_dim too large for one thread block's merge buffer");
    __shared__ float sm_m[NW][G], sm_l[NW][G];
    __shared__ float sm_acc[NW][G][D];

    const int t = blockIdx.x, g = blockIdx.y;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    if (t >= rows) return;
    float* o = out + (size_t(t) * HQ + size_t(g) * G) * D;
    if (t >= st.header[kHeaderTokens]) {  // graph padding: a defined output, no reads
        for (int i = threadIdx.x; i < G * D; i += blockDim.x) o[i] = 0.0f;
        return;
    }
    const int ctx = st.positions[t] + 1;
    const int first = x.window > 0 ? max(0, ctx - x.window) : 0;  // oldest visible position
    const int32_t* table = st.block_tables + size_t(st.seq_of_token[t]) * st.header[kHeaderTableStride];

    float qr[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int d = lane + i * kWarp;
            qr[h][i] = d < D ? q[(size_t(t) * HQ + size_t(g) * G + h) * D + d] : 0.0f;
            acc[h][i] = 0.0f;
        }
    }
    const int nblocks = (ctx + BS - 1) / BS;
    for (int blk = first / BS + warp; blk < nblocks; blk += NW) {
        const std::byte* base = kv + int64_t(table[blk]) * block_bytes;
        const KVT* kb = reinterpret_cast<const KVT*>(base + k_off) + size_t(g) * BS * D;
        const KVT* vb = reinterpret_cast<const KVT*>(base + v_off) + size_t(g) * BS * D;
        const int j0 = max(0, first - blk * BS), n = min(BS, ctx - blk * BS);
        for (int j = j0; j < n; ++j) {
            float kd[DPL], vd[DPL];
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + i * kWarp;
                kd[i] = d < D ? to_f32(kb[size_t(j) * D + d]) : 0.0f;
                vd[i] = d < D ? to_f32(vb[size_t(j) * D + d]) : 0.0f;
            }
#pragma unroll
            for (int h = 0; h < G; ++h) {
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < DPL; ++i) s += qr[h][i] * kd[i];
                s = warp_sum(s) * scale;
                if (x.softcap > 0.0f) s = x.softcap * tanhf(s / x.softcap);
                const float m_new = fmaxf(m[h], s);
                const float alpha = expf(m[h] - m_new);  // 0 on the first key (m = -inf)
                const float p = expf(s - m_new);
                l[h] = l[h] * alpha + p;
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[h][i] = acc[h][i] * alpha + p * vd[i];
                m[h] = m_new;
            }
        }
    }
    // Merge the warps' partial softmaxes.
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
        // A sink is one more logit in the softmax, with no value.
        const float sink = x.sinks ? x.sinks[g * G + h] : -INFINITY;
        float mx = sink;
        for (int w = 0; w < NW; ++w) mx = fmaxf(mx, sm_m[w][h]);
        float sum = x.sinks ? expf(sink - mx) : 0.0f, val = 0.0f;
        for (int w = 0; w < NW; ++w) {
            const float f = sm_l[w][h] > 0.0f ? expf(sm_m[w][h] - mx) : 0.0f;
            sum += sm_l[w][h] * f;
            val += sm_acc[w][h][d] * f;
        }
        o[idx] = val / sum;
    }
}

}  // namespace detail

// Writes this step's K and V rows into their KV slots.
template <int HKV, int D, int BS, typename KVT>
void kv_append(const Ctx& c, int rows, const float* k, const float* v, std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off) {
    if (rows <= 0) return;
    detail::kv_append_kernel<HKV, D, BS, KVT><<<rows, 128, 0, c.stream>>>(rows, c.step.slot_mapping, k, v, kv, block_bytes, k_off, v_off);
}

// Causal attention of every token's query heads over its sequence's KV blocks (already appended).
template <int HQ, int HKV, int D, int BS, typename KVT>
void attention(const Ctx& c, int rows, const float* q, const std::byte* kv, int64_t block_bytes, int64_t k_off, int64_t v_off,
               float scale, float* out, const AttnExtras& extras = {}) {
    static_assert(HQ % HKV == 0, "query heads must be a multiple of kv heads");
    if (rows <= 0) return;
    constexpr int NW = detail::attention_warps<HQ / HKV, D>();
    detail::attention_kernel<HQ, HKV, D, BS, KVT><<<dim3(rows, HKV), NW * kWarp, 0, c.stream>>>(rows, c.step, q, kv, block_bytes, k_off,
                                                                                              v_off, scale, extras, out);
}

}  // namespace scr::kernels::cuda
