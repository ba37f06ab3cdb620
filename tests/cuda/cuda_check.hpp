// What the stand-alone GPU test binaries (tests/cuda/*_test.cu) share: CUDA calls that throw with
// the failing call, file and line, and the skip on a machine without a GPU (exit code 77, which
// their ctest entries declare as SKIP_RETURN_CODE).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>

namespace scr::test_cuda {

inline void check_cuda(cudaError_t e, const char* what, const char* file, int line) {
    if (e != cudaSuccess) {
        char buf[512];
        std::snprintf(buf, sizeof buf, "CUDA error '%s' at %s:%d: %s", cudaGetErrorString(e), file, line, what);
        throw std::runtime_error(buf);
    }
}

constexpr int kSkipped = 77;

// True, after saying so, when this machine has no CUDA device: main() then returns kSkipped.
inline bool no_gpu() {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::printf("no GPU: skipped\n");
        return true;
    }
    return false;
}

}  // namespace scr::test_cuda

#define CK(call) ::scr::test_cuda::check_cuda((call), #call, __FILE__, __LINE__)
