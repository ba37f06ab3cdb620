// What CUDA kernels know of a step, in device memory. The runtime copies a step's arrays into one
// fixed device buffer before the kernels run, so the pointers below never change and a captured
// CUDA graph stays valid from step to step; the counts that do change are read from `header`.
// Plain C++ (no device code): the runtime includes it too.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace scr::kernels::cuda {

enum StepHeader : int {
    kHeaderTokens = 0,       // real tokens in the step (the launch may cover more: graph padding)
    kHeaderTableStride = 1,  // block_tables row stride of this step
    kHeaderSeqs = 2,
    kHeaderInts = 4,
};

struct DevStep {
    const int32_t* header = nullptr;        // [kHeaderInts]
    const int32_t* token_ids = nullptr;     // [launch rows]; padding rows hold 0
    const int32_t* positions = nullptr;     // [launch rows]; padding rows hold 0
    const int64_t* slot_mapping = nullptr;  // [launch rows]; padding rows hold -1 (no KV write)
    const int32_t* seq_of_token = nullptr;  // [launch rows]
    const int32_t* logit_rows = nullptr;    // [launch logit rows]; padding rows name a valid row
    const int32_t* block_tables = nullptr;  // [num_seqs * header[kHeaderTableStride]]
};

// Everything a kernel launcher needs besides its operands.
struct Ctx {
    cudaStream_t stream = nullptr;
    DevStep step;
    bool pdl = false;  // launch kernels as programmatic dependents (kernels/cuda/common.cuh: launch)
    // Every sequence of the step has exactly one token (decode): a token's new K/V row is then read
    // by its own attention block only, so RoPE + KV append can run inside the attention launch.
    bool one_token_per_seq = false;
};

}  // namespace scr::kernels::cuda
