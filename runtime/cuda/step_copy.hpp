// The step's arrays from the pinned host buffer to the device (runtime/cuda/cuda_model.cpp): for a
// small graph step queued behind a pending one (run-ahead), the ranges it uses, read by one kernel
// straight from the mapped host memory, instead of one copy-engine transfer of the whole span
// (docs/CUDA.md "Session 23": 4.9-5.4 us against 7.7-10.0 between the previous sampler and the
// step's first kernel; on an idle GPU the kernel did not help). Plain C++ declarations.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace scr::cuda_rt {

struct StepCopyRanges {
    static constexpr int kMax = 8;
    uint32_t offset[kMax] = {};  // byte offsets into both buffers, multiples of 4
    uint32_t bytes[kMax] = {};   // multiples of 4
    int n = 0;
};

// Above this many bytes a step takes the copy engine (one transfer of the span).
constexpr size_t kStepCopyKernelMaxBytes = 16384;

// dst (device) <- src (pinned host memory, which unified addressing maps for the device), per range.
void copy_step_ranges(cudaStream_t stream, std::byte* dst, const std::byte* src, const StepCopyRanges& r);

}  // namespace scr::cuda_rt
