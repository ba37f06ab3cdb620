// Prefill-sized bf16 linears on cuBLASLt (kernels/cuda/linear.cuh calls these above 64 rows).
//
// x stays float32 in the model; here it is split into two bf16 matrices, hi + lo (lo = x - hi,
// exact to ~2^-17 relative), and y = x_hi W^T + x_lo W^T is two cuBLASLt bf16 GEMMs accumulating in
// float32 (the second adds onto the first through beta = 1), so prefill keeps the float32-level
// accuracy of the decode kernels at tensor-core speed. A residual enters as the first GEMM's C.
//
// Each call returns false, having done nothing, when cuBLASLt cannot take it (no scratch yet while
// a CUDA graph is being captured, a shape it has no algorithm for, SCR_CUDA_PREFILL set to another
// path): the caller then runs its own GEMM. Scratch (the hi/lo copies, the up projection of a SwiGLU,
// cuBLASLt's workspace) is one device allocation per process, grown outside graph capture only.
#pragma once

#include <cuda_runtime_api.h>

namespace scr::cuda_rt {

// y[rows][n] = x[rows][k] W^T (+ bias[n]) (+ residual[rows][n]); W bf16 [n][k]. residual may be y.
bool prefill_linear_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* w, const float* bias,
                         const float* residual, float* y);

// y[rows][n] = silu(x Wg^T) * (x Wu^T).
bool prefill_swiglu_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* wg, const void* wu, float* y);

}  // namespace scr::cuda_rt
