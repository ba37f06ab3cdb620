#include "runtime/cuda/step_copy.hpp"

namespace scr::cuda_rt {
namespace {

// Block b copies range b, 32-bit words, four loads in flight per thread: reads of mapped host
// memory cross PCIe, so the ranges go in parallel and each thread's loads together.
__global__ void step_copy_kernel(std::byte* __restrict__ dst, const std::byte* __restrict__ src, const StepCopyRanges r) {
    const int b = blockIdx.x;
    if (b >= r.n) return;
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src + r.offset[b]);
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + r.offset[b]);
    const int words = int(r.bytes[b] / 4);
    for (int i = threadIdx.x; i < words; i += 4 * blockDim.x) {
        uint32_t v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int at = i + j * int(blockDim.x);
            if (at < words) v[j] = s[at];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int at = i + j * int(blockDim.x);
            if (at < words) d[at] = v[j];
        }
    }
}

}  // namespace

void copy_step_ranges(cudaStream_t stream, std::byte* dst, const std::byte* src, const StepCopyRanges& r) {
    if (r.n <= 0) return;
    step_copy_kernel<<<r.n, 256, 0, stream>>>(dst, src, r);
}

}  // namespace scr::cuda_rt
