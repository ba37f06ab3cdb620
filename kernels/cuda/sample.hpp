// Sampling on the GPU, the host-visible part (plain C++, no device code): the per-row parameters the
// kernel reads, what it can report back for tests, and the launcher that runtime/cuda/sample.cu
// instantiates from kernels/cuda/sample.cuh (the runtime's .cpp files are not compiled by nvcc).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace scr::kernels::cuda {

// One logit row's sampling (the fields of scr::DeviceSamplingRow, runtime/model/compiled_model.hpp).
struct SampleParams {
    float temperature;  // < kSampleGreedyBelow: greedy
    int32_t top_k;      // <= 0 or >= vocab: off
    float top_p;        // >= 1: off
    float min_p;        // <= 0: off
    double uniform;     // [0, 1)
};

// The engine's kSamplingEps (runtime/engine/sampler.hpp): below it a row is greedy.
constexpr float kSampleGreedyBelow = 1e-5f;

// Most vocabulary entries a row may have: the draw sums fixed-point masses of at most 2^42 each in
// 64-bit integers.
constexpr int kSampleMaxVocab = 1 << 21;

// What the kernel decided for one row (tests only): the kept tokens are those whose scaled logit has
// an order key (sample.cuh: order_key) >= keep_lo and a non-zero mass; z is their summed mass.
struct SampleTrace {
    uint32_t keep_lo;
    int32_t token;
    unsigned long long z;
    float max_scaled;
    int32_t greedy;
    int32_t radix_path;  // which selections ran the radix descent: bit 0 top_k, bit 1 top_p
};

// tokens[r] for r < rows, from logits[r * vocab ...] (16-byte aligned when vocab % 4 == 0 for the vector
// path); the same ids to tokens_also[r] when it is not null (the CUDA model's next input ids, for
// run-ahead). params, tokens, tokens_also and trace (when not null) are device pointers (tokens may be
// mapped pinned host memory). Throws std::invalid_argument
// for a vocabulary over kSampleMaxVocab or null pointers. Launched plainly (not as a programmatic
// dependent), so it is safe after any kernel in the stream.
void sample_rows(cudaStream_t stream, const float* logits, int vocab, int rows, const SampleParams* params,
                 int32_t* tokens, SampleTrace* trace = nullptr, int32_t* tokens_also = nullptr);

}  // namespace scr::kernels::cuda
