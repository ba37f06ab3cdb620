// Decode GEMV over quantized weights, dequantized in registers (never written out as floats):
//   y[t][n] = sum_k x[t][k] * w[n][k] (+ bias[n]) (+ residual[t][n]),  x, y float32, f32 accumulation.
//
// Weight layouts, exactly as the checkpoints store them (models/quant/*.json):
//   MlxInt4<G, ST>:    q uint32 [N][K/8], element 0 in the low nibble; scales, biases ST [N][K/G];
//                      w = scale * q + bias (MLX affine, G = 32, 64 or 128).
//   Int8Channel<ST>:   q int8 [N][K]; scale ST [N] (the checkpoint's [N, 1]); w = scale * q
//                      (compressed-tensors int-quantized W8A16, per output channel, symmetric).
//   Fp8E4M3<ST, T>:    q fp8 e4m3 (OCP e4m3fn) [N][K]; scale ST [N] (the checkpoint's [N, 1]), or [1]
//                      when T (per tensor); w = scale * q (compressed-tensors float-quantized). Weight-only:
//                      x stays float32, as on the CPU target (no fp8 activations here).
//
// Six kernels (quant_linear below picks one per shape and row count, see quant_gemv_mode()):
//  * quant_wide_kernel (quant_wide.cuh; MLX int4 g32 / g64 at 33-128 token rows by default,
//    SCR_CUDA_QUANT_WIDE=N up to N; int8 / fp8 only when SCR_CUDA_QUANT_WIDE_CODES is set, off by
//    default: faster than cuBLASLt at 33-64 rows only): the weights read once per 64 token rows
//    through a cp.async ring, x prepared once per launch by a prep kernel;
//  * quant_mma1_kernel (quant_mma1.cuh; MLX int4 at 1-2 token rows): int8 tensor cores, x as exact
//    base-256 digits, the MMA's columns as groups;
//  * quant_staged_kernel (quant_staged.cuh; MLX int4 at 9-64 token rows, 17+ in passes of 16 but
//    plain 17-32-row launches only from 16 MiB, and 3-8 rows of launches of >= 32 MiB; 65-256 rows
//    where cuBLASLt declines): quant_mma_kernel's arithmetic with x staged once per block in shared
//    memory;
//  * quant_mma_kernel (the default from 2 token rows; MLX int4 at 3-8 rows of smaller launches and
//    17-32 rows of smaller plain ones; int8 and fp8 up to cuBLASLt's rows, quant_prefill.cuh):
//    tensor cores, weights as the MMA's A operand, x as bf16 hi + lo; described at its definition
//    and in docs/CUDA.md, "Quantized GEMV";
//  * quant_smem_kernel (the default for 1 token row; 1-8 rows with SCR_CUDA_QUANT_GEMV=smem): SIMT,
//    x staged in shared memory, int4 nibbles as exact float32 denormals; its one-row launches that
//    stream many rounds per block fill a per-warp cp.async ring instead of registers (QPipe, same
//    bits); described at its definition;
//  * quant_gemv_kernel (SIMT; SCR_CUDA_QUANT_GEMV=simt, kept for A/B runs):
//    - packed weights: 16-byte `ld.global.nc.L1::no_allocate` loads, consecutive lanes on
//      consecutive 16-byte chunks of a row, 8 loads per lane in flight (4 from 2 token rows up);
//    - q -> float without I2F (16/clk/SM on Hopper, too slow): the bits are OR-ed into the mantissa
//      of a power of two, which is then subtracted (exact): one LOP3 + one FADD per weight;
//    - the affine part is factored out of the dot product per 16-byte chunk (one chunk never spans
//      two groups since G >= 32): sum x*(s*q + b) = s*sum(x*q) + b*sum(x), so the inner loop is one
//      FMA per weight per token row;
//    - each warp carries 4 output rows, so every activation load from L1 feeds 4 weight rows;
//    - up to 8 token rows per block; more rows run as 8-row groups in adjacent blocks (the repeated
//      weight reads then hit L2), as the dense GEMV does (linear.cuh).
//    Measured on the H200 (docs/CUDA.md): int8 58-93 % of the copy bandwidth at batch 1 on the large
//    shapes, int4 only 28-38 %: a lane's 16 bytes are 32 consecutive int4 weights, so its 32
//    activations are 128 bytes and each x load of a warp touches 32 L1 lines.
// In both, a row's arithmetic does not depend on the other rows, so results are batch-invariant.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include <cooperative_groups.h>
#include <cuda_fp8.h>

#include "kernels/cuda/common.cuh"

namespace scr::kernels::cuda {

// One quantized linear launch. `scales`/`biases` are the format's companion tensors.
struct QuantLinearArgs {
    const void* q = nullptr;          // packed weights (layout above)
    const void* scales = nullptr;     // ST
    const void* biases = nullptr;     // ST, MLX affine only
    const float* bias = nullptr;      // [N] or null
    const float* residual = nullptr;  // [rows][N] or null (may be y itself)
    const float* x = nullptr;         // [rows][K]
    float* y = nullptr;               // [rows][N]
    int n = 0, k = 0, rows = 0;
};

// One weight matrix of a fused launch (quant_linear_fused): its packed tensors, bias and output.
struct QuantMat {
    const void* q = nullptr;
    const void* scales = nullptr;
    const void* biases = nullptr;  // MLX affine only
    const float* bias = nullptr;   // [n] or null (not with SwiGLU)
    float* y = nullptr;            // [rows][n]; SwiGLU: mat[0].y gets silu(gate) * up
    int n = 0;
};

// Up to three matrices of one input in one launch of the tensor-core kernel below:
//  * grouped (Q, K, V): the matrices' rows stacked, each row written to its own matrix's output;
//  * SwiGLU: mat[0] the gate, mat[1] the up projection (same n), silu(g) * u in the epilogue;
//  * a folded RMSNorm (norm_w set): x is the norm's input; the kernel multiplies x by norm_w as it
//    loads it, sums x^2 in the same pass and scales the sums by 1 / sqrt(mean(x^2) + eps) at the end.
// `residual` only with one matrix and no SwiGLU (as QuantLinearArgs). Generic over the format F.
struct QuantFusedArgs {
    QuantMat mat[3];
    int nmat = 1;
    const float* x = nullptr;         // [rows][k]
    const float* residual = nullptr;  // [rows][mat[0].n] or null
    const float* norm_w = nullptr;    // [k] or null
    float eps = 0.0f;
    int k = 0, rows = 0;
};

namespace qdetail {

__host__ __device__ __forceinline__ float f32_from_bits(uint32_t b) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(b);
#else
    float f;
    std::memcpy(&f, &b, 4);
    return f;
#endif
}

// Eight 4-bit values of one little-endian word (element 0 in bits 0..3) as exact floats. Nibble i
// (i < 4) sits at bit 4i; OR-ed into 2^(23-4i), whose ulp is 2^(-4i), it adds exactly q; the upper
// four nibbles take the same path after one shift.
__host__ __device__ __forceinline__ void unpack_u4x8(uint32_t w, float (&q)[8]) {
    const uint32_t hi = w >> 16;
    q[0] = f32_from_bits((w & 0x000fu) | 0x4b000000u) - 8388608.0f;  // 2^23
    q[1] = f32_from_bits((w & 0x00f0u) | 0x49000000u) - 524288.0f;   // 2^19
    q[2] = f32_from_bits((w & 0x0f00u) | 0x47000000u) - 32768.0f;    // 2^15
    q[3] = f32_from_bits((w & 0xf000u) | 0x45000000u) - 2048.0f;     // 2^11
    q[4] = f32_from_bits((hi & 0x000fu) | 0x4b000000u) - 8388608.0f;
    q[5] = f32_from_bits((hi & 0x00f0u) | 0x49000000u) - 524288.0f;
    q[6] = f32_from_bits((hi & 0x0f00u) | 0x47000000u) - 32768.0f;
    q[7] = f32_from_bits((hi & 0xf000u) | 0x45000000u) - 2048.0f;
}

// Four int8 values of one word (element 0 in the low byte) as exact floats: q + 128 (the sign bit
// flipped) placed in the low byte of 2^23, then 2^23 + 128 subtracted.
__host__ __device__ __forceinline__ void unpack_s8x4(uint32_t w, float (&q)[4]) {
    const uint32_t u = w ^ 0x80808080u;
    for (int i = 0; i < 4; ++i) {  // unrolled by nvcc (constant trip count)
#ifdef __CUDA_ARCH__
        const uint32_t bits = __byte_perm(u, 0x4b00u, 0x5440u | i);  // bytes: u.i, 0, 0, 0x4b
#else
        const uint32_t bits = ((u >> (8 * i)) & 0xffu) | 0x4b000000u;
#endif
        q[i] = f32_from_bits(bits) - 8388736.0f;  // 2^23 + 128
    }
}

// Two e4m3 bytes (b0 in bits 0..7, b1 in bits 16..23 of `pair`) as exact bf16x2 (b0 in the low half).
// The 7 magnitude bits shifted left by 4 land on bf16's low 4 exponent bits and top 3 mantissa
// bits, the sign bit moves to bit 15: that bf16 is the e4m3 value times 2^-120 (e4m3 subnormals
// m/8 * 2^-6 become bf16 subnormals m/8 * 2^-126), and one bf16x2 multiply by 2^120 (subnormal
// inputs are kept by bf16 arithmetic; the product is exact) gives the value. NaN codes S.1111.111
// (never written by scr quantize) read as +-480, as on the CPU target's F16C path.
__host__ __device__ __forceinline__ uint32_t qfp8x2_bf16x2(uint32_t pair) {
    const uint32_t bits = ((pair << 8) & 0x80008000u) | ((pair << 4) & 0x07f007f0u);
#ifdef __CUDA_ARCH__
    const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bits), __float2bfloat162_rn(0x1p120f));
    return *reinterpret_cast<const uint32_t*>(&v);
#else
    // Exact in float32 and in bf16 (3 mantissa bits), so truncating to the top 16 bits is exact too.
    uint32_t lo, hi;
    const float flo = f32_from_bits(bits << 16) * 0x1p120f, fhi = f32_from_bits(bits & 0xffff0000u) * 0x1p120f;
    std::memcpy(&lo, &flo, 4);
    std::memcpy(&hi, &fhi, 4);
    return (lo >> 16) | (hi & 0xffff0000u);
#endif
}
// The 4 e4m3 values of a word as 2 bf16x2 registers: bytes (0, 1) and (2, 3), exact.
__host__ __device__ __forceinline__ void qunpack_fp8_bf16(uint32_t w, uint32_t (&a)[2]) {
#ifdef __CUDA_ARCH__
    a[0] = qfp8x2_bf16x2(__byte_perm(w, 0u, 0x4140u));  // bytes: w.0, 0, w.1, 0
    a[1] = qfp8x2_bf16x2(__byte_perm(w, 0u, 0x4342u));
#else
    a[0] = qfp8x2_bf16x2((w & 0xffu) | ((w << 8) & 0x00ff0000u));
    a[1] = qfp8x2_bf16x2(((w >> 16) & 0xffu) | ((w >> 8) & 0x00ff0000u));
#endif
}
#ifdef __CUDA_ARCH__
// The same through Hopper's cvt.rn.f16x2.e4m3x2, then f16 -> float -> bf16 (all exact): the
// alternative measured against the bit path above (Fp8E4M3<..., true> in quant_gemv_test.cu's bench).
__device__ __forceinline__ void qunpack_fp8_bf16_cvt(uint32_t w, uint32_t (&a)[2]) {
#pragma unroll
    for (int p = 0; p < 2; ++p) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(w >> (16 * p)), __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
        const __nv_bfloat162 v = __floats2bfloat162_rn(f.x, f.y);
        a[p] = *reinterpret_cast<const uint32_t*>(&v);
    }
}
#endif
// The 4 e4m3 values of a word as floats (the SIMT kernel), through the bf16x2 path.
__host__ __device__ __forceinline__ void unpack_fp8x4(uint32_t w, float (&q)[4]) {
    uint32_t a[2];
    qunpack_fp8_bf16(w, a);
    q[0] = f32_from_bits(a[0] << 16);
    q[1] = f32_from_bits(a[0] & 0xffff0000u);
    q[2] = f32_from_bits(a[1] << 16);
    q[3] = f32_from_bits(a[1] & 0xffff0000u);
}

template <int G, typename ST>
struct MlxInt4 {
    using Scale = ST;
    static constexpr int kGroup = G;
    static constexpr int kElems = 32;  // weights per 16-byte chunk
    static constexpr int kPerWord = 8;
    static constexpr bool kAffine = true;  // per-group scale and bias (else: one scale per row)
    static_assert(G % kElems == 0, "a 16-byte chunk must lie inside one group");
    __host__ __device__ __forceinline__ static void unpack(uint32_t w, float (&q)[kPerWord]) { unpack_u4x8(w, q); }
    // Tensor-core path: k per 64-byte chunk of a row (4 lanes x 16 bytes), and the lane-index bits
    // exchanged with word-index bits so that word w of every lane lies in one group (see below).
    static constexpr int kMmaChunk = 128;
    static constexpr int kSwap = G == 32 ? 3 : G == 64 ? 2 : 0;
    static constexpr int kWordsPerGroup = G / 32;
};

template <typename ST>
struct Int8Channel {
    using Scale = ST;
    static constexpr int kGroup = 0;
    static constexpr int kElems = 16;
    static constexpr int kPerWord = 4;
    static constexpr bool kAffine = false;
    static constexpr bool kPerTensor = false;
    static constexpr bool kFp8 = false;
    __host__ __device__ __forceinline__ static void unpack(uint32_t w, float (&q)[kPerWord]) { unpack_s8x4(w, q); }
    static constexpr int kMmaChunk = 64;
};

// fp8 e4m3, one scale per output row, or one for the tensor (PER_TENSOR). Same kernel paths as
// Int8Channel: only the byte -> bf16 / float conversion and the scale's index differ. VIA_CVT picks
// the cvt.rn.f16x2.e4m3x2 conversion (kept for the A/B in quant_gemv_test.cu only).
template <typename ST, bool PER_TENSOR, bool VIA_CVT = false>
struct Fp8E4M3 {
    using Scale = ST;
    static constexpr int kGroup = 0;
    static constexpr int kElems = 16;
    static constexpr int kPerWord = 4;
    static constexpr bool kAffine = false;
    static constexpr bool kPerTensor = PER_TENSOR;
    static constexpr bool kFp8 = true;
    static constexpr bool kViaCvt = VIA_CVT;
    __host__ __device__ __forceinline__ static void unpack(uint32_t w, float (&q)[kPerWord]) { unpack_fp8x4(w, q); }
    static constexpr int kMmaChunk = 64;
};

// The per-row scale of a one-scale-per-row format (Int8Channel, Fp8E4M3) for output row n.
template <class F>
__device__ __forceinline__ float qrow_scale(const void* scales, int n) {
    return to_f32(static_cast<const typename F::Scale*>(scales)[F::kPerTensor ? 0 : n]);
}

constexpr int kQWarps = 8;
constexpr int kQRowsPerWarp = 4;  // output rows per warp: one activation load feeds this many weight rows
constexpr int kQTile = 8;         // token rows per block

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

template <class F, int TR, int KSPLIT>
__global__ void __launch_bounds__(kQWarps * kWarp) quant_gemv_kernel(const __grid_constant__ QuantLinearArgs p) {
    constexpr int R = kQRowsPerWarp;
    constexpr int U = TR == 1 ? 2 : 1;  // chunks per lane and row per iteration: R * U loads in flight
    constexpr int PW = F::kPerWord;
    using ST = typename F::Scale;
    __shared__ float partial[KSPLIT > 1 ? kQWarps : 1][R][TR];

    const int groups = (p.rows + TR - 1) / TR;
    const int group = blockIdx.x % groups, row0 = group * TR;
    const int rows = min(TR, p.rows - row0);
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int split = warp % KSPLIT;
    const int n0 = ((blockIdx.x / groups) * (kQWarps / KSPLIT) + warp / KSPLIT) * R;
    const int chunks = p.k / F::kElems;
    const int per_split = (chunks + KSPLIT - 1) / KSPLIT;
    const int c_begin = split * per_split;
    const int c_end = n0 < p.n ? min(chunks, c_begin + per_split) : c_begin;  // rows past N: no work
    const float* x = p.x + size_t(row0) * p.k;
    const int groups_per_row = F::kAffine ? p.k / F::kGroup : 1;

    // Rows past N (the last warp's tail) read row N-1 and are never written.
    const uint8_t* wrow[R];
    const ST* srow[R];
    const ST* brow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = min(n0 + r, p.n - 1);
        wrow[r] = static_cast<const uint8_t*>(p.q) + size_t(n) * (size_t(chunks) * 16);
        srow[r] = static_cast<const ST*>(p.scales) + size_t(n) * groups_per_row;
        brow[r] = F::kAffine ? static_cast<const ST*>(p.biases) + size_t(n) * groups_per_row : nullptr;
    }

    float acc[R][TR];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TR; ++t) acc[r][t] = 0.0f;

    for (int c0 = c_begin; c0 < c_end; c0 += kWarp * U) {
        uint4 wv[U][R];
        float s[U][R], b[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * kWarp + lane;
            if (c >= c_end) continue;
#pragma unroll
            for (int r = 0; r < R; ++r) wv[u][r] = load_stream16(wrow[r] + size_t(c) * 16);
            if constexpr (F::kAffine) {
                const int g = c * F::kElems / F::kGroup;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    s[u][r] = to_f32(srow[r][g]);
                    b[u][r] = to_f32(brow[r][g]);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + u * kWarp + lane;
            if (c >= c_end) continue;
            float aq[R][TR], xsum[TR];
#pragma unroll
            for (int t = 0; t < TR; ++t) {
                xsum[t] = 0.0f;
#pragma unroll
                for (int r = 0; r < R; ++r) aq[r][t] = 0.0f;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                // The R rows' word j unpacked once, then each token row's 4 or 8 activations
                // loaded once and used R times (registers stay at R*PW + PW, not TR*PW).
                float qf[R][PW];
#pragma unroll
                for (int r = 0; r < R; ++r) F::unpack(word_of(wv[u][r], j), qf[r]);
#pragma unroll
                for (int t = 0; t < TR; ++t) {
                    if (t >= rows) break;
                    float xf[PW];
#pragma unroll
                    for (int i = 0; i < PW; i += 4) {
                        const float4 f =
                            __ldg(reinterpret_cast<const float4*>(x + size_t(t) * p.k + size_t(c) * F::kElems + j * PW + i));
                        xf[i] = f.x; xf[i + 1] = f.y; xf[i + 2] = f.z; xf[i + 3] = f.w;
                    }
                    if constexpr (F::kAffine) {
#pragma unroll
                        for (int i = 0; i < PW; ++i) xsum[t] += xf[i];
                    }
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int i = 0; i < PW; ++i) aq[r][t] = fmaf(xf[i], qf[r][i], aq[r][t]);
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < TR; ++t) {
                    if constexpr (F::kAffine) acc[r][t] += s[u][r] * aq[r][t] + b[u][r] * xsum[t];
                    else acc[r][t] += aq[r][t];
                }
        }
    }

    // Every lane ends with every sum (xor butterfly); lane r * TR + t writes (row r, token t).
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TR; ++t) acc[r][t] = warp_sum(acc[r][t]);
    if constexpr (KSPLIT > 1) {
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int t = 0; t < TR; ++t) partial[warp][r][t] = acc[r][t];
        }
        __syncthreads();
        if (split != 0) return;
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < TR; ++t) {
                float v = 0.0f;
                for (int k = 0; k < KSPLIT; ++k) v += partial[warp + k][r][t];
                acc[r][t] = v;
            }
    }
    static_assert(R * TR <= kWarp, "one lane per output");
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = n0 + r;
#pragma unroll
        for (int t = 0; t < TR; ++t) {
            if (lane != r * TR + t || t >= rows || n >= p.n) continue;
            float v = acc[r][t];
            if constexpr (!F::kAffine) v *= qrow_scale<F>(p.scales, n);
            if (p.bias) v += p.bias[n];
            const size_t at = size_t(row0 + t) * p.n + n;
            if (p.residual) v = p.residual[at] + v;
            p.y[at] = v;
        }
    }
}

// Warps per group of output rows: enough (rows, split) pairs to fill the GPU, at least one
// 16-byte chunk per lane and split.
inline int quant_ksplit(int n, int chunks) {
    const int quads = (n + kQRowsPerWarp - 1) / kQRowsPerWarp;
    int ks = 1;
    while (ks < 8 && quads * ks < 4096 && chunks / (ks * 2) >= kWarp) ks *= 2;
    return ks;
}

template <class F, int TR, int KSPLIT>
void launch_quant_gemv(cudaStream_t stream, const QuantLinearArgs& a) {
    const int rows_per_cta = (kQWarps / KSPLIT) * kQRowsPerWarp;
    const int blocks = ceil_div(a.n, rows_per_cta) * ceil_div(a.rows, TR);
    quant_gemv_kernel<F, TR, KSPLIT><<<blocks, kQWarps * kWarp, 0, stream>>>(a);
}

template <class F, int TR>
void launch_quant_gemv_split(cudaStream_t stream, const QuantLinearArgs& a) {
    switch (quant_ksplit(a.n, a.k / F::kElems)) {
        case 1: launch_quant_gemv<F, TR, 1>(stream, a); break;
        case 2: launch_quant_gemv<F, TR, 2>(stream, a); break;
        case 4: launch_quant_gemv<F, TR, 4>(stream, a); break;
        default: launch_quant_gemv<F, TR, 8>(stream, a); break;
    }
}


// ---- Decode linear on tensor cores, quantized weights as the MMA's A operand ----
// Same scheme as linear.cuh's mma_linear_kernel: mma.m16n8k16 with 16 weight rows x 16 k as A and
// 16 k x 8 token rows as B; x (float32) enters as bf16 hi + lo (~2^-17 relative); q is exact in bf16
// (0..15, -128..127). Each block owns MT tiles of 16 weight rows; its warps split K into fixed
// slices whose partial sums meet in a fixed tree, so a row's result has the same bits for any
// number of token rows. Lane (g, t) = (lane / 4, lane % 4) loads bytes 16t..16t+15 of each 64-byte
// chunk of rows g and g + 8 (16-byte loads, 4 lanes on 64 contiguous bytes of a row) and the x
// values of token g at the same k: the MMA's k order is a permutation of memory order, the same
// for A and B.
//  * int4 (chunk = 128 k): the MMA sums over the 4 lanes t of a row, so all 4 must hold k of the
//    same group for the scale to be applied to the C fragment. A lane's 16 bytes are 4 words of one
//    32-k block; for G = 32 the 4 lanes of a row transpose their 4x4 words (two xor-shuffle stages),
//    for G = 64 one stage (lane bit 1 with word bit 1), for G = 128 none. Word w of every lane then
//    lies in group w / (G / 32) of the chunk (qmma_word_k gives its k). Nibble pairs (i, i + 4) of a
//    word become one bf16x2 register ((w >> 4i) & 0x000f000f | 0x4300 4300 = 128 + q, minus 128).
//    Per group: C' = q . (x_hi + x_lo) by MMAs, then acc += scale * C' + bias * X, X the group's
//    sum of x (float32 x itself, summed in a fixed order over the 4 lanes of token g, then shuffled
//    to the lanes holding that token's C columns).
//  * int8 (chunk = 64 k): one scale per row, so no transpose; byte pairs (0,1), (2,3) of a word are
//    bf16x2 registers (exact through float32), and the scale multiplies the final sum.
constexpr int kMmaMaxWarps = 8;

__device__ __forceinline__ void qmma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                                uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// ---- Per-lane pieces of the mapping, shared with the host emulation (quant_gemv_test.cu) ----

// bf16 bits of a float, rounded to nearest even (as __floats2bfloat162_rn; no NaN inputs here).
__host__ __device__ __forceinline__ uint32_t qbf16_bits(float f) {
#ifdef __CUDA_ARCH__
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
#else
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
#endif
}
// Two floats as bf16x2, the first in the low half (the MMA's lower k).
__host__ __device__ __forceinline__ uint32_t qpack_bf16x2(float lo_k, float hi_k) {
#ifdef __CUDA_ARCH__
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo_k, hi_k);
    return *reinterpret_cast<const uint32_t*>(&v);
#else
    return qbf16_bits(lo_k) | (qbf16_bits(hi_k) << 16);
#endif
}
// x0, x1 as bf16x2 hi and lo parts: hi = bf16(x), lo = bf16(x - hi).
__host__ __device__ __forceinline__ void qsplit_bf16x2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
    hi = qpack_bf16x2(x0, x1);
    lo = qpack_bf16x2(x0 - f32_from_bits(hi << 16), x1 - f32_from_bits(hi & 0xffff0000u));
}

// k offset, inside a 128-k chunk, of the 8 nibbles in word w of lane t after the transpose that
// exchanges the lane-index bits SWAP with the same word-index bits (lane t loaded block t,
// k = 32 t + 8 w): nibble i is at k = qmma_word_k + i.
template <int SWAP>
__host__ __device__ constexpr int qmma_word_k(int t, int w) {
    return 32 * ((t & ~SWAP) | (w & SWAP)) + 8 * ((w & ~SWAP) | (t & SWAP));
}
// One transpose stage on lane bit m (1 or 2), word pair (a, a | m), a with bit m clear: the lane
// with bit m clear keeps word a and receives its partner's word a into word a | m; the other
// keeps word a | m and receives its partner's word a | m into word a.
__host__ __device__ __forceinline__ uint32_t qxpose_send(const uint32_t (&v)[4], int t, int m, int a) {
    return (t & m) ? v[a] : v[a | m];
}
__host__ __device__ __forceinline__ void qxpose_recv(uint32_t (&v)[4], int t, int m, int a, uint32_t r) {
    if (t & m) v[a] = r;
    else v[a | m] = r;
}
__host__ __device__ constexpr int qxpose_word(int m, int i) { return m == 1 ? 2 * i : i; }  // i-th word with bit m clear

template <int SWAP>
__device__ __forceinline__ void qxpose(uint32_t (&v)[4], int t) {
#pragma unroll
    for (int m = 1; m <= 2; m *= 2) {
        if (!(SWAP & m)) continue;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int a = qxpose_word(m, i);
            const uint32_t r = __shfl_xor_sync(0xffffffffu, qxpose_send(v, t, m, a), m);
            qxpose_recv(v, t, m, a, r);
        }
    }
}
// A lane's 16 bytes of one 128-k chunk as 4 words, transposed so that word w lies in group
// w / (G / 32) of the chunk (the tensor-core kernels' A operand; qmma_word_k gives each word's k).
template <int SWAP>
__device__ __forceinline__ void qchunk_words(const uint4& v, int t, uint32_t (&w)[4]) {
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
    qxpose<SWAP>(w, t);
}

// The 8 nibbles of a word as 4 bf16x2 registers: register p holds nibbles p (low half) and p + 4.
__host__ __device__ __forceinline__ void qunpack_u4_bf16(uint32_t w, uint32_t (&a)[4]) {
    for (int p = 0; p < 4; ++p) {  // unrolled by nvcc (constant trip count)
        const uint32_t bits = ((w >> (4 * p)) & 0x000f000fu) | 0x43004300u;  // bf16 128 + q in each half
#ifdef __CUDA_ARCH__
        __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&bits);
        v = __hsub2(v, __floats2bfloat162_rn(128.0f, 128.0f));  // exact
        a[p] = *reinterpret_cast<const uint32_t*>(&v);
#else
        a[p] = qpack_bf16x2(f32_from_bits((bits & 0xffffu) << 16) - 128.0f, f32_from_bits(bits & 0xffff0000u) - 128.0f);
#endif
    }
}
// The 4 int8 values of a word as 2 bf16x2 registers: bytes (0, 1) and (2, 3), exact (|q| <= 128).
__host__ __device__ __forceinline__ void qunpack_s8_bf16(uint32_t w, uint32_t (&a)[2]) {
    float q[4];
    unpack_s8x4(w, q);
    a[0] = qpack_bf16x2(q[0], q[1]);
    a[1] = qpack_bf16x2(q[2], q[3]);
}
// A one-scale-per-row format's word as 2 bf16x2 registers (the MMA's A fragments).
template <class F>
__host__ __device__ __forceinline__ void qunpack_row_bf16(uint32_t w, uint32_t (&a)[2]) {
    if constexpr (!F::kFp8) {
        qunpack_s8_bf16(w, a);
    } else {
#ifdef __CUDA_ARCH__
        if constexpr (F::kViaCvt) {
            qunpack_fp8_bf16_cvt(w, a);
            return;
        }
#endif
        qunpack_fp8_bf16(w, a);
    }
}

// Blocks of 16 * MT weight rows and TN * 8 token rows; U chunks per load round, one round ahead of
// the MMAs when kPipe (few token rows, registers to spare).
// SwiGLU: two tiles (gate and up rows) and half the chunks per round, so the bytes in flight per
// warp stay those of one matrix (registers). (Twice the chunks per round at 1-8 token rows was
// measured slower end to end on the H200: docs/CUDA.md, issue #9.)
// MLX int4 chunks per load round for MT tiles (quant_staged_kernel and its plan use the same rule).
__host__ __device__ constexpr int qaffine_chunks_per_round(int mt) { return 2 / mt; }
template <class F, int TN, bool SWIGLU = false>
struct QMmaShape {
    static constexpr int MT = SWIGLU ? 2 : 1;
    static constexpr bool kPipe = TN == 1;
    static constexpr int U = F::kAffine ? qaffine_chunks_per_round(MT) : 4 / MT;
};

// Warps splitting K: as many as divide the row's chunks, up to 8 (depends on K only).
constexpr int qmma_warps(int chunks) {
    int w = kMmaMaxWarps;
    while (w > 1 && chunks % w != 0) w /= 2;
    return w;
}

// The group parameters (scales or biases) of one row's chunk: 128 / G bf16 values as raw bits.
template <int GPC>
__device__ __forceinline__ void qload_group_params(const void* p, uint32_t (&r)[2]) {
    if constexpr (GPC == 4) {
        const uint2 v = __ldg(static_cast<const uint2*>(p));
        r[0] = v.x;
        r[1] = v.y;
    } else if constexpr (GPC == 2) {
        r[0] = __ldg(static_cast<const unsigned int*>(p));
        r[1] = 0;
    } else {
        r[0] = __ldg(static_cast<const unsigned short*>(p));
        r[1] = 0;
    }
}
template <typename ST>
__device__ __forceinline__ float qgroup_param(const uint32_t (&r)[2], int j) {
    ST v;
    v.bits = uint16_t(j & 1 ? r[j >> 1] >> 16 : r[j >> 1]);
    return to_f32(v);
}

// The MLX int4 tensor-core kernels' arithmetic per packed word, shared by quant_mma_kernel (which
// builds the B fragments from x per lane) and quant_staged_kernel (which loads them from shared
// memory). One word: 16 k of a 16-row tile (A fragments a0: rows g, a8: rows g + 8) against one
// 8-token tile of x split into bf16 hi + lo, four MMAs into the group's partial sums c.
__device__ __forceinline__ void qmma_word_hilo(float (&c)[4], const uint32_t (&a0)[4], const uint32_t (&a8)[4], const uint32_t (&bh)[4],
                                               const uint32_t (&bl)[4]) {
    qmma_bf16_16816(c, a0[0], a8[0], a0[1], a8[1], bh[0], bh[1]);
    qmma_bf16_16816(c, a0[2], a8[2], a0[3], a8[3], bh[2], bh[3]);
    qmma_bf16_16816(c, a0[0], a8[0], a0[1], a8[1], bl[0], bl[1]);
    qmma_bf16_16816(c, a0[2], a8[2], a0[3], a8[3], bl[2], bl[3]);
}
// A group's end: acc += scale * C' + bias * X for rows g (h = 0) and g + 8 (h = 1) of the tile,
// xc0 / xc1 the group sums of x of the lane's token columns 2t / 2t + 1.
template <typename ST>
__device__ __forceinline__ void qgroup_affine(float (&acc)[4], const float (&cg)[4], const uint32_t (&s)[2][2], const uint32_t (&b)[2][2],
                                              int grp, float xc0, float xc1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float sc = qgroup_param<ST>(s[h], grp), bi = qgroup_param<ST>(b[h], grp);
        acc[2 * h] = fmaf(bi, xc0, fmaf(sc, cg[2 * h], acc[2 * h]));
        acc[2 * h + 1] = fmaf(bi, xc1, fmaf(sc, cg[2 * h + 1], acc[2 * h + 1]));
    }
}

// Output rows of a grouped launch: its stacked matrices', or (SwiGLU) the gate's, whose up rows
// share them.
template <bool SWIGLU>
__device__ __forceinline__ int qfused_rows(const QuantFusedArgs& p) {
    int n = p.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < p.nmat; ++m) n += p.mat[m].n;
    return n;
}

// Which matrix of a grouped launch global row n belongs to; n becomes its row there.
__device__ __forceinline__ int qmat_of(const QuantFusedArgs& p, int& n) {
    int m = 0;
    while (m + 1 < p.nmat && n >= p.mat[m].n) n -= p.mat[m++].n;
    return m;
}

// quant_mma_kernel's main loop, shared with moe_quant_mma_kernel (moe_quant.cuh): the lane's
// partial sums acc of MT 16-row tiles (wrow / srow / brow: rows g and g + 8 of each, at the warp's
// first chunk, 16 t bytes in) against TN 8-token tiles over CH chunks of K from chunk c_first.
// xrow(n): the x row of token column n * 8 + g; a column past the launch's tokens reads a valid row
// (the callers give the last token's) and its sums are never written. No null rows: a load guarded
// by `if (xr)` was executed with xr = 0 on the H100 (a 2-tile fp8 MoE instantiation faulted at
// address 0 although its PTX branches around the load; docs/CUDA.md "Session 47"), so no load's
// address depends on such a branch. NORM: x times norm_w, and ss[n] gathers token g's sum of x^2
// over the lane's k.
template <class F, int TN, bool NORM, int MT, class XRow>
__device__ __forceinline__ void qmma_accumulate(const uint8_t* const (&wrow)[MT][2], const typename F::Scale* const (&srow)[MT][2],
                                                const typename F::Scale* const (&brow)[MT][2], int CH, int c_first, int g, int t,
                                                const XRow& xrow, const float* norm_w, float (&acc)[MT][TN][4], float (&ss)[TN]) {
    using S = QMmaShape<F, TN, MT == 2>;
    using ST = typename F::Scale;
    constexpr int U = S::U;
    constexpr int CK = F::kMmaChunk;
    static_assert(S::MT == MT, "the tiles of QMmaShape");
#pragma unroll
    for (int n = 0; n < TN; ++n) ss[n] = 0.0f;

#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < TN; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][n][e] = 0.0f;

    struct Round {
        uint4 w[U][MT][2];
        uint32_t s[F::kAffine ? U : 1][MT][2][2], b[F::kAffine ? U : 1][MT][2][2];
    };
    auto load_round = [&](Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u >= CH) break;
#pragma unroll
            for (int m = 0; m < MT; ++m)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    r.w[u][m][h] = load_stream16(wrow[m][h] + size_t(c0 + u) * 64);
                    if constexpr (F::kAffine) {
                        constexpr int GPC = CK / F::kGroup;
                        qload_group_params<GPC>(srow[m][h] + (c0 + u) * GPC, r.s[u][m][h]);
                        qload_group_params<GPC>(brow[m][h] + (c0 + u) * GPC, r.b[u][m][h]);
                    }
                }
        }
    };
    auto mma_round = [&](const Round& r, int c0) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (c0 + u >= CH) break;
            const int kc = (c_first + c0 + u) * CK;  // first k of the chunk
            if constexpr (F::kAffine) {
                constexpr int WPG = F::kWordsPerGroup;
                uint32_t wq[MT][2][4];
#pragma unroll
                for (int m = 0; m < MT; ++m)
#pragma unroll
                    for (int h = 0; h < 2; ++h) qchunk_words<F::kSwap>(r.w[u][m][h], t, wq[m][h]);
                float cg[MT][TN][4], xs[TN];
#pragma unroll
                for (int wd = 0; wd < 4; ++wd) {
                    if (wd % WPG == 0) {
#pragma unroll
                        for (int n = 0; n < TN; ++n) {
                            xs[n] = 0.0f;
#pragma unroll
                            for (int m = 0; m < MT; ++m)
#pragma unroll
                                for (int e = 0; e < 4; ++e) cg[m][n][e] = 0.0f;
                        }
                    }
                    uint32_t a[MT][2][4];
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int h = 0; h < 2; ++h) qunpack_u4_bf16(wq[m][h][wd], a[m][h]);
                    const int k = kc + qmma_word_k<F::kSwap>(t, wd);
                    float nw[8];
                    if constexpr (NORM) {
                        const float4 n0 = __ldg(reinterpret_cast<const float4*>(norm_w + k));
                        const float4 n1 = __ldg(reinterpret_cast<const float4*>(norm_w + k + 4));
                        nw[0] = n0.x; nw[1] = n0.y; nw[2] = n0.z; nw[3] = n0.w;
                        nw[4] = n1.x; nw[5] = n1.y; nw[6] = n1.z; nw[7] = n1.w;
                    }
#pragma unroll
                    for (int n = 0; n < TN; ++n) {
                        const float* xr = xrow(n);
                        float xv[8];
                        const float4 x0 = __ldg(reinterpret_cast<const float4*>(xr + k));
                        const float4 x1 = __ldg(reinterpret_cast<const float4*>(xr + k + 4));
                        xv[0] = x0.x; xv[1] = x0.y; xv[2] = x0.z; xv[3] = x0.w;
                        xv[4] = x1.x; xv[5] = x1.y; xv[6] = x1.z; xv[7] = x1.w;
                        if constexpr (NORM) {
#pragma unroll
                            for (int i = 0; i < 8; ++i) {
                                ss[n] = fmaf(xv[i], xv[i], ss[n]);
                                xv[i] *= nw[i];
                            }
                        }
#pragma unroll
                        for (int i = 0; i < 8; ++i) xs[n] += xv[i];
                        uint32_t bh[4], bl[4];
#pragma unroll
                        for (int q = 0; q < 4; ++q) qsplit_bf16x2(xv[q], xv[q + 4], bh[q], bl[q]);
#pragma unroll
                        for (int m = 0; m < MT; ++m) qmma_word_hilo(cg[m][n], a[m][0], a[m][1], bh, bl);
                    }
                    if (wd % WPG == WPG - 1) {
                        const int grp = wd / WPG;
#pragma unroll
                        for (int n = 0; n < TN; ++n) {
                            // Token g's group sum over its 4 lanes, then to the lanes of columns 2t, 2t + 1.
                            float xsum = xs[n];
                            xsum += __shfl_xor_sync(0xffffffffu, xsum, 1);
                            xsum += __shfl_xor_sync(0xffffffffu, xsum, 2);
                            const float xc0 = __shfl_sync(0xffffffffu, xsum, 8 * t);
                            const float xc1 = __shfl_sync(0xffffffffu, xsum, 8 * t + 4);
#pragma unroll
                            for (int m = 0; m < MT; ++m) qgroup_affine<ST>(acc[m][n], cg[m][n], r.s[u][m], r.b[u][m], grp, xc0, xc1);
                        }
                    }
                }
            } else {
#pragma unroll
                for (int wd = 0; wd < 4; ++wd) {
                    uint32_t a[MT][2][2];
#pragma unroll
                    for (int m = 0; m < MT; ++m)
#pragma unroll
                        for (int h = 0; h < 2; ++h) qunpack_row_bf16<F>(word_of(r.w[u][m][h], wd), a[m][h]);
                    const int k = kc + 16 * t + 4 * wd;
                    float4 nw;
                    if constexpr (NORM) nw = __ldg(reinterpret_cast<const float4*>(norm_w + k));
#pragma unroll
                    for (int n = 0; n < TN; ++n) {
                        float4 xv = __ldg(reinterpret_cast<const float4*>(xrow(n) + k));
                        if constexpr (NORM) {
                            ss[n] = fmaf(xv.x, xv.x, ss[n]);
                            ss[n] = fmaf(xv.y, xv.y, ss[n]);
                            ss[n] = fmaf(xv.z, xv.z, ss[n]);
                            ss[n] = fmaf(xv.w, xv.w, ss[n]);
                            xv.x *= nw.x; xv.y *= nw.y; xv.z *= nw.z; xv.w *= nw.w;
                        }
                        uint32_t bh[2], bl[2];
                        qsplit_bf16x2(xv.x, xv.y, bh[0], bl[0]);
                        qsplit_bf16x2(xv.z, xv.w, bh[1], bl[1]);
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            qmma_bf16_16816(acc[m][n], a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1], bh[0], bh[1]);
                            qmma_bf16_16816(acc[m][n], a[m][0][0], a[m][1][0], a[m][0][1], a[m][1][1], bl[0], bl[1]);
                        }
                    }
                }
            }
        }
    };

    if constexpr (S::kPipe) {
        Round ra, rb;
        load_round(ra, 0);
        pdl_wait();  // weights never depend on an earlier kernel: the first loads fly before the wait
#pragma unroll 1
        for (int c0 = 0; c0 < CH; c0 += 2 * U) {
            if (c0 + U < CH) load_round(rb, c0 + U);
            mma_round(ra, c0);
            if (c0 + U >= CH) break;
            if (c0 + 2 * U < CH) load_round(ra, c0 + 2 * U);
            mma_round(rb, c0 + U);
        }
    } else {
        Round r;
#pragma unroll 1
        for (int c0 = 0; c0 < CH; c0 += U) {
            load_round(r, c0);
            if (c0 == 0) pdl_wait();
            mma_round(r, c0);
        }
    }
}

// Every accumulator of the tensor-core kernels, then (NORM) every sum of squares, with its slot.
template <bool NORM, int MT, int TN, class Fn>
__device__ __forceinline__ void qmma_each_partial(float (&acc)[MT][TN][4], float (&ss)[TN], Fn&& f) {
    int v = 0;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int n = 0; n < TN; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(acc[m][n][e], v++);
    if constexpr (NORM) {
#pragma unroll
        for (int n = 0; n < TN; ++n) f(ss[n], v++);
    }
}
// Fixed tree over a block's nw warps: the upper half hands its partials to the lower half (red:
// [nw / 2][partials][kWarp] floats of shared memory); warp 0 ends with the block's sums.
template <bool NORM, int MT, int TN, int VALS>
__device__ __forceinline__ void qmma_warp_tree(float (&acc)[MT][TN][4], float (&ss)[TN], float (*red)[VALS][kWarp], int nw, int warp,
                                               int lane) {
    for (int half = nw / 2; half >= 1; half /= 2) {
        if (warp >= half && warp < 2 * half) qmma_each_partial<NORM>(acc, ss, [&](float& a, int v) { red[warp - half][v][lane] = a; });
        __syncthreads();
        if (warp < half) qmma_each_partial<NORM>(acc, ss, [&](float& a, int v) { a += red[warp][v][lane]; });
        __syncthreads();
    }
}

template <class F, int TN, bool SWIGLU, bool NORM>
__global__ void __launch_bounds__(kMmaMaxWarps * kWarp) quant_mma_kernel(const __grid_constant__ QuantFusedArgs p) {
    using S = QMmaShape<F, TN, SWIGLU>;
    using ST = typename F::Scale;
    constexpr int MT = S::MT;
    constexpr int CK = F::kMmaChunk;
    constexpr int kVals = MT * TN * 4 + (NORM ? TN : 0);
    __shared__ float red[kMmaMaxWarps / 2][kVals][kWarp];
    // Rows of the launch: the stacked matrices, or (SwiGLU) the gate's, whose tile 1 is the up rows.
    const int n_total = qfused_rows<SWIGLU>(p);

    const int nw = blockDim.x / kWarp;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int g = lane / 4, t = lane % 4;
    // Split K: gridDim.z blocks of one cluster (qmma_split) each take a slice of K, their nw warps
    // split it again; the slices are K-order, warp by warp, block by block.
    const int CH = p.k / CK / (nw * int(gridDim.z));  // chunks per warp
    const int c_first = (int(blockIdx.z) * nw + warp) * CH;
    const int row0 = blockIdx.y * (SWIGLU ? 16 : 16 * MT);  // SwiGLU: the two tiles share their rows
    const int tok0 = blockIdx.x * (TN * 8);
    const size_t row_bytes = size_t(p.k) / CK * 64;

    // Rows g and g + 8 of each tile (rows past the last read the last row and are never written).
    const uint8_t* wrow[MT][2];
    const ST* srow[MT][2];
    const ST* brow[MT][2];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int n = min(row0 + (SWIGLU ? 0 : 16 * m) + g + 8 * h, n_total - 1);
            const QuantMat& mat = p.mat[SWIGLU ? m : qmat_of(p, n)];
            wrow[m][h] = static_cast<const uint8_t*>(mat.q) + size_t(n) * row_bytes + size_t(c_first) * 64 + 16 * t;
            if constexpr (F::kAffine) {
                constexpr int GPC = CK / F::kGroup;
                const size_t at = size_t(n) * (p.k / F::kGroup) + size_t(c_first) * GPC;
                srow[m][h] = static_cast<const ST*>(mat.scales) + at;
                brow[m][h] = static_cast<const ST*>(mat.biases) + at;
            }
        }
    float ss[TN];  // folded RMSNorm: token g's sum of x^2 over this lane's k
    float acc[MT][TN][4];
    qmma_accumulate<F, TN, NORM>(
        wrow, srow, brow, CH, c_first, g, t,
        [&](int n) { return p.x + size_t(min(tok0 + n * 8 + g, p.rows - 1)) * p.k; },  // past the last: the last
        p.norm_w, acc, ss);
    pdl_trigger();
    // Token g's sum of squares over its 4 lanes (then over the warps in the tree below).
    if constexpr (NORM) {
#pragma unroll
        for (int n = 0; n < TN; ++n) {
            ss[n] += __shfl_xor_sync(0xffffffffu, ss[n], 1);
            ss[n] += __shfl_xor_sync(0xffffffffu, ss[n], 2);
        }
    }

    auto each_partial = [&](auto&& f) { qmma_each_partial<NORM>(acc, ss, f); };
    qmma_warp_tree<NORM>(acc, ss, red, nw, warp, lane);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (gridDim.z > 1) {
        // The cluster's blocks (one per K slice) meet in block 0's registers through distributed
        // shared memory, added in rank order (fixed: the split depends on the shape only).
        namespace cg = cooperative_groups;
        cg::cluster_group cluster = cg::this_cluster();
        if (warp == 0) each_partial([&](float& a, int v) { red[0][v][lane] = a; });
        cluster.sync();
        const unsigned rank = cluster.block_rank();
        if (rank == 0 && warp == 0)
            for (unsigned r = 1; r < cluster.num_blocks(); ++r) {
                const float* remote = cluster.map_shared_rank(&red[0][0][0], r);
                each_partial([&](float& a, int v) { a += remote[v * kWarp + lane]; });
            }
        cluster.sync();  // the other blocks' shared memory stays alive until block 0 has read it
        if (rank != 0) return;
    }
#endif
    if (warp != 0) return;
    // Lane (g, t) holds rows g and g + 8 of each tile for token columns 2t and 2t + 1.
#pragma unroll
    for (int n = 0; n < TN; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float inv = 1.0f;
            if constexpr (NORM) {
                const float sum = __shfl_sync(0xffffffffu, ss[n], (2 * t + j) * 4);  // from token 2t + j's lanes
                inv = 1.0f / sqrtf(sum / float(p.k) + p.eps);
            }
            const int tok = tok0 + n * 8 + 2 * t + j;
            if (tok >= p.rows) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                if constexpr (SWIGLU) {
                    const int row = row0 + g + 8 * h;
                    if (row >= n_total) continue;
                    float gate = acc[0][n][2 * h + j], up = acc[1][n][2 * h + j];
                    if constexpr (!F::kAffine) {
                        gate *= qrow_scale<F>(p.mat[0].scales, row);
                        up *= qrow_scale<F>(p.mat[1].scales, row);
                    }
                    if constexpr (NORM) {
                        gate *= inv;
                        up *= inv;
                    }
                    p.mat[0].y[size_t(tok) * p.mat[0].n + row] = silu(gate) * up;  // as silu_mul_kernel
                } else {
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        int row = row0 + 16 * m + g + 8 * h;
                        if (row >= n_total) continue;
                        const QuantMat& mat = p.mat[qmat_of(p, row)];
                        float v = acc[m][n][2 * h + j];
                        if constexpr (!F::kAffine) v *= qrow_scale<F>(mat.scales, row);
                        if constexpr (NORM) v *= inv;
                        if (mat.bias) v += mat.bias[row];
                        const size_t at = size_t(tok) * mat.n + row;
                        if (p.residual) v = p.residual[at] + v;
                        mat.y[at] = v;
                    }
                }
            }
        }
}

// Split of K in the tensor-core kernel (SCR_CUDA_QUANT_SPLITK): K slices per 16-row tile = warps per
// block x blocks per cluster (along K, reduced through distributed shared memory in rank order).
//   0 (default): the original split: up to 8 warps of one block (qmma_warps), no cluster;
//   1: one wave: the most slices (powers of two, whole chunks per warp) for which every
//      warp of the launch is resident at once (row tiles x slices <= the SMs' resident warps of the
//      kernel), at least 1: few row tiles (2048-row q/o/down at 1B) get a cluster of 2 blocks, many
//      (gate/up, lm_head) fewer warps that stream more chunks each, loads one round ahead. Measured on
//      the H200 (docs/CUDA.md): int4-g64 1B shapes 1.0x / 1.12x / 1.26x / 1.29x (q-o / gate-up / down /
//      lm_head) at batch 1; more slices than one wave (a second wave) was slower at every shape. The
//      default since this rule (resident warps from the occupancy API) passed on the H200: 720 GEMV
//      checks of every format incl. fused and batch invariance, memcheck clean, int4-g64 gate/up 11.2
//      -> 9.9 us, down 13.3 -> 10.6, lm_head 122.6 -> 95.1; int8 lm_head 121.6 -> 96.1, q/o 5.2 -> 5.5.
//      SCR_CUDA_QUANT_SPLITK=0 is the earlier split.
// The split depends on the shape, the format and the kernel variant only (never on the number of
// token rows: a row's bits depend on the split, and must not depend on the batch).
struct QMmaSplit {
    int warps = 1;   // per block
    int blocks = 1;  // per cluster (along K)
};
inline int quant_splitk_mode() {
    static const int mode = int(env_int_switch("SCR_CUDA_QUANT_SPLITK", 1, [](long long m) { return m == 0 || m == 1; }, "0 or 1"));
    return mode;
}
// SCR_CUDA_QUANT_SPLITK_WARPS=n replaces the resident-warp count (A/B runs); 0: the device's.
inline int quant_splitk_warps_override() {
    static const int v = int(env_int_switch(
        "SCR_CUDA_QUANT_SPLITK_WARPS", 0, [](long long w) { return w >= 0 && w <= (1 << 20); }, "a warp count (0: the device's)", "the device's"));
    return v;
}
inline QMmaSplit qmma_split(int row_tiles, int chunks, int mode, int resident_warps) {
    QMmaSplit s;
    s.warps = qmma_warps(chunks);
    if (mode <= 0) return s;
    int slices = 1;
    while (slices < kMmaMaxWarps * 8 && chunks % (2 * slices) == 0 && int64_t(row_tiles) * 2 * slices <= resident_warps)
        slices *= 2;
    s.warps = std::min(slices, kMmaMaxWarps);
    s.blocks = slices / s.warps;
    return s;
}
// The split of the last tensor-core launch on this thread (the test prints it).
inline QMmaSplit& qmma_last_split() {
    static thread_local QMmaSplit s;
    return s;
}

// Warps of quant_mma_kernel<F, 1, SWIGLU, NORM> resident on the whole GPU in blocks of 8 warps
// (registers decide: 128 per thread -> 2 blocks per SM). From the one-token-tile variant whatever TN
// a launch uses, so the split stays the same for any number of rows.
template <class F, bool SWIGLU, bool NORM>
int qmma_resident_warps();

template <class F, int TN, bool SWIGLU, bool NORM>
void launch_quant_mma(const Ctx& c, const QuantFusedArgs& a) {
    int n_total = a.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < a.nmat; ++m) n_total += a.mat[m].n;
    const int row_tiles = ceil_div(n_total, 16);
    const int mode = quant_splitk_mode();
    const int resident = mode <= 0 ? 0
                         : quant_splitk_warps_override() > 0 ? quant_splitk_warps_override()
                                                             : qmma_resident_warps<F, SWIGLU, NORM>();
    const QMmaSplit s = qmma_split(row_tiles, a.k / F::kMmaChunk, mode, resident);
    qmma_last_split() = s;
    launch_ex(c, quant_mma_kernel<F, TN, SWIGLU, NORM>, dim3(ceil_div(a.rows, TN * 8), row_tiles, s.blocks), dim3(s.warps * kWarp), 0,
              s.blocks, a);
}

template <class F, bool SWIGLU, bool NORM>
int qmma_resident_warps() {
    static const int warps = [] {
        int blocks = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_mma_kernel<F, 1, SWIGLU, NORM>, kMmaMaxWarps * kWarp, 0);
        return std::max(1, device_sm_count() * blocks * kMmaMaxWarps);
    }();
    return warps;
}

// Token-row tiles per block: up to 64 rows (8 tiles); the fused variants (SwiGLU's two weight
// tiles, the norm's sums: registers, spills from 4 tiles on) up to 16 rows, more rows in more
// blocks. A row's arithmetic is the same in every variant, so results do not depend on the number
// of rows.
template <class F, bool SWIGLU, bool NORM>
void launch_quant_mma_rows(const Ctx& c, const QuantFusedArgs& a) {
    if (a.rows <= 8) {
        launch_quant_mma<F, 1, SWIGLU, NORM>(c, a);
    } else if constexpr (SWIGLU || NORM) {
        launch_quant_mma<F, 2, SWIGLU, NORM>(c, a);
    } else {
        if (a.rows <= 16) launch_quant_mma<F, 2, false, false>(c, a);
        else if (a.rows <= 32) launch_quant_mma<F, 4, false, false>(c, a);
        else launch_quant_mma<F, 8, false, false>(c, a);
    }
}

// The tensor-core path takes K in whole chunks and the companion tensors aligned for vector loads
// (the runtime aligns every tensor to 256 bytes); anything else runs the SIMT kernel.
template <class F>
bool quant_mma_fits(const QuantLinearArgs& a) {
    const auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    if (a.k % F::kMmaChunk != 0 || !aligned(a.q, 16) || !aligned(a.x, 16)) return false;
    if constexpr (F::kAffine) {
        constexpr size_t bytes = sizeof(typename F::Scale) * (F::kMmaChunk / F::kGroup);
        return sizeof(typename F::Scale) == 2 && aligned(a.scales, bytes) && aligned(a.biases, bytes);
    }
    return true;
}
// Every matrix of a fused launch as above, and the norm weight aligned for float4 loads.
template <class F>
bool quant_mma_fits(const QuantFusedArgs& a) {
    if (a.norm_w && reinterpret_cast<uintptr_t>(a.norm_w) % 16 != 0) return false;
    for (int m = 0; m < a.nmat; ++m) {
        QuantLinearArgs one;
        one.q = a.mat[m].q;
        one.scales = a.mat[m].scales;
        one.biases = a.mat[m].biases;
        one.x = a.x;
        one.k = a.k;
        if (!quant_mma_fits<F>(one)) return false;
    }
    return true;
}

inline QuantFusedArgs fused_of(const QuantLinearArgs& a) {
    QuantFusedArgs f;
    f.mat[0] = QuantMat{a.q, a.scales, a.biases, a.bias, a.y, a.n};
    f.x = a.x;
    f.residual = a.residual;
    f.k = a.k;
    f.rows = a.rows;
    return f;
}


// ---- Batch 1-8: SIMT GEMV with x staged in shared memory (quant_smem_kernel, SCR_CUDA_QUANT_GEMV=smem) ----
// Built like the bf16 gemv_kernel (linear.cuh), for every format F and every fused variant:
//  * x (float32; with a folded RMSNorm, x * norm_w) is staged once per block in shared memory, each
//    16-byte chunk at index i ^ ((i >> 3) & 7): a lane's weight chunk covers 32 (int4) or 16 (int8,
//    fp8) consecutive k, so the 8 lanes of one 128-bit LDS phase read chunks 8 (or 4) apart, which
//    the XOR spreads over distinct banks (without it, all 8 in one bank quad);
//  * each warp carries 4 weight rows (SwiGLU: 2 gate rows and the same 2 up rows), so every x chunk
//    read from shared memory feeds 4 rows; 8 16-byte `ld.global.nc.L1::no_allocate` weight loads per
//    lane per round (2 chunks x 4 rows), the first round issued before pdl_wait();
//  * int4: no I2F and no subtraction: nibble e of a half-word masked in place is the float32
//    denormal q * 2^(4e - 149), exact; x is staged pre-multiplied by 2^(89 - 4e) (exact: a power of
//    two), so every product is x q 2^-60 and a chunk's sum is the plain float32 sum times 2^-60 (the
//    scale absorbs 2^60). One LOP per weight and one FMA per weight and token (needs denormals kept:
//    no -ftz / --use_fast_math, which this target never uses). The affine part per 32-k chunk:
//    s * sum(x q) + b * sum(x), sum(x) per chunk computed once per block while staging;
//  * int8 / fp8: the exact float conversions of the SIMT kernel above, one scale per row at the end;
//  * K split over KS warps of a block (fixed from the shape), partials added in split order; the grid
//    is one wave of resident blocks walking the row tiles (persistent), token rows beyond what shared
//    memory holds per block go to further blocks along y (each re-reads the weights, from L2).
// Summation order per output: the lane's chunks in increasing k, a xor butterfly over the warp, the
// KS partials in order, all fixed by the shape: a row's bits never depend on the other rows (1-8).
constexpr int kSWarps = 8;
constexpr int kSRows = 4;          // weight rows per warp
constexpr int kSBatch = 2;         // 16-byte chunks per lane and row per load round
constexpr int kSMaxTile = 4;       // token rows per block (more: more blocks along y)
constexpr int kSSmemBudget = 64 << 10;  // x bytes per block that set the token rows per block
constexpr int kSSmemMax = 100 << 10;    // above (one token row): the tensor-core kernel

template <class F>
struct QSmemFmt {
    static constexpr bool kInt4 = F::kAffine;
    static constexpr int kKPerChunk = F::kElems;  // k per 16-byte weight chunk: 32 or 16
};
// Shared memory of one block: x rows (floats) + per-32-k chunk sums (int4) + the norm's sums.
template <class F>
__host__ __device__ constexpr size_t qsmem_bytes(int k, int tile) {
    return size_t(tile) * k * 4 + (F::kAffine ? size_t(tile) * (k / 32) * 4 : 0);
}
template <class F>
int qsmem_tile_cap(int k) {
    int t = kSMaxTile;
    while (t > 1 && qsmem_bytes<F>(k, t) > size_t(kSSmemBudget)) t /= 2;
    return t;
}

__device__ __forceinline__ int qs_swz(int i) { return i ^ ((i >> 3) & 7); }

// The 4 nibbles of a half-word h (bits 0..15) masked in place: nibble e is the float32 denormal
// q * 2^(4e - 149), exact; times x staged as x * qs_x_scale(e) it gives x q 2^-60.
__host__ __device__ __forceinline__ void qs_u4_half(uint32_t h, float (&q)[4]) {
    q[0] = f32_from_bits(h & 0x000fu);
    q[1] = f32_from_bits(h & 0x00f0u);
    q[2] = f32_from_bits(h & 0x0f00u);
    q[3] = f32_from_bits(h & 0xf000u);
}
__host__ __device__ constexpr float qs_x_scale(int e) { return e == 0 ? 0x1p89f : e == 1 ? 0x1p85f : e == 2 ? 0x1p81f : 0x1p77f; }

// The weight ring of the pipelined one-token-row launch (PIPE; SCR_CUDA_QSTREAM): per warp, `depth`
// stages of one load round each, filled by cp.async `depth - 1` rounds ahead of the round being
// computed (the register path has no load in flight while it computes), across tile boundaries.
// A stage holds the round's weight chunks [kSBatch][kSRows][lane] (16 bytes each: a lane reads back
// only what it copied) and, for the affine formats, the round's scales and biases of each row
// [kSRows][2][groups] (copied in 16-byte pieces by any lane, read by all: __syncwarp orders them).
template <class F>
struct QPipe {
    static constexpr int kGroups = F::kAffine ? kSBatch * kWarp * F::kElems / (F::kAffine ? F::kGroup : 1) : 0;  // per row and round
    static constexpr int kPieces = kGroups * int(sizeof(typename F::Scale)) / 16;  // 16-byte pieces of one row's scales
    static constexpr int kWeightBytes = kSBatch * kSRows * kWarp * 16;
    static constexpr int kStageBytes = kWeightBytes + kSRows * 2 * kPieces * 16;  // per warp
    static_assert(!F::kAffine || kGroups * sizeof(typename F::Scale) % 16 == 0, "a round's scales are whole 16-byte pieces");
};
template <class F>
__host__ __device__ constexpr size_t qpipe_ring_offset(int k, int tile) { return (qsmem_bytes<F>(k, tile) + 15) & ~size_t(15); }

template <class F, int TR, bool SWIGLU, bool NORM, bool PIPE = false>
__global__ void __launch_bounds__(kSWarps * kWarp, 2) quant_smem_kernel(const __grid_constant__ QuantFusedArgs p, int ks, int depth) {
    using ST = typename F::Scale;
    constexpr int R = kSRows, KB = kSBatch;
    constexpr int KPC = F::kElems;                  // k per weight chunk
    constexpr int X4 = KPC / 4;                     // x float4 chunks per weight chunk
    constexpr int WROWS = SWIGLU ? R / 2 : R;       // output rows per warp
    extern __shared__ float4 smem4[];
    __shared__ float red[TR][kSWarps];
    __shared__ float partial[kSWarps][R * TR];
    __shared__ float inv_rms[TR];

    pdl_trigger();
    const int k = p.k;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
    const int split = warp % ks;
    const int chunks = k / KPC;
    const int per_split = chunks / ks;  // ks divides chunks (quant_smem_split)
    const int c_begin = split * per_split, c_end = c_begin + per_split;
    const int rows_per_block = (kSWarps / ks) * WROWS;
    const int n_total = qfused_rows<SWIGLU>(p);
    const int tiles = ceil_div(n_total, rows_per_block);
    const int tok0 = blockIdx.y * TR;
    const int rows = min(TR, p.rows - tok0);
    const size_t row_bytes = size_t(chunks) * 16;
    const int gpr = F::kAffine ? k / (F::kGroup > 0 ? F::kGroup : 1) : 1;  // groups per row

    float* xs = reinterpret_cast<float*>(smem4);                 // [TR][k], 16-byte chunks swizzled
    float* csum = xs + size_t(TR) * k;                           // [TR][k / 32] (int4)

    struct Rows {
        const uint8_t* w[R];
        const ST* s[R];
        const ST* b[R];
    };
    // Slot r's weight row (stacked matrices; SwiGLU: slots R/2.. are the up rows of slots 0..).
    auto rows_of = [&](int tile, Rows& rw) {
        const int n0 = tile * rows_per_block + (warp / ks) * WROWS;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            int n = min(n0 + (SWIGLU ? r % WROWS : r), n_total - 1);
            const QuantMat& mat = p.mat[SWIGLU ? r / WROWS : qmat_of(p, n)];
            rw.w[r] = static_cast<const uint8_t*>(mat.q) + size_t(n) * row_bytes;
            if constexpr (F::kAffine) {
                rw.s[r] = static_cast<const ST*>(mat.scales) + size_t(n) * gpr;
                rw.b[r] = static_cast<const ST*>(mat.biases) + size_t(n) * gpr;
            }
        }
    };
    struct Round {
        uint4 w[KB][R];
        ST s[F::kAffine ? KB : 1][R], b[F::kAffine ? KB : 1][R];  // raw: no use before pdl_wait()
    };
    auto load_round = [&](const Rows& rw, Round& rd, int c0) {
#pragma unroll
        for (int u = 0; u < KB; ++u) {
            const int c = c0 + u * kWarp + lane;
            if (c >= c_end) continue;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                rd.w[u][r] = load_stream16(rw.w[r] + size_t(c) * 16);
                if constexpr (F::kAffine) {
                    const int g = c * KPC / F::kGroup;
                    rd.s[u][r] = rw.s[r][g];
                    rd.b[u][r] = rw.b[r][g];
                }
            }
        }
    };

    Rows rw;
    Round rd;
    int tile = blockIdx.x;

    // PIPE: the issue cursor walks this warp's rounds (tile by tile, c0 by c0) `depth` rounds ahead
    // of the compute; every call commits one group (empty past the end) so the count stays uniform.
    using Pipe = QPipe<F>;
    const char* ring = reinterpret_cast<const char*>(smem4) + qpipe_ring_offset<F>(k, TR) + size_t(warp) * depth * Pipe::kStageBytes;
    const int rounds_per_tile = ceil_div(c_end - c_begin, kWarp * KB);
    int it_left = PIPE && tile < tiles ? ceil_div(tiles - tile, gridDim.x) * rounds_per_tile : 0;
    int it_tile = tile, it_c0 = c_begin, it_stage = 0;
    Rows it_rw;
    auto issue = [&]() {
        if (it_left > 0) {
            if (it_c0 == c_begin) rows_of(it_tile, it_rw);
            const uint32_t st = smem_addr(ring + it_stage * Pipe::kStageBytes);
#pragma unroll
            for (int u = 0; u < KB; ++u) {
                const int c = it_c0 + u * kWarp + lane;
                if (c >= c_end) continue;
#pragma unroll
                for (int r = 0; r < R; ++r) cp_async16(st + ((u * R + r) * kWarp + lane) * 16, it_rw.w[r] + size_t(c) * 16);
            }
            if constexpr (F::kAffine) {
                constexpr int P = Pipe::kPieces;
                const int g0 = it_c0 * KPC / F::kGroup;
                const int valid = min(c_end - it_c0, kWarp * KB) * KPC / F::kGroup * int(sizeof(ST));  // whole pieces (host check)
                for (int idx = lane; idx < R * 2 * P; idx += kWarp) {
                    const int slot = idx / P, piece = idx % P;  // slot = row * 2 + (0 scales, 1 biases)
                    if (piece * 16 >= valid) continue;
                    const ST* src = it_rw.s[0];
#pragma unroll
                    for (int q = 0; q < R * 2; ++q)
                        if (slot == q) src = q & 1 ? it_rw.b[q / 2] : it_rw.s[q / 2];
                    cp_async16(st + Pipe::kWeightBytes + idx * 16, reinterpret_cast<const char*>(src + g0) + piece * 16);
                }
            }
            --it_left;
            it_c0 += kWarp * KB;
            if (it_c0 >= c_end) {
                it_c0 = c_begin;
                it_tile += gridDim.x;
            }
        }
        cp_async_commit();
        it_stage = it_stage + 1 == depth ? 0 : it_stage + 1;
    };

    if constexpr (PIPE) {
        for (int d = 0; d < depth; ++d) issue();  // weights never depend on an earlier kernel
    } else if (tile < tiles) {
        rows_of(tile, rw);
        load_round(rw, rd, c_begin);
    }
    pdl_wait();

    // Stage x (x * norm_w), the int4 chunk sums, the norm's 1 / rms; all threads take part in the
    // shuffles (the loop count is uniform), so the sums' order is fixed by k only.
    {
        const int k4 = k / 4;
        float ss[TR];
#pragma unroll
        for (int t = 0; t < TR; ++t) ss[t] = 0.0f;
        for (int i0 = 0; i0 < k4; i0 += kSWarps * kWarp) {
            const int i = i0 + threadIdx.x;
            const bool in = i < k4;
            float4 nw = make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            if (NORM && in) nw = __ldg(reinterpret_cast<const float4*>(p.norm_w) + i);
#pragma unroll
            for (int t = 0; t < TR; ++t) {
                if (t >= rows) break;
                float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (in) v = __ldg(reinterpret_cast<const float4*>(p.x + size_t(tok0 + t) * k) + i);
                if constexpr (NORM) {
                    ss[t] = fmaf(v.x, v.x, ss[t]);
                    ss[t] = fmaf(v.y, v.y, ss[t]);
                    ss[t] = fmaf(v.z, v.z, ss[t]);
                    ss[t] = fmaf(v.w, v.w, ss[t]);
                    v.x *= nw.x; v.y *= nw.y; v.z *= nw.z; v.w *= nw.w;
                }
                if constexpr (F::kAffine) {
                    float s = (v.x + v.y) + (v.z + v.w);  // a 32-k chunk is 8 consecutive lanes
                    s += __shfl_xor_sync(0xffffffffu, s, 1);
                    s += __shfl_xor_sync(0xffffffffu, s, 2);
                    s += __shfl_xor_sync(0xffffffffu, s, 4);
                    if (in && (lane & 7) == 0) csum[size_t(t) * (k / 32) + i / 8] = s;
                    v.x *= qs_x_scale(0); v.y *= qs_x_scale(1); v.z *= qs_x_scale(2); v.w *= qs_x_scale(3);  // k % 4 = 0..3
                }
                if (in) smem4[size_t(t) * k4 + qs_swz(i)] = v;
            }
        }
        if constexpr (NORM) {
#pragma unroll
            for (int t = 0; t < TR; ++t) {
                const float s = warp_sum(ss[t]);
                if (lane == 0) red[t][warp] = s;
            }
        }
        __syncthreads();
        if constexpr (NORM) {
            if (threadIdx.x < TR) {
                float s = 0.0f;
                for (int w = 0; w < kSWarps; ++w) s += red[threadIdx.x][w];
                inv_rms[threadIdx.x] = 1.0f / sqrtf(s / float(k) + p.eps);
            }
            __syncthreads();
        }
    }
    const float4* xs4 = smem4;
    int cs = 0;  // PIPE: the stage of the round being computed

    for (; tile < tiles; tile += gridDim.x) {
        if (tile != int(blockIdx.x)) {
            if (!PIPE || ks > 1) __syncthreads();  // the last tile's partials are read
            if constexpr (!PIPE) {
                rows_of(tile, rw);
                load_round(rw, rd, c_begin);
            }
        }
        float acc[R][TR];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < TR; ++t) acc[r][t] = 0.0f;
        for (int c0 = c_begin; c0 < c_end; c0 += kWarp * KB) {
            const char* stage = ring + cs * Pipe::kStageBytes;
            if constexpr (PIPE) {
                cp_async_wait(depth - 1);  // this round's group (committed depth groups ago) has landed
                __syncwarp();              // and the other lanes' scale pieces are visible
            } else if (c0 != c_begin) {
                load_round(rw, rd, c0);
            }
#pragma unroll
            for (int u = 0; u < KB; ++u) {
                const int c = c0 + u * kWarp + lane;
                if (c >= c_end) continue;
                uint4 wv[R];
                ST sv[F::kAffine ? R : 1], bv[F::kAffine ? R : 1];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if constexpr (PIPE) {
                        wv[r] = *reinterpret_cast<const uint4*>(stage + ((u * R + r) * kWarp + lane) * 16);
                        if constexpr (F::kAffine) {
                            const ST* sc = reinterpret_cast<const ST*>(stage + Pipe::kWeightBytes);
                            const int gl = (u * kWarp + lane) * KPC / F::kGroup;
                            sv[r] = sc[(r * 2) * Pipe::kGroups + gl];
                            bv[r] = sc[(r * 2 + 1) * Pipe::kGroups + gl];
                        }
                    } else {
                        wv[r] = rd.w[u][r];
                        if constexpr (F::kAffine) {
                            sv[r] = rd.s[u][r];
                            bv[r] = rd.b[u][r];
                        }
                    }
                }
                float aq[R][TR];
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int t = 0; t < TR; ++t) aq[r][t] = 0.0f;
#pragma unroll
                for (int j = 0; j < X4; ++j) {  // the chunk's x float4s in k order
                    float q[R][4];
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        if constexpr (F::kAffine) {
                            const uint32_t w = word_of(wv[r], j / 2);
                            qs_u4_half(j & 1 ? w >> 16 : w, q[r]);
                        } else {
                            F::unpack(word_of(wv[r], j), q[r]);
                        }
                    }
#pragma unroll
                    for (int t = 0; t < TR; ++t) {
                        if (t >= rows) break;
                        const float4 xv = xs4[size_t(t) * (k / 4) + qs_swz(c * X4 + j)];
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            aq[r][t] = fmaf(xv.x, q[r][0], aq[r][t]);
                            aq[r][t] = fmaf(xv.y, q[r][1], aq[r][t]);
                            aq[r][t] = fmaf(xv.z, q[r][2], aq[r][t]);
                            aq[r][t] = fmaf(xv.w, q[r][3], aq[r][t]);
                        }
                    }
                }
#pragma unroll
                for (int t = 0; t < TR; ++t) {
                    if (t >= rows) break;
                    if constexpr (F::kAffine) {
                        const float xsum = csum[size_t(t) * (k / 32) + c];
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            const float s = to_f32(sv[r]) * 0x1p60f;  // the int4 products carry 2^-60
                            acc[r][t] = fmaf(to_f32(bv[r]), xsum, fmaf(s, aq[r][t], acc[r][t]));
                        }
                    } else {
#pragma unroll
                        for (int r = 0; r < R; ++r) acc[r][t] += aq[r][t];
                    }
                }
            }
            if constexpr (PIPE) {
                __syncwarp();  // every lane is done with this stage before it is refilled
                issue();
                cs = cs + 1 == depth ? 0 : cs + 1;
            }
        }
        // Every lane ends with every sum (xor butterfly: the same bits in every lane).
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < TR; ++t) acc[r][t] = warp_sum(acc[r][t]);
        if (ks > 1) {
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int t = 0; t < TR; ++t) partial[warp][r * TR + t] = acc[r][t];
            }
            __syncthreads();
            if (split == 0) {
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int t = 0; t < TR; ++t) {
                        float v = 0.0f;
                        for (int s = 0; s < ks; ++s) v += partial[warp + s][r * TR + t];
                        acc[r][t] = v;
                    }
            }
        }
        if (split != 0) continue;
        const int n0 = tile * rows_per_block + (warp / ks) * WROWS;
#pragma unroll
        for (int r = 0; r < WROWS; ++r)
#pragma unroll
            for (int t = 0; t < TR; ++t) {
                int n = n0 + r;
                if (lane != r * TR + t || t >= rows || n >= n_total) continue;
                const float inv = NORM ? inv_rms[t] : 1.0f;
                const size_t tok = size_t(tok0 + t);
                if constexpr (SWIGLU) {
                    float gate = acc[r][t], up = acc[r + WROWS][t];
                    if constexpr (!F::kAffine) {
                        gate *= qrow_scale<F>(p.mat[0].scales, n);
                        up *= qrow_scale<F>(p.mat[1].scales, n);
                    }
                    if constexpr (NORM) {
                        gate *= inv;
                        up *= inv;
                    }
                    p.mat[0].y[tok * p.mat[0].n + n] = silu(gate) * up;
                } else {
                    const QuantMat& mat = p.mat[qmat_of(p, n)];
                    float v = acc[r][t];
                    if constexpr (!F::kAffine) v *= qrow_scale<F>(mat.scales, n);
                    if constexpr (NORM) v *= inv;
                    if (mat.bias) v += mat.bias[n];
                    const size_t at = tok * mat.n + n;
                    if (p.residual) v = p.residual[at] + v;
                    mat.y[at] = v;
                }
            }
    }
}

// K split of quant_smem_kernel: warps per weight-row group, from the shape, the format and the kernel
// variant only (never the number of token rows): the most (1, 2, 4, 8) with whole chunks per split,
// at least one chunk per lane, and every warp of the launch resident at once (row groups x split <=
// resident warps of the one-token-row variant).
inline int quant_smem_split(int row_groups, int chunks, int resident_warps) {
    int ks = 1;
    while (ks < kSWarps && chunks % (2 * ks) == 0 && chunks / (2 * ks) >= kWarp &&
           int64_t(row_groups) * 2 * ks <= resident_warps)
        ks *= 2;
    return ks;
}
inline int& qsmem_last_split() {
    static thread_local int s = 0;
    return s;
}

inline int qsmem_smem_optin() {  // the most dynamic shared memory one block may ask for
    static const int bytes = [] {
        int dev = 0, n = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
        return n;
    }();
    return bytes;
}

// The dynamic shared memory a launch of this variant may use (set as its attribute once): the
// register variant kSSmemMax, the ring variant what the device grants beyond its static arrays.
template <class F, int TR, bool SWIGLU, bool NORM, bool PIPE = false>
size_t qsmem_max_dynamic() {
    static const size_t bytes = [] {
        cudaFuncAttributes fa = {};
        cudaFuncGetAttributes(&fa, quant_smem_kernel<F, TR, SWIGLU, NORM, PIPE>);
        const size_t b = PIPE ? size_t(qsmem_smem_optin()) - fa.sharedSizeBytes : size_t(kSSmemMax);
        cudaFuncSetAttribute(quant_smem_kernel<F, TR, SWIGLU, NORM, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(b));
        return b;
    }();
    return bytes;
}

template <class F, int TR, bool SWIGLU, bool NORM, bool PIPE = false>
int qsmem_blocks_per_sm(size_t smem) {
    if (smem > qsmem_max_dynamic<F, TR, SWIGLU, NORM, PIPE>()) return 0;
    int blocks = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, quant_smem_kernel<F, TR, SWIGLU, NORM, PIPE>, kSWarps * kWarp, smem);
    return blocks;
}
inline int qsmem_sms() { return device_sm_count(); }

// The ring depth of the pipelined one-token-row launch (SCR_CUDA_QSTREAM, read once; tests set
// qsmem_pipe_override()): unset or `auto` picks below, `0` runs the register path (no ring),
// `2`-`4` forces that depth. Either way a row's bits are the same: only where the weights wait differs.
inline int& qsmem_pipe_override() {
    static int v = -2;  // -2: none (the environment decides)
    return v;
}
inline int qsmem_pipe_mode() {
    static const int mode = [] {
        const char* e = std::getenv("SCR_CUDA_QSTREAM");
        if (!e || !*e || std::strcmp(e, "auto") == 0) return -1;
        return int(env_int_switch("SCR_CUDA_QSTREAM", -1, [](long long d) { return d == 0 || (d >= 2 && d <= 4); }, "auto, 0, 2, 3 or 4", "auto"));
    }();
    return qsmem_pipe_override() != -2 ? qsmem_pipe_override() : mode;
}
inline int& qsmem_last_depth() {
    static thread_local int d = 0;
    return d;
}

// Whether the ring takes this launch: every round's scales and biases must be whole 16-byte pieces
// at 16-byte aligned addresses (row strides, split starts and tensors), as cp.async copies them.
template <class F>
bool qpipe_layout_ok(const QuantFusedArgs& a, int ks) {
    if constexpr (F::kAffine) {
        using ST = typename F::Scale;
        const int chunks = a.k / F::kElems, per_split = chunks / ks;
        const int gpr = a.k / F::kGroup;
        if (size_t(gpr) * sizeof(ST) % 16 != 0 || per_split * F::kElems % F::kGroup != 0 ||
            size_t(per_split * F::kElems / F::kGroup) * sizeof(ST) % 16 != 0)
            return false;
        for (int m = 0; m < a.nmat; ++m)
            if (reinterpret_cast<uintptr_t>(a.mat[m].scales) % 16 || reinterpret_cast<uintptr_t>(a.mat[m].biases) % 16) return false;
    }
    return true;
}

// Ring depth for a one-token-row launch of `tiles` row tiles, 0 for the register path. `auto`: depth 2
// (two blocks per SM still fit) for the affine formats when each block streams at least 8 rounds;
// elsewhere the register path. Measured on the H200 (docs/CUDA.md, "The cp.async ring"): int4-g64
// lm_head 1.20x at both 1B and 8B shapes (15 and 30 rounds per block, where the register path
// waits out its scale loads and a tile boundary every round or two), 14336x4096 level (7 rounds),
// the launches of 1-4 rounds per block 6-14 % slower, int8 no faster; depths 3-4 (one block per SM)
// slower everywhere.
template <class F, bool SWIGLU, bool NORM>
int qpipe_depth(const QuantFusedArgs& a, int ks, int tiles) {
    const int mode = qsmem_pipe_mode();
    if (mode == 0 || !qpipe_layout_ok<F>(a, ks)) return 0;
    const auto smem = [&](int d) { return qpipe_ring_offset<F>(a.k, 1) + size_t(kSWarps) * d * QPipe<F>::kStageBytes; };
    const auto blocks = [&](int d) { return qsmem_blocks_per_sm<F, 1, SWIGLU, NORM, true>(smem(d)); };
    if (mode > 0) return blocks(mode) >= 1 ? mode : 0;
    if (!F::kAffine || blocks(2) < 2) return 0;
    const int grid = std::min(tiles, 2 * qsmem_sms());
    const int rounds_per_tile = ceil_div(a.k / F::kElems / ks, kWarp * kSBatch);
    return int64_t(ceil_div(tiles, grid)) * rounds_per_tile >= 8 ? 2 : 0;
}

template <class F, int TR, bool SWIGLU, bool NORM>
void launch_quant_smem_tile(const Ctx& c, const QuantFusedArgs& a, int n_total) {
    const int wrows = SWIGLU ? kSRows / 2 : kSRows;
    const int row_groups = ceil_div(n_total, wrows);
    const int chunks = a.k / F::kElems;
    // The K split (so every row's summation order) comes from the register variant's occupancy,
    // whichever variant runs.
    const int resident1 = qsmem_sms() * std::max(1, qsmem_blocks_per_sm<F, 1, SWIGLU, NORM>(qsmem_bytes<F>(a.k, 1))) * kSWarps;
    const int ks = quant_smem_split(row_groups, chunks, resident1);
    qsmem_last_split() = ks;
    const int tiles = ceil_div(n_total, (kSWarps / ks) * wrows);
    const int groups = ceil_div(a.rows, TR);
    const dim3 block(kSWarps * kWarp);
    if constexpr (TR == 1) {
        if (const int depth = qpipe_depth<F, SWIGLU, NORM>(a, ks, tiles); depth > 0) {
            qsmem_last_depth() = depth;
            const size_t smem = qpipe_ring_offset<F>(a.k, 1) + size_t(kSWarps) * depth * QPipe<F>::kStageBytes;
            const int resident = qsmem_sms() * qsmem_blocks_per_sm<F, 1, SWIGLU, NORM, true>(smem);
            launch_smem(c, quant_smem_kernel<F, 1, SWIGLU, NORM, true>, dim3(std::max(1, std::min(tiles, resident / groups)), groups),
                        block, smem, a, ks, depth);
            return;
        }
    }
    qsmem_last_depth() = 0;
    const size_t smem = qsmem_bytes<F>(a.k, TR);
    const int resident = qsmem_sms() * std::max(1, qsmem_blocks_per_sm<F, TR, SWIGLU, NORM>(smem));
    launch_smem(c, quant_smem_kernel<F, TR, SWIGLU, NORM>, dim3(std::max(1, std::min(tiles, resident / groups)), groups), block, smem,
                a, ks, 0);
}

// 1-8 token rows: as many per block as shared memory allows (up to 4), the rest in more blocks.
template <class F, bool SWIGLU, bool NORM>
void launch_quant_smem(const Ctx& c, const QuantFusedArgs& a) {
    int n_total = a.mat[0].n;
    if (!SWIGLU)
        for (int m = 1; m < a.nmat; ++m) n_total += a.mat[m].n;
    const int tile = std::min(qsmem_tile_cap<F>(a.k), a.rows <= 1 ? 1 : a.rows <= 2 ? 2 : 4);
    if (tile == 1) launch_quant_smem_tile<F, 1, SWIGLU, NORM>(c, a, n_total);
    else if (tile == 2) launch_quant_smem_tile<F, 2, SWIGLU, NORM>(c, a, n_total);
    else launch_quant_smem_tile<F, 4, SWIGLU, NORM>(c, a, n_total);
}

// What the shared-memory kernel takes: 1-8 token rows, K in whole 32-k chunks (int4) / 16-k
// (int8, fp8) with one token row of x in kSSmemMax, 16-byte aligned weights and x, norm weight.
template <class F>
bool quant_smem_fits(const QuantFusedArgs& a) {
    const auto aligned = [](const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
    if (a.rows < 1 || a.rows > 8 || a.k % F::kElems != 0 || a.k % 32 != 0 || qsmem_bytes<F>(a.k, 1) > size_t(kSSmemMax))
        return false;
    if (!aligned(a.x, 16) || (a.norm_w && !aligned(a.norm_w, 16))) return false;
    for (int m = 0; m < a.nmat; ++m)
        if (!aligned(a.mat[m].q, 16)) return false;
    return true;
}

}  // namespace qdetail
}  // namespace scr::kernels::cuda

#include "kernels/cuda/quant_mma1.cuh"
#include "kernels/cuda/quant_staged.cuh"
#include "kernels/cuda/quant_wide.cuh"
#include "kernels/cuda/quant_prefill.cuh"

namespace scr::kernels::cuda {

// Which kernel quant_linear runs (SCR_CUDA_QUANT_GEMV, read once):
//   `tc1` (default): 1 to qmma1_max_rows() (2) token rows of an MLX int4 format on the int8
//           tensor-core kernel (quant_mma1_kernel; its SwiGLU form one row, 2 rows of SwiGLU as
//           a grouped launch, quant_swiglu_grouped: regimes 1 | 2 | 3+ there), one row of int8 /
//           fp8 on the shared-memory kernel; other rows as `smem1`;
//   `smem1`: one token row on the shared-memory SIMT kernel (quant_smem_kernel), 2+ rows
//           on the tensor-core kernel: each regime on the kernel that measured fastest for it
//           (Llama-3.2-1B on the H200, docs/CUDA.md: batch 1 int4-g64 1,347-1,353 tok/s on the
//           shared-memory kernel vs 1,201 on the tensor-core one; batch 8 6,298 vs 2,917 the other
//           way round);
//   `mma`: the tensor-core kernel for every row count;
//   `smem`: 1-8 token rows on the shared-memory kernel, more rows on the tensor-core one;
//   `simt`: the first SIMT kernel (quant_gemv_kernel; unfused launches only).
// A shape or layout a kernel does not take falls back (smem -> mma -> simt). Within each regime
// (1 row and 2+ rows for `smem1`; 1-8 and 9+ for `smem`; all rows for `mma`; for `tc1` on MLX int4
// 1-2 rows, SwiGLU 1 | 2, and 3+) the choice depends on the shape only, so a decode row's bits
// never depend on the other rows of its regime. (One exception: a K so long that 2 rows of staged x
// exceed a block's shared memory, > ~36k, runs its 2-row launches on quant_mma_kernel; no model
// here comes near.)
enum class QuantGemvPath { automatic, simt, mma, smem, smem1, tc1 };

inline QuantGemvPath quant_gemv_mode() {
    static const QuantGemvPath mode = env_choice_switch("SCR_CUDA_QUANT_GEMV", QuantGemvPath::tc1,
                                                        {{"tc1", QuantGemvPath::tc1},
                                                         {"smem1", QuantGemvPath::smem1},
                                                         {"mma", QuantGemvPath::mma},
                                                         {"smem", QuantGemvPath::smem},
                                                         {"simt", QuantGemvPath::simt}},
                                                        "tc1");
    return mode;
}

// Whether a SwiGLU launch (gate and up rows, silu(g) * u) of `rows` token rows runs as one grouped
// launch of the two matrices into the caller's scratch and then the silu*mul kernel
// (kernels/cuda/quant_ops.cuh, qlinear_swiglu): at 2 to qmma1_max_rows() (2) rows of an MLX int4
// format, where quant_mma1_kernel takes two rows in its one-matrix and grouped forms but not in the
// SwiGLU one (whose accumulators for 2 rows need 196 registers against its 128; 4 rows 255). 1 row
// stays fused; 3+ fused on quant_mma_kernel.
// SCR_CUDA_QUANT_TC1_SWIGLU=fused keeps such launches fused on quant_mma_kernel (A/B runs).
// Only with the default form of the one-row kernel (SCR_CUDA_QUANT_TC1_VARIANT=wide2); the A/B forms
// take one row.
template <class F>
bool quant_swiglu_grouped(int rows) {
    static const bool on = env_choice_switch("SCR_CUDA_QUANT_TC1_SWIGLU", true, {{"grouped", true}, {"fused", false}}, "grouped");
    return F::kAffine && on && rows >= 2 && rows <= qdetail::qmma1_max_rows() && quant_gemv_mode() == QuantGemvPath::tc1 &&
           qdetail::qmma1_variant() == qdetail::QMma1Variant::wide2;
}

// y = x W^T (+ bias) (+ residual) for any number of rows (decode-sized batches are the fast case).
// F: qdetail::MlxInt4<G, ST> or qdetail::Int8Channel<ST>.
template <class F>
void quant_linear(const Ctx& c, const QuantLinearArgs& a, QuantGemvPath path = QuantGemvPath::automatic) {
    if (a.rows <= 0) return;
    const int align = F::kAffine ? F::kGroup : F::kElems;
    // std::invalid_argument, not scr::Error: fmt (error.hpp) does not compile in nvcc's C++20 host pass.
    if (a.n <= 0 || a.k <= 0 || a.k % align != 0)
        throw std::invalid_argument("quant_linear: K = " + std::to_string(a.k) + " must be a positive multiple of " +
                    std::to_string(align) + " (N = " + std::to_string(a.n) + ")");
    if (!a.q || !a.scales || (F::kAffine && !a.biases) || !a.x || !a.y)
        throw std::invalid_argument("quant_linear: missing weight, scale, bias, input or output pointer");
    // 33-256 rows: one read of the weights per 64 rows (quant_wide.cuh, when on for F), before cuBLASLt.
    if ((path == QuantGemvPath::tc1 || (path == QuantGemvPath::automatic && quant_gemv_mode() == QuantGemvPath::tc1)) &&
        qdetail::launch_quant_wide<F, false, false>(c, qdetail::fused_of(a)))
        return;
    // Prefill-sized calls on cuBLASLt (quant_prefill.cuh); an explicit path is a test's A/B of the kernels.
    if (path == QuantGemvPath::automatic && qdetail::quant_prefill<F, false, false>(c, qdetail::fused_of(a)) == 1) return;
    if (path == QuantGemvPath::automatic) path = quant_gemv_mode();
    if constexpr (F::kAffine) {
        if (path == QuantGemvPath::tc1 && a.rows <= qdetail::qmma1_max_rows()) {
            const QuantFusedArgs fa = qdetail::fused_of(a);
            if (qdetail::quant_mma1_fits<F>(fa) && qdetail::launch_quant_mma1<F, false, false>(c, fa)) return;
        }
        if (path == QuantGemvPath::tc1 && a.rows >= qdetail::kQsMinRows && a.rows <= qdetail::qstaged_max_rows() &&
            qdetail::launch_quant_staged<F, false, false>(c, qdetail::fused_of(a)))
            return;
    }
    if (path == QuantGemvPath::tc1) path = QuantGemvPath::smem1;
    if (((path == QuantGemvPath::smem && a.rows <= 8) || (path == QuantGemvPath::smem1 && a.rows == 1)) && a.n > 0) {
        const QuantFusedArgs fa = qdetail::fused_of(a);
        if (qdetail::quant_smem_fits<F>(fa)) {
            qdetail::launch_quant_smem<F, false, false>(c, fa);
            return;
        }
    }
    if (path != QuantGemvPath::simt && qdetail::quant_mma_fits<F>(a)) {
        qdetail::launch_quant_mma_rows<F, false, false>(c, qdetail::fused_of(a));
        return;
    }
    if (a.rows <= 1) qdetail::launch_quant_gemv_split<F, 1>(c.stream, a);
    else if (a.rows <= 2) qdetail::launch_quant_gemv_split<F, 2>(c.stream, a);
    else if (a.rows <= 4) qdetail::launch_quant_gemv_split<F, 4>(c.stream, a);
    else qdetail::launch_quant_gemv_split<F, qdetail::kQTile>(c.stream, a);
}

// Grouped / SwiGLU / folded-RMSNorm launch (QuantFusedArgs) on the tensor-core kernel. Returns false
// (nothing launched) when that kernel does not take the shape or layout (quant_mma_fits): the caller
// then runs the unfused launches (kernels/cuda/quant_ops.cuh). Batch-invariant as quant_linear.
template <class F, bool SWIGLU, bool NORM>
bool quant_linear_fused(const Ctx& c, const QuantFusedArgs& a, QuantGemvPath path = QuantGemvPath::automatic) {
    if (a.rows <= 0) return true;
    if (a.nmat < 1 || a.nmat > 3 || (SWIGLU && (a.nmat != 2 || a.mat[0].n != a.mat[1].n)) || (a.residual && a.nmat != 1) ||
        (SWIGLU && a.residual) || NORM != (a.norm_w != nullptr) || a.k <= 0)
        throw std::invalid_argument("quant_linear_fused: inconsistent arguments (matrices, SwiGLU, residual or norm)");
    for (int m = 0; m < a.nmat; ++m)
        if (!a.mat[m].q || !a.mat[m].scales || (F::kAffine && !a.mat[m].biases) || !a.mat[m].y || a.mat[m].n <= 0)
            throw std::invalid_argument("quant_linear_fused: matrix " + std::to_string(m) + " lacks a tensor, an output or rows");
    if (!a.x) throw std::invalid_argument("quant_linear_fused: no input");
    // 33-256 rows (quant_wide.cuh, when on for F), before cuBLASLt
    if ((path == QuantGemvPath::tc1 || (path == QuantGemvPath::automatic && quant_gemv_mode() == QuantGemvPath::tc1)) &&
        qdetail::launch_quant_wide<F, SWIGLU, NORM>(c, a))
        return true;
    if (path == QuantGemvPath::automatic) {
        // Prefill-sized calls on cuBLASLt (quant_prefill.cuh); an explicit path is a test's A/B of the kernels.
        const int count = SWIGLU ? 1 : a.nmat;
        const int done = qdetail::quant_prefill<F, SWIGLU, NORM>(c, a);
        if (done == count) return true;
        if (done > 0) {  // a cuBLASLt call failed midway (never with one matrix): the rest on the kernels
            QuantFusedArgs rest = a;
            rest.nmat = count - done;
            for (int m = 0; m < rest.nmat; ++m) rest.mat[m] = a.mat[done + m];
            return quant_linear_fused<F, SWIGLU, NORM>(c, rest, quant_gemv_mode());
        }
        path = quant_gemv_mode();
    }
    if constexpr (F::kAffine) {
        if (path == QuantGemvPath::tc1 && a.rows <= qdetail::qmma1_max_rows() && qdetail::quant_mma1_fits<F>(a) &&
            qdetail::launch_quant_mma1<F, SWIGLU, NORM>(c, a))
            return true;
        if (path == QuantGemvPath::tc1 && a.rows >= qdetail::kQsMinRows && a.rows <= qdetail::qstaged_max_rows() &&
            qdetail::launch_quant_staged<F, SWIGLU, NORM>(c, a))
            return true;
    }
    if (path == QuantGemvPath::tc1) path = QuantGemvPath::smem1;
    if (((path == QuantGemvPath::smem && a.rows <= 8) || (path == QuantGemvPath::smem1 && a.rows == 1)) &&
        qdetail::quant_smem_fits<F>(a)) {
        qdetail::launch_quant_smem<F, SWIGLU, NORM>(c, a);
        return true;
    }
    if (!qdetail::quant_mma_fits<F>(a)) return false;
    qdetail::launch_quant_mma_rows<F, SWIGLU, NORM>(c, a);
    return true;
}

}  // namespace scr::kernels::cuda
