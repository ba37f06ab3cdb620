// Decode GEMV over quantized weights, dequantized in registers (never written out as floats):
//   y[t][n] = sum_k x[t][k] * w[n][k] (+ bias[n]) (+ residual[t][n]),  x, y float32, f32 accumulation.
//
// Weight layouts, exactly as the checkpoints store them (models/quant/*.json):
//   MlxInt4<G, ST>:    q uint32 [N][K/8], element 0 in the low nibble; scales, biases ST [N][K/G];
//                      w = scale * q + bias (MLX affine, G = 32, 64 or 128).
//   Int8Channel<ST>:   q int8 [N][K]; scale ST [N] (the checkpoint's [N, 1]); w = scale * q
//                      (compressed-tensors int-quantized W8A16, per output channel, symmetric).
//
// Streaming the packed bytes at HBM speed leaves few instructions per weight (int4 at ~4.2 TB/s is
// ~32 weights per clock per SM), so:
//  * packed weights: 16-byte `ld.global.nc.L1::no_allocate` loads, consecutive lanes on
//    consecutive 16-byte chunks of a row, 8 loads per lane in flight (4 from 2 token rows up);
//  * q -> float without I2F (16/clk/SM on Hopper, too slow): the bits are OR-ed into the mantissa
//    of a power of two, which is then subtracted (exact): one LOP3 + one FADD per weight;
//  * the affine part is factored out of the dot product per 16-byte chunk (one chunk never spans
//    two groups since G >= 32): sum x*(s*q + b) = s*sum(x*q) + b*sum(x), so the inner loop is one
//    FMA per weight per token row;
//  * each warp carries 4 output rows, so every activation load from L1 feeds 4 weight rows.
// Up to 8 token rows per block; more rows run as 8-row groups in adjacent blocks (the repeated
// weight reads then hit L2), as the dense GEMV does (linear.cuh). No tensor-core path: a quantized
// prefill through this kernel is correct but slow. A row's arithmetic does not depend on the other
// rows, so results are batch-invariant.
//
// Measured on the H200 (docs/CUDA.md, "Quantized GEMV"): int8 58-93 % of the copy bandwidth at batch 1
// on the large shapes, int4 only 28-38 %: a lane's 16 bytes are 32 consecutive int4 weights, so its
// 32 activations are 128 bytes and each x load of a warp touches 32 L1 lines. Repacking the words at
// upload (lane l holding words l, l+32, l+64, l+96 of each 512-byte span) is the planned fix.
#pragma once

#include <cstring>
#include <stdexcept>
#include <string>

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

template <int G, typename ST>
struct MlxInt4 {
    using Scale = ST;
    static constexpr int kGroup = G;
    static constexpr int kElems = 32;  // weights per 16-byte chunk
    static constexpr int kPerWord = 8;
    static constexpr bool kAffine = true;  // per-group scale and bias (else: one scale per row)
    static_assert(G % kElems == 0, "a 16-byte chunk must lie inside one group");
    __device__ __forceinline__ static void unpack(uint32_t w, float (&q)[kPerWord]) { unpack_u4x8(w, q); }
};

template <typename ST>
struct Int8Channel {
    using Scale = ST;
    static constexpr int kGroup = 0;
    static constexpr int kElems = 16;
    static constexpr int kPerWord = 4;
    static constexpr bool kAffine = false;
    __device__ __forceinline__ static void unpack(uint32_t w, float (&q)[kPerWord]) { unpack_s8x4(w, q); }
};

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
            if constexpr (!F::kAffine) v *= to_f32(static_cast<const ST*>(p.scales)[n]);
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

}  // namespace qdetail

// y = x W^T (+ bias) (+ residual) for any number of rows (decode-sized batches are the fast case).
// F: qdetail::MlxInt4<G, ST> or qdetail::Int8Channel<ST>.
template <class F>
void quant_linear(const Ctx& c, const QuantLinearArgs& a) {
    if (a.rows <= 0) return;
    const int align = F::kAffine ? F::kGroup : F::kElems;
    // std::invalid_argument, not scr::Error: fmt (error.hpp) does not compile in nvcc's C++20 host pass.
    if (a.n <= 0 || a.k <= 0 || a.k % align != 0)
        throw std::invalid_argument("quant_linear: K = " + std::to_string(a.k) + " must be a positive multiple of " +
                    std::to_string(align) + " (N = " + std::to_string(a.n) + ")");
    if (!a.q || !a.scales || (F::kAffine && !a.biases) || !a.x || !a.y)
        throw std::invalid_argument("quant_linear: missing weight, scale, bias, input or output pointer");
    if (a.rows <= 1) qdetail::launch_quant_gemv_split<F, 1>(c.stream, a);
    else if (a.rows <= 2) qdetail::launch_quant_gemv_split<F, 2>(c.stream, a);
    else if (a.rows <= 4) qdetail::launch_quant_gemv_split<F, 4>(c.stream, a);
    else qdetail::launch_quant_gemv_split<F, qdetail::kQTile>(c.stream, a);
}

}  // namespace scr::kernels::cuda
