// Every CUDA kernel the generated code calls. Templates over the compiled constants only.
#pragma once

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/decode1.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/moe_quant.cuh"
#include "kernels/cuda/quant_ops.cuh"

namespace scr::kernels::cuda {
// The decode attention's context split keeps to the bf16 GEMV's rows, the regime whose sequences
// already share their bits (attention.cuh: kAttentionPartsRows).
static_assert(kAttentionPartsRows == detail::kMmaMinRows - 1, "the attention split's rows must be the GEMV regime's");
}  // namespace scr::kernels::cuda
