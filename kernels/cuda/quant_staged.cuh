// MLX int4 decode of 3-256 token rows on tensor cores with x staged once per block (17+ in passes of 16)
// (quant_staged_kernel; issue #9). Included from quant_linear.cuh; docs/CUDA.md "Session 29".
//
// Why another kernel. quant_mma_kernel (quant_linear.cuh) gives each 16-row weight tile its own
// block whose warps split K, and every lane loads and splits its token rows' x (float32) from L2 for
// every tile: at 16 rows that is 4x the int4 weight bytes of traffic per tile, and the 8B's MLX int4
// batch 16 ran below bf16 (docs/CUDA.md "Session 27"). Here x is read once per block:
//  * a block owns one K slice (cluster rank z of gridDim.z slices) and a range of row tiles; its
//    256 threads stage x[rows][slice] into shared memory as the MMA's B fragments, already split into
//    bf16 hi + lo, each group's sum of x (the MLX bias term) and each token's sum of x^2 (a folded
//    RMSNorm), the norm weight applied;
//  * each warp then streams whole row tiles (16 weight rows, SwiGLU: the gate's and the up's) over
//    the slice, weights one load round ahead across tile boundaries, B fragments from shared memory
//    (two 16-byte loads per word and token tile, no conversions);
//  * with more than one slice the cluster's blocks meet after each wave of tiles: each rank takes a
//    share of the tile's outputs, adds the ranks' partial sums in rank order through distributed
//    shared memory and writes them (norm scale, bias, residual, silu * up).
// The weight words and their MMA arithmetic are quant_mma_kernel's (same A fragments, same group
// handling); the B fragments are the same registers it builds.
//
// Batch invariance: the slices, waves and row groups depend on the shape only (qstaged_plan, sized
// for 16 rows), the MMA's token columns are independent, staging sums are per token in a fixed
// order: a row's bits are the same for any number of rows of one regime. Which launches come here
// is qstaged_takes's rule (9-256 rows but plain 17-32-row launches under 16 MiB; 3-8 rows of large
// launches): the MLX int4 regimes are 1-2 | 3-8 | 9-16 | 17-32 | 33-64 | 65-256 | 257+ rows (65+
// on cuBLASLt, what it declines here; 33-64 in passes with the bits of 9-16), one kernel per shape
// in each. Since session 33 MLX int4 g32 / g64 take quant_wide_kernel at 33-128 rows (one regime)
// and cuBLASLt from 129: the passes remain for g128 and what those two decline.
#pragma once

#include <cooperative_groups.h>

#include <vector>

namespace scr::kernels::cuda::qdetail {

constexpr int kQsWarps = 8;
constexpr int kQsMinRows = 3, kQsMaxRows = 16;

// Dynamic shared memory of a block for sc chunks and TN token tiles: the B fragments (sc x 4 words x
// TN x hi/lo x 32 lanes x 16 bytes), group sums (sc x 4 x 16 floats), 16 sums of squares and, with
// more than one slice, the partials the cluster meets on (8 warps x MT TN 4 values x 32 lanes).
inline size_t qstaged_smem(int sc, int tn, int mt, bool cluster) {
    return size_t(sc) * tn * 4096 + size_t(sc) * 4 * 16 * 4 + 16 * 4 + (cluster ? size_t(kQsWarps) * mt * tn * 4 * 32 * 4 : 0);
}

// One packed word (wd of a 128-k chunk, after qchunk_words) of MT 16-row tiles against TN token
// columns whose B fragments lie in shared memory in this kernel's staging layout (`frags`: the
// word's TN x 64 uint4, per column 32 lanes of hi then 32 of lo), into the group partials cg,
// zeroed at a group's first word. Shared with quant_wide_kernel (quant_wide.cuh).
template <int MT, int TN, int WPG>
__device__ __forceinline__ void qmma_word_staged(float (&cg)[MT][TN][4], const uint32_t (&wq)[MT][2][4], int wd, const uint4* frags,
                                                 int lane) {
    if (wd % WPG == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < TN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) cg[m][n][e] = 0.0f;
    }
    uint32_t a[MT][2][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) qunpack_u4_bf16(wq[m][h][wd], a[m][h]);
#pragma unroll
    for (int n = 0; n < TN; ++n) {
        const uint4 vh = frags[n * 64 + lane];
        const uint4 vl = frags[n * 64 + 32 + lane];
        const uint32_t bh[4] = {vh.x, vh.y, vh.z, vh.w}, bl[4] = {vl.x, vl.y, vl.z, vl.w};
#pragma unroll
        for (int m = 0; m < MT; ++m) qmma_word_hilo(cg[m][n], a[m][0], a[m][1], bh, bl);
    }
}

template <class F, int TN, bool SWIGLU, bool NORM>
__global__ void __launch_bounds__(kQsWarps * kWarp, 2) quant_staged_kernel(const __grid_constant__ QuantFusedArgs p, int sc, int waves, int trigger_late) {
    using ST = typename F::Scale;
    constexpr int MT = SWIGLU ? 2 : 1;
    constexpr int U = qaffine_chunks_per_round(MT);  // chunks per load round (registers: SwiGLU loads two tiles)
    constexpr int CK = 128;
    constexpr int GPC = CK / F::kGroup;
    constexpr int WPG = F::kWordsPerGroup;
    constexpr int kVals = MT * TN * 4;
    constexpr int TP = TN * 8;
    extern __shared__ __align__(16) unsigned char qs_smem[];
    uint4* xf = reinterpret_cast<uint4*>(qs_smem);
    float* xsum = reinterpret_cast<float*>(qs_smem + size_t(sc) * TN * 4096);
    float* ssp = xsum + sc * 4 * 16;
    float* red = ssp + 16;

    const int n_total = qfused_rows<SWIGLU>(p);
    const int n_tiles = (n_total + 15) / 16;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int slices = int(gridDim.z);
    const int c_first = int(blockIdx.z) * sc;
    const int tile_first = int(blockIdx.x) * kQsWarps * waves;
    const size_t row_bytes = size_t(p.k) / CK * 64;

    struct Ptrs {
        const uint8_t* w[MT][2];
        const ST* s[MT][2];
        const ST* b[MT][2];
    };
    auto ptrs_of = [&](int tile, Ptrs& P) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                int n = min(tile * 16 + g + 8 * h, n_total - 1);  // rows past the last read the last, never written
                const QuantMat& mat = p.mat[SWIGLU ? m : qmat_of(p, n)];
                P.w[m][h] = static_cast<const uint8_t*>(mat.q) + size_t(n) * row_bytes + size_t(c_first) * 64 + 16 * t;
                const size_t at = size_t(n) * (p.k / F::kGroup) + size_t(c_first) * GPC;
                P.s[m][h] = static_cast<const ST*>(mat.scales) + at;
                P.b[m][h] = static_cast<const ST*>(mat.biases) + at;
            }
    };
    struct Round {
        uint4 w[U][MT][2];
        uint32_t s[U][MT][2][2], b[U][MT][2][2];
    };
    auto load_round = [&](Round& r, const Ptrs& P, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u >= sc) break;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    r.w[u][m][h] = load_stream16(P.w[m][h] + size_t(c0 + u) * 64);
                    qload_group_params<GPC>(P.s[m][h] + (c0 + u) * GPC, r.s[u][m][h]);
                    qload_group_params<GPC>(P.b[m][h] + (c0 + u) * GPC, r.b[u][m][h]);
                }
        }
    };
    float acc[MT][TN][4];
    auto mma_round = [&](const Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u;
            if (c >= sc) break;
            uint32_t wq[MT][2][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) qchunk_words<F::kSwap>(r.w[u][m][h], t, wq[m][h]);
            float cg[MT][TN][4];
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                qmma_word_staged<MT, TN, WPG>(cg, wq, wd, xf + (c * 4 + wd) * TN * 64, lane);
                if (wd % WPG == WPG - 1) {
                    const int grp = wd / WPG;
#pragma unroll
                    for (int n = 0; n < TN; ++n) {
                        const float2 xc = *reinterpret_cast<const float2*>(xsum + (c * 4 + grp) * 16 + n * 8 + 2 * t);
#pragma unroll
                        for (int m = 0; m < MT; ++m) qgroup_affine<ST>(acc[m][n], cg[m][n], r.s[u][m], r.b[u][m], grp, xc.x, xc.y);
                    }
                }
            }
        }
    };

    // The first tile's first round flies before the wait: weights never depend on an earlier kernel.
    Ptrs P;
    Round cur;
    if (tile_first + warp < n_tiles) {
        ptrs_of(tile_first + warp, P);
        load_round(cur, P, 0);
    }
    pdl_wait();
    {
        // Staging: thread (tok, sub) takes k = 8 sub .. 8 sub + 7 of every chunk of token tok.
        const int tok = threadIdx.x / 16, sub = threadIdx.x % 16;
        const bool live = tok < TP;
        const bool real = tok < p.rows;
        const int ka = sub / 4, kb = sub % 4;
        constexpr int S = F::kSwap;
        const int lt = (ka & ~S) | (kb & S), lw = (kb & ~S) | (ka & S);  // qmma_word_k(lt, lw) == 8 sub
        const int dst = (tok % 8) * 4 + lt, ntile = tok / 8;
        const float* xrow = p.x + size_t(real ? tok : 0) * p.k;
        float ss = 0.0f;
#pragma unroll 4
        for (int c = 0; c < sc; ++c) {
            const int k = (c_first + c) * CK + 8 * sub;
            float xv[8];
            if (real) {
                const float4 x0 = __ldg(reinterpret_cast<const float4*>(xrow + k));
                const float4 x1 = __ldg(reinterpret_cast<const float4*>(xrow + k + 4));
                xv[0] = x0.x; xv[1] = x0.y; xv[2] = x0.z; xv[3] = x0.w;
                xv[4] = x1.x; xv[5] = x1.y; xv[6] = x1.z; xv[7] = x1.w;
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) xv[i] = 0.0f;
            }
            if constexpr (NORM) {
                const float4 n0 = __ldg(reinterpret_cast<const float4*>(p.norm_w + k));
                const float4 n1 = __ldg(reinterpret_cast<const float4*>(p.norm_w + k + 4));
                const float nw[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    ss = fmaf(xv[i], xv[i], ss);
                    xv[i] *= nw[i];
                }
            }
            float gs = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) gs += xv[i];
#pragma unroll
            for (int off = 1; off < F::kGroup / 8; off *= 2) gs += __shfl_xor_sync(0xffffffffu, gs, off);
            uint32_t bh[4], bl[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) qsplit_bf16x2(xv[q], xv[q + 4], bh[q], bl[q]);
            if (live) {
                if (sub % (F::kGroup / 8) == 0) xsum[(c * 4 + 8 * sub / F::kGroup) * 16 + tok] = gs;
                xf[((c * 4 + lw) * TN + ntile) * 64 + dst] = make_uint4(bh[0], bh[1], bh[2], bh[3]);
                xf[((c * 4 + lw) * TN + ntile) * 64 + 32 + dst] = make_uint4(bl[0], bl[1], bl[2], bl[3]);
            }
        }
        if constexpr (NORM) {
#pragma unroll
            for (int off = 1; off < 16; off *= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
            if (live && sub == 0) ssp[tok] = ss;
        }
    }
    __syncthreads();
    if (!trigger_late) pdl_trigger();

    namespace cgs = cooperative_groups;
    // 1 / rms of token tok: its sums of squares over the slices in rank order (after a cluster sync).
    auto inv_rms = [&](int tok) {
        float sum = ssp[tok];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (slices > 1) {  // every rank writes outputs: rank 0's sums first, whichever rank this is
            cgs::cluster_group cluster = cgs::this_cluster();
            sum = cluster.map_shared_rank(ssp, 0)[tok];
            for (int r = 1; r < slices; ++r) sum += cluster.map_shared_rank(ssp, r)[tok];
        }
#endif
        return 1.0f / sqrtf(sum / float(p.k) + p.eps);
    };
    // One output of the tile: C-fragment position (n, e) of this lane (row g + 8 (e / 2), token
    // n * 8 + 2t + e % 2), its sums v[m] (SwiGLU: gate, up).
    auto epilogue_at = [&](int tile, int n, int e, const float (&v)[MT]) {
        const int tok = n * 8 + 2 * t + (e & 1);
        int row = tile * 16 + g + 8 * (e >> 1);
        if (tok >= p.rows || row >= n_total) return;
        float inv = 1.0f;
        if constexpr (NORM) inv = inv_rms(tok);
        if constexpr (SWIGLU) {
            const float gate = v[0] * inv, up = v[1] * inv;
            p.mat[0].y[size_t(tok) * p.mat[0].n + row] = silu(gate) * up;  // as silu_mul_kernel
        } else {
            const QuantMat& mat = p.mat[qmat_of(p, row)];
            float y = v[0];
            if constexpr (NORM) y *= inv;
            if (mat.bias) y += mat.bias[row];
            const size_t at = size_t(tok) * mat.n + row;
            if (p.residual) y = p.residual[at] + y;
            mat.y[at] = y;
        }
    };

    const int rounds = (sc + U - 1) / U;
#pragma unroll 1
    for (int v = 0; v < waves; ++v) {
        const int tile = tile_first + v * kQsWarps + warp;
        const bool have = tile < n_tiles;
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < TN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;
        if (have) {
            const int next = tile + kQsWarps;
            const bool next_here = v + 1 < waves && next < n_tiles;
#pragma unroll 1
            for (int r = 0; r < rounds; ++r) {
                Round nxt;
                if (r + 1 < rounds) {
                    load_round(nxt, P, (r + 1) * U);
                } else if (next_here) {  // the next tile's first round, during this tile's last MMAs and sums
                    ptrs_of(next, P);
                    load_round(nxt, P, 0);
                }
                mma_round(cur, r * U);
                cur = nxt;
            }
        }
        if (slices == 1) {
            if (have)
#pragma unroll
                for (int n = 0; n < TN; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        float v[MT];
#pragma unroll
                        for (int m = 0; m < MT; ++m) v[m] = acc[m][n][e];
                        epilogue_at(tile, n, e, v);
                    }
            continue;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        // The cluster meets: every rank finishes the positions (n, e) with (n * 4 + e) % slices ==
        // its rank, adding the ranks' partials in rank order (loads of all ranks issued together).
        cgs::cluster_group cluster = cgs::this_cluster();
        if (have) {
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int n = 0; n < TN; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) red[(warp * kVals + (m * TN + n) * 4 + e) * kWarp + lane] = acc[m][n][e];
        }
        cluster.sync();
        if (have) {
            const int rank = int(cluster.block_rank());
            const float* from[8];
#pragma unroll
            for (int rk = 0; rk < 8; ++rk) from[rk] = rk < slices ? cluster.map_shared_rank(red, rk) : red;
#pragma unroll
            for (int n = 0; n < TN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    if ((n * 4 + e) % slices != rank) continue;
                    float v[MT], part[MT][8];
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int rk = 0; rk < 8; ++rk)
                            part[m][rk] = rk < slices ? from[rk][(warp * kVals + (m * TN + n) * 4 + e) * kWarp + lane] : 0.0f;
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        v[m] = part[m][0];
#pragma unroll
                        for (int rk = 1; rk < 8; ++rk)
                            if (rk < slices) v[m] += part[m][rk];
                    }
                    epilogue_at(tile, n, e, v);
                }
        }
        cluster.sync();  // the partials (and ssp) stay alive until every rank has read them
#endif
    }
    if (trigger_late) pdl_trigger();
}

// How a launch is cut (a function of the shape only, sized for 16 token rows): K slices (the
// cluster's blocks), waves of 8 row tiles per block, row groups (blocks along x).
struct QStagedPlan {
    int slices = 0, waves = 1, row_groups = 1;
};

// Which launches take this kernel (SCR_CUDA_QUANT_STAGED, read once):
//   1 or unset (the rule): 9-256 token rows (17+ in passes of 16, but plain launches of 17-32 rows
//     only from kQsPassMinKiB, below; from 65 only what cuBLASLt declines, quant_prefill.cuh); 3-8
//     rows only for launches of at least
//     kQsLowMinKiB KiB of packed nibbles (16-row tiles x 128-k chunks, 1 KiB each; SwiGLU's gate and
//     up both count). Smaller launches of 3-8 rows measured faster end to end on quant_mma_kernel,
//     whose 8 warps per tile split K inside one block (the H200, docs/CUDA.md "Session 29", batch 3:
//     the 1B with its gate/up, 16 MiB, here 3,352-3,362 tok/s against 3,680-3,681 with only its
//     lm_head here; the 8B's gate/up, 56 MiB, here 866-867 against 770-772); so the MLX int4
//     regimes are 1-2 | 3-8 | 9-16 | 17-32 | 33-64 | 65-256 | 257+ rows (65+: cuBLASLt,
//     quant_prefill.cuh, and here what it declines), each on one kernel per shape;
//   all: every launch of 3-256 rows (A/B runs);
//   0: none, 3-256 rows on quant_mma_kernel as before session 29 (A/B runs).
// SCR_CUDA_QUANT_STAGED_SLICES=C (1, 2, 4, 8) forces the K slices where they divide K and fit.
enum class QStagedMode { rule, all, off };
constexpr int kQsLowMaxRows = 8, kQsLowMinKiB = 32 << 10;
inline QStagedMode qstaged_mode() {
    static const QStagedMode m = env_choice_switch("SCR_CUDA_QUANT_STAGED", QStagedMode::rule,
                                                   {{"1", QStagedMode::rule}, {"all", QStagedMode::all}, {"0", QStagedMode::off}}, "1");
    return m;
}
inline bool qstaged_on() { return qstaged_mode() != QStagedMode::off; }
// Launches of 17..qstaged_max_rows() rows run as passes of 16 rows, each a launch of the 16-row
// kernel (the same plan, TN = 2) that reads the weights again: a row's bits are those of the 9-16
// regime. quant_mma_kernel, which took 17+ rows before, re-reads x per tile and spills at 32-64
// token columns: on the H200 ("Session 30") the 8B's 28672x4096 at 64 rows takes 239 us in 4
// passes against 581 us there, at 32 rows 119 against 187 (the 8B int4 batch 64 3,095 against
// 2,433 tok/s). From 65 rows MLX int4 goes to cuBLASLt (quant_prefill_min_rows); the passes reach
// 256 rows for what cuBLASLt declines there (a matrix over its 1 GiB of expanded weights: the 8B's
// lm_head). SCR_CUDA_QUANT_STAGED_UPTO=N (a multiple of 16 up to 256; 16: no passes) moves the
// top (A/B runs).
constexpr int kQsPassMaxRows = 256;  // also the default
inline int qstaged_max_rows() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_STAGED_UPTO", kQsPassMaxRows,
        [](long long n) { return n >= kQsMaxRows && n <= kQsPassMaxRows && n % kQsMaxRows == 0; }, "a multiple of 16 from 16 to 256"));
    return v;
}
// SCR_CUDA_QUANT_STAGED_LOW_KIB=N replaces kQsLowMinKiB (A/B runs).
inline int64_t qstaged_low_min_kib() {
    static const int64_t v = env_int_switch(
        "SCR_CUDA_QUANT_STAGED_LOW_KIB", kQsLowMinKiB, [](long long n) { return n > 0; }, "a positive number of KiB");
    return v;
}
// Plain launches (no SwiGLU, no folded norm: the o and down projections) of 17-32 rows run the
// passes only from kQsPassMinKiB of packed weights (a 16-row tile of one 128-k chunk is 1 KiB, as
// for kQsLowMinKiB); smaller ones stay on quant_mma_kernel, whose plain form holds all 32 token rows
// in a block (4 tiles) and so reads the weights once, against the two passes' twice. Its fused forms
// hold 2 tiles (registers) and run 17-32 rows as two column blocks that each read the weights, no
// better than the passes; from 33 rows its 8-tile plain form spills and the passes win everywhere.
// Measured on the H200 ("Session 31"), per launch at 24 / 32 rows, passes against quant_mma_kernel,
// us: 4096x4096 (8 MiB) 36.5 / 37.2 against 24.4 / 28.1, 2048x8192 35.4 / 36.0 against 25.4 / 29.0,
// 4096x14336 (28 MiB) 83.0 / 83.8 against 72.0 / 84.0, 128256x4096 494 / 499 against 672 / 799.
// End to end the 8B MLX int4 at batch 20 / 24 / 32 gains 2.2-2.9 % per round with its o (8 MiB)
// there and its down (28 MiB) on the passes, which did better than on quant_mma_kernel (1.8-2.8 %
// with both there); the 1B was level. SCR_CUDA_QUANT_STAGED_PASS_KIB=N replaces the threshold (A/B runs; 0: the passes for
// every launch, as in session 30).
constexpr int kQsPassMinKiB = 16 << 10;
inline int64_t qstaged_pass_min_kib() {
    static const int64_t v = env_int_switch(
        "SCR_CUDA_QUANT_STAGED_PASS_KIB", kQsPassMinKiB, [](long long n) { return n >= 0; }, "a number of KiB (0: every launch)");
    return v;
}
// Whether a launch of `rows` rows, `tiles` 16-row tiles (SwiGLU: both matrices') and `chunks`
// 128-k chunks per row takes this kernel; `fused`: a SwiGLU or folded-norm launch.
inline bool qstaged_takes(int rows, int tiles, int chunks, bool fused) {
    if (rows < kQsMinRows || rows > qstaged_max_rows() || qstaged_mode() == QStagedMode::off) return false;
    if (qstaged_mode() == QStagedMode::all) return true;
    const int64_t kib = int64_t(tiles) * chunks;
    if (rows <= kQsLowMaxRows) return kib >= qstaged_low_min_kib();
    if (rows <= kQsMaxRows || rows > 2 * kQsMaxRows || fused) return true;
    return kib >= qstaged_pass_min_kib();
}
// Where the kernel lets the next launch start: after its staging for 3-8 rows, after its last tile
// for 9-16 (the H200, "Session 29": batch 16 on the 1B 12,817-12,923 against 12,249-12,268 tok/s
// with the early trigger, 3-8 rows 2-4.5 % slower with the late one). The place changes no value.
// SCR_CUDA_QUANT_STAGED_TRIGGER=wait|loop forces one (A/B runs).
inline bool qstaged_trigger_late(int rows) {
    static const int v = env_choice_switch("SCR_CUDA_QUANT_STAGED_TRIGGER", -1, {{"wait", 0}, {"loop", 1}}, "the rule");
    return v >= 0 ? v == 1 : rows > kQsLowMaxRows;
}
inline int qstaged_slices_override() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_STAGED_SLICES", 0, [](long long c) { return c == 1 || c == 2 || c == 4 || c == 8; }, "1, 2, 4 or 8", "the rule"));
    return v;
}

// The kernel may take the device's opt-in shared memory (set once per instantiation, on the device
// current then: the runtime drives one GPU per process; the plan cache below assumes it too).
template <class F, int TN, bool SWIGLU, bool NORM>
bool qstaged_ready() {
    static const bool set = [] {
        int optin = 0, dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        if (cudaFuncSetAttribute(quant_staged_kernel<F, TN, SWIGLU, NORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, optin) ==
            cudaSuccess)
            return true;
        cudaGetLastError();  // the launches fall back to quant_mma_kernel
        return false;
    }();
    return set;
}
// Blocks of a launch with `smem` bytes each and clusters of c blocks resident on the GPU at once
// (clusters must fit within a GPC: fewer than SMs x blocks per SM where c > 1).
template <class F, int TN, bool SWIGLU, bool NORM>
int qstaged_resident_blocks(size_t smem, int c) {
    if (!qstaged_ready<F, TN, SWIGLU, NORM>()) return 0;
    if (c == 1) {
        int blocks = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_staged_kernel<F, TN, SWIGLU, NORM>, kQsWarps * kWarp, smem) !=
            cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return blocks * device_sm_count();
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, c);
    cfg.blockDim = dim3(kQsWarps * kWarp);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = c;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, quant_staged_kernel<F, TN, SWIGLU, NORM>, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return clusters * c;
}

// The plan: for each slice count C (a power of two up to 8 dividing K's chunks), the fewest waves
// whose grid is one wave of resident blocks (clusters counted as the occupancy API places them), then the least estimated time: the bytes (weights
// from HBM; x once per row group and slice, from L2, weighted 0.35) at ~3.3 TB/s, or a warp's chain
// of load rounds (~0.45 us each with one round ahead) where that is longer, plus the staging and
// the cluster's meetings per wave. The constants are rough: the rule only has to order the choices.
inline QStagedPlan qstaged_choose(int n_tiles, int chunks, int mt, int (*resident_of)(size_t, int)) {
    QStagedPlan best;
    double best_us = 1e30;
    const int forced = qstaged_slices_override();
    for (int c = 1; c <= 8; c *= 2) {
        if (chunks % c != 0) continue;
        const int sc = chunks / c;
        const size_t smem = qstaged_smem(sc, 2, mt, c > 1);
        const int64_t resident = resident_of(smem, c);
        if (resident < c) continue;
        int waves = 1;
        while (int64_t((n_tiles + kQsWarps * waves - 1) / (kQsWarps * waves)) * c > resident) ++waves;
        const int rg = (n_tiles + kQsWarps * waves - 1) / (kQsWarps * waves);
        const double weight_bytes = double(n_tiles) * 16 * mt * chunks * 72.0;  // 64 B of nibbles + 8 B of g64 params
        const double x_bytes = double(rg) * chunks * 128 * 16 * 4;
        const double bw_us = (weight_bytes + 0.35 * x_bytes) / 3.3e6;
        const int u = qaffine_chunks_per_round(mt);
        const double chain_us = waves * ((sc + u - 1) / u) * 0.45;
        double us = std::max(bw_us, chain_us) + 0.8 + 0.03 * sc + (c > 1 ? 0.7 * waves : 0.0);
        if (forced == c) us = -1.0;  // SCR_CUDA_QUANT_STAGED_SLICES, where it fits
        if (us < best_us) {
            best_us = us;
            best = QStagedPlan{c, waves, rg};
        }
    }
    return best;
}

// Cached per shape (the occupancy queries are host calls; a model has a handful of shapes).
template <class F, bool SWIGLU, bool NORM>
QStagedPlan qstaged_plan(int n_tiles, int chunks) {
    struct Entry {
        int n_tiles, chunks;
        QStagedPlan plan;
    };
    static thread_local std::vector<Entry> cache;
    for (const Entry& e : cache)
        if (e.n_tiles == n_tiles && e.chunks == chunks) return e.plan;
    const QStagedPlan plan = qstaged_choose(n_tiles, chunks, SWIGLU ? 2 : 1,
                                            [](size_t smem, int c) { return qstaged_resident_blocks<F, 2, SWIGLU, NORM>(smem, c); });
    cache.push_back({n_tiles, chunks, plan});
    return plan;
}

// The plan of the last launch on this thread (the test prints it).
inline QStagedPlan& qstaged_last_plan() {
    static thread_local QStagedPlan p;
    return p;
}

// What the kernel takes: an MLX int4 format with 2-byte scales, 3..qstaged_max_rows() token rows, K in whole 128-k
// chunks, 16-byte aligned weights, x and norm weight, scales and biases aligned for their loads.
template <class F>
bool quant_staged_fits(const QuantFusedArgs& a) {
    if constexpr (!F::kAffine) {
        return false;
    } else {
        const auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
        constexpr size_t param_align = sizeof(typename F::Scale) * (128 / F::kGroup);
        if (!qstaged_on() || a.rows < kQsMinRows || a.rows > qstaged_max_rows() || a.k % 128 != 0 || sizeof(typename F::Scale) != 2 ||
            !aligned(a.x, 16) || (a.norm_w && !aligned(a.norm_w, 16)))
            return false;
        for (int m = 0; m < a.nmat; ++m)
            if (!aligned(a.mat[m].q, 16) || !aligned(a.mat[m].scales, param_align) || !aligned(a.mat[m].biases, param_align))
                return false;
        return true;
    }
}

template <class F, int TN, bool SWIGLU, bool NORM>
bool launch_quant_staged_tn(const Ctx& c, const QuantFusedArgs& a, const QStagedPlan& plan) {
    const int sc = a.k / 128 / plan.slices;
    // At most the plan's 16-row bytes, which fit (qstaged_choose); the attribute is set once.
    const size_t smem = qstaged_smem(sc, TN, SWIGLU ? 2 : 1, plan.slices > 1);
    if (!qstaged_ready<F, TN, SWIGLU, NORM>()) return false;
    // A refused launch falls back to quant_mma_kernel: its error is consumed here so that the caller's
    // next error check does not report a launch that was made another way.
    if (launch_ex(c, quant_staged_kernel<F, TN, SWIGLU, NORM>, dim3(plan.row_groups, 1, plan.slices), dim3(kQsWarps * kWarp), smem,
                  plan.slices, a, sc, plan.waves, qstaged_trigger_late(a.rows) ? 1 : 0) == cudaSuccess)
        return true;
    cudaGetLastError();
    return false;
}

// Launches 3-16 token rows (up to qstaged_max_rows() in passes); false (nothing launched) when the
// kernel does not take them.
template <class F, bool SWIGLU, bool NORM>
bool launch_quant_staged(const Ctx& c, const QuantFusedArgs& a) {
    qstaged_last_plan() = {};
    if (!quant_staged_fits<F>(a)) return false;
    int n_total = a.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < a.nmat; ++m) n_total += a.mat[m].n;
    if (!qstaged_takes(a.rows, (n_total + 15) / 16 * (SWIGLU ? 2 : 1), a.k / 128, SWIGLU || NORM)) return false;
    const QStagedPlan plan = qstaged_plan<F, SWIGLU, NORM>((n_total + 15) / 16, a.k / 128);
    if (plan.slices == 0) return false;
    if (a.rows <= kQsMaxRows) {
        const bool ok =
            a.rows <= 8 ? launch_quant_staged_tn<F, 1, SWIGLU, NORM>(c, a, plan) : launch_quant_staged_tn<F, 2, SWIGLU, NORM>(c, a, plan);
        if (ok) qstaged_last_plan() = plan;
        return ok;
    }
    // Passes of 16 rows (SCR_CUDA_QUANT_STAGED_UPTO). A pass refused after the first (never seen: the
    // same kernel and shape) leaves its rows and the rest to quant_mma_kernel, so nothing runs twice;
    // those rows' bits would then be quant_mma_kernel's, not the regime's.
    for (int r0 = 0; r0 < a.rows; r0 += kQsMaxRows) {
        QuantFusedArgs pass = a;
        pass.rows = std::min(kQsMaxRows, a.rows - r0);
        pass.x = a.x + size_t(r0) * a.k;
        for (int m = 0; m < a.nmat; ++m) pass.mat[m].y = a.mat[m].y + size_t(r0) * a.mat[m].n;
        if (a.residual) pass.residual = a.residual + size_t(r0) * a.mat[0].n;
        if (launch_quant_staged_tn<F, 2, SWIGLU, NORM>(c, pass, plan)) continue;
        if (r0 == 0) return false;
        pass.rows = a.rows - r0;
        launch_quant_mma_rows<F, SWIGLU, NORM>(c, pass);
        return true;
    }
    qstaged_last_plan() = plan;
    return true;
}

}  // namespace scr::kernels::cuda::qdetail
