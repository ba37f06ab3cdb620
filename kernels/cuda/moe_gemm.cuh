// Grouped expert GEMMs for the MoE MLP (bf16 experts). The per-(row, expert) GEMVs of moe.cuh
// read an expert's weights once for every row that picked it: fine for one decode row, but a
// 2k-token Qwen3-30B-A3B prefill step picks each of 128 experts ~128 times and spent 90 % of its
// time re-reading experts from L2. Here the step's (row, expert) pairs are grouped by expert and
// each weight tile is streamed once per chunk of up to 8 TN pairs, on the tensor cores.
//
// moe_group_kernel (one block): counts the pairs per expert, lays the pair ids out expert by expert
// (`order`), and cuts each expert's run into chunks of at most CR pairs (MoeChunk), writing the
// chunk count to device memory: the launches after it read their work from there, so a captured
// decode graph stays valid whatever the routing.
// moe_gemm_kernel: a persistent grid over (chunk, 16 MT weight rows) items. Per item the arithmetic
// is the MMA linear's (mma_linear_kernel in linear.cuh): weights as the A operand of mma.m16n8k16,
// x as bf16 hi + lo (~2^-17 relative), fixed K slices per warp and a fixed tree over the warps. A
// pair occupies one MMA column, and a column's sum does not depend on the other columns, so a pair
// gets the same bits whichever chunk, column or tile width TN it lands in: batch-invariant.
#pragma once

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/linear.cuh"

namespace scr::kernels::cuda {

struct MoeChunk {
    int expert, first, count, pad;  // pairs order[first .. first + count) of one expert
};

// Grouped-expert scratch after the activations and expert outputs (floats): order (pairs), the
// chunk count (+ padding to 16 bytes), the chunk table (at most pairs + experts entries of 4 ints).
template <int E>
constexpr int64_t moe_group_floats(int64_t pairs) {
    return pairs + 8 + 4 * (pairs + E);
}

namespace detail {

// Chunk size in pairs of a TN-column GEMM launch.
constexpr int moe_chunk_pairs(int tn) { return tn * 8; }

// Experts with wide_from pairs or more (wide_chunks non-null) are cut into chunks of CRW pairs in
// their own table `wide_chunks`, their count in n_chunks[1]; the rest into chunks of CR in `chunks`,
// their count in n_chunks[0]. Without a wide table every expert takes chunks of CR.
template <int E, int CR, int CRW = CR>
__global__ void __launch_bounds__(1024) moe_group_kernel(int pairs, const int32_t* __restrict__ top_id, int32_t* __restrict__ order,
                                                         MoeChunk* __restrict__ chunks, int32_t* __restrict__ n_chunks,
                                                         MoeChunk* __restrict__ wide_chunks = nullptr, int wide_from = 0) {
    __shared__ int count[E], first[E], cursor[E], chunk0[E];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        count[e] = 0;
        cursor[e] = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) atomicAdd(&count[top_id[i]], 1);
    __syncthreads();
    const bool split = wide_chunks != nullptr;
    auto wide = [&](int e) { return split && count[e] >= wide_from; };
    if (threadIdx.x < kWarp) {  // exclusive scans of the pair and the two tables' chunk counts, one warp
        constexpr int kPer = (E + kWarp - 1) / kWarp;
        const int lane = threadIdx.x;
        int s = 0, c = 0, cw = 0;
        for (int j = 0; j < kPer; ++j) {
            const int e = lane * kPer + j;
            if (e < E) {
                s += count[e];
                if (wide(e)) cw += (count[e] + CRW - 1) / CRW;
                else c += (count[e] + CR - 1) / CR;
            }
        }
        int si = s, ci = c, cwi = cw;
#pragma unroll
        for (int o = 1; o < kWarp; o <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, si, o), b = __shfl_up_sync(0xffffffffu, ci, o),
                      d = __shfl_up_sync(0xffffffffu, cwi, o);
            if (lane >= o) {
                si += a;
                ci += b;
                cwi += d;
            }
        }
        int at = si - s, nc = ci - c, nw = cwi - cw;
        for (int j = 0; j < kPer; ++j) {
            const int e = lane * kPer + j;
            if (e < E) {
                first[e] = at;
                at += count[e];
                if (wide(e)) {
                    chunk0[e] = nw;
                    nw += (count[e] + CRW - 1) / CRW;
                } else {
                    chunk0[e] = nc;
                    nc += (count[e] + CR - 1) / CR;
                }
            }
        }
        if (lane == kWarp - 1) {
            n_chunks[0] = ci;
            if (split) n_chunks[1] = cwi;
        }
    }
    __syncthreads();
    // A pair's slot inside its expert's run follows the atomics' order: harmless, since the column a
    // pair lands in does not change its bits (see the top of this file).
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        const int e = top_id[i];
        order[first[e] + atomicAdd(&cursor[e], 1)] = i;
    }
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        const bool w = wide(e);
        const int cr = w ? CRW : CR;
        MoeChunk* table = w ? wide_chunks : chunks;
        for (int j = 0; j * cr < count[e]; ++j) table[chunk0[e] + j] = MoeChunk{e, first[e] + j * cr, min(cr, count[e] - j * cr), 0};
    }
}

// The outputs lane (g, t) holds after a chunk's MMAs: rows g and g + 8 of each tile for the pair
// columns 2t and 2t + 1 of each 8-column group. f(n, j, o) for column n * 8 + 2t + j of each group n
// that the chunk fills, o its pair's output row (N floats).
template <int TN, int N, class Fn>
__device__ __forceinline__ void moe_chunk_outputs(const MoeChunk& ch, const int32_t* __restrict__ order, float* __restrict__ out, int t,
                                                  Fn&& f) {
#pragma unroll
    for (int n = 0; n < TN; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int i = n * 8 + 2 * t + j;
            if (i >= ch.count) continue;
            f(n, j, out + size_t(order[ch.first + i]) * N);
        }
}

// out[pair][n] = x[pair / XDIV] . W_MAT[n] (SWIGLU: silu(x . W_MAT[n]) * (x . W_MAT+1[n])), for every
// pair of every chunk. The up projection reads the token's row (XDIV = top_k) and the gate and up
// matrices (MAT 0, 1); the down projection reads the pair's activation row (XDIV = 1), matrix 2.
template <int K, int N, int TN, bool SWIGLU, int XDIV, int MAT>
__global__ void __launch_bounds__(mma_warps(K) * kWarp)
    moe_gemm_kernel(const float* __restrict__ x, const void* const* __restrict__ experts, const int32_t* __restrict__ order,
                    const MoeChunk* __restrict__ chunks, const int32_t* __restrict__ n_chunks, float* __restrict__ out) {
    using S = MmaShape<K, TN, SWIGLU>;
    constexpr int NW = S::NW, KW = S::KW, CH = S::CH, NA = S::NA, MT = S::MT, U = S::U;
    static_assert(KW % 32 == 0, "the grouped expert GEMM needs K % 32 == 0");
    static_assert(N % (kMmaRows * MT) == 0, "the grouped expert GEMM needs whole 16-row weight tiles");
    constexpr int kTiles = N / (kMmaRows * MT);
    constexpr int kVals = NA * MT * TN * 4;
    __shared__ float red[NW > 1 ? NW / 2 : 1][kVals][kWarp];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int items = *n_chunks * kTiles;

    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const MoeChunk ch = chunks[item / kTiles];
        const int nl = (item % kTiles) * (kMmaRows * MT);
        const bf16_t* wbase[NA];
        wbase[0] = static_cast<const bf16_t*>(experts[3 * ch.expert + MAT]) + size_t(nl + g) * K + warp * KW + 8 * t;
        if constexpr (SWIGLU) wbase[1] = static_cast<const bf16_t*>(experts[3 * ch.expert + MAT + 1]) + size_t(nl + g) * K + warp * KW + 8 * t;
        // Lane's token column g of each 8-column group: its x row from this warp's K slice on. A
        // column past the chunk's pairs reads the last pair's row (never a null row: a guarded null
        // load faulted in the quantized form, docs/CUDA.md "Session 47"); MMA columns are
        // independent and moe_chunk_outputs writes live columns only, so the live bits are the same.
        const float* xr[TN];
#pragma unroll
        for (int n = 0; n < TN; ++n) {
            const int i = min(n * 8 + g, ch.count - 1);
            xr[n] = x + size_t(order[ch.first + i] / XDIV) * K + warp * KW + 8 * t;
        }

        float acc[NA][MT][TN][4];
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < TN; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[a][m][n][e] = 0.0f;

        using WRegs = uint4[NA][MT][U][2];  // rows g and g + 8 of each tile
        auto load_round = [&](WRegs& w, int c0) {
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int a = 0; a < NA; ++a)
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        const bf16_t* r = wbase[a] + size_t(16 * m) * K + (c0 + u) * 32;
                        w[a][m][u][0] = load_stream16(r);
                        w[a][m][u][1] = load_stream16(r + size_t(8) * K);
                    }
        };
        auto mma_round = [&](const WRegs& w, int c0) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int n = 0; n < TN; ++n) {
                    const float4 x0 = *reinterpret_cast<const float4*>(xr[n] + (c0 + u) * 32);
                    const float4 x1 = *reinterpret_cast<const float4*>(xr[n] + (c0 + u) * 32 + 4);
                    const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                    uint32_t bh[4], bl[4];
#pragma unroll
                    for (int i = 0; i < 8; i += 2) {
                        const float h0 = __bfloat162float(__float2bfloat16_rn(xv[i]));
                        const float h1 = __bfloat162float(__float2bfloat16_rn(xv[i + 1]));
                        bh[i / 2] = pack_bf16x2(h0, h1);
                        bl[i / 2] = pack_bf16x2(xv[i] - h0, xv[i + 1] - h1);
                    }
#pragma unroll
                    for (int a = 0; a < NA; ++a)
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            const uint4& r0 = w[a][m][u][0];
                            const uint4& r8 = w[a][m][u][1];
                            mma_bf16_16816(acc[a][m][n], r0.x, r8.x, r0.y, r8.y, bh[0], bh[1]);
                            mma_bf16_16816(acc[a][m][n], r0.z, r8.z, r0.w, r8.w, bh[2], bh[3]);
                            mma_bf16_16816(acc[a][m][n], r0.x, r8.x, r0.y, r8.y, bl[0], bl[1]);
                            mma_bf16_16816(acc[a][m][n], r0.z, r8.z, r0.w, r8.w, bl[2], bl[3]);
                        }
                }
            }
        };
        if constexpr (S::kPipe) {
            WRegs wa, wb;
            load_round(wa, 0);
#pragma unroll 1
            for (int c0 = 0; c0 < CH; c0 += 2 * U) {
                if (c0 + U < CH) load_round(wb, c0 + U);
                mma_round(wa, c0);
                if (c0 + U >= CH) break;
                if (c0 + 2 * U < CH) load_round(wa, c0 + 2 * U);
                mma_round(wb, c0 + U);
            }
        } else {
            WRegs w;
#pragma unroll 1
            for (int c0 = 0; c0 < CH; c0 += U) {
                load_round(w, c0);
                mma_round(w, c0);
            }
        }
        // Fixed tree over the warps: the upper half hands its partials to the lower half.
#pragma unroll
        for (int half = NW / 2; half >= 1; half /= 2) {
            if (warp >= half && warp < 2 * half) {
                int v = 0;
#pragma unroll
                for (int a = 0; a < NA; ++a)
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int n = 0; n < TN; ++n)
#pragma unroll
                            for (int e = 0; e < 4; ++e) red[warp - half][v++][lane] = acc[a][m][n][e];
            }
            __syncthreads();
            if (warp < half) {
                int v = 0;
#pragma unroll
                for (int a = 0; a < NA; ++a)
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int n = 0; n < TN; ++n)
#pragma unroll
                            for (int e = 0; e < 4; ++e) acc[a][m][n][e] += red[warp][v++][lane];
            }
            __syncthreads();
        }
        if (warp != 0) continue;
        moe_chunk_outputs<TN, N>(ch, order, out, t, [&](int n, int j, float* o) {
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = nl + 16 * m + g + 8 * h;
                    float v = acc[0][m][n][2 * h + j];
                    if constexpr (SWIGLU) v = silu(v) * acc[NA - 1][m][n][2 * h + j];
                    o[row] = v;
                }
        });
    }
}

// ---- Wide chunks: warps over weight rows ----
// moe_gemm_kernel splits K over its warps, so every 16-row tile re-reads (from L2) and re-converts the
// chunk's x: at 32 pairs x K floats, twice the bytes of the tile's weights. For wide chunks (long
// prompts) moe_gemm_rows_kernel gives each warp its own 16 weight rows for the whole K instead; the
// chunk's x is staged in shared memory 64 k at a time as bf16 hi + lo, once for the block's warps
// (128 rows), and no partial sums cross warps. Its summation order (k in order within a warp) is not
// the k-split kernel's, so wide steps are a regime of their own; within it a pair still gets the same
// bits whichever chunk or column it lands in.
//
// Quantized experts expanded for a wide step (moe_quant.cuh):
//  * WP = 2 (MLX affine): each matrix is stored as bf16 hi then lo (w = hi + lo to ~2^-18 |w|, the
//    lo matrix right after the hi one); both are loaded and multiplied by x's hi and lo, except
//    lo x lo (~2^-18 |w x|, as large as the split's own error);
//  * row_scale (int8 / fp8: the matrices are the codes, exact in bf16): output row r of matrix m
//    = 3 e + j is multiplied by row_scale[m * max(K, N) + r] before the SwiGLU, as the GEMVs do.
template <int N>
__host__ __device__ constexpr int moe_row_warps() {
    return (N / 16) % 8 == 0 ? 8 : (N / 16) % 4 == 0 ? 4 : (N / 16) % 2 == 0 ? 2 : 1;
}
constexpr int kMoeRowsStep = 64;  // k staged per step (two 32-k sub-tiles)

template <int K, int N, int TN, bool SWIGLU, int XDIV, int MAT, int WP = 1, bool ROW_SCALE = false>
__global__ void __launch_bounds__(moe_row_warps<N>() * kWarp)
    moe_gemm_rows_kernel(const float* __restrict__ x, const void* const* __restrict__ experts, const int32_t* __restrict__ order,
                         const MoeChunk* __restrict__ chunks, const int32_t* __restrict__ n_chunks, float* __restrict__ out,
                         const float* __restrict__ row_scale) {
    constexpr int NWp = moe_row_warps<N>();
    constexpr int kThreads = NWp * kWarp;
    constexpr int NA = SWIGLU ? 2 : 1;
    constexpr int NL = NA * WP;  // weight loads per k step: each matrix (WP 2: its hi and lo parts)
    static_assert(WP == 1 || WP == 2, "moe_gemm_rows_kernel: bf16 weights (1) or bf16 hi + lo (2)");
    constexpr int kTiles = N / (16 * NWp);
    constexpr int P = TN * 8;  // pairs per chunk
    constexpr int KS = kMoeRowsStep;
    constexpr int kSteps = K / KS;
    constexpr int kPieces = P * KS / 4;  // float4 pieces of x per step
    static_assert(kPieces % kThreads == 0, "moe_gemm_rows_kernel: every thread stages whole slots of x pieces");
    constexpr int kSlots = kPieces / kThreads;
    static_assert(K % KS == 0 && N % (16 * NWp) == 0, "moe_gemm_rows_kernel: K % 64 and whole 16-row tiles per warp");
    // [buffer][hi, lo][32-k sub-tile][pair][k]: a pair's 32 k are 64 bytes, so the 8 lanes of a
    // quarter warp (pairs g, g + 1 x 16-byte pieces t) read 8 distinct bank groups.
    __shared__ __align__(16) bf16_t xs[2][2][2][P][32];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int items = *n_chunks * kTiles;

    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const MoeChunk ch = chunks[item / kTiles];
        const int row0 = (item % kTiles) * (16 * NWp) + warp * 16;
        const bf16_t* w[NL];
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int p = 0; p < WP; ++p)
                w[a * WP + p] = static_cast<const bf16_t*>(experts[3 * ch.expert + MAT + a]) + size_t(p) * N * K + size_t(row0 + g) * K + 8 * t;
        // The x pieces this thread stages: piece i -> pair i / (KS / 4), k 4 (i % (KS / 4)) of the step.
        // A pair past the chunk's stages the last pair's x (never a null row, as in moe_gemm_kernel;
        // its columns are never written).
        const float* src[kSlots];
#pragma unroll
        for (int sl = 0; sl < kSlots; ++sl) {
            const int i = threadIdx.x + sl * kThreads, pair = min(i / (KS / 4), ch.count - 1);
            src[sl] = x + size_t(order[ch.first + pair] / XDIV) * K + 4 * (i % (KS / 4));
        }
        float acc[NA][TN][4];
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int n = 0; n < TN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[a][n][e] = 0.0f;
        float4 xv[kSlots];
        uint4 wc[NL][2][2], wn[NL][2][2];  // [matrix (part)][sub-tile][rows g, g + 8]
        auto load_x = [&](int step) {
#pragma unroll
            for (int sl = 0; sl < kSlots; ++sl)
                xv[sl] = *reinterpret_cast<const float4*>(src[sl] + step * KS);
        };
        auto store_x = [&](int buf) {
#pragma unroll
            for (int sl = 0; sl < kSlots; ++sl) {
                const int i = threadIdx.x + sl * kThreads;
                const int pair = i / (KS / 4), k = 4 * (i % (KS / 4));
                uint32_t h0, l0, h1, l1;
                split_pair(xv[sl].x, xv[sl].y, h0, l0);
                split_pair(xv[sl].z, xv[sl].w, h1, l1);
                *reinterpret_cast<uint2*>(&xs[buf][0][k / 32][pair][k % 32]) = make_uint2(h0, h1);
                *reinterpret_cast<uint2*>(&xs[buf][1][k / 32][pair][k % 32]) = make_uint2(l0, l1);
            }
        };
        auto load_w = [&](uint4 (&r)[NL][2][2], int step) {
#pragma unroll
            for (int a = 0; a < NL; ++a)
#pragma unroll
                for (int sub = 0; sub < 2; ++sub) {
                    const bf16_t* p = w[a] + step * KS + sub * 32;
                    r[a][sub][0] = load_stream16(p);
                    r[a][sub][1] = load_stream16(p + size_t(8) * K);
                }
        };
        load_x(0);
        load_w(wc, 0);
        store_x(0);
        __syncthreads();
#pragma unroll 1
        for (int step = 0; step < kSteps; ++step) {
            const int buf = step & 1;
            if (step + 1 < kSteps) {
                load_x(step + 1);
                load_w(wn, step + 1);
            }
#pragma unroll
            for (int sub = 0; sub < 2; ++sub)
#pragma unroll
                for (int n = 0; n < TN; ++n) {
                    const uint4 bh = *reinterpret_cast<const uint4*>(&xs[buf][0][sub][n * 8 + g][8 * t]);
                    const uint4 bl = *reinterpret_cast<const uint4*>(&xs[buf][1][sub][n * 8 + g][8 * t]);
#pragma unroll
                    for (int a = 0; a < NA; ++a)
#pragma unroll
                        for (int p = 0; p < WP; ++p) {
                            const uint4& r0 = wc[a * WP + p][sub][0];
                            const uint4& r8 = wc[a * WP + p][sub][1];
                            mma_bf16_16816(acc[a][n], r0.x, r8.x, r0.y, r8.y, bh.x, bh.y);
                            mma_bf16_16816(acc[a][n], r0.z, r8.z, r0.w, r8.w, bh.z, bh.w);
                            if (p == 1) continue;  // lo x lo left out (see above)
                            mma_bf16_16816(acc[a][n], r0.x, r8.x, r0.y, r8.y, bl.x, bl.y);
                            mma_bf16_16816(acc[a][n], r0.z, r8.z, r0.w, r8.w, bl.z, bl.w);
                        }
                }
            if (step + 1 < kSteps) {
                store_x(buf ^ 1);  // the other buffer: every warp finished reading it before the last barrier
#pragma unroll
                for (int a = 0; a < NL; ++a)
#pragma unroll
                    for (int sub = 0; sub < 2; ++sub) {
                        wc[a][sub][0] = wn[a][sub][0];
                        wc[a][sub][1] = wn[a][sub][1];
                    }
            }
            __syncthreads();
        }
        // (rows of the warp's own tile)
        moe_chunk_outputs<TN, N>(ch, order, out, t, [&](int n, int j, float* o) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float v = acc[0][n][2 * h + j];
                if constexpr (ROW_SCALE) {
                    constexpr int kStride = K > N ? K : N;
                    const int row = row0 + g + 8 * h;
                    v *= row_scale[(3 * ch.expert + MAT) * kStride + row];
                    if constexpr (SWIGLU) v = silu(v) * (acc[NA - 1][n][2 * h + j] * row_scale[(3 * ch.expert + MAT + 1) * kStride + row]);
                } else {
                    if constexpr (SWIGLU) v = silu(v) * acc[NA - 1][n][2 * h + j];
                }
                o[row0 + g + 8 * h] = v;
            }
        });
    }
}

// Blocks of `kernel` the GPU holds at once (block of `threads`).
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads) {
    int per_sm = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    return device_sm_count() * (per_sm > 0 ? per_sm : 1);
}

template <int K, int N, int TN, bool SWIGLU, int XDIV, int MAT>
void launch_moe_gemm(const Ctx& c, int max_chunks, const float* x, const void* const* experts, const int32_t* order,
                     const MoeChunk* chunks, const int32_t* n_chunks, float* out) {
    constexpr auto kernel = moe_gemm_kernel<K, N, TN, SWIGLU, XDIV, MAT>;
    constexpr int threads = mma_warps(K) * kWarp;
    constexpr int tiles = N / (kMmaRows * MmaShape<K, TN, SWIGLU>::MT);
    static const int resident = resident_blocks(kernel, threads);
    const int64_t most = int64_t(max_chunks) * tiles;  // items if every chunk were used
    const int grid = int(std::min<int64_t>(most, resident));
    kernel<<<grid, threads, 0, c.stream>>>(x, experts, order, chunks, n_chunks, out);
}

template <int K, int N, int TN, bool SWIGLU, int XDIV, int MAT, int WP = 1, bool ROW_SCALE = false>
void launch_moe_gemm_rows(const Ctx& c, int max_chunks, const float* x, const void* const* experts, const int32_t* order,
                          const MoeChunk* chunks, const int32_t* n_chunks, float* out, const float* row_scale = nullptr) {
    constexpr auto kernel = moe_gemm_rows_kernel<K, N, TN, SWIGLU, XDIV, MAT, WP, ROW_SCALE>;
    constexpr int threads = moe_row_warps<N>() * kWarp;
    constexpr int tiles = N / (16 * moe_row_warps<N>());
    static const int resident = resident_blocks(kernel, threads);
    const int grid = int(std::min<int64_t>(int64_t(max_chunks) * tiles, resident));
    kernel<<<grid, threads, 0, c.stream>>>(x, experts, order, chunks, n_chunks, out, row_scale);
}

// Whether moe_gemm_rows_kernel covers an H x F expert (k staged kMoeRowsStep at a time).
template <int H, int F>
constexpr bool kMoeRowsFits = H % kMoeRowsStep == 0 && F % kMoeRowsStep == 0;

// SCR_CUDA_MOE_WIDE=ksplit: wide steps on the k-split kernel too (A/B runs).
inline bool moe_wide_rows_on() {
    static const bool on = env_choice_switch("SCR_CUDA_MOE_WIDE", true, {{"rows", true}, {"ksplit", false}}, "rows");
    return on;
}

}  // namespace detail

// Whether the expert MLPs of a step with `pairs` (row, pick) pairs run as grouped GEMMs (bf16
// experts whose shapes the MMA tiles cover) or as per-pair GEMVs. Grouping pays once the experts
// average half a pair or more (Qwen3-30B-A3B, 128 experts x top 8: from 8 rows); below that most
// experts meet one pair either way and the GEMVs' one launch less wins (docs/CUDA.md). Like the
// linears' row regimes, the two paths round differently; each is batch-invariant on its own.
// SCR_CUDA_MOE_GEMM=0 / =1 force the GEMVs / the grouped GEMMs (A/B runs); tests set
// moe_gemm_override() (kernels/cuda/step.hpp).
template <int H, int F, typename WT>
constexpr bool moe_gemm_fits() {
    return std::is_same_v<WT, bf16_t> && H % 32 == 0 && F % 32 == 0;
}
// Which expert form a step takes: SCR_CUDA_MOE_GEMM=0 / =1 (or moe_gemm_override() 0 / 1) force
// the per-pair GEMVs / the grouped form; =mma (override 3) the quantized experts' tensor-core form
// (moe_quant.cuh; bf16 experts take their grouped GEMMs); otherwise the row rules (moe_gemm_wanted,
// moe_quant_form).
// 4 (moe_gemm_override() only, a test hook): the quantized experts expanded to bf16.
enum class MoeGemmMode { kPerPair = 0, kGrouped = 1, kByRows = 2, kQuantMma = 3, kQuantExpand = 4 };
inline MoeGemmMode moe_gemm_mode() {
    static const MoeGemmMode from_env = env_choice_switch(
        "SCR_CUDA_MOE_GEMM", MoeGemmMode::kByRows,
        {{"0", MoeGemmMode::kPerPair}, {"1", MoeGemmMode::kGrouped}, {"mma", MoeGemmMode::kQuantMma}}, "the row rule");
    return moe_gemm_override() >= 0 ? MoeGemmMode(moe_gemm_override()) : from_env;
}
inline bool moe_gemm_wanted(int pairs, int experts) {
    const MoeGemmMode mode = moe_gemm_mode();
    if (mode == MoeGemmMode::kPerPair) return false;
    return mode != MoeGemmMode::kByRows || 2 * pairs >= experts;  // forced: the grouped GEMMs
}

// act[p] = SwiGLU(x[p / TOPK]) and y[p] = act[p] . Wd for the pairs p of `rows` rows, grouped by
// expert. `group` is moe_group_floats<E>(rows * TOPK) floats of scratch.
// The grouping's arrays in `group` (moe_group_floats<E>(pairs) floats): the pairs' order, the chunk
// count, the chunk table (16-byte aligned).
struct MoeGroupScratch {
    int32_t* order;
    int32_t* n_chunks;
    MoeChunk* chunks;
};
inline MoeGroupScratch moe_group_scratch(float* group, int pairs) {
    int32_t* order = reinterpret_cast<int32_t*>(group);
    int32_t* n_chunks = order + pairs;
    auto* chunks = reinterpret_cast<MoeChunk*>(n_chunks + 4 + (4 - (reinterpret_cast<uintptr_t>(n_chunks + 4) / 4) % 4) % 4);
    return {order, n_chunks, chunks};
}

// One step's grouping: its pairs ordered by expert in chunks of CR pairs (moe_group_kernel, into
// `group`) and the most chunks that can come of it (each expert's last chunk may be partial), which
// bounds the grouped kernels' grids; the chunk count itself stays on the device.
struct MoeGrouping : MoeGroupScratch {
    int max_chunks;
};
template <int E, int CR>
MoeGrouping launch_moe_group(const Ctx& c, int pairs, const int32_t* top_id, float* group) {
    const MoeGroupScratch s = moe_group_scratch(group, pairs);
    detail::moe_group_kernel<E, CR><<<1, 1024, 0, c.stream>>>(pairs, top_id, s.order, s.chunks, s.n_chunks);
    return {s, std::min(pairs, pairs / CR + E)};
}

// A grouping with a chunk size per expert: experts with wide_from (>= 2) pairs or more in chunks of
// CRW pairs (`wide`, their count at n_chunks + 1, at most max_wide of them), the rest in chunks of
// CR (as launch_moe_group). The wide table follows the narrow one's bound in the chunk scratch:
// pairs / CR + E + pairs / CRW + pairs / wide_from <= pairs + E entries.
struct MoeSplitGrouping : MoeGrouping {
    MoeChunk* wide;
    int max_wide;
};
template <int E, int CR, int CRW>
MoeSplitGrouping launch_moe_group_split(const Ctx& c, int pairs, const int32_t* top_id, float* group, int wide_from) {
    static_assert(CR >= 4 && CRW >= CR, "the two tables fit the chunk scratch for chunks of 4+ pairs");
    const MoeGroupScratch s = moe_group_scratch(group, pairs);
    const int max_narrow = std::min(pairs, pairs / CR + E);
    // each wide expert's last chunk may be partial; wide experts number at most pairs / wide_from
    wide_from = std::max(wide_from, 2);
    const int max_wide = pairs / CRW + std::min(E, pairs / wide_from);
    MoeChunk* wide = s.chunks + max_narrow;
    detail::moe_group_kernel<E, CR, CRW><<<1, 1024, 0, c.stream>>>(pairs, top_id, s.order, s.chunks, s.n_chunks, wide, wide_from);
    return {{s, max_narrow}, wide, max_wide};
}

// Steps whose experts average this many pairs or more are wide (32-pair chunks; moe_gemm_rows_kernel
// where the shape allows): every weight tile then feeds enough pairs to pay for staging x.
constexpr int kMoeWidePairsPerExpert = 16;

// A wide step on moe_gemm_rows_kernel (the shape allowing: detail::kMoeRowsFits): the pairs grouped
// in 32-pair chunks, then the gate / up and the down launches. `experts`: bf16 matrices, WP per
// weight matrix (hi then lo), and with ROW_SCALE their row scales (moe_quant.cuh's expanded experts).
template <int H, int F, int E, int TOPK, int WP = 1, bool ROW_SCALE = false>
void moe_experts_wide_rows(const Ctx& c, int pairs, const float* x, const void* const* experts, const int32_t* top_id, float* act,
                           float* y, float* group, const float* row_scale = nullptr) {
    static_assert(detail::kMoeRowsFits<H, F>, "moe_gemm_rows_kernel stages k in steps of kMoeRowsStep");
    const MoeGrouping g = launch_moe_group<E, detail::moe_chunk_pairs(4)>(c, pairs, top_id, group);
    detail::launch_moe_gemm_rows<H, F, 4, true, TOPK, 0, WP, ROW_SCALE>(c, g.max_chunks, x, experts, g.order, g.chunks, g.n_chunks, act,
                                                                         row_scale);
    detail::launch_moe_gemm_rows<F, H, 4, false, 1, 2, WP, ROW_SCALE>(c, g.max_chunks, act, experts, g.order, g.chunks, g.n_chunks, y,
                                                                       row_scale);
}

template <int H, int F, int E, int TOPK>
void moe_experts_grouped(const Ctx& c, int rows, const float* x, const void* const* experts, const int32_t* top_id, float* act,
                         float* y, float* group) {
    const int pairs = rows * TOPK;
    // Wide chunks (4 column groups: each weight tile feeds 32 pairs) once experts average 16+
    // pairs; narrow ones for decode-sized steps, where most experts see a pair or two.
    const bool wide = pairs >= kMoeWidePairsPerExpert * E;
    if constexpr (detail::kMoeRowsFits<H, F>) {
        if (wide && detail::moe_wide_rows_on()) {
            moe_experts_wide_rows<H, F, E, TOPK>(c, pairs, x, experts, top_id, act, y, group);
            return;
        }
    }
    auto run = [&]<int TN>() {
        const MoeGrouping g = launch_moe_group<E, detail::moe_chunk_pairs(TN)>(c, pairs, top_id, group);
        detail::launch_moe_gemm<H, F, TN, true, TOPK, 0>(c, g.max_chunks, x, experts, g.order, g.chunks, g.n_chunks, act);
        detail::launch_moe_gemm<F, H, TN, false, 1, 2>(c, g.max_chunks, act, experts, g.order, g.chunks, g.n_chunks, y);
    };
    if (wide) run.template operator()<4>();
    else run.template operator()<1>();
}

}  // namespace scr::kernels::cuda
