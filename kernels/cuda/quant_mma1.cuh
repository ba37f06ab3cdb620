// One token row of an MLX int4 linear on tensor cores: quant_mma1_kernel (issue #9).
//
// Why a kernel of its own: at one token row the SIMT kernels are issue-bound, not memory-bound
// (docs/CUDA.md, "Where the one-row shared-memory kernel's time goes": 4.3 thread instructions per
// int4 weight, ~40 % of the packed-byte floor, while streaming at the floor leaves ~7 weights per
// warp instruction). quant_mma_kernel spends its instructions on x at one row (every lane loads,
// splits and sums the activations of its token column, 7 of 8 columns empty) and on per-group
// shuffles. Here:
//  * weights as the MMA's A operand exactly as quant_mma_kernel loads them (16-byte streaming loads,
//    the same lane transpose, so word w of every lane lies in one group), nibble pairs as bf16x2
//    128 + q by one LOP3 (no subtraction: the 128 is taken out per group below);
//  * x (float32) is split once per warp into bf16 hi + lo B fragments in shared memory, with the
//    group sums X_g = sum of (hi + lo) over the group (the same values the MMAs see);
//  * the MMA's 8 columns carry 8 consecutive groups instead of 8 token rows: the lanes of column
//    j supply x only for the k of group j (the others read 32 zero bytes), so C[row][j] is group j's
//    sum of (128 + q) * x and the scales are applied once per 8 groups, on every lane, no shuffles:
//        y += s_g * (C_g - 128 X_g) + b_g X_g        (C_g - 128 X_g in one fmaf: one rounding)
//    A per-warp cost of ~25 warp instructions per 512 weights plus 4 MMAs, against ~100 before.
//  * warps split K, then blocks of a cluster (qmma_split, as quant_mma_kernel), partial sums meet
//    in a fixed order: a row's bits depend on the shape only (batch 1 has one kernel).
// Error: x enters as hi + lo (~2^-17 relative), q exactly; the bound quant_gemv_test checks is the
// tensor-core kernel's (2e-5 B + 1e-6, B = sum |x| (|s q| + |b|)).
#pragma once
// Included by quant_linear.cuh (after its qdetail helpers, before quant_linear()), not on its own.

namespace scr::kernels::cuda::qdetail {

constexpr int kMma1MaxWarps = 8;

// Per-format constants of the one-row kernel.
template <class F>
struct QMma1Shape {
    static constexpr int GPC = 128 / F::kGroup;  // groups per 128-k chunk
    static constexpr int SPC = 8 / GPC;          // chunks per span of 8 groups (the MMA's 8 columns)
    static constexpr int LPG = 4 * F::kWordsPerGroup;  // staging lanes per group (word-major, 4 per word)
    static constexpr int kChunkBytes = 512;      // staged x per chunk: 16 (word, lane) x (hi[4], lo[4])
};

// Dynamic shared memory of one block: per warp 32 zero bytes + its staged x, then every warp's group
// sums, then the cross-warp partials (MT * 16 rows + the norm's sum of squares).
template <class F>
__host__ __device__ constexpr size_t qmma1_warp_bytes(int chunks_per_warp) {
    return 32 + size_t(chunks_per_warp) * QMma1Shape<F>::kChunkBytes;
}
template <class F, bool SWIGLU>
__host__ __device__ constexpr size_t qmma1_smem(int warps, int chunks_per_warp) {
    constexpr int MT = SWIGLU ? 2 : 1;
    return size_t(warps) * (qmma1_warp_bytes<F>(chunks_per_warp) + size_t(chunks_per_warp) * QMma1Shape<F>::GPC * 4) +
           size_t(warps) * (MT * 16 + 1) * 4;
}

template <class F, bool SWIGLU, bool NORM>
__global__ void __launch_bounds__(kMma1MaxWarps * kWarp, 2) quant_mma1_kernel(const __grid_constant__ QuantFusedArgs p) {
    static_assert(F::kAffine, "the one-row tensor-core kernel is for the MLX int4 formats");
    using S = QMma1Shape<F>;
    using ST = typename F::Scale;
    constexpr int MT = SWIGLU ? 2 : 1;  // SwiGLU: tile 0 the gate's rows, tile 1 the up rows
    constexpr int GPC = S::GPC, SPC = S::SPC, WPG = F::kWordsPerGroup, SWAP = F::kSwap;
    constexpr int U = SWIGLU ? 1 : 2;  // chunks per load round, two rounds in flight (SwiGLU: two tiles per chunk)
    extern __shared__ __align__(16) uint8_t qmma1_smem_raw[];

    int n_total = p.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < p.nmat; ++m) n_total += p.mat[m].n;
    const int nw = blockDim.x / kWarp;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    const int CH = p.k / 128 / (nw * int(gridDim.z));  // chunks per warp
    const int c_first = (int(blockIdx.z) * nw + warp) * CH;
    const int row0 = blockIdx.y * 16;
    const size_t row_bytes = size_t(p.k) / 2;
    const int groups_per_row = p.k / F::kGroup;

    uint8_t* wbase = qmma1_smem_raw + size_t(warp) * qmma1_warp_bytes<F>(CH);
    const uint4* zero = reinterpret_cast<const uint4*>(wbase);
    uint4* xs = reinterpret_cast<uint4*>(wbase + 32);  // [chunk][word * 4 + lane t][hi, lo]
    float* xg = reinterpret_cast<float*>(qmma1_smem_raw + size_t(nw) * qmma1_warp_bytes<F>(CH)) + size_t(warp) * CH * GPC;
    float* red = reinterpret_cast<float*>(qmma1_smem_raw + size_t(nw) * (qmma1_warp_bytes<F>(CH) + size_t(CH) * GPC * 4));
    constexpr int kRed = MT * 16 + 1;

    const uint8_t* wrow[MT][2];
    const uint16_t* srow[MT][2];
    const uint16_t* brow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int n = min(row0 + g + 8 * h, n_total - 1);  // rows past the last read the last row, never written
            const QuantMat& mat = p.mat[SWIGLU ? m : qmat_of(p, n)];
            wrow[m][h] = static_cast<const uint8_t*>(mat.q) + size_t(n) * row_bytes + size_t(c_first) * 64 + 16 * t;
            const size_t at = size_t(n) * groups_per_row + size_t(c_first) * GPC;
            srow[m][h] = static_cast<const uint16_t*>(mat.scales) + at;
            brow[m][h] = static_cast<const uint16_t*>(mat.biases) + at;
        }

    struct Round {
        uint4 w[U][MT][2];
    };
    auto load_round = [&](Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u >= CH) break;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) r.w[u][m][h] = load_stream16(wrow[m][h] + size_t(c0 + u) * 64);
        }
    };
    // A span's scales and biases for this lane: rows g, g + 8 of each tile, the span's groups 2t, 2t + 1.
    // Packed in pairs: group 2t in the low half, 2t + 1 in the high half (16-bit loads: a row's
    // groups need not start 4-byte aligned).
    struct Params {
        uint32_t s[MT][2], b[MT][2];
    };
    auto load_params = [&](Params& q, int span) {
        const int gl = span * 8 + 2 * t;  // the warp's group
        const bool in0 = gl < CH * GPC, in1 = gl + 1 < CH * GPC;
        const auto ld = [](const uint16_t* at, bool in) { return in ? uint32_t(__ldg(reinterpret_cast<const unsigned short*>(at))) : 0u; };
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                q.s[m][h] = ld(srow[m][h] + gl, in0) | ld(srow[m][h] + gl + 1, in1) << 16;
                q.b[m][h] = ld(brow[m][h] + gl, in0) | ld(brow[m][h] + gl + 1, in1) << 16;
            }
    };

    Round ra, rb;
    load_round(ra, 0);
    Params pc, pn;
    load_params(pc, 0);
    load_params(pn, 1);
    pdl_wait();  // weights and scales never depend on an earlier kernel; x does

    // Stage x: lanes 0-15 one chunk, 16-31 the next; lane e = 4 * word + t of its chunk holds the 8
    // k of that word after the transpose (qmma_word_k), as the B fragments of both k-steps.
    if (lane < 8) reinterpret_cast<float*>(wbase)[lane] = 0.0f;
    float ss = 0.0f;  // folded RMSNorm: this lane's sum of x^2
#pragma unroll 4
    for (int it = 0; it < (CH + 1) / 2; ++it) {
        const int cl = 2 * it + lane / 16, e = lane % 16;
        float part = 0.0f;
        if (cl < CH) {
            const int k = (c_first + cl) * 128 + qmma_word_k<SWAP>(e % 4, e / 4);
            const float4 x0 = __ldg(reinterpret_cast<const float4*>(p.x + k));
            const float4 x1 = __ldg(reinterpret_cast<const float4*>(p.x + k + 4));
            float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
            if constexpr (NORM) {
                const float4 n0 = __ldg(reinterpret_cast<const float4*>(p.norm_w + k));
                const float4 n1 = __ldg(reinterpret_cast<const float4*>(p.norm_w + k + 4));
                const float nv[8] = {n0.x, n0.y, n0.z, n0.w, n1.x, n1.y, n1.z, n1.w};
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    ss = fmaf(xv[i], xv[i], ss);
                    xv[i] *= nv[i];
                }
            }
            uint32_t hi[4], lo[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                qsplit_bf16x2(xv[q], xv[q + 4], hi[q], lo[q]);
                part += f32_from_bits(hi[q] << 16) + f32_from_bits(lo[q] << 16);
                part += f32_from_bits(hi[q] & 0xffff0000u) + f32_from_bits(lo[q] & 0xffff0000u);
            }
            xs[(cl * 16 + e) * 2] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            xs[(cl * 16 + e) * 2 + 1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
#pragma unroll
        for (int o = 1; o < S::LPG; o *= 2) part += __shfl_xor_sync(0xffffffffu, part, o);
        if (cl < CH && e % S::LPG == 0) xg[cl * GPC + e / S::LPG] = part;
    }
    __syncwarp();

    float acc[MT][2];  // rows g, g + 8 of each tile, this lane's columns (groups 2t, 2t + 1) of every span
    // The span's C fragments: four independent accumulators (x hi / lo, first / second k-step of a
    // word), so consecutive MMAs do not wait for each other (one chain of 32 dependent MMAs per chunk
    // became four of 8); added in a fixed order at the flush.
    float cg[4][MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        acc[m][0] = acc[m][1] = 0.0f;
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int e = 0; e < 4; ++e) cg[a][m][e] = 0.0f;
    }
    auto flush = [&](int span) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int gl = span * 8 + 2 * t + j;
            const float X = gl < CH * GPC ? xg[gl] : 0.0f;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    ST sv, bv;
                    sv.bits = uint16_t(pc.s[m][h] >> (16 * j));
                    bv.bits = uint16_t(pc.b[m][h] >> (16 * j));
                    const float s = to_f32(sv), b = to_f32(bv);
                    const int e = 2 * h + j;
                    const float c = (cg[0][m][e] + cg[1][m][e]) + (cg[2][m][e] + cg[3][m][e]);
                    acc[m][h] = fmaf(s, fmaf(-128.0f, X, c), fmaf(b, X, acc[m][h]));
                }
        }
#pragma unroll
        for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int e = 0; e < 4; ++e) cg[a][m][e] = 0.0f;
        pc = pn;
        load_params(pn, span + 2);
    };
    auto mma_round = [&](const Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u;
            if (c >= CH) break;
            uint32_t wq[MT][2][4];
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    wq[m][h][0] = r.w[u][m][h].x;
                    wq[m][h][1] = r.w[u][m][h].y;
                    wq[m][h][2] = r.w[u][m][h].z;
                    wq[m][h][3] = r.w[u][m][h].w;
                    qxpose<SWAP>(wq[m][h], t);
                }
            const int col0 = (c % SPC) * GPC;
#pragma unroll
            for (int wd = 0; wd < 4; ++wd) {
                const uint4* xp = g == col0 + wd / WPG ? xs + (c * 16 + wd * 4 + t) * 2 : zero;  // zero: 32 bytes
                const uint4 bh = xp[0], bl = xp[1];
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    uint32_t a0[4], a8[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {  // bf16 128 + q in each half: exact
                        a0[q] = ((wq[m][0][wd] >> (4 * q)) & 0x000f000fu) | 0x43004300u;
                        a8[q] = ((wq[m][1][wd] >> (4 * q)) & 0x000f000fu) | 0x43004300u;
                    }
                    qmma_bf16_16816(cg[0][m], a0[0], a8[0], a0[1], a8[1], bh.x, bh.y);
                    qmma_bf16_16816(cg[1][m], a0[2], a8[2], a0[3], a8[3], bh.z, bh.w);
                    qmma_bf16_16816(cg[2][m], a0[0], a8[0], a0[1], a8[1], bl.x, bl.y);
                    qmma_bf16_16816(cg[3][m], a0[2], a8[2], a0[3], a8[3], bl.z, bl.w);
                }
            }
            if (c % SPC == SPC - 1 || c == CH - 1) flush(c / SPC);
        }
    };
#pragma unroll 1
    for (int c0 = 0; c0 < CH; c0 += 2 * U) {
        if (c0 + U < CH) load_round(rb, c0 + U);
        mma_round(ra, c0);
        if (c0 + U >= CH) break;
        if (c0 + 2 * U < CH) load_round(ra, c0 + 2 * U);
        mma_round(rb, c0 + U);
    }
    pdl_trigger();

    // Rows g, g + 8 over the 4 lanes t (their groups), then the warps in order, then the cluster's
    // blocks in rank order: fixed for a shape.
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            acc[m][h] += __shfl_xor_sync(0xffffffffu, acc[m][h], 1);
            acc[m][h] += __shfl_xor_sync(0xffffffffu, acc[m][h], 2);
        }
    if constexpr (NORM) {
#pragma unroll
        for (int o = 16; o >= 1; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    }
    // red: [warp][MT * 16 rows + the sum of squares].
    if (t == 0) {
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            red[warp * kRed + m * 16 + g] = acc[m][0];
            red[warp * kRed + m * 16 + g + 8] = acc[m][1];
        }
    }
    if (lane == 0) red[warp * kRed + MT * 16] = NORM ? ss : 0.0f;
    __syncthreads();
    float v = 0.0f, sq = 0.0f;  // warp 0: lane i < MT * 16 row slot i, every lane the sum of squares
    if (warp == 0) {
        for (int w = 0; w < nw; ++w) {
            if (lane < MT * 16) v += red[w * kRed + lane];
            if constexpr (NORM) sq += red[w * kRed + MT * 16];
        }
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (gridDim.z > 1) {
        namespace cg_ns = cooperative_groups;
        cg_ns::cluster_group cluster = cg_ns::this_cluster();
        __syncthreads();  // every read of red[] is done before slot 0 is overwritten
        if (warp == 0) {
            if (lane < MT * 16) red[lane] = v;
            if (lane == 0) red[MT * 16] = sq;
        }
        cluster.sync();
        const unsigned rank = cluster.block_rank();
        if (rank == 0 && warp == 0)
            for (unsigned r = 1; r < cluster.num_blocks(); ++r) {
                const float* remote = cluster.map_shared_rank(red, r);
                if (lane < MT * 16) v += remote[lane];
                if constexpr (NORM) sq += remote[MT * 16];
            }
        cluster.sync();  // the other blocks' shared memory stays alive until block 0 has read it
        if (rank != 0) return;
    }
#endif
    if (warp != 0) return;
    float inv = 1.0f;
    if constexpr (NORM) inv = 1.0f / sqrtf(sq / float(p.k) + p.eps);
    if constexpr (SWIGLU) {
        const float up = __shfl_down_sync(0xffffffffu, v, 16);
        const int row = row0 + lane;
        if (lane < 16 && row < n_total) {
            float gate = v, u = up;
            if constexpr (NORM) {
                gate *= inv;
                u *= inv;
            }
            p.mat[0].y[row] = silu(gate) * u;  // as silu_mul_kernel
        }
    } else {
        int row = row0 + lane;
        if (lane < 16 && row < n_total) {
            const QuantMat& mat = p.mat[qmat_of(p, row)];
            if constexpr (NORM) v *= inv;
            if (mat.bias) v += mat.bias[row];
            if (p.residual) v = p.residual[row] + v;
            mat.y[row] = v;
        }
    }
}

// What the one-row kernel takes: an MLX int4 format with 2-byte scales, one token row, K in whole
// 128-k chunks, 16-byte aligned weights, x and norm weight.
template <class F>
bool quant_mma1_fits(const QuantFusedArgs& a) {
    if constexpr (!F::kAffine) {
        return false;
    } else {
        const auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
        if (a.rows != 1 || a.k % 128 != 0 || sizeof(typename F::Scale) != 2 || !aligned(a.x, 16) ||
            (a.norm_w && !aligned(a.norm_w, 16)))
            return false;
        for (int m = 0; m < a.nmat; ++m)
            if (!aligned(a.mat[m].q, 16) || !aligned(a.mat[m].scales, 2) || !aligned(a.mat[m].biases, 2)) return false;
        return true;
    }
}

// Warps of quant_mma1_kernel resident on the GPU in blocks of 8 warps (registers decide; shared
// memory is checked per launch).
template <class F, bool SWIGLU, bool NORM>
int qmma1_resident_warps() {
    static const int warps = [] {
        int dev = 0, sms = 0, blocks = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_mma1_kernel<F, SWIGLU, NORM>, kMma1MaxWarps * kWarp, 0);
        return std::max(1, sms * blocks * kMma1MaxWarps);
    }();
    return warps;
}

// The split of the last one-row tensor-core launch on this thread (the test prints it).
inline QMmaSplit& qmma1_last_split() {
    static thread_local QMmaSplit s;
    return s;
}

// Launches the one-row kernel; false (nothing launched) when its shared memory would not fit.
template <class F, bool SWIGLU, bool NORM>
bool launch_quant_mma1(const Ctx& c, const QuantFusedArgs& a) {
    int n_total = a.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < a.nmat; ++m) n_total += a.mat[m].n;
    const int row_tiles = ceil_div(n_total, 16);
    const int chunks = a.k / 128;
    const QMmaSplit s = qmma_split(row_tiles, chunks, 1, qmma1_resident_warps<F, SWIGLU, NORM>());
    const int per_warp = chunks / (s.warps * s.blocks);
    const size_t smem = qmma1_smem<F, SWIGLU>(s.warps, per_warp);
    static const int smem_max = [] {
        int dev = 0, v = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        cudaFuncSetAttribute(quant_mma1_kernel<F, SWIGLU, NORM>, cudaFuncAttributeMaxDynamicSharedMemorySize, v);
        return v;
    }();
    if (smem > size_t(smem_max)) return false;
    qmma1_last_split() = s;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(1, row_tiles, s.blocks);
    cfg.blockDim = dim3(s.warps * kWarp);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c.stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = c.pdl ? 1 : 0;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = 1;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = s.blocks;
    cfg.attrs = attr;
    cfg.numAttrs = s.blocks > 1 ? 2 : 1;
    cudaLaunchKernelEx(&cfg, quant_mma1_kernel<F, SWIGLU, NORM>, a);
    return true;
}

}  // namespace scr::kernels::cuda::qdetail
