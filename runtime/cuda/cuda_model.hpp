// What every generated CUDA specialization shares: the weights uploaded once to the GPU (pinned,
// overlapped copies), the device scratch arena and logits, the step's arrays copied into one fixed
// device buffer, the KV pool mirrored on the device, and whole decode steps captured as CUDA graphs
// per batch-size bucket. Generated code implements `run` (the kernel launches of one step).
//
// The engine's KvPool stays the interface: its host memory is never touched (the engine maps it
// lazily, so it costs nothing); the model keeps a device pool of the same block count and layout
// keyed by that KvPool, so block ids, prefix caching and preemption work unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cuda/step.hpp"
#include "runtime/model/generated_support.hpp"

namespace scr {

class CudaGeneratedModel : public GeneratedModel {
public:
    CudaGeneratedModel(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, int64_t scratch_floats,
                       int64_t moe_workspace_floats, int64_t attention_workspace_floats, int64_t quant_wide_workspace_bytes = 0);
    ~CudaGeneratedModel() override;

    // Logits come back in host memory, as the interface says. A decode-only step (one token per
    // sequence, logits for each) replays the CUDA graph of its batch-size bucket; any other step
    // launches its kernels directly.
    void forward(const StepBatch& batch, KvPool& kv, float* logits) final;

    // Sampling on the GPU (kernels/cuda/sample.cuh): the logits stay on the device, one token id per
    // row comes back. On unless SCR_CUDA_DEVICE_SAMPLING=0 or set_device_sampling(false).
    bool can_sample_on_device() const final;
    void forward_sample(const StepBatch& batch, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                        int32_t* token_ids) final;
    void set_device_sampling(bool on);
    // Run-ahead (CompiledModel::launch_sample): with device sampling, unless SCR_CUDA_RUN_AHEAD=0 or
    // set_run_ahead(false). Two launch slots of pinned buffers and events; one device stream.
    bool can_run_ahead() const final;
    void launch_sample(const StepBatch& batch, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                       bool feed_previous) final;
    void wait_sample(int32_t* token_ids) final;
    void set_run_ahead(bool on);

    struct Stats {
        double upload_seconds = 0;   // weights to the GPU, in the constructor
        double after_upload_seconds = 0;  // the constructor's allocations after the upload
        double device_wait_seconds = 0;  // the constructor waiting for the background device opening (runtime/cuda/startup.hpp)
        int64_t prefaulted_bytes = 0;    // weight bytes faulted in while the device was opening
        int64_t upload_bytes = 0;
        int graphs_captured = 0;
        double capture_seconds = 0;  // all graph captures so far
        int64_t graph_steps = 0, eager_steps = 0;
        double device_seconds = 0;   // with timing on: the steps' kernels and sampler, by CUDA events
        double sample_seconds = 0;   // with timing on: of which the sampler
        double copy_seconds = 0;     // with timing on: the steps' host-to-device copies (arrays, parameters)
        int64_t timed_steps = 0;
        int64_t device_sampled_rows = 0;  // rows sampled on the GPU (forward_sample)
    };
    const Stats& stats() const;
    // Times each step's kernels with CUDA events (off by default; for benchmarks).
    void set_timing(bool on);

protected:
    // Every kernel of one step for `rows` token rows and `logit_rows` rows of logits, on c.stream.
    virtual void run(const kernels::cuda::Ctx& c, int rows, int logit_rows, std::byte* kv) = 0;

    template <typename T>
    const T* dw(int index) const { return static_cast<const T*>(dev_weights_[size_t(index)]); }
    // Device address of the device-side pointer table at `index` (MoE expert lists).
    const void* const* dwp(int index) const { return dev_weight_table_ + index; }
    float* dev_scratch() const { return dev_scratch_; }
    float* dev_logits() const { return dev_logits_; }
    float* dev_moe_workspace() const { return dev_moe_ws_; }
    // The persistent decode kernel's counters (kernels/cuda/decode1.cuh; kDecode1SyncBytes), zero
    // between launches.
    unsigned* dev_sync() const { return dev_sync_; }

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::vector<const void*> dev_weights_;
    const void* const* dev_weight_table_ = nullptr;
    float* dev_scratch_ = nullptr;
    float* dev_logits_ = nullptr;
    float* dev_moe_ws_ = nullptr;
    unsigned* dev_sync_ = nullptr;
};

template <typename M>
std::unique_ptr<CompiledModel> make_cuda_generated(const WeightSet& w, ThreadPool& pool) {
    return std::make_unique<M>(w, pool);
}

}  // namespace scr
