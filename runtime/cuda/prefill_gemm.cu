// Prefill-sized bf16 linears on cuBLASLt: see prefill_gemm.hpp.
#include "runtime/cuda/prefill_gemm.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <mutex>
#include <tuple>

#include "kernels/cuda/env_switch.hpp"

namespace scr::cuda_rt {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;
// The largest quantized matrix prefill_linears_bf16 expands (hi + lo bf16): 1 GiB, e.g. 8B's gate
// (235 MB); larger ones (a 128k-vocabulary lm_head over many rows) stay on the quantized kernels.
constexpr size_t kMaxExpandedBytes = size_t(1) << 30;
// Token rows from which linear.cuh hands a linear to cuBLASLt (SCR_CUDA_CUBLAS_MIN_ROWS overrides):
// measured on the H200 (docs/CUDA.md), cuBLASLt beats the MMA linear from 64 decode rows up
// (Llama-3.2-1B: 15.2k vs 14.2k tok/s at 64, 19.6k vs 18.1k at 256) and loses badly at 16 (4.3k vs 9.0k).
constexpr int kDefaultMinRows = 33;

__global__ void split_hi_lo_kernel(int64_t n, const float* __restrict__ x, __nv_bfloat16* __restrict__ hi, __nv_bfloat16* __restrict__ lo) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = x[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

// The same split, four elements per thread (16-byte load, two 8-byte stores): n % 4 == 0 and x 16-byte
// aligned (hi and lo then 8-byte aligned: the scratch's own layout). Same bits as the kernel above.
__device__ __forceinline__ void split4(float4 v, __nv_bfloat162 (&h)[2], __nv_bfloat162 (&l)[2]) {
    const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const __nv_bfloat16 a = __float2bfloat16_rn(e[2 * i]), b = __float2bfloat16_rn(e[2 * i + 1]);
        h[i] = __halves2bfloat162(a, b);
        l[i] = __halves2bfloat162(__float2bfloat16_rn(e[2 * i] - __bfloat162float(a)),
                                  __float2bfloat16_rn(e[2 * i + 1] - __bfloat162float(b)));
    }
}
__global__ void split_hi_lo_vec4_kernel(int64_t n4, const float4* __restrict__ x, uint2* __restrict__ hi, uint2* __restrict__ lo) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
        __nv_bfloat162 h[2], l[2];
        split4(x[i], h, l);
        hi[i] = make_uint2(reinterpret_cast<const uint32_t&>(h[0]), reinterpret_cast<const uint32_t&>(h[1]));
        lo[i] = make_uint2(reinterpret_cast<const uint32_t&>(l[0]), reinterpret_cast<const uint32_t&>(l[1]));
    }
}

// The split with a folded RMSNorm: one block per row, x[row] * inv_rms * norm_w split into hi and lo
// (the sum of squares reduced in a fixed order: lanes, then warps). k % 4 == 0.
constexpr int kNormSplitThreads = 256;
__global__ void __launch_bounds__(kNormSplitThreads) norm_split_hi_lo_kernel(int k, const float* __restrict__ x,
                                                                             const float* __restrict__ w, float eps, int64_t elems,
                                                                             __nv_bfloat16* __restrict__ hi) {
    const float4* xr = reinterpret_cast<const float4*>(x + size_t(blockIdx.x) * k);
    const int chunks = k / 4;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < chunks; c += kNormSplitThreads) {
        const float4 v = xr[c];
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    __shared__ float part[kNormSplitThreads / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float total = 0.0f;
    for (int i = 0; i < kNormSplitThreads / 32; ++i) total += part[i];
    const float inv = 1.0f / sqrtf(total / float(k) + eps);
    // 8-byte stores of four bf16 each (k % 4 == 0; the scratch rows are 8-byte aligned).
    auto* h = reinterpret_cast<uint2*>(hi + size_t(blockIdx.x) * k);
    auto* l = reinterpret_cast<uint2*>(hi + elems + size_t(blockIdx.x) * k);
    for (int c = threadIdx.x; c < chunks; c += kNormSplitThreads) {
        const float4 v = xr[c], g = reinterpret_cast<const float4*>(w)[c];
        __nv_bfloat162 hv[2], lv[2];
        split4(make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv)), hv, lv);
        h[c] = make_uint2(reinterpret_cast<const uint32_t&>(hv[0]), reinterpret_cast<const uint32_t&>(hv[1]));
        l[c] = make_uint2(reinterpret_cast<const uint32_t&>(lv[0]), reinterpret_cast<const uint32_t&>(lv[1]));
    }
}

// The closing pass of prefill_linears_bf16: output blockIdx.y's halves summed (+ bias, + residual),
// or silu(gate) * up for a SwiGLU output.
struct HalvesOut {
    const float* t = nullptr;   // [2 rows][n]
    const float* u = nullptr;   // SwiGLU: the up projection's [2 rows][n]
    const float* bias = nullptr;
    const float* residual = nullptr;
    float* y = nullptr;
    int n = 0;
    const float* scale = nullptr;    // [n]: per-column factor of t (a WeightExpander's codes' scales), or null
    const float* scale_u = nullptr;  // the same for u
};
struct HalvesArgs {
    HalvesOut out[3];
    int rows = 0;
    int xparts = 2;  // 1: t holds x_hi's products alone (no lo half to add)
};
__global__ void sum_outputs_kernel(const __grid_constant__ HalvesArgs a) {
    const HalvesOut& o = a.out[blockIdx.y];
    const int64_t total = int64_t(a.rows) * o.n;
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        float v = a.xparts == 2 ? o.t[i] + o.t[i + total] : o.t[i];
        if (o.scale) v *= o.scale[i % o.n];
        if (o.u) {
            float u = a.xparts == 2 ? o.u[i] + o.u[i + total] : o.u[i];
            if (o.scale_u) u *= o.scale_u[i % o.n];
            o.y[i] = v * (1.0f / (1.0f + expf(-v))) * u;
            continue;
        }
        if (o.bias) v += o.bias[i % o.n];
        if (o.residual) v = o.residual[i] + v;
        o.y[i] = v;
    }
}

// The closing pass four columns per thread: output blockIdx.z, token rows blockIdx.y, + gridDim.y,
// ..., columns 4 (blockIdx.x * blockDim.x + threadIdx.x). Every n % 4 == 0 and every pointer 16-byte
// aligned (vec4_outputs_ok). The arithmetic, element by element, is sum_outputs_kernel's: same bits.
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// Four columns of one GEMM output at element i: the x halves' products added (t, then t + total),
// then the columns' scale when there is one.
__device__ __forceinline__ void half_sums4(const float* t, int64_t i, int64_t total, int xparts, const float* scale,
                                           const float4& s4, float (&v)[4]) {
    const float4 t0 = ld4(t + i), t1 = xparts == 2 ? ld4(t + i + total) : make_float4(0, 0, 0, 0);
    const float a[4] = {t0.x, t0.y, t0.z, t0.w}, b[4] = {t1.x, t1.y, t1.z, t1.w}, sc[4] = {s4.x, s4.y, s4.z, s4.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        v[j] = xparts == 2 ? a[j] + b[j] : a[j];
        if (scale) v[j] *= sc[j];
    }
}
__global__ void sum_outputs_vec4_kernel(const __grid_constant__ HalvesArgs a) {
    const HalvesOut& o = a.out[blockIdx.z];
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (c >= o.n) return;
    const int64_t total = int64_t(a.rows) * o.n;
    const float4 scale = o.scale ? ld4(o.scale + c) : make_float4(1, 1, 1, 1);
    const float4 scale_u = o.scale_u ? ld4(o.scale_u + c) : make_float4(1, 1, 1, 1);
    const float4 bias = o.bias ? ld4(o.bias + c) : make_float4(0, 0, 0, 0);
    const float bv[4] = {bias.x, bias.y, bias.z, bias.w};
    for (int r = blockIdx.y; r < a.rows; r += gridDim.y) {
        const int64_t i = int64_t(r) * o.n + c;
        float v[4];
        half_sums4(o.t, i, total, a.xparts, o.scale, scale, v);
        if (o.u) {  // SwiGLU: t the gate's products, u the up's
            float u[4];
            half_sums4(o.u, i, total, a.xparts, o.scale_u, scale_u, u);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = v[j] * (1.0f / (1.0f + expf(-v[j]))) * u[j];
        } else {
            const float4 res = o.residual ? ld4(o.residual + i) : make_float4(0, 0, 0, 0);
            const float rv[4] = {res.x, res.y, res.z, res.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (o.bias) v[j] += bv[j];
                if (o.residual) v[j] = rv[j] + v[j];
            }
        }
        *reinterpret_cast<float4*>(o.y + i) = make_float4(v[0], v[1], v[2], v[3]);
    }
}

// SCR_CUDA_PREFILL_PASSES=scalar keeps the one-element-per-thread split and closing passes (A/B
// runs; the same bits either way).
bool vec4_passes() {
    static const bool on = scr::kernels::cuda::env_choice_switch("SCR_CUDA_PREFILL_PASSES", true, {{"vec4", true}, {"scalar", false}}, "vec4");
    return on;
}
bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool vec4_outputs_ok(const HalvesArgs& a, int count) {
    if (!vec4_passes()) return false;
    for (int i = 0; i < count; ++i) {
        const HalvesOut& o = a.out[i];
        if (o.n % 4 != 0 || !aligned16(o.t) || !aligned16(o.y) || (o.u && !aligned16(o.u)) || (o.bias && !aligned16(o.bias)) ||
            (o.residual && !aligned16(o.residual)) || (o.scale && !aligned16(o.scale)) || (o.scale_u && !aligned16(o.scale_u)))
            return false;
    }
    return true;
}

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 8192)); }

// x [elems] as bf16 hi (x2) and lo (x2 + elems).
void split_x(cudaStream_t stream, int64_t elems, const float* x, __nv_bfloat16* x2) {
    if (vec4_passes() && elems % 4 == 0 && aligned16(x) && reinterpret_cast<uintptr_t>(x2) % 8 == 0)
        split_hi_lo_vec4_kernel<<<blocks_for(elems / 4), 256, 0, stream>>>(elems / 4, reinterpret_cast<const float4*>(x),
                                                                          reinterpret_cast<uint2*>(x2), reinterpret_cast<uint2*>(x2 + elems));
    else
        split_hi_lo_kernel<<<blocks_for(elems), 256, 0, stream>>>(elems, x, x2, x2 + elems);
}

bool enabled() {
    return scr::kernels::cuda::prefill_gemm_choice() == scr::kernels::cuda::PrefillGemm::cublaslt;
}

// SCR_CUDA_PREFILL_X=bf16: prefill-sized calls (above the decode buckets) multiply x rounded to bf16
// alone, one GEMM operand instead of hi + lo: half the GEMM work, the activation rounding every
// bf16 engine does (~2^-9 relative per product instead of ~2^-17). Default `hilo`.
bool prefill_x_bf16() {
    static const bool on = scr::kernels::cuda::env_choice_switch("SCR_CUDA_PREFILL_X", false, {{"hilo", false}, {"bf16", true}}, "hilo");
    return on;
}

bool capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone;
}

// y[r][j] = t[r][j] + t[rows + r][j] (+ bias[j]) (+ residual[r][j]): the hi and lo halves of one
// stacked GEMM summed. residual may be y.
__global__ void sum_halves_kernel(int64_t total, int n, const float* __restrict__ t, const float* __restrict__ bias,
                                  const float* residual, float* y) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        float v = t[i] + t[i + total];
        if (bias) v += bias[i % n];
        if (residual) v = residual[i] + v;
        y[i] = v;
    }
}

// y = silu(g_hi + g_lo) * (u_hi + u_lo)
__global__ void swiglu_halves_kernel(int64_t total, const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ y) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const float gv = g[i] + g[i + total], uv = u[i] + u[i + total];
        y[i] = gv * (1.0f / (1.0f + expf(-gv))) * uv;
    }
}

// One process-wide state: the handle, the scratch, an algorithm per (n, k, regime) and matrix
// layouts per (m, n, k). The scratch only grows, and only outside graph capture; the kernels of
// one stream use it in order.
//
// x's hi and lo halves are stacked as one [2 rows][k] operand, so each GEMM reads the weights once:
// T[2 rows][n] = [x_hi; x_lo] W^T, then y = T_hi + T_lo (+ bias, + residual) in one pass.
// Decode-sized calls (up to kDecodeRows rows) come in two buckets, each served by one algorithm per
// shape: up to kSmallDecodeRows rows the heuristic's choice for kSmallDecodeRows rows, above it the
// one for kDecodeRows rows. Both may split K (a split count fixed by the algorithm, reduced in a fixed
// order, never in place): with one algorithm per bucket a row's bits do not depend on how many rows
// share its step (tests/cuda/linear_test.cu checks it). One algorithm tuned for 256 rows without
// split-K, as before, left B = 64 on 16-32 tiles for the narrow shapes (N = 4096: a quarter of the
// H200's SMs); SCR_CUDA_CUBLAS_DECODE=single brings that back for A/B runs.
constexpr int kDecodeRows = 256;
constexpr int kSmallDecodeRows = 64;

bool single_decode_algo() {
    static const bool single =
        scr::kernels::cuda::env_choice_switch("SCR_CUDA_CUBLAS_DECODE", false, {{"buckets", false}, {"single", true}}, "buckets");
    return single;
}

struct State {
    std::mutex mu;
    cublasLtHandle_t handle = nullptr;
    bool broken = false;
    void* scratch = nullptr;
    size_t scratch_bytes = 0;
    std::atomic<unsigned long long> epoch{0};  // scratch (re)allocations: cublas_scratch_epoch()
    struct Algo {
        cublasLtMatmulAlgo_t algo{};
        bool ok = false;
    };
    struct Layouts {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        bool ok = false;
    };
    std::map<std::tuple<int, int, int>, Algo> algos;      // (n, k, m), or (n, k, -1 - bucket) for a decode bucket
    std::map<std::tuple<int, int, int>, Layouts> layouts;  // (m, n, k)

    // Scratch of at least `bytes` past the workspace, or null (capturing, or out of memory).
    std::byte* need(cudaStream_t s, size_t bytes) {
        const size_t want = kWorkspaceBytes + bytes;
        if (want <= scratch_bytes) return static_cast<std::byte*>(scratch);
        if (capturing(s)) return nullptr;
        if (scratch) {
            cudaStreamSynchronize(s);
            cudaFree(scratch);
            scratch = nullptr;
            scratch_bytes = 0;
        }
        if (cudaMalloc(&scratch, want) != cudaSuccess) {
            cudaGetLastError();
            scratch = nullptr;
            return nullptr;
        }
        scratch_bytes = want;
        epoch.fetch_add(1, std::memory_order_release);
        return static_cast<std::byte*>(scratch);
    }

    // T (column-major n x m, ld n) = W (row-major n x k, i.e. column-major k x n, transposed) times
    // X (row-major m x k, i.e. column-major k x m): D = op(A) B with A = W, op = T.
    const Layouts* layout(int m, int n, int k) {
        auto key = std::make_tuple(m, n, k);
        auto it = layouts.find(key);
        if (it != layouts.end()) return it->second.ok ? &it->second : nullptr;
        Layouts l;
        const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
        l.ok = cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
               cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa) == CUBLAS_STATUS_SUCCESS &&
               cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb) == CUBLAS_STATUS_SUCCESS &&
               cublasLtMatrixLayoutCreate(&l.a, CUDA_R_16BF, k, n, k) == CUBLAS_STATUS_SUCCESS &&
               cublasLtMatrixLayoutCreate(&l.b, CUDA_R_16BF, k, m, k) == CUBLAS_STATUS_SUCCESS &&
               cublasLtMatrixLayoutCreate(&l.c, CUDA_R_32F, n, m, n) == CUBLAS_STATUS_SUCCESS;
        return layouts.emplace(key, l).first->second.ok ? &layouts[key] : nullptr;
    }

    // The algorithm for (n, k) and a call of `rows` rows: one per decode bucket (above), or the
    // heuristic's first choice for that m for larger calls.
    // xparts: x's halves the GEMM multiplies (2: hi and lo stacked; 1: hi alone, prefill-sized
    // calls under SCR_CUDA_PREFILL_X=bf16).
    const Algo* algo(cudaStream_t s, int rows, int n, int k, int xparts = 2) {
        if (!handle && !broken) {
            if (capturing(s) || cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
                handle = nullptr;
                if (!capturing(s)) broken = true;
                return nullptr;
            }
        }
        if (!handle) return nullptr;
        const int bucket = cublas_decode_bucket(rows);
        const bool decode = bucket >= 0;
        const int tuned_rows = bucket == 0 ? kSmallDecodeRows : kDecodeRows;
        const int m = xparts * (decode ? tuned_rows : rows);
        auto key = std::make_tuple(n, k, decode ? -1 - bucket : m);
        auto it = algos.find(key);
        if (it != algos.end()) return it->second.ok ? &it->second : nullptr;
        if (capturing(s)) return nullptr;  // heuristics are queried outside capture only
        const Layouts* l = layout(m, n, k);
        Algo a;
        if (l) {
            cublasLtMatmulPreference_t pref = nullptr;
            cublasLtMatmulHeuristicResult_t result{};
            int found = 0;
            size_t ws = kWorkspaceBytes;
            const uint32_t fixed_order = single_decode_algo() ? uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE)
                                                              : uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE |
                                                                         CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE);
            a.ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
                   cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                       CUBLAS_STATUS_SUCCESS &&
                   (!decode || cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &fixed_order,
                                                                    sizeof fixed_order) == CUBLAS_STATUS_SUCCESS) &&
                   cublasLtMatmulAlgoGetHeuristic(handle, l->op, l->a, l->b, l->c, l->c, pref, 1, &result, &found) ==
                       CUBLAS_STATUS_SUCCESS &&
                   found > 0;
            if (pref) cublasLtMatmulPreferenceDestroy(pref);
            if (a.ok) a.algo = result.algo;
        }
        return algos.emplace(key, a).first->second.ok ? &algos[key] : nullptr;
    }

    // T[2 rows][n] = [x_hi; x_lo] W^T (xparts 1: T[rows][n] = x_hi W^T) (+ T when accumulate).
    // False (nothing written) when cuBLASLt declines.
    bool gemm_stacked(cudaStream_t s, int rows, int n, int k, const __nv_bfloat16* x2, const void* w, float* t, bool accumulate = false,
                      int xparts = 2) {
        const Algo* a = algo(s, rows, n, k, xparts);
        if (!a) return false;
        const Layouts* l = layout(xparts * rows, n, k);  // host-side descriptors only: fine inside a capture
        if (!l) return false;
        const float one = 1.0f, zero = 0.0f;
        return cublasLtMatmul(handle, l->op, &one, w, l->a, x2, l->b, accumulate ? &one : &zero, t, l->c, t, l->c, &a->algo, scratch,
                              kWorkspaceBytes, s) ==
               CUBLAS_STATUS_SUCCESS;
    }
};

State& state() {
    static State s;
    return s;
}

bool min_rows_ok(int rows) { return rows >= cublas_min_rows(); }

}  // namespace

int cublas_decode_bucket(int rows) {
    if (rows < cublas_min_rows() || rows > kDecodeRows) return -1;
    return single_decode_algo() || rows > kSmallDecodeRows ? 1 : 0;
}

int cublas_decode_max_rows() { return kDecodeRows; }

unsigned long long cublas_scratch_epoch() { return state().epoch.load(std::memory_order_acquire); }

void cublas_release_scratch() {
    State& st = state();
    std::lock_guard lock(st.mu);
    if (!st.scratch) return;
    cudaDeviceSynchronize();
    cudaFree(st.scratch);
    st.scratch = nullptr;
    st.scratch_bytes = 0;
    st.epoch.fetch_add(1, std::memory_order_release);
}

int cublas_min_rows() {
    static const int min_rows = int(kernels::cuda::env_int_switch(
        "SCR_CUDA_CUBLAS_MIN_ROWS", kDefaultMinRows, [](long long n) { return n >= 1 && n <= (1 << 30); }, "a row count from 1"));
    return min_rows;
}

int prefill_linears_bf16(cudaStream_t stream, int rows, int k, const float* x, const float* norm_w, float eps, const GemmOut* outs,
                         int count, const WeightExpander* expander) {
    if (!enabled() || rows <= 0 || !min_rows_ok(rows) || count <= 0 || count > kMaxGemmOuts || k % 4 != 0) return 0;
    State& st = state();
    std::lock_guard lock(st.mu);
    const size_t elems = size_t(rows) * k;
    // Per output: T (and U) [2 rows][n] floats, with scaled codes their [n] column scales; the
    // expanded weights: one matrix at a time, hi + lo bf16, or the codes alone.
    // Every buffer starts 256-byte aligned (cuBLASLt's operands): each is sized in whole 64-float
    // (256-byte) units, so every sum of sizes below is an aligned offset.
    const auto floats = [](size_t n) { return (n + 63) / 64 * 64; };
    const bool scaled = expander && expander->scaled;
    // x as hi + lo (two stacked GEMM operands) unless SCR_CUDA_PREFILL_X=bf16 asks for x_hi alone
    // above the decode buckets (decode rows keep their bits either way).
    const int xparts = prefill_x_bf16() && cublas_decode_bucket(rows) < 0 ? 1 : 2;
    size_t t_bytes = 0, w_bytes = 0;
    for (int i = 0; i < count; ++i) {
        const size_t mats = outs[i].w_up || outs[i].swiglu ? 2 : 1;
        t_bytes += mats * 4 * (floats(xparts * size_t(rows) * outs[i].n) + (scaled ? floats(outs[i].n) : 0));
        if (expander) w_bytes = std::max(w_bytes, size_t(outs[i].n) * k * (scaled ? 2 : 4));
    }
    if (w_bytes > kMaxExpandedBytes) return 0;
    const size_t x_bytes = 4 * floats(elems);  // x as bf16 hi + lo: 2 x 2 bytes per element
    std::byte* scratch = st.need(stream, x_bytes + t_bytes + w_bytes);
    if (!scratch) return 0;
    // Every algorithm and layout first: nothing is written unless every GEMM can run.
    for (int i = 0; i < count; ++i)
        if (!st.algo(stream, rows, outs[i].n, k, xparts) || !st.layout(xparts * rows, outs[i].n, k)) return 0;
    auto* x2 = reinterpret_cast<__nv_bfloat16*>(scratch + kWorkspaceBytes);  // [2 rows][k]: hi, then lo
    if (norm_w)
        norm_split_hi_lo_kernel<<<rows, kNormSplitThreads, 0, stream>>>(k, x, norm_w, eps, int64_t(elems), x2);
    else
        split_x(stream, int64_t(elems), x, x2);
    HalvesArgs args;
    args.rows = rows;
    args.xparts = xparts;
    auto* t = reinterpret_cast<float*>(scratch + kWorkspaceBytes + x_bytes);
    auto* w_hi = reinterpret_cast<void*>(scratch + kWorkspaceBytes + x_bytes + t_bytes);
    // One output's T: from its bf16 weight, or (expander) from the hi and lo matrices it writes, the
    // second GEMM adding into the first's T, or from the codes it writes (scaled: their column scales
    // go to `scale`, [n] floats, applied by the closing pass).
    const auto gemm = [&](int i, bool up, const void* w, float* out, float* scale) {
        const int n = outs[i].n;
        if (!expander) return st.gemm_stacked(stream, rows, n, k, x2, w, out, false, xparts);
        if (scaled) {
            expander->expand(expander->ctx, i, up, w_hi, scale, stream);
            return st.gemm_stacked(stream, rows, n, k, x2, w_hi, out, false, xparts);
        }
        auto* w_lo = static_cast<std::byte*>(w_hi) + size_t(n) * k * 2;
        expander->expand(expander->ctx, i, up, w_hi, w_lo, stream);
        return st.gemm_stacked(stream, rows, n, k, x2, w_hi, out, false, xparts) &&
               st.gemm_stacked(stream, rows, n, k, x2, w_lo, out, true, xparts);
    };
    int done = 0, widest = 0;
    for (; done < count; ++done) {
        const GemmOut& o = outs[done];
        HalvesOut& h = args.out[done];
        h = HalvesOut{t, nullptr, o.bias, o.residual, o.y, o.n};
        t += floats(xparts * size_t(rows) * o.n);
        if (scaled) {
            h.scale = t;
            t += floats(o.n);
        }
        if (!gemm(done, false, o.w, const_cast<float*>(h.t), const_cast<float*>(h.scale))) break;
        if (o.w_up || o.swiglu) {
            h.u = t;
            t += floats(xparts * size_t(rows) * o.n);
            if (scaled) {
                h.scale_u = t;
                t += floats(o.n);
            }
            if (!gemm(done, true, o.w_up, const_cast<float*>(h.u), const_cast<float*>(h.scale_u))) break;
        }
        widest = std::max(widest, o.n);
    }
    if (done > 0 && vec4_outputs_ok(args, done)) {
        // Columns over blockIdx.x (256 threads x 4 each), rows over blockIdx.y: up to ~8k blocks per output.
        const int col_blocks = (widest / 4 + 255) / 256;
        const int row_blocks = std::max(1, std::min(rows, 8192 / col_blocks));
        sum_outputs_vec4_kernel<<<dim3(col_blocks, row_blocks, done), 256, 0, stream>>>(args);
    } else if (done > 0) {
        sum_outputs_kernel<<<dim3(blocks_for(int64_t(rows) * widest), done), 256, 0, stream>>>(args);
    }
    return done;
}

bool prefill_linear_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* w, const float* bias,
                         const float* residual, float* y) {
    if (!enabled() || rows <= 0 || !min_rows_ok(rows)) return false;
    State& st = state();
    std::lock_guard lock(st.mu);
    const size_t elems = size_t(rows) * k, out = size_t(rows) * n;
    std::byte* scratch = st.need(stream, elems * 4 + out * 8);
    if (!scratch) return false;
    auto* x2 = reinterpret_cast<__nv_bfloat16*>(scratch + kWorkspaceBytes);  // [2 rows][k]: hi, then lo
    auto* t = reinterpret_cast<float*>(x2 + 2 * elems);                       // [2 rows][n]
    split_x(stream, int64_t(elems), x, x2);
    if (!st.gemm_stacked(stream, rows, n, k, x2, w, t)) return false;  // y untouched: the caller's GEMM takes it
    sum_halves_kernel<<<blocks_for(int64_t(out)), 256, 0, stream>>>(int64_t(out), n, t, bias, residual, y);
    return true;
}

bool prefill_swiglu_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* wg, const void* wu, float* y) {
    if (!enabled() || rows <= 0 || !min_rows_ok(rows)) return false;
    State& st = state();
    std::lock_guard lock(st.mu);
    const size_t elems = size_t(rows) * k, out = size_t(rows) * n;
    std::byte* scratch = st.need(stream, elems * 4 + out * 16);
    if (!scratch) return false;
    auto* x2 = reinterpret_cast<__nv_bfloat16*>(scratch + kWorkspaceBytes);
    auto* g = reinterpret_cast<float*>(x2 + 2 * elems);
    auto* u = g + 2 * out;
    split_x(stream, int64_t(elems), x, x2);
    if (!st.gemm_stacked(stream, rows, n, k, x2, wg, g) || !st.gemm_stacked(stream, rows, n, k, x2, wu, u)) return false;
    swiglu_halves_kernel<<<blocks_for(int64_t(out)), 256, 0, stream>>>(int64_t(out), g, u, y);
    return true;
}

}  // namespace scr::cuda_rt
