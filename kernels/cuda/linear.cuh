// y[t][n] = sum_k x[t][k] * W[n][k] (+ bias[n]) (+ residual[t][n]), W in the checkpoint's [out, in]
// layout (f32 / bf16 / f16), x and y float32, accumulation in float32.
//
// Two paths, chosen per launch by the number of rows:
//  * up to 64 rows (decode): a GEMV that streams every weight row once with 16-byte loads, one warp
//    (or KSPLIT warps, when N is too small to fill the GPU) per weight row, up to 8 rows of x at
//    once (more rows: groups of 8 in adjacent blocks, whose repeated weight reads hit L2). A row's
//    arithmetic never depends on the other rows, so decode batches up to 64 are batch-invariant. It can fold a preceding RMSNorm (x is normalized on the fly: y = inv_rms * (x*w_norm)W^T,
//    the sum of squares accumulated in the same pass), a grouped launch of up to three matrices
//    that read the same x (Q, K, V), and SwiGLU (silu(x Wg^T) * (x Wu^T)).
//  * more rows (prefill, large batches): a tiled tensor-core GEMM for bf16 weights. x is split into
//    two bf16 parts (hi + lo, exact to ~2^-17 relative) so the products keep float32-level accuracy
//    on bf16 matrix units; other weight types take a plain float32 tiled GEMM.
#pragma once

#include <mma.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"

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
};

// Warps per weight row: enough (row, split) pairs to fill the GPU, at least one 16-byte chunk per lane.
constexpr int gemv_ksplit(int n, int k, int vec) {
    int ks = 1;
    while (ks < 8 && n * ks < 2048 && (k / vec) / (ks * 2) >= kWarp) ks *= 2;
    return ks;
}

template <int K, typename WT, int TR, int KSPLIT, bool SWIGLU, bool NORM>
__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_kernel(const __grid_constant__ LinearParams p) {
    using V = Vec16<WT>;
    constexpr int kVec = V::n;
    static_assert(K % kVec == 0, "K must be a whole number of 16-byte chunks");
    constexpr int kChunks = K / kVec;
    constexpr int kPerSplit = (kChunks + KSPLIT - 1) / KSPLIT;
    constexpr int kRowsPerCta = kGemvWarps / KSPLIT;
    constexpr int kBatch = 4;  // 16-byte weight loads per lane in flight
    constexpr int kVals = SWIGLU ? 2 : 1;
    __shared__ float partial[KSPLIT > 1 ? kGemvWarps : 1][kVals + NORM][TR];

    // More than TR token rows: groups of TR rows, the group index fastest across blocks, so the
    // blocks reading the same weight rows run together and all but the first read hit L2.
    const int groups = (p.rows + TR - 1) / TR;
    const int group = blockIdx.x % groups, row0 = group * TR;
    const int rows = min(TR, p.rows - row0);
    const float* x = p.x + size_t(row0) * K;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int split = warp % KSPLIT;
    const int n = (blockIdx.x / groups) * kRowsPerCta + warp / KSPLIT;
    const bool active = n < p.n_total;
    int s = 0, nl = n;
    while (s + 1 < p.nseg && nl >= p.seg[s].n) nl -= p.seg[s++].n;
    const LinearOut& o = p.seg[s];

    float acc[kVals][TR], ss[TR];
#pragma unroll
    for (int t = 0; t < TR; ++t) {
        ss[t] = 0.0f;
#pragma unroll
        for (int j = 0; j < kVals; ++j) acc[j][t] = 0.0f;
    }
    if (active) {
        const WT* wr = static_cast<const WT*>(o.w) + size_t(nl) * K;
        const WT* ur = SWIGLU ? static_cast<const WT*>(o.w_up) + size_t(nl) * K : nullptr;
        const int c_begin = split * kPerSplit;
        const int c_end = min(kChunks, c_begin + kPerSplit);
        for (int c0 = c_begin; c0 < c_end; c0 += kWarp * kBatch) {
            uint4 wv[kBatch], uv[kBatch];
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                const int c = c0 + b * kWarp + lane;
                if (c < c_end) {
                    wv[b] = load_stream16(wr + size_t(c) * kVec);
                    if constexpr (SWIGLU) uv[b] = load_stream16(ur + size_t(c) * kVec);
                }
            }
#pragma unroll
            for (int b = 0; b < kBatch; ++b) {
                const int c = c0 + b * kWarp + lane;
                if (c >= c_end) continue;
                float wf[kVec], uf[kVec], nw[kVec];
                V::unpack(wv[b], wf);
                if constexpr (SWIGLU) V::unpack(uv[b], uf);
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
#pragma unroll
                    for (int i = 0; i < kVec; ++i) {
                        float xv = xf[i];
                        if constexpr (NORM) {
                            ss[t] += xv * xv;
                            xv *= nw[i];
                        }
                        acc[0][t] += xv * wf[i];
                        if constexpr (SWIGLU) acc[1][t] += xv * uf[i];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < TR; ++t) {
        ss[t] = warp_sum(ss[t]);
#pragma unroll
        for (int j = 0; j < kVals; ++j) acc[j][t] = warp_sum(acc[j][t]);
    }
    if constexpr (KSPLIT > 1) {
        if (lane == 0) {
#pragma unroll
            for (int t = 0; t < TR; ++t) {
#pragma unroll
                for (int j = 0; j < kVals; ++j) partial[warp][j][t] = acc[j][t];
                if constexpr (NORM) partial[warp][kVals][t] = ss[t];
            }
        }
        __syncthreads();
        if (split != 0) return;
#pragma unroll
        for (int t = 0; t < TR; ++t) {
#pragma unroll
            for (int j = 0; j < kVals; ++j) {
                float v = 0.0f;
                for (int k = 0; k < KSPLIT; ++k) v += partial[warp + k][j][t];
                acc[j][t] = v;
            }
            if constexpr (NORM) {
                float v = 0.0f;
                for (int k = 0; k < KSPLIT; ++k) v += partial[warp + k][kVals][t];
                ss[t] = v;
            }
        }
    }
    if (!active || lane != 0) return;
#pragma unroll
    for (int t = 0; t < TR; ++t) {
        if (t >= rows) break;
        float v = acc[0][t];
        float u = SWIGLU ? acc[kVals - 1][t] : 0.0f;
        if constexpr (NORM) {
            const float inv = 1.0f / sqrtf(ss[t] / float(K) + p.eps);
            v *= inv;
            u *= inv;
        }
        const size_t at = size_t(row0 + t) * o.n + nl;
        if constexpr (SWIGLU) {
            v = silu(v) * u;
        } else {
            if (o.bias) v += o.bias[nl];
            if (o.residual) v = o.residual[at] + v;
        }
        o.y[at] = v;
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

template <int K, typename WT, int NTOTAL, bool SWIGLU, bool NORM, int TR>
void launch_gemv(const Ctx& c, const LinearParams& p) {
    constexpr int ks = gemv_ksplit(NTOTAL, K, Vec16<WT>::n);
    constexpr int rows_per_cta = kGemvWarps / ks;
    const int groups = ceil_div(p.rows, TR);
    gemv_kernel<K, WT, TR, ks, SWIGLU, NORM><<<ceil_div(NTOTAL, rows_per_cta) * groups, kGemvWarps * kWarp, 0, c.stream>>>(p);
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
    if (rows <= kGemvMaxRows) {
        p.x = NORM ? norm.x : x;
        p.norm_w = norm.w;
        p.eps = norm.eps;
        launch_gemv_rows<K, WT, NTOTAL, SWIGLU, NORM>(c, p);
        return;
    }
    if constexpr (NORM) rmsnorm<K>(c, rows, norm.x, norm.w, norm.eps, const_cast<float*>(x));
    p.x = x;
    p.norm_w = nullptr;
    if constexpr (std::is_same_v<WT, bf16_t> && K % 16 == 0) {
        const int row_tiles = ceil_div(rows, 64);
        if (ceil_div(NMAX, 64) * row_tiles * p.nseg >= 132)
            gemm_bf16_kernel<K, 64, SWIGLU><<<dim3(ceil_div(NMAX, 64), row_tiles, p.nseg), 128, 0, c.stream>>>(p);
        else
            gemm_bf16_kernel<K, 32, SWIGLU><<<dim3(ceil_div(NMAX, 32), row_tiles, p.nseg), 128, 0, c.stream>>>(p);
    } else {
        gemm_simt_kernel<K, WT, SWIGLU><<<dim3(ceil_div(NMAX, 16), ceil_div(rows, 16), p.nseg), dim3(16, 16), 0, c.stream>>>(p);
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
