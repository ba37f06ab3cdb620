// Prefill-sized bf16 linears on cuBLASLt: see prefill_gemm.hpp.
#include "runtime/cuda/prefill_gemm.hpp"

#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <mutex>
#include <tuple>

namespace scr::cuda_rt {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

__global__ void split_hi_lo_kernel(int64_t n, const float* __restrict__ x, __nv_bfloat16* __restrict__ hi, __nv_bfloat16* __restrict__ lo) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const float v = x[i];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

// y[r][j] += bias[j]
__global__ void add_bias_kernel(int64_t total, int n, const float* __restrict__ bias, float* __restrict__ y) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x)
        y[i] += bias[i % n];
}

// y = silu(y) * u, as kernels/cuda/common.cuh's silu rounds it.
__global__ void silu_mul_kernel(int64_t total, const float* __restrict__ u, float* __restrict__ y) {
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
        const float g = y[i];
        y[i] = g * (1.0f / (1.0f + expf(-g))) * u[i];
    }
}

int blocks_for(int64_t n) { return int(std::min<int64_t>((n + 255) / 256, 8192)); }

bool enabled() {
    static const bool on = [] {
        const char* e = std::getenv("SCR_CUDA_PREFILL");
        return !e || std::strcmp(e, "cublaslt") == 0;
    }();
    return on;
}

bool capturing(cudaStream_t s) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(s, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone;
}

// One process-wide state: the handle, the scratch and a plan per (rows, n, k). The scratch only
// grows, and only outside graph capture; the kernels of one stream use it in order.
struct State {
    std::mutex mu;
    cublasLtHandle_t handle = nullptr;
    bool broken = false;
    void* scratch = nullptr;
    size_t scratch_bytes = 0;
    struct Plan {
        cublasLtMatmulDesc_t op = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
        cublasLtMatmulAlgo_t algo{};
        bool ok = false;
    };
    std::map<std::tuple<int, int, int>, Plan> plans;

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
        return static_cast<std::byte*>(scratch);
    }

    // y (column-major n x rows, ld n) = W (row-major n x k, i.e. column-major k x n, transposed)
    // times x (row-major rows x k, i.e. column-major k x rows): D = op(A) B with A = W, op = T.
    const Plan* plan(cudaStream_t s, int rows, int n, int k) {
        if (!handle && !broken) {
            if (capturing(s) || cublasLtCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
                handle = nullptr;
                if (!capturing(s)) broken = true;
                return nullptr;
            }
        }
        if (!handle) return nullptr;
        auto key = std::make_tuple(rows, n, k);
        auto it = plans.find(key);
        if (it != plans.end()) return it->second.ok ? &it->second : nullptr;
        if (capturing(s)) return nullptr;  // heuristics query outside capture only
        Plan p;
        const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
        bool ok = cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, rows, k) == CUBLAS_STATUS_SUCCESS &&
                  cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, rows, n) == CUBLAS_STATUS_SUCCESS;
        if (ok) {
            cublasLtMatmulPreference_t pref = nullptr;
            cublasLtMatmulHeuristicResult_t result{};
            int found = 0;
            size_t ws = kWorkspaceBytes;
            ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
                 cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
                     CUBLAS_STATUS_SUCCESS &&
                 cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found) == CUBLAS_STATUS_SUCCESS &&
                 found > 0;
            if (pref) cublasLtMatmulPreferenceDestroy(pref);
            if (ok) p.algo = result.algo;
        }
        p.ok = ok;
        return plans.emplace(key, p).first->second.ok ? &plans[key] : nullptr;
    }

    // y = x W^T + (accumulate ? y : 0), x given as hi/lo bf16.
    bool gemm_hilo(cudaStream_t s, const Plan& p, const __nv_bfloat16* hi, const __nv_bfloat16* lo, const void* w, const float* c_in,
                   float* y) {
        const float one = 1.0f, zero = 0.0f;
        void* ws = scratch;
        if (cublasLtMatmul(handle, p.op, &one, w, p.a, hi, p.b, c_in ? &one : &zero, c_in ? c_in : y, p.c, y, p.c, &p.algo, ws,
                           kWorkspaceBytes, s) != CUBLAS_STATUS_SUCCESS)
            return false;  // nothing written: the caller's own GEMM takes it
        // y now holds part of the sum (and may be its own residual): no way back to the fallback.
        if (cublasLtMatmul(handle, p.op, &one, w, p.a, lo, p.b, &one, y, p.c, y, p.c, &p.algo, ws, kWorkspaceBytes, s) !=
            CUBLAS_STATUS_SUCCESS)
            throw std::runtime_error("cuBLASLt: the second (lo) half of a prefill GEMM failed after the first succeeded");
        return true;
    }
};

State& state() {
    static State s;
    return s;
}

}  // namespace

bool prefill_linear_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* w, const float* bias,
                         const float* residual, float* y) {
    if (!enabled() || rows <= 0) return false;
    State& st = state();
    std::lock_guard lock(st.mu);
    const size_t elems = size_t(rows) * k;
    std::byte* scratch = st.need(stream, elems * 4);
    const State::Plan* p = scratch ? st.plan(stream, rows, n, k) : nullptr;
    if (!p) return false;
    auto* hi = reinterpret_cast<__nv_bfloat16*>(scratch + kWorkspaceBytes);
    auto* lo = hi + elems;
    split_hi_lo_kernel<<<blocks_for(int64_t(elems)), 256, 0, stream>>>(int64_t(elems), x, hi, lo);
    if (!st.gemm_hilo(stream, *p, hi, lo, w, residual, y)) return false;
    if (bias) add_bias_kernel<<<blocks_for(int64_t(rows) * n), 256, 0, stream>>>(int64_t(rows) * n, n, bias, y);
    return true;
}

bool prefill_swiglu_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* wg, const void* wu, float* y) {
    if (!enabled() || rows <= 0) return false;
    State& st = state();
    std::lock_guard lock(st.mu);
    const size_t elems = size_t(rows) * k, out = size_t(rows) * n;
    std::byte* scratch = st.need(stream, elems * 4 + out * 4);
    const State::Plan* p = scratch ? st.plan(stream, rows, n, k) : nullptr;
    if (!p) return false;
    auto* hi = reinterpret_cast<__nv_bfloat16*>(scratch + kWorkspaceBytes);
    auto* lo = hi + elems;
    auto* up = reinterpret_cast<float*>(lo + elems);
    split_hi_lo_kernel<<<blocks_for(int64_t(elems)), 256, 0, stream>>>(int64_t(elems), x, hi, lo);
    if (!st.gemm_hilo(stream, *p, hi, lo, wg, nullptr, y) || !st.gemm_hilo(stream, *p, hi, lo, wu, nullptr, up)) return false;
    silu_mul_kernel<<<blocks_for(int64_t(out)), 256, 0, stream>>>(int64_t(out), up, y);
    return true;
}

}  // namespace scr::cuda_rt
