// Start-up of a CUDA specialization: opening the device in the background (registered with
// runtime/model/device_open.hpp, so load_model starts it before the weights are mapped) and the
// weight upload (one device allocation, pinned staging buffers filled by every host thread while
// the previous ones are on the copy engine).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <vector>

#include "runtime/model/compiled_model.hpp"

namespace scr {

class ThreadPool;
class WeightSet;

namespace cuda_startup {

// Waits until the background opening (if load_model started one) has its context ready, or has
// ended without one; returns at once otherwise. The CUDA model calls it before its first CUDA call.
void wait_device_open();
// True while the background opening has no context yet.
bool device_opening();

// When the background opening started, when its context was ready and when it ended (the upload's
// staging buffers allocated); default (epoch) values where no opening ran. Waits for the opening.
struct OpenTimes {
    std::chrono::steady_clock::time_point started, context_ready, ended;
};
OpenTimes open_times();

// With SCR_CUDA_PREFAULT=1: until the device is open (and at most once over the tensors), faults
// the weights' host pages in from all threads (madvise(MADV_POPULATE_READ), reading from disk if the
// file is not cached), so the upload then copies from resident pages. Off by default (startup.cpp
// says why). Returns the bytes it covered.
size_t prefault_while_opening(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool);

inline constexpr int kStagingBuffers = 3;
inline constexpr size_t kStagingBytes = size_t(32) << 20;

struct DeviceWeights {
    void* base = nullptr;           // one cudaMalloc; the caller frees it
    std::vector<const void*> tensors;  // per tensor of info.tensors, null when absent
    size_t bytes = 0;               // allocated, alignment padding included
    double seconds = 0;
    // The pinned staging buffers (kStagingBytes each, cudaMallocHost; null where none), handed on:
    // the model keeps them as its step and logits buffers or frees them with cudaFreeHost.
    void* staging[kStagingBuffers] = {};
};

// Uploads every present tensor, each at a 256-byte aligned offset, and waits until it is done.
DeviceWeights upload_weights(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, cudaStream_t stream);

}  // namespace cuda_startup
}  // namespace scr
