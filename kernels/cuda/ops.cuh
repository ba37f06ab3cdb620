// Every CUDA kernel the generated code calls. Templates over the compiled constants only.
#pragma once

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/decode1.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/moe.cuh"
#include "kernels/cuda/quant_ops.cuh"
