// Decode batches of 33-256 token rows in one read of the quantized weights (quant_wide_kernel;
// issue #9, docs/QUANT_GEMM_PLAN.md; docs/CUDA.md "Session 32" and "Session 33"): MLX int4 g32 / g64
// and int8 / fp8 codes. Included from quant_linear.cuh.
//
// Why. Until now MLX int4's 33-64 rows ran quant_staged_kernel in passes of 16 rows (the weights
// read and dequantized once per pass) and 65-256 rows expanded every weight to bf16 hi + lo for
// cuBLASLt every step; int8 / fp8 from 33 rows expand their codes to bf16 for cuBLASLt every step:
// the 8B's MLX int4 build trailed its bf16 build 2.3-2.9x from 64 rows, int8 / fp8 ran at 0.53-0.77x
// of bf16. Here one block holds 64 token columns, so the weights are read once per 64 rows (65-256
// rows: the token tiles of a row group are adjacent blocks, so they run side by side and share the
// weight reads through L2).
//
// Two launches:
//  * quant_wide_prep_kernel turns x (float32, [rows][k]) into what the MMA's B operand takes, in a
//    workspace (Ctx::qwide_ws): per 64-token tile and chunk (64 bytes of every weight row: int4 128 k,
//    codes 64 k), the bf16 hi + lo fragments in the layout the kernel reads (int4: quant_staged_kernel's
//    staging layout, 32 KiB; codes: 16 KiB), for int4 each group's sum of x (the MLX bias term), and
//    each token's partial sums of squares (a folded RMSNorm; the norm weight is applied to x here).
//    Padding tokens of the last tile are zeros.
//  * quant_wide_kernel: 8 warps, each owning two 16-row tiles (plain: 32 consecutive rows; SwiGLU:
//    16 gate rows and the same 16 up rows) against the tile's 64 tokens (8 MMA columns of 8). Every
//    chunk (weights, int4 scales, biases and x group sums, x fragments) comes through a cp.async ring
//    in shared memory (QwFmt: int4 4 stages, codes 6); the arithmetic per word is quant_mma_kernel's
//    (int4: same A fragments, group partials c, acc += scale * c + bias * sum(x); codes: the codes
//    exact in bf16 into acc, the row scale in the epilogue). K may be split over up to 8 blocks,
//    whose partials meet in rank order: through distributed shared memory when the split's blocks
//    form a cluster, or through global memory (L2) when clusters of that size would not all be
//    resident at once (the "global split": the last block of a tile's row group to arrive sums the
//    ranks' partials; the same additions in the same order, so the same bits).
//
// Batch invariance: the split, the row groups and the chunk order depend on the shape only; a token
// column's arithmetic never sees another column; the prep's sums are per token in a fixed order. So
// a row's bits are the same in any launch of 33-256 rows (the kernel's regime).
#pragma once

#include <cooperative_groups.h>

#include <vector>

namespace scr::kernels::cuda::qdetail {

constexpr int kQwWarps = 8;
constexpr int kQwTN = 8;                // MMA token columns of 8 per block
constexpr int kQwTokens = kQwTN * 8;    // token rows per block (one token tile)
constexpr int kQwRows = kQwWarps * 32;  // weight rows per block (plain); SwiGLU: half as many output rows
constexpr int kQwMinRows = 33, kQwMaxRows = 256;

// What differs between the formats. A chunk is 64 bytes of every weight row in both: MLX int4 128 k
// (4 packed words of 8 nibbles per lane of 4), int8 / fp8 codes 64 k (4 words of 4 bytes per lane).
//  * x's B fragments per chunk and token tile: int4 32 KiB (per word and MMA column, 32 lanes x 4 hi
//    words then 32 x 4 lo: two k16 MMAs per word), codes 16 KiB (per word and column, 32 lanes x
//    {hi, hi, lo, lo}: one k16 MMA per word);
//  * int4 stages each row's group scales and biases and x's group sums with the chunk; the codes'
//    one scale per row (or tensor) is applied in the epilogue;
//  * the ring: int4 4 stages of 50.5 KiB (g64), codes 6 stages of 32 KiB (as many weight bytes in
//    flight per SM, against half the MMAs per byte).
template <class F>
struct QwFmt {
    static constexpr bool kInt4 = F::kAffine;
    static constexpr int kCK = kInt4 ? 128 : 64;           // k per chunk
    static constexpr int kGpc = kInt4 ? 128 / F::kGroup : 0;  // MLX groups per chunk
    static constexpr int kFragBytes = kInt4 ? kQwTN * 4 * 64 * 16 : kQwTN * 4 * 32 * 16;
    static constexpr int kStages = kInt4 ? 4 : 6;
    static constexpr int kPrepChunks = kInt4 ? 4 : 8;      // chunks per prep block (512 k either way)
    static constexpr int kSubK = kCK / 16;                  // k per prep thread and chunk (16 threads per token)
};

// Token rows up to which launches take this kernel (0: off) and from which (SCR_CUDA_QUANT_WIDE_FROM
// =N, 3-256; A/B runs). MLX int4: SCR_CUDA_QUANT_WIDE=N, by default 128: its checks passed on the
// H200 in session 33 (scr_cuda_quant_gemv with SCR_CUDA_QUANT_WIDE=256: 144 value and bit checks of
// 33-256 rows, the PDL chain, memcheck clean) and the 8B's decode gained 1.39x at batch 48, 1.38x at
// 64, 1.05x at 128 over the staged passes / cuBLASLt, but lost at 256 (0.86x: cuBLASLt's wgmma GEMM
// on expanded weights is faster there), so 129+ rows stay on cuBLASLt (quant_prefill_min_rows: the
// kernel is tried first, so its top is the regimes' border). int8 / fp8: SCR_CUDA_QUANT_WIDE_CODES=N,
// by default 64: written in session 33, emulated on the host (scr_cuda_quant_gemv --host-selftest,
// run in CI) and checked on the H200 (216 checks, memcheck clean), faster than cuBLASLt on the codes
// only at 33-64 rows (8B int8 1.13x / 1.12x at batch 48 / 64, 0.78x at 128); the 1B int8's logits
// of 33-128-token steps stayed within 2.4e-3 of the kernel-off logits (session 35, tolerance 5.0e-3).
constexpr int kQwDefaultMaxRows = 128, kQwCodesDefaultMaxRows = 64;
inline int qwide_max_rows_of(bool int4) {
    const auto valid = [](long long n) { return n == 0 || (n >= 3 && n <= kQwMaxRows); };
    static const int v4 = int(env_int_switch("SCR_CUDA_QUANT_WIDE", kQwDefaultMaxRows, valid, "0 (off) or a row count from 3 to 256"));
    static const int vc =
        int(env_int_switch("SCR_CUDA_QUANT_WIDE_CODES", kQwCodesDefaultMaxRows, valid, "0 (off) or a row count from 3 to 256"));
    return int4 ? v4 : vc;
}
template <class F>
int qwide_max_rows() {
    return qwide_max_rows_of(F::kAffine);
}
inline int qwide_min_rows() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_WIDE_FROM", kQwMinRows, [](long long n) { return n >= 3 && n <= kQwMaxRows; }, "a row count from 3 to 256"));
    return v;
}
template <class F>
bool qwide_takes(int rows) {
    return rows >= qwide_min_rows() && rows <= qwide_max_rows<F>();
}

// The formats the kernel takes: MLX int4 at g32 / g64 with 2-byte scales (a g128 chunk's 2-byte
// parameters are below cp.async's 4 bytes), and int8 / fp8 codes. The one statement of the rule: the
// launcher (quant_wide_fits), the model's workspace (the expression the CUDA emitter writes) and the
// GPU test ask it.
template <class F>
__host__ __device__ constexpr bool qwide_format_ok() {
    if constexpr (F::kAffine) return F::kGroup <= 64 && sizeof(typename F::Scale) == 2;
    else return true;
}

// Workspace bytes of format F's launches of up to kQwMaxRows rows and K = k: B fragments, group sums
// (int4), the norm's partial sums of squares. A launch's K is whole chunks (quant_wide_fits); for a
// model's largest K that is not, the whole chunks below it cover every smaller K that is.
template <class F>
__host__ __device__ constexpr int64_t qwide_workspace_bytes_for(int64_t k) {
    using Q = QwFmt<F>;
    const int64_t chunks = k / Q::kCK, tiles = kQwMaxRows / kQwTokens;
    const int64_t cblocks = (chunks + Q::kPrepChunks - 1) / Q::kPrepChunks;
    return tiles * chunks * Q::kFragBytes + tiles * chunks * Q::kGpc * kQwTokens * 4 + cblocks * kQwMaxRows * 4;
}
// The global split's part of the workspace, at its end: one block's partials (its 8 warps' 64 C
// fragment values per lane, 64 KiB) per slot, and per slot one arrival counter for each split of 2,
// 4 and 8 (a counter only ever counts one split, so it stays a multiple of it across launches and
// needs no reset; it starts at zero: the workspace is zeroed once, when it is allocated).
constexpr int kQwPartFloats = kQwWarps * 2 * kQwTN * 4 * kWarp;
constexpr int kQwSplitCounters = 3;
__host__ __device__ constexpr int64_t qwide_split_bytes(int64_t slots) {
    return (kQwSplitCounters * slots * 4 + 255) / 256 * 256 + slots * kQwPartFloats * 4;
}
// Slots: a launch's blocks when they all fit at once (one block per SM) for the largest launch
// (kQwMaxRows / kQwTokens token tiles): the global split is planned only where a tile's blocks fit
// in one wave (qwide_choose).
inline int qwide_split_slots() { return kQwMaxRows / kQwTokens * device_sm_count(); }
// What a model of format F allocates for its largest quantized K (read once, at its construction):
// nothing for a format the kernel does not take or while the kernel is off for it. Zeroed once.
template <class F>
inline int64_t quant_wide_model_workspace_bytes(int64_t k_max) {
    if constexpr (!qwide_format_ok<F>()) return 0;
    else return qwide_max_rows<F>() > 0 ? qwide_workspace_bytes_for<F>(k_max) + qwide_split_bytes(qwide_split_slots()) : 0;
}

// Where a launch's prep output lives in the workspace.
struct QWideArgs {
    const uint4* xf = nullptr;  // [tile][chunk] 32 KiB of B fragments
    const float* xs = nullptr;  // [tile][chunk][group][64] group sums of x
    const float* ss = nullptr;  // [prep chunk block][token] partial sums of x^2 (NORM)
    int chunks = 0, cblocks = 0, rows_pad = 0;
    int sc = 0;  // chunks per K slice (cluster rank)
    // The global split (null: the slices form a cluster, or there is one): slot (tile, row group,
    // rank)'s partials at part + slot * kQwPartFloats; the arrival counters of the (tile, row group)s.
    float* part = nullptr;
    unsigned* arrivals = nullptr;  // [split 2, 4, 8][cells]
    int cells = 0;                 // slots of the workspace (the counters' stride)
};

// ---- The kernel's index maps, shared with the host emulation (quant_gemv_test.cu) ----
// Prep, MLX int4: token l (0..63) of a tile, k = 8 sub .. 8 sub + 7 of a chunk: the uint4 of its bf16
// hi parts in the chunk's 32 KiB of B fragments (the lo parts: + 32), so that lane (g, t) of MMA
// column n reads word wd's registers at qw_xfrag(wd, n, lane) (quant_staged_kernel's staging mapping).
template <int SWAP>
__host__ __device__ __forceinline__ int qw_prep_frag(int l, int sub) {
    const int ka = sub / 4, kb = sub % 4;
    const int lt = (ka & ~SWAP) | (kb & SWAP), lw = (kb & ~SWAP) | (ka & SWAP);  // qmma_word_k(lt, lw) == 8 sub
    return (lw * kQwTN + l / 8) * 64 + (l % 8) * 4 + lt;
}
__host__ __device__ __forceinline__ int qw_xfrag(int wd, int n, int lane) { return (wd * kQwTN + n) * 64 + lane; }
// Prep, int8 / fp8 codes: token l, k = 4 sub .. 4 sub + 3 of a 64-k chunk (lane t = sub / 4's word
// wd = sub % 4, as quant_mma_kernel's codes: k = 16 t + 4 wd): the uint4 {hi(k, k+1), hi(k+2, k+3),
// lo(k, k+1), lo(k+2, k+3)} that lane (g, t) of MMA column n reads at qw_xfrag_codes(wd, n, lane).
__host__ __device__ __forceinline__ int qw_xfrag_codes(int wd, int n, int lane) { return (wd * kQwTN + n) * 32 + lane; }
__host__ __device__ __forceinline__ int qw_prep_frag_codes(int l, int sub) { return qw_xfrag_codes(sub % 4, l / 8, (l % 8) * 4 + sub / 4); }
// Group sums of a chunk: group grp (0..GPC-1) of token l.
__host__ __device__ __forceinline__ int qw_xsum(int grp, int l) { return grp * kQwTokens + l; }
// Block row r (0..255) = warp * 32 + m * 16 + rr: its output row (SwiGLU: gate m = 0, up m = 1 of
// the same output row) before clamping to the last row.
template <bool SWIGLU>
__host__ __device__ __forceinline__ int qw_row_of(int rg, int r) {
    if constexpr (SWIGLU) return rg * (kQwRows / 2) + (r / 32) * 16 + r % 16;
    else return rg * kQwRows + r;
}
// The block row a lane's A fragments come from: warp's tile m, rows g (h = 0) and g + 8 (h = 1).
__host__ __device__ __forceinline__ int qw_lane_row(int warp, int m, int g, int h) { return warp * 32 + m * 16 + g + 8 * h; }
// Thread tid's q-th weight copy of a stage: block row tid / 4 + 64 q, 16-byte piece tid % 4.
__host__ __device__ __forceinline__ int qw_copy_row(int tid, int q) { return tid / 4 + 64 * q; }

__device__ __forceinline__ void qw_cp_async(uint32_t dst, const void* src, int bytes) {
    if (bytes == 8) asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
    else asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
template <int N>
__device__ __forceinline__ void qw_cp_async_wait() {  // at most N of this thread's groups in flight
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// x -> B fragments. Block (chunk block, 16-token group): thread (tok, sub) takes k = kSubK sub ..
// kSubK (sub + 1) - 1 of each of the block's chunks for token tok.
template <class F, bool NORM>
__global__ void __launch_bounds__(256) quant_wide_prep_kernel(const float* __restrict__ x, const float* __restrict__ norm_w, int k, int rows,
                                                              uint4* __restrict__ xf, float* __restrict__ xs, float* __restrict__ ss_out,
                                                              int rows_pad) {
    using Q = QwFmt<F>;
    constexpr int SK = Q::kSubK;
    const int chunks = k / Q::kCK;
    const int tok = blockIdx.y * 16 + threadIdx.x / 16, sub = threadIdx.x % 16;
    const bool real = tok < rows;
    const int tt = tok / kQwTokens, l = tok % kQwTokens;
    int frag_at;
    if constexpr (Q::kInt4) frag_at = qw_prep_frag<F::kSwap>(l, sub);
    else frag_at = qw_prep_frag_codes(l, sub);
    const float* xrow = x + size_t(real ? tok : 0) * k;
    pdl_wait();
    float ss = 0.0f;
    const int c_end = min(chunks, int(blockIdx.x + 1) * Q::kPrepChunks);
    for (int c = blockIdx.x * Q::kPrepChunks; c < c_end; ++c) {
        const int kk = c * Q::kCK + SK * sub;
        float xv[SK];
#pragma unroll
        for (int i = 0; i < SK; i += 4) {
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (real) v = __ldg(reinterpret_cast<const float4*>(xrow + kk + i));
            xv[i] = v.x; xv[i + 1] = v.y; xv[i + 2] = v.z; xv[i + 3] = v.w;
        }
        if constexpr (NORM) {
#pragma unroll
            for (int i = 0; i < SK; i += 4) {
                const float4 n = __ldg(reinterpret_cast<const float4*>(norm_w + kk + i));
                const float nw[4] = {n.x, n.y, n.z, n.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    ss = fmaf(xv[i + j], xv[i + j], ss);
                    xv[i + j] *= nw[j];
                }
            }
        }
        const size_t tc = size_t(tt) * chunks + c;
        uint4* frag = xf + tc * (Q::kFragBytes / 16);
        if constexpr (Q::kInt4) {
            constexpr int G = F::kGroup, GPC = Q::kGpc;
            float gs = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) gs += xv[i];
#pragma unroll
            for (int off = 1; off < G / 8; off *= 2) gs += __shfl_xor_sync(0xffffffffu, gs, off);
            uint32_t bh[4], bl[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) qsplit_bf16x2(xv[q], xv[q + 4], bh[q], bl[q]);  // nibble pairs (p, p + 4)
            frag[frag_at] = make_uint4(bh[0], bh[1], bh[2], bh[3]);
            frag[frag_at + 32] = make_uint4(bl[0], bl[1], bl[2], bl[3]);
            if (sub % (G / 8) == 0) xs[tc * GPC * kQwTokens + qw_xsum(8 * sub / G, l)] = gs;
        } else {
            uint32_t bh[2], bl[2];
            qsplit_bf16x2(xv[0], xv[1], bh[0], bl[0]);
            qsplit_bf16x2(xv[2], xv[3], bh[1], bl[1]);
            frag[frag_at] = make_uint4(bh[0], bh[1], bl[0], bl[1]);
        }
    }
    if constexpr (NORM) {
#pragma unroll
        for (int off = 1; off < 16; off *= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (sub == 0) ss_out[size_t(blockIdx.x) * rows_pad + tok] = ss;
    }
    pdl_trigger();
}

// Shared memory of one stage: weights (kQwRows rows x 64 B), then for MLX int4 scales and biases
// (kQwRows rows x GPC values each), B fragments (int4 32 KiB, codes 16 KiB), int4 group sums (GPC x
// 64 floats).
template <class F>
struct QwStage {
    using Q = QwFmt<F>;
    static constexpr int kGpc = Q::kGpc;
    static constexpr int kW = 0;
    static constexpr int kS = kQwRows * 64;
    static constexpr int kB = kS + kQwRows * kGpc * 2;
    static constexpr int kX = kB + kQwRows * kGpc * 2;
    static constexpr int kXs = kX + Q::kFragBytes;
    static constexpr int kBytes = kXs + kGpc * kQwTokens * 4;
    static_assert(kS % 16 == 0 && kB % 16 == 0 && kX % 16 == 0 && kXs % 16 == 0 && kBytes % 16 == 0, "16-byte aligned parts");
};
template <class F>
__host__ __device__ constexpr size_t qwide_smem() {
    return size_t(QwFmt<F>::kStages) * QwStage<F>::kBytes;
}

// GSPLIT: the instance of the global K split (the launch's QWideArgs::part set). A separate instance
// keeps the others' code as it was: with both epilogues in one kernel, the cluster and one-slice
// launches measured 2-17 % slower on an H100 (docs/CUDA.md "Session 37").
template <class F, bool SWIGLU, bool NORM, bool GSPLIT = false>
__global__ void __launch_bounds__(kQwWarps * kWarp, 1) quant_wide_kernel(const __grid_constant__ QuantFusedArgs p, const __grid_constant__ QWideArgs w) {
    using ST = typename F::Scale;
    using L = QwStage<F>;
    using Q = QwFmt<F>;
    constexpr int MT = 2, TN = kQwTN, S = Q::kStages;
    constexpr int GPC = L::kGpc;
    extern __shared__ __align__(16) unsigned char qw_smem[];
    __shared__ float inv_s[kQwTokens];

    const int n_total = qfused_rows<SWIGLU>(p);
    const int tid = threadIdx.x, warp = tid / kWarp, lane = tid % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int tt = blockIdx.x, rg = blockIdx.y;  // a row group's token tiles side by side: one HBM read of its weights
    const int slices = int(gridDim.z);
    const int c_first = int(blockIdx.z) * w.sc;
    const size_t row_bytes = size_t(p.k) / Q::kCK * 64;
    const int tok0 = tt * kQwTokens;

    // Block row r: the global row and its matrix.
    auto global_row = [&](int r, int& mat) {
        int n = min(qw_row_of<SWIGLU>(rg, r), n_total - 1);  // rows past the last read the last, never written
        if constexpr (SWIGLU) mat = (r % 32) / 16;
        else mat = qmat_of(p, n);
        return n;
    };
    // This thread's copies: weight rows tid / 4 + 64 q (16-byte piece tid % 4), parameters of row tid.
    const uint8_t* wsrc[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        int mat;
        const int n = global_row(qw_copy_row(tid, q), mat);
        wsrc[q] = static_cast<const uint8_t*>(p.mat[mat].q) + size_t(n) * row_bytes + size_t(c_first) * 64 + 16 * (tid % 4);
    }
    const ST* psrc[2] = {nullptr, nullptr};
    if constexpr (Q::kInt4) {
        int mat;
        const int n = global_row(tid, mat);
        const size_t at = size_t(n) * (p.k / F::kGroup) + size_t(c_first) * GPC;
        psrc[0] = static_cast<const ST*>(p.mat[mat].scales) + at;
        psrc[1] = static_cast<const ST*>(p.mat[mat].biases) + at;
    }
    const uint32_t smem0 = smem_addr(qw_smem);
    auto issue_weights = [&](int i) {
        const uint32_t st = smem0 + uint32_t((i % S) * L::kBytes);
#pragma unroll
        for (int q = 0; q < 4; ++q) cp_async16(st + L::kW + qw_copy_row(tid, q) * 64 + (tid % 4) * 16, wsrc[q] + size_t(i) * 64);
        if constexpr (Q::kInt4) {
            qw_cp_async(st + L::kS + tid * GPC * 2, psrc[0] + i * GPC, GPC * 2);
            qw_cp_async(st + L::kB + tid * GPC * 2, psrc[1] + i * GPC, GPC * 2);
        }
    };
    auto issue_x = [&](int i) {
        const uint32_t st = smem0 + uint32_t((i % S) * L::kBytes);
        const size_t tc = size_t(tt) * w.chunks + c_first + i;
        const uint4* src = w.xf + tc * (Q::kFragBytes / 16);
#pragma unroll
        for (int q = 0; q < Q::kFragBytes / 16 / 256; ++q) cp_async16(st + L::kX + (tid + 256 * q) * 16, src + tid + 256 * q);
        if constexpr (Q::kInt4)
            if (tid < GPC * kQwTokens / 4)
                cp_async16(st + L::kXs + tid * 16, reinterpret_cast<const float4*>(w.xs + tc * GPC * kQwTokens) + tid);
    };

    float acc[MT][TN][4];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < TN; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;

    auto compute = [&](int i) {
        const unsigned char* st = qw_smem + size_t(i % S) * L::kBytes;
        const uint4* wsm = reinterpret_cast<const uint4*>(st + L::kW);
        const uint4* xsm = reinterpret_cast<const uint4*>(st + L::kX);
        if constexpr (Q::kInt4) {
            constexpr int WPG = F::kWordsPerGroup;
            const float* xsum = reinterpret_cast<const float*>(st + L::kXs);
            uint32_t wq[MT][2][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) qchunk_words<F::kSwap>(wsm[qw_lane_row(warp, m, g, h) * 4 + t], t, wq[m][h]);
            // A row's scales or biases of this chunk as qload_group_params lays them out (read when used).
            auto params = [&](int part, int m, uint32_t (&r)[2][2]) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const uint32_t* p32 = reinterpret_cast<const uint32_t*>(st + part + qw_lane_row(warp, m, g, h) * GPC * 2);
                    r[h][0] = p32[0];
                    r[h][1] = GPC == 4 ? p32[1] : 0u;
                }
            };
            float cg[MT][TN][4];
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                qmma_word_staged<MT, TN, WPG>(cg, wq, wd, xsm + qw_xfrag(wd, 0, 0), lane);  // the staged kernel's word
                if (wd % WPG == WPG - 1) {
                    const int grp = wd / WPG;
#pragma unroll
                    for (int n = 0; n < TN; ++n) {
                        const float2 xc = *reinterpret_cast<const float2*>(xsum + qw_xsum(grp, n * 8 + 2 * t));
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            uint32_t sp[2][2], bp[2][2];
                            params(L::kS, m, sp);
                            params(L::kB, m, bp);
                            qgroup_affine<ST>(acc[m][n], cg[m][n], sp, bp, grp, xc.x, xc.y);
                        }
                    }
                }
            }
        } else {
            // Codes: word wd of lane t is k = 16 t + 4 wd .. + 3 of the chunk, exact in bf16 (the
            // A fragments of quant_mma_kernel's codes), one MMA per word and x part into acc.
            uint4 wv[MT][2];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) wv[m][h] = wsm[qw_lane_row(warp, m, g, h) * 4 + t];
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                uint32_t a[MT][2][2];
#pragma unroll
                for (int m = 0; m < MT; ++m)
#pragma unroll
                    for (int h = 0; h < 2; ++h) qunpack_row_bf16<F>(word_of(wv[m][h], wd), a[m][h]);
#pragma unroll
                for (int n = 0; n < TN; ++n) {
                    const uint4 b = xsm[qw_xfrag_codes(wd, n, lane)];
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        qmma_bf16_16816(acc[m][n], a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1], b.x, b.y);
                        qmma_bf16_16816(acc[m][n], a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1], b.z, b.w);
                    }
                }
            }
        }
    };

    // The ring: stages 0..S-2 in flight before the loop; weights never depend on an earlier kernel,
    // so they are issued before the wait, x fragments (the prep's output) after it.
    const int sc = w.sc;
#pragma unroll
    for (int i = 0; i < S - 1; ++i)
        if (i < sc) issue_weights(i);
    pdl_wait();
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
        if (i < sc) issue_x(i);
        cp_async_commit();
    }
#pragma unroll 1
    for (int i = 0; i < sc; ++i) {
        qw_cp_async_wait<S - 2>();  // chunk i's group has landed (for this thread)
        __syncthreads();            // ... for every thread; and chunk i - 1's stage is free
        const int nxt = i + S - 1;
        if (nxt < sc) {
            issue_weights(nxt);
            issue_x(nxt);
        }
        cp_async_commit();
        compute(i);
    }
    cp_async_wait(0);
    // The norm's sums are the last workspace reads: before the trigger, so that the next launch's
    // prep (which rewrites the workspace) cannot start writing while they are read, whatever the
    // kernels in between do.
    if constexpr (NORM) {
        if (tid < kQwTokens) {
            float sum = 0.0f;
            for (int cb = 0; cb < w.cblocks; ++cb) sum += w.ss[size_t(cb) * w.rows_pad + tok0 + tid];
            inv_s[tid] = 1.0f / sqrtf(sum / float(p.k) + p.eps);
        }
    }
    __syncthreads();  // every warp is done with the ring (its memory takes the partials below); inv_s is set
    // The global split reads the workspace once more (its partials): it triggers after that, below.
    if constexpr (!GSPLIT) pdl_trigger();

    // One output: C-fragment position (m, n, e) of this lane, its sum(s) v (SwiGLU: gate, up).
    auto epilogue_at = [&](int m, int n, int e, float v0, float v1) {
        const int tok = tok0 + n * 8 + 2 * t + (e & 1);
        if (tok >= p.rows) return;
        float inv = 1.0f;
        if constexpr (NORM) inv = inv_s[n * 8 + 2 * t + (e & 1)];
        if constexpr (SWIGLU) {
            const int row = qw_row_of<true>(rg, qw_lane_row(warp, 0, g, e >> 1));
            if (row >= n_total) return;
            float gate = v0, up = v1;
            if constexpr (!Q::kInt4) {  // the codes' row scales, as quant_mma_kernel applies them
                gate *= qrow_scale<F>(p.mat[0].scales, row);
                up *= qrow_scale<F>(p.mat[1].scales, row);
            }
            gate *= inv;
            up *= inv;
            p.mat[0].y[size_t(tok) * p.mat[0].n + row] = silu(gate) * up;  // as silu_mul_kernel
        } else {
            int row = qw_row_of<false>(rg, qw_lane_row(warp, m, g, e >> 1));
            if (row >= n_total) return;
            const QuantMat& mat = p.mat[qmat_of(p, row)];
            float y = v0;
            if constexpr (!Q::kInt4) y *= qrow_scale<F>(mat.scales, row);
            if constexpr (NORM) y *= inv;
            if (mat.bias) y += mat.bias[row];
            const size_t at = size_t(tok) * mat.n + row;
            if (p.residual) y = p.residual[at] + y;
            mat.y[at] = y;
        }
    };
    // Every lane's partials go to shared memory (the ring's, now free): partial (m, n, e) of this lane
    // at red[(warp * kVals + v) * 32 + lane], v = (m * TN + n) * 4 + e. The outputs are then written
    // by a loop over v, not unrolled: unrolled over the 64 positions, the epilogue was ~10k SASS
    // instructions run once per warp, and at 64 rows it took ~45 % of the kernel's stall samples,
    // mostly waiting on instruction fetch (ncu, session 35); as a loop the launches are 2-17 % faster
    // (docs/CUDA.md "Session 36").
    float* red = reinterpret_cast<float*>(qw_smem);
    constexpr int kVals = MT * TN * 4;
    static_assert(kQwWarps * kVals * kWarp == kQwPartFloats, "a block's partials");
    static_assert(size_t(kQwPartFloats) * 4 <= qwide_smem<F>(), "the partials reuse the ring's shared memory");
    auto slot = [&](int v) { return (warp * kVals + v) * kWarp + lane; };
    // This lane's partials, in slot order, to shared memory or to the global split's workspace slot.
    auto store_partials = [&](float* to) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < TN; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) to[slot((m * TN + n) * 4 + e)] = acc[m][n][e];
    };
    // The outputs of this block: every position (one slice; the global split's last block), or
    // those with v % slices == rank (a cluster).
    // SwiGLU: the gate's positions (m = 0), each with its up partner (m = 1).
    constexpr int kOut = SWIGLU ? TN * 4 : kVals;
    auto finish = [&](int first, int step, auto&& total) {
#pragma unroll 1
        for (int v = first; v < kOut; v += step) {
            const int e = v % 4, n = (v / 4) % TN;
            if constexpr (SWIGLU) epilogue_at(0, n, e, total(v), total((TN + n) * 4 + e));
            else epilogue_at(v / (TN * 4), n, e, total(v), 0.0f);
        }
    };
    if constexpr (GSPLIT) {
        // The global split: the partials go to this block's slot in the workspace (32 lanes: 128
        // bytes in a row), and the last of the row group's slices to arrive finishes every position,
        // adding the ranks' partials in rank order (the fence before the arrival publishes this
        // block's partials; the counter of this split size stays a multiple of it between launches).
        const int cell = tt * int(gridDim.y) + rg;  // this block's (tile, row group)
        const float* const part = w.part + size_t(cell) * slices * kQwPartFloats;
        store_partials(w.part + (size_t(cell) * slices + blockIdx.z) * kQwPartFloats);
        __shared__ bool last_s;
        const bool last = last_block_to_arrive(last_s, [&] {
            unsigned* counter = w.arrivals + size_t(slices == 2 ? 0 : slices == 4 ? 1 : 2) * w.cells + cell;
            return (atomicAdd(counter, 1u) + 1u) % unsigned(slices) == 0u;
        });
        if (!last) return;  // an exit counts as this block's trigger
        // The sums first, into shared memory, 8 positions' loads in flight at a time (a loop that
        // used each sum as it came waited one L2 round trip per position), then the outputs.
#pragma unroll 8
        for (int v = 0; v < kVals; ++v) {
            float sum = __ldcg(part + slot(v));
#pragma unroll
            for (int rk = 1; rk < 8; ++rk)
                if (rk < slices) sum += __ldcg(part + size_t(rk) * kQwPartFloats + slot(v));
            red[slot(v)] = sum;
        }
        // After the last workspace read: the next launch (which rewrites the slots once its own
        // loop is done) can start.
        pdl_trigger();
        finish(0, 1, [&](int v) { return red[slot(v)]; });  // each lane reads back its own sums
        return;
    } else {
        store_partials(red);
        if (slices == 1) {
            // Each lane reads back only its own partials: program order suffices, no barrier.
            finish(0, 1, [&](int v) { return red[slot(v)]; });
            return;
        }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        // The cluster meets: rank r finishes the positions with v % slices == r, adding the ranks'
        // partials in rank order.
        namespace cgs = cooperative_groups;
        cgs::cluster_group cluster = cgs::this_cluster();
        cluster.sync();
        const int rank = int(cluster.block_rank());
        const float* from[8];
#pragma unroll
        for (int rk = 0; rk < 8; ++rk) from[rk] = rk < slices ? cluster.map_shared_rank(red, rk) : red;
        finish(rank, slices, [&](int v) {
            float s = from[0][slot(v)];
#pragma unroll
            for (int rk = 1; rk < 8; ++rk)
                if (rk < slices) s += from[rk][slot(v)];
            return s;
        });
        cluster.sync();  // the partials stay alive until every rank has read them
#else
        __trap();  // clusters need sm_90: never launched so (the plan's occupancy query refuses them)
#endif
    }
}

// How a launch is cut (a function of the shape only): K slices (a cluster's blocks, or the global
// split's) and row groups.
struct QWidePlan {
    int slices = 0, row_groups = 0;
    bool global = false;  // the slices meet through global memory, not as a cluster
};

template <class F, bool SWIGLU, bool NORM>
bool qwide_ready() {
    static const bool set = [] {
        const int smem = int(qwide_smem<F>());
        if (cudaFuncSetAttribute(quant_wide_kernel<F, SWIGLU, NORM, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess &&
            cudaFuncSetAttribute(quant_wide_kernel<F, SWIGLU, NORM, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) == cudaSuccess)
            return true;
        cudaGetLastError();  // the launches go elsewhere
        return false;
    }();
    return set;
}
// Blocks resident at once in clusters of c (0: the kernel cannot run so); GSPLIT: of the global
// split's instance (single blocks only).
template <class F, bool SWIGLU, bool NORM, bool GSPLIT = false>
int qwide_resident_blocks(int c) {
    if (!qwide_ready<F, SWIGLU, NORM>()) return 0;
    if (c == 1) {
        int blocks = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_wide_kernel<F, SWIGLU, NORM, GSPLIT>, kQwWarps * kWarp,
                                                          qwide_smem<F>()) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        return blocks * device_sm_count();
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, 1, c);
    cfg.blockDim = dim3(kQwWarps * kWarp);
    cfg.dynamicSmemBytes = qwide_smem<F>();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 1;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = c;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, quant_wide_kernel<F, SWIGLU, NORM, false>, &cfg) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return clusters * c;
}
// SCR_CUDA_QUANT_WIDE_SLICES=C (1, 2, 4, 8) forces the K slices where they divide K (A/B runs).
inline int qwide_slices_override() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_WIDE_SLICES", 0, [](long long c) { return c == 1 || c == 2 || c == 4 || c == 8; }, "1, 2, 4 or 8", "the rule"));
    return v;
}
// SCR_CUDA_QUANT_WIDE_GLOBAL: 0 never splits K through global memory (clusters only: session 36's
// plans); 1 (default) where the cost rule picks it; for checks and A/B runs, 2 takes rule 1's split
// through global memory wherever one wave holds it and 3 runs it as clusters (in waves): 2 and 3
// must give the same bits.
inline int qwide_global_switch() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_WIDE_GLOBAL", 1, [](long long c) { return c >= 0 && c <= 3; }, "0, 1, 2 or 3", "1"));
    return v;
}
// The plan for one token tile: for each slice count C (a power of two up to 8 dividing the chunks),
// waves x (chunks per slice + the ring's fill) plus a meeting cost when C > 1; the least wins. A
// cluster of C must be resident as a whole, which for C = 8 leaves SMs idle (a 4096-row linear's
// 16 row groups x 8 = 128 blocks do not fit in one wave of 8-block clusters on an H100 / H200, so
// its K split stopped at 4: 64 blocks on 132 SMs). The global split takes any C whose blocks fit in
// one wave of single blocks (up to `global_blocks`), at a higher meeting cost: the last block reads
// the C partials of every position from L2. That cost is the same time for every format, so in
// chunks it weighs `meet_scale` times more for the codes (3: their 64-k chunks are short; measured
// on an H100, session 37: the 8B's 4096x4096 int8 at 33-64 rows stays a cluster of 4, 35 us against
// 40-42 us split 8 ways through L2, while 4096x14336 gains 16-26 %; MLX int4 1: 4096x4096 gains 1-4 %
// at 48-64 rows and 14-15 % at 96-128, 4096x14336 29-35 %).
// `global`: qwide_global_switch()'s rule; `forced`: qwide_slices_override() (0: none).
inline QWidePlan qwide_choose(int row_groups, int chunks, int stages, double meet_scale, int (*resident_of)(int), int global_blocks,
                              int global, int forced) {
    QWidePlan best;
    double best_cost = 1e30;
    for (int c = 1; c <= 8; c *= 2) {
        if (chunks % c != 0) continue;
        const int sc = chunks / c;
        const int resident = resident_of(c);
        if (resident >= c) {
            const int waves = (row_groups * c + resident - 1) / resident;
            double cost = waves * (sc + stages - 1.0) + (c > 1 ? 1.5 : 0.0);
            if (forced == c) cost = -1.0;
            if (cost < best_cost) {
                best_cost = cost;
                best = QWidePlan{c, row_groups, false};
            }
        }
        if (c > 1 && global > 0 && row_groups * c <= global_blocks) {
            double cost = (sc + stages - 1.0) + (1.5 + 0.25 * c) * meet_scale;
            if (forced == c) cost = -0.5;  // a forced C stays a cluster where one fits
            if (cost < best_cost) {
                best_cost = cost;
                best = QWidePlan{c, row_groups, true};
            }
        }
    }
    if (global == 2 && best.slices > 1 && row_groups * best.slices <= global_blocks) best.global = true;
    if (global == 3 && best.global && resident_of(best.slices) >= best.slices) best.global = false;
    return best;
}
template <class F, bool SWIGLU, bool NORM>
QWidePlan qwide_plan(int row_groups, int chunks) {
    struct Entry {
        int row_groups, chunks;
        QWidePlan plan;
    };
    static thread_local std::vector<Entry> cache;
    for (const Entry& e : cache)
        if (e.row_groups == row_groups && e.chunks == chunks) return e.plan;
    // The global split's blocks: one wave of its instance's single blocks, within the workspace's
    // slots per tile.
    const int global_blocks =
        std::min(qwide_resident_blocks<F, SWIGLU, NORM, true>(1), qwide_split_slots() / (kQwMaxRows / kQwTokens));
    const QWidePlan plan = qwide_choose(
        row_groups, chunks, QwFmt<F>::kStages, QwFmt<F>::kInt4 ? 1.0 : 3.0, [](int c) { return qwide_resident_blocks<F, SWIGLU, NORM>(c); }, global_blocks,
        qwide_global_switch(), qwide_slices_override());
    cache.push_back({row_groups, chunks, plan});
    return plan;
}
// The plan of the last launch on this thread (tests print it; slices 0: the kernel did not run).
inline QWidePlan& qwide_last_plan() {
    static thread_local QWidePlan p;
    return p;
}

// What the kernel takes: a format of qwide_format_ok, K in whole chunks, 16-byte aligned weights, x
// and norm weight, aligned int4 parameters, and a workspace for the prep.
template <class F>
bool quant_wide_fits(const Ctx& c, const QuantFusedArgs& a) {
    using Q = QwFmt<F>;
    if constexpr (!qwide_format_ok<F>()) return false;
    if (!qwide_takes<F>(a.rows) || a.k % Q::kCK != 0 || !c.qwide_ws) return false;
    // The need of a 256-row launch, whatever this one's rows: whether a shape takes the kernel must
    // not depend on the row count (batch invariance within the regime).
    if (qwide_workspace_bytes_for<F>(a.k) > c.qwide_ws_bytes) return false;
    const auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    if (!aligned(a.x, 16) || (a.norm_w && !aligned(a.norm_w, 16)) || !aligned(c.qwide_ws, 16)) return false;
    for (int m = 0; m < a.nmat; ++m) {
        if (!aligned(a.mat[m].q, 16)) return false;
        if constexpr (Q::kInt4)
            if (!aligned(a.mat[m].scales, 2 * Q::kGpc) || !aligned(a.mat[m].biases, 2 * Q::kGpc)) return false;
    }
    return true;
}

// Launches the prep and the kernel; false (nothing launched) when the kernel does not take them.
template <class F, bool SWIGLU, bool NORM>
bool launch_quant_wide(const Ctx& c, const QuantFusedArgs& a) {
    qwide_last_plan() = {};
    // A format the kernel never takes instantiates no kernel (MLX int4 g128: the build's time).
    if constexpr (!qwide_format_ok<F>()) return false;
    else {
        if (!quant_wide_fits<F>(c, a)) return false;
        int n_total = a.mat[0].n;
        if (!SWIGLU)
            for (int m = 1; m < a.nmat; ++m) n_total += a.mat[m].n;
        const int row_groups = SWIGLU ? (n_total + kQwRows / 2 - 1) / (kQwRows / 2) : (n_total + kQwRows - 1) / kQwRows;
        using Q = QwFmt<F>;
        const int chunks = a.k / Q::kCK;
        const QWidePlan plan = qwide_plan<F, SWIGLU, NORM>(row_groups, chunks);
        if (plan.slices == 0) return false;
        const int tiles = (a.rows + kQwTokens - 1) / kQwTokens;
        const int cblocks = (chunks + Q::kPrepChunks - 1) / Q::kPrepChunks;
        QWideArgs w;
        unsigned char* ws = static_cast<unsigned char*>(c.qwide_ws);
        w.xf = reinterpret_cast<const uint4*>(ws);
        w.xs = reinterpret_cast<const float*>(ws + size_t(tiles) * chunks * Q::kFragBytes);
        w.ss = w.xs + size_t(tiles) * chunks * Q::kGpc * kQwTokens;
        w.chunks = chunks;
        w.cblocks = cblocks;
        w.rows_pad = tiles * kQwTokens;
        w.sc = chunks / plan.slices;
        // The global split's slots at the workspace's end (quant_wide_model_workspace_bytes). A
        // workspace without them (never made so here) takes the same split as a cluster: the same bits.
        QWidePlan ran = plan;
        if (plan.global) {
            const int slots = qwide_split_slots();
            const int64_t at = c.qwide_ws_bytes - qwide_split_bytes(slots);
            if (at >= qwide_workspace_bytes_for<F>(a.k) && int64_t(tiles) * row_groups * plan.slices <= slots) {
                w.arrivals = reinterpret_cast<unsigned*>(ws + at);
                w.part = reinterpret_cast<float*>(ws + at + (qwide_split_bytes(slots) - int64_t(slots) * kQwPartFloats * 4));
                w.cells = slots;
            } else if (qwide_resident_blocks<F, SWIGLU, NORM>(plan.slices) >= plan.slices) {
                ran.global = false;
            } else {
                return false;
            }
        }

        if (launch_ex(c, quant_wide_prep_kernel<F, NORM>, dim3(cblocks, w.rows_pad / 16), dim3(256), 0, 1, a.x, a.norm_w, a.k, a.rows,
                      const_cast<uint4*>(w.xf), const_cast<float*>(w.xs), const_cast<float*>(w.ss), w.rows_pad) != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        // A refused launch (never seen: the same kernel and shape passed the occupancy query) falls back
        // like the staged kernel's: the prep wrote only this kernel's workspace, and its error is consumed
        // so that the caller's next check does not report a launch that was made another way.
        const cudaError_t launched =
            ran.global ? launch_ex(c, quant_wide_kernel<F, SWIGLU, NORM, true>, dim3(tiles, row_groups, plan.slices), dim3(kQwWarps * kWarp),
                                   qwide_smem<F>(), 1, a, w)
                       : launch_ex(c, quant_wide_kernel<F, SWIGLU, NORM, false>, dim3(tiles, row_groups, plan.slices), dim3(kQwWarps * kWarp),
                                   qwide_smem<F>(), plan.slices, a, w);
        if (launched != cudaSuccess) {
            cudaGetLastError();
            return false;
        }
        qwide_last_plan() = ran;
        return true;
    }
}

}  // namespace scr::kernels::cuda::qdetail
