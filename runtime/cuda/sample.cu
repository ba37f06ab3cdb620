// The one translation unit that instantiates the GPU sampler (kernels/cuda/sample.cuh) for the
// runtime, whose other files are plain C++ (kernels/cuda/sample.hpp declares the launcher).
#include "kernels/cuda/sample.cuh"

namespace scr::kernels::cuda {

void sample_rows(cudaStream_t stream, const float* logits, int vocab, int rows, const SampleParams* params, int32_t* tokens,
                 SampleTrace* trace, int32_t* tokens_also) {
    launch_sample_rows(stream, logits, vocab, rows, params, tokens, trace, tokens_also);
}

}  // namespace scr::kernels::cuda
