// Larger bf16 linears on cuBLASLt: decode batches from cublas_min_rows() rows and prefill
// (kernels/cuda/linear.cuh calls these first from that many rows on).
//
// x stays float32 in the model; here it is split into two bf16 matrices, hi + lo (lo = x - hi,
// exact to ~2^-17 relative), stacked as one [2 rows][k] operand: one cuBLASLt bf16 GEMM with float32
// accumulation reads the weights once, and a second pass adds the halves (and bias, residual, or
// SwiGLU's silu(gate) * up), so prefill keeps the float32-level accuracy of the decode kernels.
//
// Each call returns false, having done nothing, when cuBLASLt cannot take it (no scratch yet while
// a CUDA graph is being captured, a shape it has no algorithm for, SCR_CUDA_PREFILL set to another
// path): the caller then runs its own GEMM. Scratch (the hi/lo copies, the up projection of a SwiGLU,
// cuBLASLt's workspace) is one device allocation per process, grown outside graph capture only.
#pragma once

#include <cuda_runtime_api.h>

namespace scr::cuda_rt {

// Token rows from which linear.cuh hands bf16 linears to cuBLASLt (33, or SCR_CUDA_CUBLAS_MIN_ROWS).
int cublas_min_rows();

// Which decode bucket a call of `rows` rows falls in: 0 (up to 64 rows) or 1 (65-256), each with one
// algorithm per shape, so results are batch-invariant inside a bucket; -1 when cuBLASLt does not
// take the call as decode (fewer than cublas_min_rows() rows, or a prefill above 256).
int cublas_decode_bucket(int rows);

// The largest decode bucket's rows (256, the largest batch the CUDA graphs capture): calls of more
// rows are prefill, where results may depend on the call's row count.
int cublas_decode_max_rows();

// Counts the (re)allocations of the scratch below. A CUDA graph captured before the count moved
// holds the freed scratch's address (or a fallback taken for want of scratch): its owner drops it
// (runtime/cuda/cuda_model.cpp) and captures again.
unsigned long long cublas_scratch_epoch();
// Frees the scratch (after the device is idle) and moves the epoch, so the next call that needs it
// allocates again: for tests that must see the scratch grow whatever ran before them.
void cublas_release_scratch();

// One output of prefill_linears_bf16: y[rows][n] = x W^T (+ bias) (+ residual; may be y), or with
// w_up set, y = silu(x W^T) * (x W_up^T) (no bias, no residual). W, W_up bf16 [n][k].
struct GemmOut {
    const void* w = nullptr;
    const void* w_up = nullptr;
    const float* bias = nullptr;
    const float* residual = nullptr;
    float* y = nullptr;
    int n = 0;
    bool swiglu = false;  // a SwiGLU output whose two matrices a WeightExpander writes (w, w_up unused)
};
constexpr int kMaxGemmOuts = 3;

// Up to kMaxGemmOuts outputs of the same input (Q, K, V; a SwiGLU pair; one linear), with x split
// into its hi/lo halves once, optionally normalized on the way (norm_w set: the rows are
// rmsnorm(x) * norm_w, computed in the same pass; the normalized rows are not written anywhere),
// and every output's halves summed in one closing launch. Returns how many leading outputs it
// wrote: 0 when cuBLASLt cannot take every one of them (nothing written then), fewer than `count`
// only if a cuBLASLt call fails midway. The caller runs the rest on its own GEMM.
//
// Quantized weights (kernels/cuda/quant_prefill.cuh): with `expander` set, each output's matrix (and
// a SwiGLU output's up matrix) is written right before its GEMMs, on the stream, by
// expander->expand(ctx, output, up, a, b, stream), in one of two forms:
//  * scaled = false: a and b are two bf16 [n][k] matrices, hi and lo, whose sum is the dequantized
//    weight to ~2^-17 of each |w|; T = [x_hi; x_lo] hi^T, then T += [x_hi; x_lo] lo^T, so all four
//    products of the halves are kept (MLX int4: s q + b is not exact in bf16);
//  * scaled = true: a is the bf16 [n][k] matrix of the codes (exact in bf16: int8, e4m3) and b gets
//    the [n] float32 row scales, applied to T's columns by the closing pass: one GEMM, as dense.
// The expanded matrices share one scratch buffer (at most 1 GiB; a larger matrix returns 0).
struct WeightExpander {
    void (*expand)(const void* ctx, int output, bool up, void* a, void* b, cudaStream_t stream) = nullptr;
    const void* ctx = nullptr;
    bool scaled = false;
};
int prefill_linears_bf16(cudaStream_t stream, int rows, int k, const float* x, const float* norm_w, float eps, const GemmOut* outs,
                         int count, const WeightExpander* expander = nullptr);

// y[rows][n] = x[rows][k] W^T (+ bias[n]) (+ residual[rows][n]); W bf16 [n][k]. residual may be y.
bool prefill_linear_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* w, const float* bias,
                         const float* residual, float* y);

// y[rows][n] = silu(x Wg^T) * (x Wu^T).
bool prefill_swiglu_bf16(cudaStream_t stream, int rows, int n, int k, const float* x, const void* wg, const void* wu, float* y);

}  // namespace scr::cuda_rt
