// Sparse MoE MLP over quantized experts (MLX affine int4 g32 / g64 / g128, int8 per channel, fp8
// e4m3 per channel or per tensor: the formats of quant_linear.cuh), the CUDA side of
// kernels/cpu/moe.hpp's moe_quant. The routing and the combine are moe.cuh's (the same kernels as
// the bf16 experts, so the same picks and the same summation order); the experts' SwiGLU MLPs run
// as GEMVs that dequantize each expert row in registers, per (row, pick) pair: a block stages its
// pair's x row in shared memory once (swizzled, so the warp's reads under its lanes' weight chunks
// are free of bank conflicts; through L1 they touched 32 lines per load and made the kernels
// L1-bound, docs/CUDA.md "Session 39"), its warps read the gate and up rows in one pass over x and
// carry several rows each where a row is short. A grouped form (moe_gemm.cuh's grouping, up to 8
// pairs of an expert sharing each weight row's loads; the same bits) runs only when forced, as it
// measured slower. Steps whose experts average a pair or more run the tensor-core form instead
// (moe_quant_mma_kernel: the pairs grouped by expert, the codes as the MMA's A operand), and wide
// steps expand the picked experts to bf16 for the bf16 build's grouped GEMM (moe_quant_form).
//
// The experts' table: expert e's gate, up and down projections at experts[(3 e + j) P], each as
// its P adjacent weight-table entries (codes, scales, and MLX's biases: P = 3, else 2), the order
// compiler/quant/apply.cpp writes and the CPU kernel reads.
#pragma once

#include <algorithm>
#include <cstring>

#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/quant_ops.cuh"

namespace scr::kernels::cuda {

namespace qdetail {

// Tensors per quantized projection in the weight table: codes, scales (and MLX's biases).
template <class F>
constexpr int kQuantTensors = F::kAffine ? 3 : 2;

__host__ __device__ __forceinline__ uint4 qdot_load16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return load_stream16(p);  // expert rows are streamed: keep L1 for the x rows
#else
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
#endif
}

// Where float4 q of a row staged in shared memory lies (moe_quant_stage_x writes it there): slot
// q ^ ((q >> 3) & 7), a swizzle inside each 128-byte line. A warp's lanes read the x under their own
// consecutive 16-byte weight chunks (32 or 16 floats apart), so unswizzled, the 8 lanes of a 128-bit
// access phase would all hit the same banks; swizzled, they hit 8 different 16-byte bank groups.
__host__ __device__ constexpr int qdot_x_slot(int q) { return q ^ ((q >> 3) & 7); }

// Floats x[i .. i + 4) of a row: as given (global memory, the read-only path), or the row staged
// swizzled in shared memory (SMEM_X).
template <bool SMEM_X>
__host__ __device__ __forceinline__ float4 qdot_x4(const float* x, size_t i) {
    if constexpr (SMEM_X) {
        return reinterpret_cast<const float4*>(x)[qdot_x_slot(int(i / 4))];
    } else {
#ifdef __CUDA_ARCH__
        return __ldg(reinterpret_cast<const float4*>(x + i));
#else
        return float4{x[i], x[i + 1], x[i + 2], x[i + 3]};
#endif
    }
}

// Lane `lane`'s parts of the dot products of rows n[m] of the quantized [N][K] matrices w[m]
// (m < M) with the rows x[0 .. nr) (nr <= R): each matrix row's 16-byte chunks lane, lane + 32, ...,
// each loaded and unpacked once for all the x rows, and each x
// value read once for all M matrix rows (a SwiGLU's gate and up, or a warp's several rows). MLX
// affine: s * sum(x q) + b * sum(x) per chunk (a chunk lies inside one group, G >= 32); one scale
// per row (or tensor): sum(x q), the scale applied to the warp's sum (qdot_finish). The warp's sum
// of the 32 lanes' parts is a dot. Every product that meets an addition is an explicit fmaf, so
// an (m, r) part's arithmetic, and its bits, are the same for any R, M and SMEM_X and whichever
// other rows share the call (the grouped and per-pair kernels agree bit for bit). Host and device:
// the host self-test runs it lane by lane (so no bare `#pragma unroll`, which the host compiler
// warns of: SCR_QDOT_UNROLL is the pragma on the device only; without it nvcc left the wide M forms'
// arrays in local memory). Loads per matrix in flight: 4, or fewer where a row has fewer chunks per
// lane (the chunks' order per lane, and so the bits, do not depend on it).
#ifdef __CUDA_ARCH__
#define SCR_QDOT_UNROLL _Pragma("unroll")
#else
#define SCR_QDOT_UNROLL
#endif
template <int K, class F, int R, int M = 1, bool SMEM_X = false>
__host__ __device__ __forceinline__ void qdot_lanes(const QuantW (&w)[M], const int (&n)[M], const float* const (&x)[R], int nr, int lane,
                                                    float (&acc)[M][R]) {
    using ST = typename F::Scale;
    constexpr int PW = F::kPerWord, kChunks = K / F::kElems, kBatch = ceil_div(kChunks, kWarp) < 4 ? ceil_div(kChunks, kWarp) : 4;
    static_assert(K % F::kElems == 0, "K must be a whole number of 16-byte chunks of the packed row");
    static_assert(K % (F::kAffine ? F::kGroup : 1) == 0, "K must be a whole number of groups");
    const uint8_t* row[M];
    SCR_QDOT_UNROLL
    for (int m = 0; m < M; ++m) {
        row[m] = static_cast<const uint8_t*>(w[m].q) + size_t(n[m]) * (size_t(kChunks) * 16);
        SCR_QDOT_UNROLL
        for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;
    }
    SCR_QDOT_UNROLL
    for (int c0 = 0; c0 < kChunks; c0 += 32 * kBatch) {
        uint4 wv[M][kBatch];
        SCR_QDOT_UNROLL
        for (int b = 0; b < kBatch; ++b) {
            const int c = c0 + b * 32 + lane;
            if (c < kChunks) {
                SCR_QDOT_UNROLL
                for (int m = 0; m < M; ++m) wv[m][b] = qdot_load16(row[m] + size_t(c) * 16);
            }
        }
        SCR_QDOT_UNROLL
        for (int b = 0; b < kBatch; ++b) {
            const int c = c0 + b * 32 + lane;
            if (c >= kChunks) continue;
            float aq[M][R], xs[R];
            SCR_QDOT_UNROLL
            for (int r = 0; r < R; ++r) {
                xs[r] = 0.0f;
                SCR_QDOT_UNROLL
                for (int m = 0; m < M; ++m) aq[m][r] = 0.0f;
            }
            SCR_QDOT_UNROLL
            for (int j = 0; j < 4; ++j) {
                float q[M][PW];
                SCR_QDOT_UNROLL
                for (int m = 0; m < M; ++m) {
                    const uint32_t word = j == 0 ? wv[m][b].x : j == 1 ? wv[m][b].y : j == 2 ? wv[m][b].z : wv[m][b].w;
                    F::unpack(word, q[m]);
                }
                SCR_QDOT_UNROLL
                for (int r = 0; r < R; ++r) {
                    if (r >= nr) break;
                    SCR_QDOT_UNROLL
                    for (int i = 0; i < PW; i += 4) {
                        const float4 f = qdot_x4<SMEM_X>(x[r], size_t(c) * F::kElems + j * PW + i);
                        SCR_QDOT_UNROLL
                        for (int m = 0; m < M; ++m) {
                            aq[m][r] = fmaf(f.x, q[m][i], aq[m][r]);
                            aq[m][r] = fmaf(f.y, q[m][i + 1], aq[m][r]);
                            aq[m][r] = fmaf(f.z, q[m][i + 2], aq[m][r]);
                            aq[m][r] = fmaf(f.w, q[m][i + 3], aq[m][r]);
                        }
                        if constexpr (F::kAffine) xs[r] += (f.x + f.y) + (f.z + f.w);
                    }
                }
            }
            SCR_QDOT_UNROLL
            for (int m = 0; m < M; ++m) {
                if constexpr (F::kAffine) {
                    const size_t g = size_t(n[m]) * (K / F::kGroup) + size_t(c) * F::kElems / F::kGroup;
                    const float sc = to_f32(static_cast<const ST*>(w[m].scales)[g]), bi = to_f32(static_cast<const ST*>(w[m].biases)[g]);
                    SCR_QDOT_UNROLL
                    for (int r = 0; r < R; ++r) {
                        if (r >= nr) break;
                        acc[m][r] += fmaf(sc, aq[m][r], bi * xs[r]);
                    }
                } else {
                    SCR_QDOT_UNROLL
                    for (int r = 0; r < R; ++r) {
                        if (r >= nr) break;
                        acc[m][r] += aq[m][r];
                    }
                }
            }
        }
    }
}

// One row's part: qdot_lanes of one x row, as the per-pair kernels (CR = 1) run it (the host
// self-test's reference form for the grouped one).
template <int K, class F>
__host__ __device__ __forceinline__ float qdot_lane(const QuantW& w, int n, const float* x, int lane) {
    const QuantW ws[1] = {w};
    const int ns[1] = {n};
    const float* const xs[1] = {x};
    float acc[1][1];
    qdot_lanes<K, F, 1>(ws, ns, xs, 1, lane, acc);
    return acc[0][0];
}

// The dot product from the warp's sum of qdot_lane: times the row's (or tensor's) scale for the
// one-scale formats.
template <class F>
__host__ __device__ __forceinline__ float qdot_finish(const QuantW& w, int n, float sum) {
    if constexpr (F::kAffine) {
        return sum;
    } else {
        return sum * to_f32(static_cast<const typename F::Scale*>(w.scales)[F::kPerTensor ? 0 : n]);
    }
}

// Projection j of expert e in the experts' table.
template <class F>
__host__ __device__ __forceinline__ QuantW qexpert(const void* const* experts, int e, int j) {
    constexpr int P = kQuantTensors<F>;
    const void* const* t = experts + size_t(3 * P) * size_t(e) + size_t(j) * P;
    return QuantW{t[0], t[1], P == 3 ? t[2] : nullptr};
}

// Chunk size of the grouped form: up to this many pairs of one expert share each weight row's loads
// and unpacking.
constexpr int kMoeQuantChunk = 8;

// Where a block of the experts' kernels finds its (row, pick) pairs p = row * TOPK + pick: per pair
// (CR == 1), pair blockIdx.x alone, its expert top_id[p]; grouped (CR == kMoeQuantChunk), chunk
// blockIdx.x of moe_gemm.cuh's grouping, up to CR pairs of one expert in `order`. Blocks past the
// grouping's chunk count exit (the grid is sized for the most chunks, so a captured graph stays
// valid whatever the routing).
struct MoeQuantPairs {
    const int32_t* top_id;
    const int32_t* order;     // grouped form only
    const MoeChunk* chunks;   // grouped form only
    const int32_t* n_chunks;  // grouped form only
};

template <int CR>
__device__ __forceinline__ bool moe_quant_block_pairs(const MoeQuantPairs& src, int& expert, int& count, int (&pair)[CR]) {
    if constexpr (CR == 1) {
        pair[0] = int(blockIdx.x);
        expert = src.top_id[pair[0]];
        count = 1;
    } else {
        if (int(blockIdx.x) >= *src.n_chunks) return false;
        const MoeChunk ch = src.chunks[blockIdx.x];
        expert = ch.expert;
        count = ch.count;
        for (int r = 0; r < CR; ++r) pair[r] = src.order[ch.first + (r < ch.count ? r : 0)];
    }
    return true;
}

// Matrix rows per warp of the per-pair kernels: enough that each lane has about kLoads 16-byte
// weight loads in flight (MATS matrices per row: 2 for the SwiGLU's gate and up), at most 8.
constexpr int kMoeQuantLoads = 8;
template <int K, class F, int MATS>
constexpr int kMoeQuantRowsPerWarp = std::clamp(kMoeQuantLoads / (ceil_div(K / F::kElems, kWarp) * MATS), 1, 8);

// Floats of shared memory for one staged x row of K floats (whole 128-byte lines: the swizzle
// stays inside a line).
template <int K>
constexpr int kMoeQuantStagedFloats = ceil_div(K, 32) * 32;

// Output rows per block of the per-pair kernels (8 warps): the up kernel's (K = H, gate and up per
// row) and the down kernel's (K = FF); the launches size their grids by the same constants.
template <int H, class F>
constexpr int kMoeQuantUpRowsPerBlock = 8 * kMoeQuantRowsPerWarp<H, F, 2>;
template <int FF, class F>
constexpr int kMoeQuantDownRowsPerBlock = 8 * kMoeQuantRowsPerWarp<FF, F, 1>;

// The per-pair kernels' x row (K floats, 16-byte aligned) into shared memory, swizzled for
// qdot_x4<true>: every warp of the block reads it, for every one of its matrix rows, so it comes
// from global memory (L2) once per block instead of once per row through L1.
template <int K>
__device__ __forceinline__ void moe_quant_stage_x(const float* __restrict__ x, float* staged) {
    static_assert(K % 4 == 0, "the staged row is copied as float4");
    static_assert(kMoeQuantStagedFloats<K> * 4 <= 48 * 1024,
                  "quantized MoE experts: the per-pair kernels stage a row of hidden_size (up) or moe_intermediate_size "
                  "(down) floats in static shared memory, at most 48 KiB (12,288 floats); this model's row is larger");
    const float4* src = reinterpret_cast<const float4*>(x);
    float4* dst = reinterpret_cast<float4*>(staged);
    for (int q = threadIdx.x; q < K / 4; q += blockDim.x) dst[qdot_x_slot(q)] = src[q];
    __syncthreads();
}

// act[p][f] = silu(x[row] . Wg_e[f]) * (x[row] . Wu_e[f]) for the block's pairs p of expert e: block
// (pairs, 8 warps), each warp RPW adjacent rows f, gate and up in one pass over x. Per pair (CR ==
// 1) the pair's x row is staged in shared memory first; the grouped form (CR rows) reads x from
// global memory. A pair's value has the same bits in either form (qdot_lanes).
template <int H, int FF, int TOPK, class F, int CR>
__global__ void __launch_bounds__(256) moe_quant_up_kernel(const float* __restrict__ x, const void* const* __restrict__ experts,
                                                           MoeQuantPairs src, float* __restrict__ act) {
    constexpr bool kStage = CR == 1;
    constexpr int RPW = kStage ? kMoeQuantUpRowsPerBlock<H, F> / 8 : 1, M = 2 * RPW;
    __shared__ __align__(16) float staged[kStage ? kMoeQuantStagedFloats<H> : 4];
    int e, count, pair[CR];
    if (!moe_quant_block_pairs<CR>(src, e, count, pair)) return;  // the same for the whole block
    const float* xr[CR];
    if constexpr (kStage) {
        moe_quant_stage_x<H>(x + size_t(pair[0] / TOPK) * H, staged);
        xr[0] = staged;
    } else {
        for (int r = 0; r < CR; ++r) xr[r] = x + size_t(pair[r] / TOPK) * H;
    }
    const int f0 = (blockIdx.y * 8 + threadIdx.x / kWarp) * RPW, lane = threadIdx.x % kWarp;
    if (f0 >= FF) return;
    const QuantW gate = qexpert<F>(experts, e, 0), up = qexpert<F>(experts, e, 1);
    QuantW w[M];
    int n[M];
    for (int i = 0; i < RPW; ++i) {
        w[2 * i] = gate;
        w[2 * i + 1] = up;
        n[2 * i] = n[2 * i + 1] = f0 + i < FF ? f0 + i : FF - 1;  // rows past FF: computed, not written
    }
    float v[M][CR];
    qdot_lanes<H, F, CR, M, kStage>(w, n, xr, count, lane, v);
    for (int i = 0; i < RPW; ++i) {
        if (f0 + i >= FF) break;
        for (int r = 0; r < CR; ++r) {
            if (r >= count) break;
            const float gs = qdot_finish<F>(gate, f0 + i, warp_sum(v[2 * i][r])), us = qdot_finish<F>(up, f0 + i, warp_sum(v[2 * i + 1][r]));
            if (lane == 0) act[size_t(pair[r]) * FF + f0 + i] = silu(gs) * us;
        }
    }
}

// y[p][h] = act[p] . Wd_e[h] for the block's pairs: block (pairs, 8 warps), each warp RPW adjacent
// rows h; per pair the act row staged in shared memory as the up kernel's x.
template <int H, int FF, class F, int CR>
__global__ void __launch_bounds__(256) moe_quant_down_kernel(const float* __restrict__ act, const void* const* __restrict__ experts,
                                                             MoeQuantPairs src, float* __restrict__ y) {
    constexpr bool kStage = CR == 1;
    constexpr int RPW = kStage ? kMoeQuantDownRowsPerBlock<FF, F> / 8 : 1;
    __shared__ __align__(16) float staged[kStage ? kMoeQuantStagedFloats<FF> : 4];
    int e, count, pair[CR];
    if (!moe_quant_block_pairs<CR>(src, e, count, pair)) return;  // the same for the whole block
    const float* ar[CR];
    if constexpr (kStage) {
        moe_quant_stage_x<FF>(act + size_t(pair[0]) * FF, staged);
        ar[0] = staged;
    } else {
        for (int r = 0; r < CR; ++r) ar[r] = act + size_t(pair[r]) * FF;
    }
    const int h0 = (blockIdx.y * 8 + threadIdx.x / kWarp) * RPW, lane = threadIdx.x % kWarp;
    if (h0 >= H) return;
    const QuantW down = qexpert<F>(experts, e, 2);
    QuantW w[RPW];
    int n[RPW];
    for (int i = 0; i < RPW; ++i) {
        w[i] = down;
        n[i] = h0 + i < H ? h0 + i : H - 1;  // rows past H: computed, not written
    }
    float v[RPW][CR];
    qdot_lanes<FF, F, CR, RPW, kStage>(w, n, ar, count, lane, v);
    for (int i = 0; i < RPW; ++i) {
        if (h0 + i >= H) break;
        for (int r = 0; r < CR; ++r) {
            if (r >= count) break;
            const float s = qdot_finish<F>(down, h0 + i, warp_sum(v[i][r]));
            if (lane == 0) y[size_t(pair[r]) * H + h0 + i] = s;
        }
    }
}

// ---- Tensor-core steps: the experts' codes as the MMA's A operand, grouped by expert ----
// Decode batches pick most experts several times: the per-pair GEMVs then re-read an expert's codes
// for each of its pairs (Qwen3-30B-A3B int8 at 64 rows: 0.45x the bf16 build's decode). Here the
// pairs are grouped by expert (moe_gemm.cuh's grouping, chunks of 8 TN pairs) and each (chunk,
// 16-row tile) item runs quant_mma_kernel's arithmetic (qmma_accumulate: the codes unpacked to bf16
// in registers, x as bf16 hi + lo, MLX's affine per group; K split over the block's warps, a fixed
// tree over them), so an expert's codes are read once per chunk, on the tensor cores. Its own
// regime (the MMA's summation order); a pair's column does not change its bits, so within it a
// pair's bits do not depend on the other pairs.
template <int K, int N, class F>
constexpr bool kMoeQuantMmaFits = K % F::kMmaChunk == 0 && N % detail::kMmaRows == 0;
template <int K, class F>
constexpr int kMoeQuantMmaWarps = qmma_warps(K / F::kMmaChunk);

// out[pair][n] = x[pair / XDIV] . W_MAT[n] (SWIGLU: silu(x . W_MAT[n]) * (x . W_MAT+1[n])), with the
// format's row scale, for every pair of every chunk (as moe_gemm_kernel: a persistent grid over the
// items, the chunk count read from device memory).
template <int K, int N, int TN, bool SWIGLU, int XDIV, int MAT, class F>
__global__ void __launch_bounds__(kMoeQuantMmaWarps<K, F> * kWarp)
    moe_quant_mma_kernel(const float* __restrict__ x, const void* const* __restrict__ experts, const int32_t* __restrict__ order,
                         const MoeChunk* __restrict__ chunks, const int32_t* __restrict__ n_chunks, float* __restrict__ out) {
    using ST = typename F::Scale;
    constexpr int MT = QMmaShape<F, TN, SWIGLU>::MT, CK = F::kMmaChunk, NW = kMoeQuantMmaWarps<K, F>, CH = K / CK / NW;
    static_assert(kMoeQuantMmaFits<K, N, F>, "the quantized experts' tensor-core form needs whole chunks of K and 16-row tiles");
    constexpr int kTiles = N / detail::kMmaRows;
    __shared__ float red[NW > 1 ? NW / 2 : 1][MT * TN * 4][kWarp];
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int c_first = warp * CH;
    const int items = *n_chunks * kTiles;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
        const MoeChunk ch = chunks[item / kTiles];
        const int row0 = (item % kTiles) * detail::kMmaRows;
        QuantW w[MT];
        const uint8_t* wrow[MT][2];
        const ST* srow[MT][2];
        const ST* brow[MT][2];
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            w[m] = qexpert<F>(experts, ch.expert, MAT + m);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int n = row0 + g + 8 * h;
                wrow[m][h] = static_cast<const uint8_t*>(w[m].q) + size_t(n) * (K / CK * 64) + size_t(c_first) * 64 + 16 * t;
                if constexpr (F::kAffine) {
                    const size_t at = size_t(n) * (K / F::kGroup) + size_t(c_first) * (CK / F::kGroup);
                    srow[m][h] = static_cast<const ST*>(w[m].scales) + at;
                    brow[m][h] = static_cast<const ST*>(w[m].biases) + at;
                }
            }
        }
        const float* xr[TN];  // token column n * 8 + g: its pair's x row (past the chunk's pairs: the last one's)
#pragma unroll
        for (int n = 0; n < TN; ++n) xr[n] = x + size_t(order[ch.first + min(n * 8 + g, ch.count - 1)] / XDIV) * K;
        float acc[MT][TN][4], ss[TN];
        qmma_accumulate<F, TN, false>(wrow, srow, brow, CH, c_first, g, t, [&](int n) { return xr[n]; }, nullptr, acc, ss);
        qmma_warp_tree<false>(acc, ss, red, NW, warp, lane);
        if (warp != 0) continue;
        detail::moe_chunk_outputs<TN, N>(ch, order, out, t, [&](int n, int j, float* o) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = row0 + g + 8 * h;
                float v[MT];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    v[m] = acc[m][n][2 * h + j];
                    if constexpr (!F::kAffine) v[m] *= qrow_scale<F>(w[m].scales, row);  // as qdot_finish
                }
                if constexpr (SWIGLU) o[row] = silu(v[0]) * v[1];
                else o[row] = v[0];
            }
        });
    }
}

template <int K, int N, int TN, bool SWIGLU, int XDIV, int MAT, class F>
void launch_moe_quant_mma(const Ctx& c, int max_chunks, const float* x, const void* const* experts, const int32_t* order,
                          const MoeChunk* chunks, const int32_t* n_chunks, float* out) {
    constexpr auto kernel = moe_quant_mma_kernel<K, N, TN, SWIGLU, XDIV, MAT, F>;
    constexpr int threads = kMoeQuantMmaWarps<K, F> * kWarp;
    static const int resident = detail::resident_blocks(kernel, threads);
    const int grid = int(std::min<int64_t>(int64_t(max_chunks) * (N / detail::kMmaRows), resident));
    if (grid == 0) return;  // no chunk can come (a per-expert grouping's wide table for a few pairs)
    kernel<<<grid, threads, 0, c.stream>>>(x, experts, order, chunks, n_chunks, out);
}

// ---- Wide steps: the experts expanded to bf16, then the bf16 grouped GEMM ----
// A long prompt picks every expert many times: the GEMVs above then re-read each expert's codes
// once per pair (Qwen3-30B-A3B MLX int4 g64 at 2,048 rows: 0.17x the bf16 build's prefill). From
// kMoeQuantExpandPairsPerExpert pairs per expert (moe_quant_form) the step instead writes each
// picked expert's matrices out in bf16 and runs moe_gemm_rows_kernel over them: the dense quantized
// linears' prefill (quant_prefill.cuh) applied to the experts.
//  * MLX affine: w = dequant(q) in float32 as the GEMVs', as bf16 hi + lo (|w - hi - lo| <= 2^-18
//    |w|; the kernel's WP = 2);
//  * int8 / fp8: the codes, exact in bf16, and each row's scale in float32, applied by the kernel's
//    epilogue (ROW_SCALE) as the GEMVs apply it: half the bytes to write and read.
// Its own regime (another summation order): a pair's bits do not depend on the other pairs within it.
template <int H, int FF>
constexpr bool kMoeQuantExpandable = detail::kMoeRowsFits<H, FF>;
// bf16 matrices per expanded weight matrix: hi and lo (affine), or the codes.
template <class F>
constexpr int kMoeQuantExpandParts = F::kAffine ? 2 : 1;

// The expansion's scratch after the grouping's (kMoeQuantExpandFloats): the bf16 pointer table (3 E), the experts' picked
// flags (E), then, 256-byte aligned, the expanded matrices: 3 E x (hi + lo) x H x FF bf16, or 3 E x
// H x FF codes followed by 3 E x max(H, FF) float32 row scales (no larger, as H FF / 2 >= max(H, FF)).
// The 128 floats of slack cover both alignments (at most 3 + 63 floats).
template <int H, int FF, int E>
constexpr int64_t kMoeQuantExpandFloats = 2 * 3 * E + E + 128 + int64_t(3) * E * H * FF;
struct MoeQuantExpandScratch {
    const void** table;
    int32_t* picked;
    bf16_t* weights;
    float* row_scale;  // int8 / fp8 only
};
template <int H, int FF, int E>
inline MoeQuantExpandScratch moe_qexpand_scratch(float* at) {
    static_assert(int64_t(H) * FF / 2 >= (H > FF ? H : FF), "the row scales fit beside the codes");
    auto align = [](uintptr_t p, uintptr_t a) { return (p + a - 1) / a * a; };
    auto** table = reinterpret_cast<const void**>(align(reinterpret_cast<uintptr_t>(at), 16));
    auto* picked = reinterpret_cast<int32_t*>(table + 3 * E);
    auto* weights = reinterpret_cast<bf16_t*>(align(reinterpret_cast<uintptr_t>(picked + E), 256));
    auto* row_scale = reinterpret_cast<float*>(weights + size_t(3) * E * H * FF);
    return {table, picked, weights, row_scale};
}

// One block: which experts the step picked, and the expanded experts' table (matrix 3 e + j: its
// WP bf16 matrices of H x FF, hi then lo for the affine format).
template <int H, int FF, int E, int WP>
__global__ void __launch_bounds__(1024) moe_qexpand_pick_kernel(int pairs, const int32_t* __restrict__ top_id, MoeQuantExpandScratch s) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) s.picked[e] = 0;
    for (int i = threadIdx.x; i < 3 * E; i += blockDim.x) s.table[i] = s.weights + size_t(i) * WP * H * FF;
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) s.picked[top_id[i]] = 1;
}

// Matrix blockIdx.y = 3 e + j of the picked experts in bf16 (hi + lo, or the codes and the row
// scales), 8 consecutive weights of a row per thread and unit (16-byte stores).
constexpr int kMoeQuantExpandUnits = 4;  // units per thread
template <int H, int FF, class F>
__global__ void __launch_bounds__(256) moe_qexpand_kernel(const void* const* __restrict__ experts, MoeQuantExpandScratch s) {
    const int m = blockIdx.y, e = m / 3, j = m % 3;
    if (!s.picked[e]) return;
    const int k = j == 2 ? FF : H;  // the down projection reads the activation (FF)
    const QuantW w = qexpert<F>(experts, e, j);
    bf16_t* hi = s.weights + size_t(m) * kMoeQuantExpandParts<F> * H * FF;  // or the codes
    bf16_t* lo = hi + size_t(H) * FF;                                       // affine only
    constexpr int kUnits = H * FF / 8;
#pragma unroll
    for (int i = 0; i < kMoeQuantExpandUnits; ++i) {
        const int u = (blockIdx.x * kMoeQuantExpandUnits + i) * 256 + threadIdx.x;
        if (u >= kUnits) break;
        const int row = u / (k / 8), k0 = u % (k / 8) * 8;
        if constexpr (F::kAffine) {
            const uint32_t word = static_cast<const uint32_t*>(w.q)[u];
            const size_t g = size_t(row) * (k / F::kGroup) + k0 / F::kGroup;  // 8 weights never straddle a group
            const float sc = to_f32(static_cast<const typename F::Scale*>(w.scales)[g]);
            const float b = to_f32(static_cast<const typename F::Scale*>(w.biases)[g]);
            __align__(16) __nv_bfloat16 h[8], l[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const float v = fmaf(float((word >> (4 * q)) & 15u), sc, b);  // as qexpand_hi_lo_kernel
                h[q] = __float2bfloat16_rn(v);
                l[q] = __float2bfloat16_rn(v - __bfloat162float(h[q]));
            }
            reinterpret_cast<uint4*>(hi)[u] = *reinterpret_cast<const uint4*>(h);
            reinterpret_cast<uint4*>(lo)[u] = *reinterpret_cast<const uint4*>(l);
        } else {
            const uint2 bytes = static_cast<const uint2*>(w.q)[u];
            float q4[2][4];
            F::unpack(bytes.x, q4[0]);
            F::unpack(bytes.y, q4[1]);
            __align__(16) __nv_bfloat16 c[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) c[q] = __float2bfloat16_rn(q4[q / 4][q % 4]);  // exact: |q| <= 127, e4m3's 4 bits
            reinterpret_cast<uint4*>(hi)[u] = *reinterpret_cast<const uint4*>(c);
            constexpr int kStride = H > FF ? H : FF;
            if (k0 == 0) s.row_scale[size_t(m) * kStride + row] = qrow_scale<F>(w.scales, row);
        }
    }
}

}  // namespace qdetail

// The form a step of `pairs` (row, pick) pairs takes, by the average pairs per expert (the H100,
// Qwen3-30B-A3B's expert shape, us per call, docs/CUDA.md "Session 42"):
//  * per pair (the GEMVs) below kMoeQuantMmaPairsPerExpert (1): MLX int4 at 16 rows 144 us against
//    165 per pair, at 8 rows 93 against 92; int8 at 16 rows 184 against 171 with uniform routing,
//    but the random 30B-A3B's uneven routing decodes at batch 16 1.64x faster (2,471 against 1,503
//    tok/s): fewer picked experts, so fewer chunks, while the GEMVs' cost follows the pairs;
//  * the tensor-core form from there (chunks of 8 pairs, or 32 for an expert's many pairs:
//    moe_quant_mma_width):
//    64 rows 229 / 281 us (per pair 591 / 543; the bf16 experts' grouped GEMMs 425);
//  * expanded to bf16 (the bf16 build's wide GEMM) from kMoeQuantExpandPairsPerExpert, where a
//    step's fixed cost of writing the experts out pays: int8 / fp8 128 (2,048 rows: 3,048 us
//    against 3,250, the 30B-A3B's int8 prefill 11,609 tok/s against 9,781; 1,024 rows: 2,011 us
//    against 1,667), MLX int4 512 (4,096 rows: 6,257 against
//    5,997; the crossover, ~350 pairs per expert, extrapolated from the two forms' slopes, so the
//    Qwen3-30B-A3B's steps of up to 2,048 tokens never expand and allocate no expansion).
// SCR_CUDA_MOE_GEMM / moe_gemm_override() force a form; one the shape does not allow falls back to
// the per-pair GEMVs. The forced expansion is a test hook (moe_gemm_override() 4): its caller
// sizes the workspace for it (moe_quant_experts_floats counts the expansion only where the rule
// expands).
enum class MoeQuantForm { kPerPair, kGroupedGemv, kMma, kExpanded };
constexpr int kMoeQuantMmaPairsPerExpert = 1;
template <class F>
constexpr int kMoeQuantExpandPairsPerExpert = F::kAffine ? 512 : 128;
template <int H, int FF, int E, class F>
inline MoeQuantForm moe_quant_form(int pairs) {
    constexpr bool mma_fits = qdetail::kMoeQuantMmaFits<H, FF, F> && qdetail::kMoeQuantMmaFits<FF, H, F>;
    constexpr bool expandable = qdetail::kMoeQuantExpandable<H, FF>;
    switch (moe_gemm_mode()) {
        case MoeGemmMode::kPerPair: return MoeQuantForm::kPerPair;
        case MoeGemmMode::kGrouped: return MoeQuantForm::kGroupedGemv;
        case MoeGemmMode::kQuantMma: return mma_fits ? MoeQuantForm::kMma : MoeQuantForm::kPerPair;
        case MoeGemmMode::kQuantExpand: return expandable ? MoeQuantForm::kExpanded : MoeQuantForm::kPerPair;
        case MoeGemmMode::kByRows: break;
    }
    if (expandable && pairs >= kMoeQuantExpandPairsPerExpert<F> * E) return MoeQuantForm::kExpanded;
    if (mma_fits && pairs >= kMoeQuantMmaPairsPerExpert * E) return MoeQuantForm::kMma;
    return MoeQuantForm::kPerPair;
}
// The tensor-core form's token tiles per chunk (chunks of 8 TN pairs). Below kMoeWidePairsPerExpert
// (16) pairs per expert on average: 1 for every expert. From there a width per expert: 4 (each
// weight tile read once per 32 pairs) for the experts holding kMoeQmmaWideFrom<F> pairs or more
// (MLX int4 32: its 4-tile SwiGLU kernel takes 255 registers, one block per SM, and pays only on
// long runs; int8 / fp8 16, 128 registers), 1 for the rest: two launches per matrix, the wide
// experts' chain on the step's stream and the others' on the side stream (fork_join), so the two
// overlap. Measured (H100, Qwen3-30B-A3B's expert shape, us per call, 1-tile / 4-tile / per expert
// on one stream / on two; docs/CUDA.md "Session 45"): MLX int4 at 256 rows 542 / 648 / 547 / 542
// with uniform routing, 534 / 752 / 520 / 502 with hot experts (half of each row's picks among 8);
// int8 at 256 rows 617 / 495 / 529 / 472 uniform, 619 / 611 / 589 / 524 hot, at 512 rows hot 1,129
// / 871 / 896 / 765, and within 0.8 % of 4-tile at 512-2,048 rows uniform. fp8 takes int8's rule
// (the same kernel but for the code's unpacking; not timed at this shape). End to end on the random
// 30B-A3B at batch 256 (tok/s, one call each): MLX int4 6,734 on two streams against 6,642 on one;
// int8 7,732 against 7,428 for 4-tile chunks (the rule before) and 7,346 per expert on one stream.
// SCR_CUDA_MOE_QMMA_TN=1|2|4|expert|expert2 forces one for every step (A/B runs; expert2: 2-tile
// chunks for the experts below kMoeQmmaWideFrom; a pair's bits do not depend on its chunk's width,
// nor on the streams).
template <class F>
constexpr int kMoeQmmaWideFrom = F::kAffine ? 32 : 16;
inline MoeQmmaWidth moe_quant_mma_width_forced() {
    static const MoeQmmaWidth v = env_choice_switch(
        "SCR_CUDA_MOE_QMMA_TN", MoeQmmaWidth::kRule,
        {{"1", MoeQmmaWidth::kOne}, {"2", MoeQmmaWidth::kTwo}, {"4", MoeQmmaWidth::kFour}, {"expert", MoeQmmaWidth::kPerExpert},
         {"expert2", MoeQmmaWidth::kPerExpertTwo}},
        "the rule");
    return v;
}
template <int E, class F>
inline MoeQmmaWidth moe_quant_mma_width(int pairs) {
    if (moe_quant_mma_width_override() != MoeQmmaWidth::kRule) return moe_quant_mma_width_override();
    if (const MoeQmmaWidth forced = moe_quant_mma_width_forced(); forced != MoeQmmaWidth::kRule) return forced;
    if (pairs < kMoeWidePairsPerExpert * E) return MoeQmmaWidth::kOne;
    return MoeQmmaWidth::kPerExpert;
}
// The expansion's floats when steps of up to `rows` rows may expand by the rule (else 0).
template <int H, int FF, int E, int TOPK, class F>
constexpr int64_t moe_quant_expand_floats(int64_t rows) {
    const bool may_expand = qdetail::kMoeQuantExpandable<H, FF> && rows * TOPK >= kMoeQuantExpandPairsPerExpert<F> * E;
    return may_expand ? qdetail::kMoeQuantExpandFloats<H, FF, E> : 0;
}
// The quantized experts' workspace (floats): moe_experts_floats plus the expansion's.
template <int H, int FF, int E, int TOPK, class F>
constexpr int64_t moe_quant_experts_floats(int64_t rows) {
    return moe_experts_floats<H, FF, E, TOPK>(rows) + moe_quant_expand_floats<H, FF, E, TOPK, F>(rows);
}
// moe_workspace_floats for quantized experts (the CUDA emitter sizes the model's MoE workspace by it).
template <int H, int FF, int E, int TOPK, class F>
constexpr int64_t moe_quant_workspace_floats(int64_t rows) {
    return moe_workspace_floats<H, FF, E, TOPK>(rows) + moe_quant_expand_floats<H, FF, E, TOPK, F>(rows);
}

// The experts of every (row, pick) pair and their weighted sum per row (+ residual), given the
// routing; ws: moe_quant_experts_floats (activations, expert outputs, grouping, expansion).
template <int H, int FF, int E, int TOPK, class F>
void moe_quant_experts(const Ctx& c, int rows, const float* x, const void* const* experts, const int32_t* top_id, const float* top_w,
                       const float* residual, float* out, float* ws) {
    // 16-byte aligned rows for the vector loads of act (FF is a multiple of 16 elements here)
    float* act = ws + (4 - (reinterpret_cast<uintptr_t>(ws) / 4) % 4) % 4;
    float* y = act + size_t(rows) * TOPK * FF;
    const int pairs = rows * TOPK;
    float* group = y + size_t(pairs) * H;
    const MoeQuantForm form = moe_quant_form<H, FF, E, F>(pairs);
    if (form == MoeQuantForm::kExpanded) {
        if constexpr (qdetail::kMoeQuantExpandable<H, FF>) {
            constexpr int WP = qdetail::kMoeQuantExpandParts<F>;
            const qdetail::MoeQuantExpandScratch xs = qdetail::moe_qexpand_scratch<H, FF, E>(group + moe_group_floats<E>(pairs));
            qdetail::moe_qexpand_pick_kernel<H, FF, E, WP><<<1, 1024, 0, c.stream>>>(pairs, top_id, xs);
            constexpr int kBlocks = ceil_div(H * FF / 8, 256 * qdetail::kMoeQuantExpandUnits);
            qdetail::moe_qexpand_kernel<H, FF, F><<<dim3(kBlocks, 3 * E), 256, 0, c.stream>>>(experts, xs);
            moe_experts_wide_rows<H, FF, E, TOPK, WP, !F::kAffine>(c, pairs, x, xs.table, top_id, act, y, group, xs.row_scale);
        }
    } else if (form == MoeQuantForm::kMma) {
        if constexpr (qdetail::kMoeQuantMmaFits<H, FF, F> && qdetail::kMoeQuantMmaFits<FF, H, F>) {
            // gate / up + SwiGLU, then down, over one chunk table's pairs in TN-tile chunks
            auto chain = [&]<int TN>(const Ctx& on, const int32_t* order, const MoeChunk* chunks, const int32_t* n_chunks, int max_chunks) {
                qdetail::launch_moe_quant_mma<H, FF, TN, true, TOPK, 0, F>(on, max_chunks, x, experts, order, chunks, n_chunks, act);
                qdetail::launch_moe_quant_mma<FF, H, TN, false, 1, 2, F>(on, max_chunks, act, experts, order, chunks, n_chunks, y);
            };
            auto run = [&]<int TN>() {
                const MoeGrouping g = launch_moe_group<E, detail::moe_chunk_pairs(TN)>(c, pairs, top_id, group);
                chain.template operator()<TN>(c, g.order, g.chunks, g.n_chunks, g.max_chunks);
            };
            // Two chains: the wide experts' pairs in 4-tile chunks on the step's stream, the others'
            // in TN-tile chunks on the side stream (fork_join). A pair's down reads only its own act
            // row, so the chains share nothing but the grouping and may overlap.
            auto per_expert = [&]<int TN>() {
                constexpr int kNarrow = detail::moe_chunk_pairs(TN), kWide = detail::moe_chunk_pairs(4);
                const MoeSplitGrouping g = launch_moe_group_split<E, kNarrow, kWide>(c, pairs, top_id, group, kMoeQmmaWideFrom<F>);
                fork_join(
                    c, [&](const Ctx& on) { chain.template operator()<4>(on, g.order, g.wide, g.n_chunks + 1, g.max_wide); },
                    [&](const Ctx& on) { chain.template operator()<TN>(on, g.order, g.chunks, g.n_chunks, g.max_chunks); });
            };
            switch (moe_quant_mma_width<E, F>(pairs)) {
                case MoeQmmaWidth::kTwo: run.template operator()<2>(); break;
                case MoeQmmaWidth::kFour: run.template operator()<4>(); break;
                case MoeQmmaWidth::kPerExpert: per_expert.template operator()<1>(); break;
                case MoeQmmaWidth::kPerExpertTwo: per_expert.template operator()<2>(); break;
                default: run.template operator()<1>();
            }
        }
    } else if (form == MoeQuantForm::kGroupedGemv) {
        // Forced only (SCR_CUDA_MOE_GEMM=1, moe_gemm_override() = 1): on the H100 the grouped GEMVs
        // were slower than the per-pair ones at every batch measured (1-2,048 rows at Qwen3-30B-A3B's
        // shape, int8 and MLX int4 g64: docs/CUDA.md "Session 39"); they stay for the A/B and the
        // bit-for-bit check (per-pair blocks in expert order, tried in session 40, were no faster).
        // The two forms give the same bits.
        constexpr int CR = qdetail::kMoeQuantChunk;
        const MoeGrouping g = launch_moe_group<E, CR>(c, pairs, top_id, group);
        const qdetail::MoeQuantPairs src{top_id, g.order, g.chunks, g.n_chunks};
        qdetail::moe_quant_up_kernel<H, FF, TOPK, F, CR><<<dim3(g.max_chunks, ceil_div(FF, 8)), 256, 0, c.stream>>>(x, experts, src, act);
        qdetail::moe_quant_down_kernel<H, FF, F, CR><<<dim3(g.max_chunks, ceil_div(H, 8)), 256, 0, c.stream>>>(act, experts, src, y);
    } else {
        const qdetail::MoeQuantPairs src{top_id, nullptr, nullptr, nullptr};
        constexpr int kUpRows = qdetail::kMoeQuantUpRowsPerBlock<H, F>, kDownRows = qdetail::kMoeQuantDownRowsPerBlock<FF, F>;
        qdetail::moe_quant_up_kernel<H, FF, TOPK, F, 1><<<dim3(pairs, ceil_div(FF, kUpRows)), 256, 0, c.stream>>>(x, experts, src, act);
        qdetail::moe_quant_down_kernel<H, FF, F, 1><<<dim3(pairs, ceil_div(H, kDownRows)), 256, 0, c.stream>>>(act, experts, src, y);
    }
    detail::moe_combine_kernel<H, TOPK><<<dim3(ceil_div(H, 128), rows), 128, 0, c.stream>>>(rows, top_id, top_w, y, residual, out);
}

// moe() with quantized experts in format F (the CUDA emitter's call for a quantized preset).
template <int H, int FF, int E, int TOPK, bool NORMALIZE, class F, typename RT>
void moe_quant(const Ctx& c, int rows, const float* x, const RT* router, const void* const* experts, const float* residual,
               float* out, float* ws) {
    if (rows <= 0) return;
    const MoeRouted r = moe_route<H, E, TOPK, NORMALIZE>(c, rows, x, router, ws);
    moe_quant_experts<H, FF, E, TOPK, F>(c, rows, x, experts, r.top_id, r.top_w, residual, out, r.rest);
}

}  // namespace scr::kernels::cuda
