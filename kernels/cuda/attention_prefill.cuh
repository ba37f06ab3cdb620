// Prefill attention on the tensor cores (flash-attention style) for a bf16 KV cache. Included from
// attention.cuh, which picks it for prefill-sized launches.
//
// attention_keys_kernel gives every (token, kv head) its own block, so each token re-reads its whole
// context from L2: a 512-token chunk at 2k context read ~2 GB per launch (Llama-3.2-1B prefill: 57 %
// of the time, docs/CUDA.md). Here a block takes 16 consecutive token rows x one kv head, one warp
// per query head of the group, and streams the sequence's K/V through shared memory in tiles of KT
// keys (cp.async, two buffers), once for 16 tokens x G heads.
//
// Per warp, per KV tile: S (16 tokens x KT keys) = Q K^T with mma.m16n8k16 (q as bf16 hi + lo,
// so scores keep ~2^-17 relative accuracy; K is bf16 in the cache, exact), the online softmax in
// float32 over each row (a row's values sit in one lane quad), then O += P V with P as bf16 hi + lo
// taken straight from S's accumulator registers and V's fragments from shared memory by
// ldmatrix.trans. Causal masking, sliding windows, softcapping and sinks as attention_keys_kernel.
// A 16-row tile may straddle sequences (chunked prefill mixing requests): it is processed once per
// run of rows of one sequence, the other rows masked.
#pragma once

namespace scr::kernels::cuda {
namespace detail {

constexpr int kPrefillRows = 16;  // token rows per block (one MMA row tile)

template <int D>
__host__ __device__ constexpr int prefill_key_tile() {
    return D > 64 ? 32 : 64;  // keeps 2 buffers x (K + V) at 32 KiB
}

__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

template <int HQ, int HKV, int D, int BS>
__global__ void __launch_bounds__((HQ / HKV) * kWarp)
    attention_prefill_mma_kernel(int rows, const DevStep st, const float* __restrict__ q, const std::byte* __restrict__ kv,
                                 int64_t block_bytes, int64_t k_off, int64_t v_off, float scale, const AttnExtras x,
                                 float* __restrict__ out) {
    constexpr int G = HQ / HKV;
    constexpr int KT = prefill_key_tile<D>();
    constexpr int LD = D + 8;  // padded row (bf16): rows 16 bytes apart in banks, conflict-free fragments
    constexpr int kChunks = D / 8;  // 16-byte pieces per K or V row
    constexpr int kThreads = G * kWarp;
    static_assert(D % 16 == 0 && KT % 16 == 0, "head_dim must be a multiple of 16");
    __shared__ __align__(16) bf16_t sk[2][KT][LD];
    __shared__ __align__(16) bf16_t sv[2][KT][LD];

    pdl_wait();
    pdl_trigger();
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int kvh = blockIdx.y, head = kvh * G + warp;
    const int t0 = blockIdx.x * kPrefillRows;
    const int live = min(rows, st.header[kHeaderTokens]);
    // Graph padding rows: a defined output, no reads.
    for (int i = threadIdx.x; i < kPrefillRows * G * D; i += kThreads) {
        const int r = t0 + i / (G * D);
        if (r >= live && r < rows) out[(size_t(r) * HQ + size_t(kvh) * G) * D + i % (G * D)] = 0.0f;
    }

    for (int seg_lo = t0; seg_lo < min(t0 + kPrefillRows, live);) {
        const int seq = st.seq_of_token[seg_lo];
        int seg_hi = seg_lo + 1;
        while (seg_hi < min(t0 + kPrefillRows, live) && st.seq_of_token[seg_hi] == seq) ++seg_hi;
        const int32_t* table = st.block_tables + size_t(seq) * st.header[kHeaderTableStride];
        // A sequence's rows come in position order: the first row sees the fewest keys, the last the most.
        const int kbeg = x.window > 0 ? max(0, st.positions[seg_lo] + 1 - x.window) : 0;
        const int kend = st.positions[seg_hi - 1] + 1;

        // This lane's rows g and g + 8 of the tile: the keys each sees ([first, ctx); none outside the run).
        int ctx[2], first[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = t0 + g + 8 * h;
            const bool in = r >= seg_lo && r < seg_hi;
            ctx[h] = in ? st.positions[r] + 1 : 0;
            first[h] = in && x.window > 0 ? max(0, ctx[h] - x.window) : 0;
        }
        // Q fragments (A operand, hi + lo) for the warp's query head.
        uint32_t qh[D / 16][4], ql[D / 16][4];
#pragma unroll
        for (int s = 0; s < D / 16; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = t0 + g + 8 * h;
                float2 a = make_float2(0.0f, 0.0f), b = a;
                if (ctx[h] > 0) {
                    const float* qr = q + (size_t(r) * HQ + head) * D + 16 * s + 2 * t;
                    a = *reinterpret_cast<const float2*>(qr);
                    b = *reinterpret_cast<const float2*>(qr + 8);
                }
                split_pair(a.x, a.y, qh[s][h], ql[s][h]);          // k = 2t, 2t + 1
                split_pair(b.x, b.y, qh[s][2 + h], ql[s][2 + h]);  // k = 2t + 8, 2t + 9
            }

        float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[n][e] = 0.0f;

        auto load_tile = [&](int buf, int k0) {
            for (int i = threadIdx.x; i < 2 * KT * kChunks; i += kThreads) {
                const int which = i / (KT * kChunks), key = (i / kChunks) % KT, c = i % kChunks;
                const int j = k0 + key;
                const bool valid = j >= kbeg && j < kend;
                const void* src = kv;
                if (valid)
                    src = kv + int64_t(table[j / BS]) * block_bytes + (which ? v_off : k_off) +
                          ((int64_t(kvh) * BS + j % BS) * D + c * 8) * int64_t(sizeof(bf16_t));
                bf16_t* dst = which ? &sv[buf][key][c * 8] : &sk[buf][key][c * 8];
                cp_async16_zfill(smem_addr(dst), src, valid);
            }
            cp_async_commit();
        };

        const int kt0 = kbeg / KT * KT;
        load_tile(0, kt0);
        for (int k0 = kt0, it = 0; k0 < kend; k0 += KT, ++it) {
            const int buf = it & 1;
            if (k0 + KT < kend) {
                load_tile(buf ^ 1, k0 + KT);
                cp_async_wait(1);
            } else {
                cp_async_wait(0);
            }
            __syncthreads();

            // S = Q K^T for KT keys
            float s[KT / 8][4];
#pragma unroll
            for (int n = 0; n < KT / 8; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
#pragma unroll
                for (int d = 0; d < D / 16; ++d) {
                    const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&sk[buf][n * 8 + g][16 * d + 2 * t]);
                    const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&sk[buf][n * 8 + g][16 * d + 2 * t + 8]);
                    mma_bf16_16816(s[n], qh[d][0], qh[d][1], qh[d][2], qh[d][3], b0, b1);
                    mma_bf16_16816(s[n], ql[d][0], ql[d][1], ql[d][2], ql[d][3], b0, b1);
                }
            }
            // Online softmax per row (h = 0: row g, entries 0-1; h = 1: row g + 8, entries 2-3).
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
#pragma unroll
                for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int j = k0 + n * 8 + 2 * t + e;
                        float sc = s[n][2 * h + e] * scale;
                        if (x.softcap > 0.0f) sc = x.softcap * tanhf(sc / x.softcap);
                        sc = j >= first[h] && j < ctx[h] ? sc : -INFINITY;
                        s[n][2 * h + e] = sc;
                        mx = fmaxf(mx, sc);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float m_new = fmaxf(m[h], mx);
                const float alpha = m_new == -INFINITY ? 0.0f : expf(m[h] - m_new);
                const float m_use = m_new == -INFINITY ? 0.0f : m_new;
                float sum = 0.0f;
#pragma unroll
                for (int n = 0; n < KT / 8; ++n)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const float p = expf(s[n][2 * h + e] - m_use);  // 0 for masked keys
                        s[n][2 * h + e] = p;
                        sum += p;
                    }
                l[h] = l[h] * alpha + sum;  // this lane's columns; summed over the quad at the end
                m[h] = m_new;
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    o[n][2 * h] *= alpha;
                    o[n][2 * h + 1] *= alpha;
                }
            }
            // O += P V: P's A fragments come from S's accumulators (keys 16kk .. 16kk + 15).
#pragma unroll
            for (int kk = 0; kk < KT / 16; ++kk) {
                uint32_t ph[4], pl[4];
                split_pair(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
                split_pair(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
                split_pair(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
                split_pair(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
                for (int n2 = 0; n2 < D / 16; ++n2) {
                    uint32_t v[4];  // B fragments of dims 16 n2 .. + 7 (v0, v1) and + 8 .. + 15 (v2, v3)
                    const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                    ldmatrix_x4_trans(v, smem_addr(&sv[buf][key][n2 * 16 + (lane >> 4) * 8]));
                    mma_bf16_16816(o[2 * n2], ph[0], ph[1], ph[2], ph[3], v[0], v[1]);
                    mma_bf16_16816(o[2 * n2], pl[0], pl[1], pl[2], pl[3], v[0], v[1]);
                    mma_bf16_16816(o[2 * n2 + 1], ph[0], ph[1], ph[2], ph[3], v[2], v[3]);
                    mma_bf16_16816(o[2 * n2 + 1], pl[0], pl[1], pl[2], pl[3], v[2], v[3]);
                }
            }
            __syncthreads();  // the buffer is refilled by the next iteration's load
        }

        // Normalize (with the sink logit joining the softmax) and write the run's rows.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float lt = l[h];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            float rescale = 1.0f;
            if (x.sinks) {
                const float sink = x.sinks[head];
                const float mf = fmaxf(m[h], sink);
                rescale = expf(m[h] - mf);
                lt = lt * rescale + expf(sink - mf);
            }
            if (ctx[h] == 0) continue;
            const float inv = rescale / lt;
            float* orow = out + (size_t(t0 + g + 8 * h) * HQ + head) * D + 2 * t;
#pragma unroll
            for (int n = 0; n < D / 8; ++n)
                *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
        }
        seg_lo = seg_hi;
    }
}

}  // namespace detail

// SCR_CUDA_ATTN_PREFILL=keys: prefill-sized launches on attention_keys_kernel (A/B runs); tests set
// attention_prefill_override() (kernels/cuda/step.hpp): 0 keys kernel, 1 tensor cores.
inline bool attention_prefill_mma_on() {
    if (attention_prefill_override() >= 0) return attention_prefill_override() == 1;
    static const bool on = env_choice_switch("SCR_CUDA_ATTN_PREFILL", true, {{"mma", true}, {"keys", false}}, "mma");
    return on;
}

template <int HQ, int HKV, int D, typename KVT>
constexpr bool attention_prefill_mma_fits() {
    return std::is_same_v<KVT, bf16_t> && HQ / HKV <= 8 && D % 16 == 0 && D <= 128;
}

}  // namespace scr::kernels::cuda
