// y[t][n] = sum_k x[t][k] * W[n][k] (+ bias[n]) (+ residual[t][n]), W in the checkpoint's [out, in]
// layout (f32 / bf16 / f16), x and y float32, accumulation in float32.
//
// Paths, chosen per launch by the number of token rows (docs/CUDA.md has the measurements):
//  * 1 row (bf16; any rows up to 64 for f32/f16 weights): a GEMV that streams every weight row
//    once with 16-byte loads, one warp (or KSPLIT warps along K) per 1-4 weight rows (x loaded once
//    for all of them), up to 8 rows of x at once, a grid of what fits on the GPU. It can fold a preceding RMSNorm (x is normalized on the fly: y = inv_rms *
//    (x*w_norm)W^T, the sum of squares accumulated in the same pass), a grouped launch of up to
//    three matrices that read the same x (Q, K, V), and SwiGLU (silu(x Wg^T) * (x Wu^T)).
//  * 2-32 rows, bf16: the MMA linear (tensor cores, weights as the A operand, x as bf16 hi + lo),
//    with the same fusions.
//  * from 33 rows, bf16: cuBLASLt (runtime/cuda/prefill_gemm.hpp), x again as hi + lo; our tiled
//    tensor-core GEMM when cuBLASLt declines; other weight types take a plain float32 tiled GEMM.
// Within each of the first two paths, and within cuBLASLt's decode range (up to 256 rows, one
// algorithm per shape), a row's arithmetic never depends on the other rows of the launch.
#pragma once

#include <mma.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "runtime/cuda/prefill_gemm.hpp"

namespace scr::kernels::cuda {

// One weight matrix of a (possibly grouped) linear launch.
struct LinearOut {
    const void* w = nullptr;          // [n][K]; the gate for SwiGLU
    const void* w_up = nullptr;       // SwiGLU: the up projection
    const float* bias = nullptr;      // [n] or null
    const float* residual = nullptr;  // [rows][n] or null (may be y itself)
    float* y = nullptr;               // [rows][n]
    int n = 0;
};

// A preceding RMSNorm folded into the linear: its input, weight and eps. The linear's own x
// argument is where the normalized rows are planned (written only on the GEMM path).
struct RmsIn {
    const float* x = nullptr;
    const float* w = nullptr;
    float eps = 0.0f;
};

namespace detail {

constexpr int kMaxSegs = 3;
constexpr int kGemvWarps = 8;
constexpr int kGemvTile = 8;      // token rows one GEMV block carries
constexpr int kGemvMaxRows = 64;  // above: the GEMM path

struct LinearParams {
    LinearOut seg[kMaxSegs];
    int nseg = 1;
    int n_total = 0;
    const float* x = nullptr;       // [rows][K]
    const float* norm_w = nullptr;  // GEMV only: fold rmsnorm(x) * norm_w
    float eps = 0.0f;
    int rows = 0;
    L2Plan l2;  // GEMV only: upcoming weights its blocks prefetch into L2 (common.cuh)
    bool prefetch_next = false;  // GEMV only: a tile's last load round is followed by the next tile's first
    PdlTrigger trigger = PdlTrigger::start;  // GEMV only: where it calls pdl_trigger() (start, or after its wait)
};

// Warps per weight row: enough (row, split) warps to keep ~16k warps of loads in flight over the
// GPU (a short row per warp means fewer dependent load rounds), with at least two 16-byte chunks
// per lane. A function of the shape only, so the summation order never depends on the batch.
constexpr int gemv_ksplit(int n, int k, int vec) {
    int ks = 1;
    while (ks < 8 && n * ks < 16384 && (k / vec) / (ks * 4) >= kWarp) ks *= 2;
    return ks;
}

// Weight rows one warp of the GEMV carries (by default; SCR_CUDA_GEMV=row: one): each 16-byte chunk of
// x (float32, 2x the bytes of the bf16 weights it meets) is loaded once and used for RW weight rows,
// so x's traffic through L1 drops RW-fold and every lane has RW x more weight loads in flight. Up
// to 4, fewer where the token rows (TR) and SwiGLU's second matrix already fill the registers.
template <int TR, bool SWIGLU, int MAX_RW = 4>
constexpr int gemv_rows_per_warp() {
    const int r = 8 / (TR * (SWIGLU ? 2 : 1));
    return r > MAX_RW ? MAX_RW : (r < 1 ? 1 : r);
}
// 16-byte chunks per lane per load round: ~16 weight loads in flight per lane with RW rows, never
// more rounds' worth than the lane's share of its K split holds.
constexpr int gemv_chunk_batch(int rows_per_warp, bool swiglu, int chunks_per_split) {
    int b = 16 / (rows_per_warp * (swiglu ? 2 : 1));
    if (b < 1) b = 1;
    const int per_lane = (chunks_per_split + kWarp - 1) / kWarp;
    return b < per_lane ? b : per_lane;
}

// RW weight rows per warp (1: SCR_CUDA_GEMV=row, the earlier kernel), KB chunks per lane per load
// round. Every output's summation order (lane-strided chunks in increasing order, the chunk's 8
// products in order, a butterfly over the warp, then the KSPLIT warps' partials in split order)
// depends on the shape only, never on TR, RW or KB: batch-invariant, and the same bits as RW = 1.
//
// A tile is kRowsPerCta weight rows x TR token rows. With more than TR token rows, groups of TR
// rows, the group index fastest across tiles, so the blocks reading the same weight rows run
// together and all but the first read hit L2. Each warp holds RW weight rows of its tile (each row
// finds its own segment: a grouped launch's rows may straddle two) and one K split of them.
template <int K, typename WT, int TR, int KSPLIT, bool SWIGLU, int RW>
struct GemvWarpTile {
    static constexpr int kVec = Vec16<WT>::n;
    static constexpr int kChunks = K / kVec;
    static constexpr int kPerSplit = (kChunks + KSPLIT - 1) / KSPLIT;
    static constexpr int kRowsPerCta = kGemvWarps / KSPLIT * RW;
    int row0 = 0, rows = 0;  // the tile's token rows
    int seg[RW], nl[RW];     // each weight row's segment and row in it
    const WT* wr[RW];        // null: past the last row
    const WT* ur[RW];        // SwiGLU's up rows
    bool any_active = false;

    __device__ __forceinline__ GemvWarpTile(const LinearParams& p, int tile) {
        const int groups = (p.rows + TR - 1) / TR;
        row0 = (tile % groups) * TR;
        rows = min(TR, p.rows - row0);
        const int warp = threadIdx.x / kWarp;
        const int n0 = (tile / groups) * kRowsPerCta + (warp / KSPLIT) * RW;
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            int sg = 0, l = n0 + r;
            while (sg + 1 < p.nseg && l >= p.seg[sg].n) l -= p.seg[sg++].n;
            const bool live = n0 + r < p.n_total;
            any_active = any_active || live;
            seg[r] = sg;
            nl[r] = l;
            wr[r] = live ? static_cast<const WT*>(p.seg[sg].w) + size_t(l) * K : nullptr;
            ur[r] = live && SWIGLU ? static_cast<const WT*>(p.seg[sg].w_up) + size_t(l) * K : nullptr;
        }
    }
    // This warp's K split: chunks [c_begin, c_end).
    __device__ __forceinline__ static int c_begin() { return (int(threadIdx.x) / kWarp % KSPLIT) * kPerSplit; }
    __device__ __forceinline__ static int c_end() { return min(kChunks, c_begin() + kPerSplit); }

    // One load round: KB chunks per lane (lane-strided from c0) of each of the warp's rows.
    template <int KB>
    __device__ __forceinline__ void load(int c0, uint4 (&wv)[KB][RW], uint4 (&uv)[KB][SWIGLU ? RW : 1]) const {
        const int lane = threadIdx.x % kWarp, end = c_end();
#pragma unroll
        for (int b = 0; b < KB; ++b) {
            const int c = c0 + b * kWarp + lane;
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                if (c < end && wr[r]) {
                    wv[b][r] = load_stream16(wr[r] + size_t(c) * kVec);
                    if constexpr (SWIGLU) uv[b][r] = load_stream16(ur[r] + size_t(c) * kVec);
                }
            }
        }
    }
};

// The products of one load round into acc (and x's squares into ss for a folded norm).
template <int K, typename WT, int TR, bool SWIGLU, bool NORM, int RW, int KB>
__device__ __forceinline__ void gemv_round(const LinearParams& p, int row0, int rows, int c0, int c_end, const uint4 (&wv)[KB][RW],
                                           const uint4 (&uv)[KB][SWIGLU ? RW : 1], float (&acc)[SWIGLU ? 2 : 1][RW][TR],
                                           float (&ss)[TR]) {
    using V = Vec16<WT>;
    constexpr int kVec = V::n;
    const float* x = p.x + size_t(row0) * K;
    const int lane = threadIdx.x % kWarp;
#pragma unroll
    for (int b = 0; b < KB; ++b) {
        const int c = c0 + b * kWarp + lane;
        if (c >= c_end) continue;
        float nw[kVec];
        if constexpr (NORM) {
#pragma unroll
            for (int i = 0; i < kVec; i += 4) {
                const float4 f = __ldg(reinterpret_cast<const float4*>(p.norm_w + size_t(c) * kVec + i));
                nw[i] = f.x; nw[i + 1] = f.y; nw[i + 2] = f.z; nw[i + 3] = f.w;
            }
        }
#pragma unroll
        for (int t = 0; t < TR; ++t) {
            if (t >= rows) break;
            float xf[kVec];
#pragma unroll
            for (int i = 0; i < kVec; i += 4) {
                const float4 f = __ldg(reinterpret_cast<const float4*>(x + size_t(t) * K + size_t(c) * kVec + i));
                xf[i] = f.x; xf[i + 1] = f.y; xf[i + 2] = f.z; xf[i + 3] = f.w;
            }
            if constexpr (NORM) {
#pragma unroll
                for (int i = 0; i < kVec; ++i) {
                    ss[t] += xf[i] * xf[i];
                    xf[i] *= nw[i];
                }
            }
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                float wf[kVec], uf[kVec];
                V::unpack(wv[b][r], wf);
                if constexpr (SWIGLU) V::unpack(uv[b][r], uf);
#pragma unroll
                for (int i = 0; i < kVec; ++i) {
                    acc[0][r][t] += xf[i] * wf[i];
                    if constexpr (SWIGLU) acc[1][r][t] += xf[i] * uf[i];
                }
            }
        }
    }
}

// A tile's sums: a butterfly per warp, the KSPLIT warps' partials in split order (through shared
// memory; `partial` is reused from tile to tile, so a block's later tiles first wait for the
// previous tile's readers), then the epilogue (norm scale, SwiGLU, bias, residual) by lane 0 of each
// split-0 warp.
template <int K, typename WT, int TR, int KSPLIT, bool SWIGLU, bool NORM, int RW>
__device__ __forceinline__ void gemv_finish(const LinearParams& p, const GemvWarpTile<K, WT, TR, KSPLIT, SWIGLU, RW>& wt,
                                            float (&acc)[SWIGLU ? 2 : 1][RW][TR], float (&ss)[TR], bool later_tile) {
    constexpr int kVals = SWIGLU ? 2 : 1;
    __shared__ float partial[KSPLIT > 1 ? kGemvWarps : 1][kVals * RW + NORM][TR];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int split = warp % KSPLIT;
#pragma unroll
    for (int t = 0; t < TR; ++t) {
        ss[t] = warp_sum(ss[t]);
#pragma unroll
        for (int j = 0; j < kVals; ++j)
#pragma unroll
            for (int r = 0; r < RW; ++r) acc[j][r][t] = warp_sum(acc[j][r][t]);
    }
    if (KSPLIT > 1 && later_tile) __syncthreads();  // the previous tile's partials have been read
    if constexpr (KSPLIT > 1) {
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < TR; ++t) {
#pragma unroll
                for (int j = 0; j < kVals; ++j)
#pragma unroll
                    for (int r = 0; r < RW; ++r) partial[warp][j * RW + r][t] = acc[j][r][t];
                if constexpr (NORM) partial[warp][kVals * RW][t] = ss[t];
            }
        }
        __syncthreads();
        if (split != 0) return;
#pragma unroll
        for (int t = 0; t < TR; ++t) {
#pragma unroll
            for (int j = 0; j < kVals; ++j)
#pragma unroll
                for (int r = 0; r < RW; ++r) {
                    float v = 0.0f;
                    for (int k = 0; k < KSPLIT; ++k) v += partial[warp + k][j * RW + r][t];
                    acc[j][r][t] = v;
                }
            if constexpr (NORM) {
                float v = 0.0f;
                for (int k = 0; k < KSPLIT; ++k) v += partial[warp + k][kVals * RW][t];
                ss[t] = v;
            }
        }
    }
    if (lane != 0) return;
#pragma unroll
    for (int t = 0; t < TR; ++t) {
        if (t >= wt.rows) break;
        float inv = 1.0f;
        if constexpr (NORM) inv = 1.0f / sqrtf(ss[t] / float(K) + p.eps);
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            if (!wt.wr[r]) continue;
            const LinearOut& o = p.seg[wt.seg[r]];
            float v = acc[0][r][t];
            float u = SWIGLU ? acc[kVals - 1][r][t] : 0.0f;
            if constexpr (NORM) {
                v *= inv;
                u *= inv;
            }
            const size_t at = size_t(wt.row0 + t) * o.n + wt.nl[r];
            if constexpr (SWIGLU) {
                v = silu(v) * u;
            } else {
                if (o.bias) v += o.bias[wt.nl[r]];
                if (o.residual) v = o.residual[at] + v;
            }
            o.y[at] = v;
        }
    }
}

// Where the GEMV calls pdl_trigger() (PdlTrigger): at its start. SCR_CUDA_GEMV_TRIGGER=wait (after
// its pdl_wait(), for A/B runs) measured 0.3-0.6 % slower on the H200 (1B / 8B bf16, docs/CUDA.md
// "Session 19"; why was not profiled).
inline PdlTrigger gemv_trigger() {
    static const PdlTrigger v = pdl_trigger_choice("SCR_CUDA_GEMV_TRIGGER", PdlTrigger::start);
    return v;
}

// SCR_CUDA_GEMV_NEXT=0: a block walking several tiles issues a tile's first weight loads only once
// the previous tile is summed and stored (the kernel before session 11), instead of right after the
// previous tile's last products, so that they fly during its butterflies, barrier and stores.
inline bool gemv_prefetch_next_tile() {
    static const bool on = env_flag_switch("SCR_CUDA_GEMV_NEXT", true);
    return on;
}

// One tile (kRowsPerCta weight rows x TR token rows) per block, or, with a grid smaller than the
// tiles (SCR_CUDA_GEMV=persist, the default), every block walks tiles blockIdx.x, + gridDim.x, ...:
// a grid of what fits on the GPU at once keeps each SM streaming instead of refilling in waves.
// A tile's arithmetic is the same either way, and whether the next tile's first loads are issued
// before this tile's sums (p.prefetch_next) changes only when bytes arrive.
template <int K, typename WT, int TR, int KSPLIT, bool SWIGLU, bool NORM, int RW, int KB>
__global__ void __launch_bounds__(kGemvWarps * kWarp, 2) gemv_kernel(const __grid_constant__ LinearParams p) {
    using Tile = GemvWarpTile<K, WT, TR, KSPLIT, SWIGLU, RW>;
    if (p.trigger == PdlTrigger::start) pdl_trigger();
    l2_prefetch_part(p.l2, blockIdx.x, gridDim.x);  // the next launches' weights (none unless the emitter asked)
    bool waited = false;  // pdl_wait() comes after the first weight loads are in flight
    const auto wait_once = [&] {
        if (waited) return;
        pdl_wait();
        if (p.trigger != PdlTrigger::start) pdl_trigger();
        waited = true;
    };
    const int tiles = (p.n_total + Tile::kRowsPerCta - 1) / Tile::kRowsPerCta * ((p.rows + TR - 1) / TR);
    const int c_begin = Tile::c_begin(), c_end = Tile::c_end();
    uint4 wv[KB][RW], uv[KB][SWIGLU ? RW : 1];
    int tile = blockIdx.x;
    if (tile < tiles) {
        Tile cur(p, tile);
        if (cur.any_active) cur.template load<KB>(c_begin, wv, uv);
        for (bool later = false;; later = true) {
            const int next = tile + int(gridDim.x);
            const bool prefetch = p.prefetch_next && next < tiles;
            float acc[SWIGLU ? 2 : 1][RW][TR], ss[TR];
#pragma unroll
            for (int t = 0; t < TR; ++t) {
                ss[t] = 0.0f;
#pragma unroll
                for (int j = 0; j < (SWIGLU ? 2 : 1); ++j)
#pragma unroll
                    for (int r = 0; r < RW; ++r) acc[j][r][t] = 0.0f;
            }
            bool loaded_next = false;
            if (cur.any_active) {
                for (int c0 = c_begin; c0 < c_end; c0 += kWarp * KB) {
                    wait_once();
                    gemv_round<K, WT, TR, SWIGLU, NORM, RW, KB>(p, cur.row0, cur.rows, c0, c_end, wv, uv, acc, ss);
                    if (c0 + kWarp * KB < c_end) {
                        cur.template load<KB>(c0 + kWarp * KB, wv, uv);
                    } else if (prefetch) {
                        const Tile nt(p, next);
                        if (nt.any_active) nt.template load<KB>(c_begin, wv, uv);
                        loaded_next = true;
                    }
                }
            }
            wait_once();
            gemv_finish<K, WT, TR, KSPLIT, SWIGLU, NORM, RW>(p, cur, acc, ss, later);
            if (next >= tiles) break;
            tile = next;
            cur = Tile(p, tile);
            if (!loaded_next && cur.any_active) cur.template load<KB>(c_begin, wv, uv);
        }
    }
    wait_once();
}

// ---- Decode linear on tensor cores, weights as the MMA's A operand ("swap AB") ----
// mma.m16n8k16: 16 weight rows x 16 k (A) times 16 k x 8 token rows (B). Each block owns MT tiles
// of 16 weight rows; its warps split K into fixed slices and their partial sums meet in a fixed
// tree, so an output's arithmetic depends on neither the number of token rows nor the other rows:
// every batch size gives each row the same bits. x (float32) enters as two bf16 parts, hi + lo, so
// products keep ~2^-17 relative accuracy. Within a 32-k chunk lane (g, t) loads 16 contiguous
// bytes (k = 8t..8t+7) of rows g and g+8, and the same 8 k of token g: the MMA's k order is a
// permutation of memory order, applied alike to A and B, so every load is a coalesced 16-byte one.
// Weight loads run one round (U chunks) ahead of the MMAs when registers allow (small TN).
constexpr int kMmaRows = 16;

// Warps splitting K: as many as divide K into 32-k chunks, up to 8.
__host__ __device__ constexpr int mma_warps(int k) {
    int w = 8;
    while (w > 1 && k % (w * 32) != 0) w /= 2;
    return w;
}
// 16-row tiles per block: two once there are 32+ token rows (each x load then feeds twice the
// weights); SwiGLU already has two matrices per tile (and no registers left for more).
__host__ __device__ constexpr int mma_tiles(int tn, bool swiglu) { return tn >= 4 && !swiglu ? 2 : 1; }

template <int K, int TN, bool SWIGLU>
struct MmaShape {
    static constexpr int NW = mma_warps(K);
    static constexpr int KW = K / NW;   // k per warp
    static constexpr int CH = KW / 32;  // 32-k chunks per warp
    static constexpr int NA = SWIGLU ? 2 : 1;
    static constexpr int MT = mma_tiles(TN, SWIGLU);
    static constexpr bool kPipe = TN <= 2;  // double-buffered weight registers
    // Chunks per round: ~64 registers of weights per buffer, and a divisor of CH.
    static constexpr int U0 = 8 / (NA * MT) < 1 ? 1 : 8 / (NA * MT);
    static constexpr int U1 = kPipe ? (U0 / 2 < 1 ? 1 : U0 / 2) : U0;
    static constexpr int U = CH % U1 == 0 ? (U1 < CH ? U1 : CH) : 1;
};

// Blocks per SM the launch bounds ask for. One by default: without it ptxas held these kernels to
// 128-142 registers; told one block is enough it takes 187-230 and keeps more weight loads in flight
// (8B decode at batch 16: 2,157 against 1,672 tok/s, docs/CUDA.md, session 8). Two (at most 128
// registers) for one 8-row token tile when each warp has at most 8 chunks of K: so short a pipeline
// hides little latency on its own, and twice the warps per SM do. H200, session 27: with two blocks
// for the 1B's K = 2048 launches (its down, K = 8192, keeps one) its batches of 2-8 rows ran 8-15 %
// faster; with two for every one-tile launch the 8B's (K = 4096, 16 chunks per warp) ran 4 % slower.
__host__ __device__ constexpr int mma_min_blocks(int k, int tn) { return tn == 1 && k / mma_warps(k) / 32 <= 8 ? 2 : 1; }

template <int K, int TN, bool SWIGLU, bool NORM>
__global__ void __launch_bounds__(mma_warps(K) * kWarp, mma_min_blocks(K, TN)) mma_linear_kernel(const __grid_constant__ LinearParams p) {
    using S = MmaShape<K, TN, SWIGLU>;
    constexpr int NW = S::NW, KW = S::KW, CH = S::CH, NA = S::NA, MT = S::MT, U = S::U;
    static_assert(KW % 32 == 0, "the MMA linear needs K % 32 == 0");
    constexpr int kVals = NA * MT * TN * 4 + (NORM ? TN : 0);
    __shared__ float red[NW > 1 ? NW / 2 : 1][kVals][kWarp];

    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    int nl = blockIdx.y * (kMmaRows * MT), s = 0;
    while (s + 1 < p.nseg && nl >= p.seg[s].n) nl -= p.seg[s++].n;
    const LinearOut& o = p.seg[s];
    const int tok0 = blockIdx.x * (TN * 8);

    // Lane's first weight element of (matrix a, tile m): row nl + 16m + g, k = warp slice + 8t.
    const bf16_t* wbase[NA];
    wbase[0] = static_cast<const bf16_t*>(o.w) + size_t(nl + g) * K + warp * KW + 8 * t;
    if constexpr (SWIGLU) wbase[1] = static_cast<const bf16_t*>(o.w_up) + size_t(nl + g) * K + warp * KW + 8 * t;

    float acc[NA][MT][TN][4], ss[TN];
#pragma unroll
    for (int n = 0; n < TN; ++n) {
        ss[n] = 0.0f;
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[a][m][n][e] = 0.0f;
    }

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
            const int k = warp * KW + (c0 + u) * 32 + 8 * t;
            float nw[8];
            if constexpr (NORM) {
                const float4 n0 = __ldg(reinterpret_cast<const float4*>(p.norm_w + k));
                const float4 n1 = __ldg(reinterpret_cast<const float4*>(p.norm_w + k + 4));
                nw[0] = n0.x; nw[1] = n0.y; nw[2] = n0.z; nw[3] = n0.w;
                nw[4] = n1.x; nw[5] = n1.y; nw[6] = n1.z; nw[7] = n1.w;
            }
#pragma unroll
            for (int n = 0; n < TN; ++n) {
                const int tok = tok0 + n * 8 + g;
                float xv[8];
                if (tok < p.rows) {
                    const float4 x0 = *reinterpret_cast<const float4*>(p.x + size_t(tok) * K + k);
                    const float4 x1 = *reinterpret_cast<const float4*>(p.x + size_t(tok) * K + k + 4);
                    xv[0] = x0.x; xv[1] = x0.y; xv[2] = x0.z; xv[3] = x0.w;
                    xv[4] = x1.x; xv[5] = x1.y; xv[6] = x1.z; xv[7] = x1.w;
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) xv[i] = 0.0f;
                }
                uint32_t bh[4], bl[4];
#pragma unroll
                for (int i = 0; i < 8; i += 2) {
                    float v0 = xv[i], v1 = xv[i + 1];
                    if constexpr (NORM) {
                        ss[n] += v0 * v0;
                        ss[n] += v1 * v1;
                        v0 *= nw[i];
                        v1 *= nw[i + 1];
                    }
                    const float h0 = __bfloat162float(__float2bfloat16_rn(v0));
                    const float h1 = __bfloat162float(__float2bfloat16_rn(v1));
                    bh[i / 2] = pack_bf16x2(h0, h1);
                    bl[i / 2] = pack_bf16x2(v0 - h0, v1 - h1);
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
        pdl_wait();  // weights never depend on an earlier kernel: the first loads fly before the wait
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
            if (c0 == 0) pdl_wait();
            mma_round(w, c0);
        }
    }
    pdl_trigger();
    // Sum of squares of token g of tile n: over the 4 lanes of the row group, then the warps.
    if constexpr (NORM) {
#pragma unroll
        for (int n = 0; n < TN; ++n) {
            ss[n] += __shfl_xor_sync(0xffffffffu, ss[n], 1);
            ss[n] += __shfl_xor_sync(0xffffffffu, ss[n], 2);
        }
    }
    // Fixed tree over the warps: the upper half hands its partials to the lower half.
    auto each_partial = [&](auto&& f) {  // every accumulator (then every sum of squares) with its slot
        int v = 0;
#pragma unroll
        for (int a = 0; a < NA; ++a)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < TN; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) f(acc[a][m][n][e], v++);
        if constexpr (NORM) {
#pragma unroll
            for (int n = 0; n < TN; ++n) f(ss[n], v++);
        }
    };
#pragma unroll
    for (int half = NW / 2; half >= 1; half /= 2) {
        if (warp >= half && warp < 2 * half) each_partial([&](float& p, int v) { red[warp - half][v][lane] = p; });
        __syncthreads();
        if (warp < half) each_partial([&](float& p, int v) { p += red[warp][v][lane]; });
        __syncthreads();
    }
    if (warp != 0) return;
    // Lane (g, t) holds rows g and g + 8 of each tile for token columns 2t and 2t + 1.
#pragma unroll
    for (int n = 0; n < TN; ++n) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int col = 2 * t + j;
            float inv = 1.0f;
            if constexpr (NORM) {
                const float sum = __shfl_sync(0xffffffffu, ss[n], col * 4);
                inv = 1.0f / sqrtf(sum / float(K) + p.eps);
            }
            const int tok = tok0 + n * 8 + col;
            if (tok >= p.rows) continue;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = nl + 16 * m + g + 8 * h;
                    float v = acc[0][m][n][2 * h + j] * inv;
                    const size_t at = size_t(tok) * o.n + row;
                    if constexpr (SWIGLU) {
                        v = silu(v) * (acc[NA - 1][m][n][2 * h + j] * inv);
                    } else {
                        if (o.bias) v += o.bias[row];
                        if (o.residual) v = o.residual[at] + v;
                    }
                    o.y[at] = v;
                }
        }
    }
}

// ---- Tensor-core GEMM for bf16 weights (rows > kGemvMaxRows) ----
namespace wmma = nvcuda::wmma;

template <int K, int BN, bool SWIGLU>
__global__ void __launch_bounds__(128) gemm_bf16_kernel(const __grid_constant__ LinearParams p) {
    constexpr int BM = 64;
    constexpr int BK = K % 32 == 0 ? 32 : 16;
    constexpr int LDA = BK + 8;  // bf16 elements; rows stay 16-byte aligned, fewer bank conflicts
    constexpr int LDC = BN + 4;
    constexpr int FM = 2, FN = BN / 32;  // 16x16 fragments per warp (2 x 2 warps)
    static_assert(K % 16 == 0, "the tensor-core path needs K % 16 == 0");
    __shared__ __align__(32) __nv_bfloat16 a_hi[BM][LDA], a_lo[BM][LDA], b_g[BN][LDA], b_u[SWIGLU ? BN : 1][LDA];
    __shared__ __align__(32) float c_tile[BM][LDC];
    pdl_wait();
    pdl_trigger();

    const LinearOut& o = p.seg[blockIdx.z];
    const int n0 = blockIdx.x * BN, t0 = blockIdx.y * BM;
    if (n0 >= o.n) return;
    const int tid = threadIdx.x, warp = tid / kWarp;
    const int wm = warp / 2, wn = warp % 2;
    const __nv_bfloat16* wg = static_cast<const __nv_bfloat16*>(o.w);
    const __nv_bfloat16* wu = static_cast<const __nv_bfloat16*>(o.w_up);

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN], acc_u[SWIGLU ? FM : 1][SWIGLU ? FN : 1];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            wmma::fill_fragment(acc[i][j], 0.0f);
            if constexpr (SWIGLU) wmma::fill_fragment(acc_u[i][j], 0.0f);
        }

    for (int k0 = 0; k0 < K; k0 += BK) {
        // x tile -> hi/lo bf16
        for (int i = tid; i < BM * BK / 4; i += 128) {
            const int r = i / (BK / 4), c4 = (i % (BK / 4)) * 4;
            float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t0 + r < p.rows) f = __ldg(reinterpret_cast<const float4*>(p.x + size_t(t0 + r) * K + k0 + c4));
            const float v[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const __nv_bfloat16 hi = __float2bfloat16_rn(v[e]);
                a_hi[r][c4 + e] = hi;
                a_lo[r][c4 + e] = __float2bfloat16_rn(v[e] - __bfloat162float(hi));
            }
        }
        // weight tile(s)
        for (int i = tid; i < BN * BK / 8; i += 128) {
            const int r = i / (BK / 8), c8 = (i % (BK / 8)) * 8;
            uint4 g = make_uint4(0, 0, 0, 0), u = make_uint4(0, 0, 0, 0);
            if (n0 + r < o.n) {
                g = load_stream16(wg + size_t(n0 + r) * K + k0 + c8);
                if constexpr (SWIGLU) u = load_stream16(wu + size_t(n0 + r) * K + k0 + c8);
            }
            *reinterpret_cast<uint4*>(&b_g[r][c8]) = g;
            if constexpr (SWIGLU) *reinterpret_cast<uint4*>(&b_u[r][c8]) = u;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> ah[FM], al[FM];
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                wmma::load_matrix_sync(ah[i], &a_hi[wm * 32 + i * 16][kk], LDA);
                wmma::load_matrix_sync(al[i], &a_lo[wm * 32 + i * 16][kk], LDA);
            }
#pragma unroll
            for (int j = 0; j < FN; ++j) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bf;
                wmma::load_matrix_sync(bf, &b_g[wn * (BN / 2) + j * 16][kk], LDA);
#pragma unroll
                for (int i = 0; i < FM; ++i) {
                    wmma::mma_sync(acc[i][j], ah[i], bf, acc[i][j]);
                    wmma::mma_sync(acc[i][j], al[i], bf, acc[i][j]);
                }
                if constexpr (SWIGLU) {
                    wmma::load_matrix_sync(bf, &b_u[wn * (BN / 2) + j * 16][kk], LDA);
#pragma unroll
                    for (int i = 0; i < FM; ++i) {
                        wmma::mma_sync(acc_u[i][j], ah[i], bf, acc_u[i][j]);
                        wmma::mma_sync(acc_u[i][j], al[i], bf, acc_u[i][j]);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            if constexpr (SWIGLU) {
                // Gate and up fragments share one element mapping, so this is elementwise.
#pragma unroll
                for (int e = 0; e < acc[i][j].num_elements; ++e) acc[i][j].x[e] = silu(acc[i][j].x[e]) * acc_u[i][j].x[e];
            }
            wmma::store_matrix_sync(&c_tile[wm * 32 + i * 16][wn * (BN / 2) + j * 16], acc[i][j], LDC, wmma::mem_row_major);
        }
    __syncthreads();
    for (int i = tid; i < BM * BN; i += 128) {
        const int r = i / BN, col = i % BN;
        const int t = t0 + r, nn = n0 + col;
        if (t >= p.rows || nn >= o.n) continue;
        float v = c_tile[r][col];
        const size_t at = size_t(t) * o.n + nn;
        if constexpr (!SWIGLU) {
            if (o.bias) v += o.bias[nn];
            if (o.residual) v = o.residual[at] + v;
        }
        o.y[at] = v;
    }
}

// ---- Plain float32 tiled GEMM (f32/f16 weights, or K not a multiple of 16) ----
template <int K, typename WT, bool SWIGLU>
__global__ void __launch_bounds__(256) gemm_simt_kernel(const __grid_constant__ LinearParams p) {
    constexpr int B = 16;
    __shared__ float xs[B][B + 1], ws[B][B + 1], us[SWIGLU ? B : 1][B + 1];
    pdl_wait();
    pdl_trigger();
    const LinearOut& o = p.seg[blockIdx.z];
    const int n0 = blockIdx.x * B, t0 = blockIdx.y * B;
    if (n0 >= o.n) return;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const WT* wg = static_cast<const WT*>(o.w);
    const WT* wu = static_cast<const WT*>(o.w_up);
    float acc = 0.0f, acc_u = 0.0f;
    for (int k0 = 0; k0 < K; k0 += B) {
        const int k = k0 + tx;
        xs[ty][tx] = (t0 + ty < p.rows && k < K) ? p.x[size_t(t0 + ty) * K + k] : 0.0f;
        ws[ty][tx] = (n0 + ty < o.n && k < K) ? to_f32(wg[size_t(n0 + ty) * K + k]) : 0.0f;
        if constexpr (SWIGLU) us[ty][tx] = (n0 + ty < o.n && k < K) ? to_f32(wu[size_t(n0 + ty) * K + k]) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < B; ++kk) {
            acc += xs[ty][kk] * ws[tx][kk];
            if constexpr (SWIGLU) acc_u += xs[ty][kk] * us[tx][kk];
        }
        __syncthreads();
    }
    const int t = t0 + ty, nn = n0 + tx;
    if (t >= p.rows || nn >= o.n) return;
    const size_t at = size_t(t) * o.n + nn;
    float v = acc;
    if constexpr (SWIGLU) {
        v = silu(v) * acc_u;
    } else {
        if (o.bias) v += o.bias[nn];
        if (o.residual) v = o.residual[at] + v;
    }
    o.y[at] = v;
}

// The GEMV's variant, SCR_CUDA_GEMV: "row" one weight row per warp, one tile per block (the
// earlier GEMV, kept for A/B runs); "rows" at most 4 rows per warp (gemv_rows_per_warp), one tile
// per block; default ("persist"): at most 4 rows per warp and, where there are at most 4 tiles per
// block slot, a grid of the blocks that fit on the GPU at once, each walking several tiles. The same bits in every case. (At most 2 rows per
// warp measured no better than 4: docs/CUDA.md.)
struct GemvVariant {
    int max_rows_per_warp = 4;
    bool persistent = true;
};
inline GemvVariant gemv_variant_from_env() {
    static const GemvVariant v = env_choice_switch("SCR_CUDA_GEMV", GemvVariant{4, true},
                                                   {{"persistent", GemvVariant{4, true}},
                                                    {"rows", GemvVariant{4, false}},
                                                    {"row", GemvVariant{1, false}}},
                                                   "persistent");
    return v;
}

template <int K, typename WT, int NTOTAL, bool SWIGLU, bool NORM, int TR, int MAX_RW>
void launch_gemv_rw(const Ctx& c, const LinearParams& p, bool persistent = false) {
    constexpr int ks = gemv_ksplit(NTOTAL, K, Vec16<WT>::n);
    constexpr int rw = MAX_RW == 1 ? 1 : gemv_rows_per_warp<TR, SWIGLU, MAX_RW>();
    constexpr int kb = rw == 1 ? 4 : gemv_chunk_batch(rw, SWIGLU, ceil_div(K / Vec16<WT>::n, ks));  // rw 1: the earlier kernel
    constexpr int rows_per_cta = kGemvWarps / ks * rw;
    constexpr auto kernel = gemv_kernel<K, WT, TR, ks, SWIGLU, NORM, rw, kb>;
    const int tiles = ceil_div(NTOTAL, rows_per_cta) * ceil_div(p.rows, TR);
    int grid = tiles;
    if (persistent) {
        static const int resident = [=] {  // blocks of this kernel the GPU holds at once
            int per_sm = 0;
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvWarps * kWarp, 0);
            return device_sm_count() * (per_sm > 0 ? per_sm : 1);
        }();
        // Many tiles per block (lm_head: ~15) measured slower than one tile per block
        // (docs/CUDA.md, session 4): walk tiles only where each block gets a few.
        if (tiles <= 4 * resident) grid = tiles < resident ? tiles : resident;
    }
    LinearParams q = p;
    q.prefetch_next = grid < tiles && gemv_prefetch_next_tile();
    q.trigger = gemv_trigger();
    launch(c, kernel, dim3(grid), dim3(kGemvWarps * kWarp), q);
}

template <int K, typename WT, int NTOTAL, bool SWIGLU, bool NORM, int TR>
void launch_gemv(const Ctx& c, const LinearParams& p) {
    const GemvVariant v = gemv_variant_from_env();
    if (v.max_rows_per_warp == 1) launch_gemv_rw<K, WT, NTOTAL, SWIGLU, NORM, TR, 1>(c, p, v.persistent);
    else launch_gemv_rw<K, WT, NTOTAL, SWIGLU, NORM, TR, 4>(c, p, v.persistent);
}

// The MMA linear, off with SCR_CUDA_LINEAR=simt (the float32 GEMV below; kept for A/B runs).
// SCR_CUDA_PREFILL=mma also sends more than kMmaMaxRows rows through it (instead of cuBLASLt).
enum class LinearMode { rule, mma, gemv_to_8, simt };
inline LinearMode linear_mode() {
    static const LinearMode m = env_choice_switch(
        "SCR_CUDA_LINEAR", LinearMode::rule,
        {{"rule", LinearMode::rule}, {"mma", LinearMode::mma}, {"gemv-to-8", LinearMode::gemv_to_8}, {"simt", LinearMode::simt}},
        "the rule");
    return m;
}
inline bool mma_linear_on() { return linear_mode() != LinearMode::simt; }
// Token rows the MMA linear takes by default: from 2 up to cuBLASLt's threshold
// (cuda_rt::cublas_min_rows(), 33). At one row the float32 GEMV, whose many small blocks keep more
// weight bytes in flight, is faster (8B: 246 against 206 tok/s); from 2 rows its float32 work per
// weight grows with the rows and it falls below the MMA linear (batch 2: 8B 374 against 404-405,
// 1B 1,825-1,828 against 1,976-1,977 tok/s), far below at 3-8 rows (8B batch 8: 419 against 1,530; docs/CUDA.md
// "Session 27"). From the threshold, cuBLASLt.
// SCR_CUDA_LINEAR=mma sends one row to the MMA linear too; SCR_CUDA_LINEAR=gemv-to-8 keeps 2-8 rows on
// the GEMV, the regime before session 27 (for A/B runs only: the attention split stays at one row).
constexpr int kMmaMinRows = kGemvRegimeRows + 1, kMmaMaxRows = 256;
inline int mma_min_rows() {
    const LinearMode m = linear_mode();
    return m == LinearMode::mma ? 1 : m == LinearMode::gemv_to_8 ? 9 : kMmaMinRows;
}
inline bool mma_prefill_on() { return prefill_gemm_choice() == PrefillGemm::mma; }

template <int K, bool SWIGLU, bool NORM, int TN>
void launch_mma(const Ctx& c, const LinearParams& p) {
    launch(c, mma_linear_kernel<K, TN, SWIGLU, NORM>, dim3(ceil_div(p.rows, TN * 8), p.n_total / (kMmaRows * mma_tiles(TN, SWIGLU))),
           dim3(mma_warps(K) * kWarp), p);
}

template <int K, bool SWIGLU, bool NORM>
void launch_mma_rows(const Ctx& c, const LinearParams& p) {
    if (p.rows <= 8) launch_mma<K, SWIGLU, NORM, 1>(c, p);
    else if (p.rows <= 16) launch_mma<K, SWIGLU, NORM, 2>(c, p);
    else if (p.rows <= 32) launch_mma<K, SWIGLU, NORM, 4>(c, p);
    else launch_mma<K, SWIGLU, NORM, 8>(c, p);
}

template <int K, typename WT, int NTOTAL, bool SWIGLU, bool NORM>
void launch_gemv_rows(const Ctx& c, const LinearParams& p) {
    if (p.rows <= 1) launch_gemv<K, WT, NTOTAL, SWIGLU, NORM, 1>(c, p);
    else if (p.rows <= 2) launch_gemv<K, WT, NTOTAL, SWIGLU, NORM, 2>(c, p);
    else if (p.rows <= 4) launch_gemv<K, WT, NTOTAL, SWIGLU, NORM, 4>(c, p);
    else launch_gemv<K, WT, NTOTAL, SWIGLU, NORM, kGemvTile>(c, p);
}

// x: the linear's input rows (with a folded norm: where the normalized rows are planned).
// NORM is known where the call is generated, so only one GEMV variant is instantiated per call.
template <int K, typename WT, bool SWIGLU, int NTOTAL, int NMAX, bool NORM>
void linear_run(const Ctx& c, int rows, const float* x, LinearParams p, const RmsIn& norm) {
    if (rows <= 0) return;
    p.rows = rows;
    p.n_total = NTOTAL;
    // From cuda_rt::cublas_min_rows() rows on (prefill), bf16 linears go to cuBLASLt first.
    const bool cublas_first = std::is_same_v<WT, bf16_t> && K % 16 == 0 && rows >= cuda_rt::cublas_min_rows();
    if constexpr (std::is_same_v<WT, bf16_t> && K % 32 == 0) {
        bool whole_tiles = !cublas_first;
        // Every segment a whole number of the widest block (two 16-row tiles).
        for (int s = 0; s < p.nseg; ++s) whole_tiles = whole_tiles && p.seg[s].n % (2 * kMmaRows) == 0;
        if (whole_tiles && mma_linear_on() && rows >= mma_min_rows() && (rows <= kMmaMaxRows || mma_prefill_on())) {
            p.x = NORM ? norm.x : x;
            p.norm_w = norm.w;
            p.eps = norm.eps;
            launch_mma_rows<K, SWIGLU, NORM>(c, p);
            return;
        }
    }
    if (rows <= kGemvMaxRows && !cublas_first) {
        p.x = NORM ? norm.x : x;
        p.norm_w = norm.w;
        p.eps = norm.eps;
        p.l2 = l2_plan(c.l2, L2Site::gemv);
        launch_gemv_rows<K, WT, NTOTAL, SWIGLU, NORM>(c, p);
        return;
    }
    p.norm_w = nullptr;
    if constexpr (std::is_same_v<WT, bf16_t> && K % 16 == 0) {
        // cuBLASLt for every matrix of the call (runtime/cuda/prefill_gemm.hpp): x normalized (when a
        // norm is folded here) and split into hi/lo once for all of them, their halves summed in one
        // closing launch; what it does not take, our WMMA GEMM.
        static_assert(kMaxSegs <= cuda_rt::kMaxGemmOuts);
        cuda_rt::GemmOut outs[cuda_rt::kMaxGemmOuts];
        for (int s = 0; s < p.nseg; ++s) {
            const LinearOut& o = p.seg[s];
            outs[s] = cuda_rt::GemmOut{o.w, SWIGLU ? o.w_up : nullptr, o.bias, o.residual, o.y, o.n};
        }
        LinearParams rest = p;
        rest.nseg = 0;
        if (fused_split_on()) {
            const int done = cuda_rt::prefill_linears_bf16(c.stream, rows, K, NORM ? norm.x : x, NORM ? norm.w : nullptr, norm.eps,
                                                           outs, p.nseg);
            if (done == p.nseg) return;
            if constexpr (NORM) rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
            for (int s = done; s < p.nseg; ++s) rest.seg[rest.nseg++] = p.seg[s];
        } else {  // the earlier path: one split and closing pass per matrix
            if constexpr (NORM) rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
            for (int s = 0; s < p.nseg; ++s) {
                const LinearOut& o = p.seg[s];
                const bool done = SWIGLU ? cuda_rt::prefill_swiglu_bf16(c.stream, rows, o.n, K, x, o.w, o.w_up, o.y)
                                         : cuda_rt::prefill_linear_bf16(c.stream, rows, o.n, K, x, o.w, o.bias, o.residual, o.y);
                if (!done) rest.seg[rest.nseg++] = o;
            }
            if (rest.nseg == 0) return;
        }
        p.x = x;
        rest.x = x;
        const int row_tiles = ceil_div(rows, 64);
        if (ceil_div(NMAX, 64) * row_tiles * rest.nseg >= 132)
            launch(c, gemm_bf16_kernel<K, 64, SWIGLU>, dim3(ceil_div(NMAX, 64), row_tiles, rest.nseg), dim3(128), rest);
        else
            launch(c, gemm_bf16_kernel<K, 32, SWIGLU>, dim3(ceil_div(NMAX, 32), row_tiles, rest.nseg), dim3(128), rest);
    } else {
        if constexpr (NORM) rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
        p.x = x;
        launch(c, gemm_simt_kernel<K, WT, SWIGLU>, dim3(ceil_div(NMAX, 16), ceil_div(rows, 16), p.nseg), dim3(16, 16), p);
    }
}

}  // namespace detail

template <int N, int K, typename WT>
void linear(const Ctx& c, int rows, const float* x, const WT* w, const float* bias, const float* residual, float* y) {
    detail::LinearParams p;
    p.seg[0] = LinearOut{w, nullptr, bias, residual, y, N};
    detail::linear_run<K, WT, false, N, N, false>(c, rows, x, p, RmsIn{});
}
// With a folded RMSNorm: x is where rmsnorm(norm.x) * norm.w is planned.
template <int N, int K, typename WT>
void linear(const Ctx& c, int rows, const float* x, const WT* w, const float* bias, const float* residual, float* y, RmsIn norm) {
    detail::LinearParams p;
    p.seg[0] = LinearOut{w, nullptr, bias, residual, y, N};
    detail::linear_run<K, WT, false, N, N, true>(c, rows, x, p, norm);
}

// y = silu(x Wg^T) * (x Wu^T): the gate and up projections of a SwiGLU MLP, never stored.
template <int N, int K, typename WT>
void linear_swiglu(const Ctx& c, int rows, const float* x, const WT* wg, const WT* wu, float* y) {
    detail::LinearParams p;
    p.seg[0] = LinearOut{wg, wu, nullptr, nullptr, y, N};
    detail::linear_run<K, WT, true, N, N, false>(c, rows, x, p, RmsIn{});
}
template <int N, int K, typename WT>
void linear_swiglu(const Ctx& c, int rows, const float* x, const WT* wg, const WT* wu, float* y, RmsIn norm) {
    detail::LinearParams p;
    p.seg[0] = LinearOut{wg, wu, nullptr, nullptr, y, N};
    detail::linear_run<K, WT, true, N, N, true>(c, rows, x, p, norm);
}

namespace detail {
template <int K, typename WT, int N0, int N1, int N2, bool NORM>
void linear_group_run(const Ctx& c, int rows, const float* x, LinearOut o0, LinearOut o1, LinearOut o2, const RmsIn& norm) {
    LinearParams p;
    o0.n = N0;
    o1.n = N1;
    o2.n = N2;
    p.seg[0] = o0;
    p.seg[1] = o1;
    p.seg[2] = o2;
    p.nseg = N2 > 0 ? 3 : 2;
    constexpr int nmax = N0 > N1 ? (N0 > N2 ? N0 : N2) : (N1 > N2 ? N1 : N2);
    linear_run<K, WT, false, N0 + N1 + N2, nmax, NORM>(c, rows, x, p, norm);
}
}  // namespace detail

// Two or three linears of one input in one launch (e.g. Q, K, V); N2 = 0 for two.
template <int K, typename WT, int N0, int N1, int N2>
void linear_group(const Ctx& c, int rows, const float* x, LinearOut o0, LinearOut o1, LinearOut o2) {
    detail::linear_group_run<K, WT, N0, N1, N2, false>(c, rows, x, o0, o1, o2, RmsIn{});
}
template <int K, typename WT, int N0, int N1, int N2>
void linear_group(const Ctx& c, int rows, const float* x, LinearOut o0, LinearOut o1, LinearOut o2, RmsIn norm) {
    detail::linear_group_run<K, WT, N0, N1, N2, true>(c, rows, x, o0, o1, o2, norm);
}

}  // namespace scr::kernels::cuda
