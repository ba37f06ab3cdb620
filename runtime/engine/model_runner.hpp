// Builds the flattened batch of one step (token ids, positions, slot mapping, query starts,
// context lengths, block tables, logit rows) into buffers allocated once, and runs the forward.
// vLLM: vllm/v1/worker/gpu_model_runner.py (GPUModelRunner._prepare_inputs).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/engine/rng.hpp"
#include "runtime/engine/scheduler.hpp"
#include "runtime/model/compiled_model.hpp"

namespace scr::engine {

class ModelRunner {
public:
    ModelRunner(CompiledModel& model, int max_num_seqs, int max_model_len);

    // Lays out out.seqs (in order) as one StepBatch. Sequences with needs_sample get a logit row.
    const StepBatch& prepare(const SchedulerOutput& out, int block_size);

    // After prepare: sample this step on the model's device (CompiledModel::forward_sample) when the
    // model can and every row asks only for what a device sampler does (Sampler::device_supports);
    // otherwise execute() brings the logits back for the engine's Sampler. Each non-greedy row takes
    // its uniform from its sequence's generator (rng_of), as Sampler::sample would: one draw per
    // token either way, so a seeded request sees the same stream on both paths.
    bool plan_device_sampling(const SchedulerOutput& out, Rng& (*rng_of)(Sequence&));
    void execute(KvPool& kv);
    bool sampled_on_device() const { return device_sampling_; }
    // With sampled_on_device(): the token drawn for scheduled sequence i (-1 if it has no logit row).
    int32_t device_token_of(size_t scheduled_index) const {
        int r = row_of_seq_[scheduled_index];
        return r < 0 ? -1 : device_tokens_[size_t(r)];
    }

    // The logits of scheduled sequence i (in out.seqs order), or nullptr if it has none this step.
    float* logits_of(size_t scheduled_index) {
        int r = row_of_seq_[scheduled_index];
        return r < 0 ? nullptr : logits_.data() + size_t(r) * size_t(vocab_);
    }
    const StepBatch& batch() const { return batch_; }
    int block_table_stride() const { return stride_; }

private:
    CompiledModel& model_;
    int vocab_;
    int stride_;                    // blocks per block-table row: ceil(max_model_len / block_size)
    StepBatch batch_;
    std::vector<int32_t> token_ids_, positions_, query_start_, seq_lens_, block_tables_, logit_rows_;
    std::vector<int64_t> slot_mapping_;
    std::vector<int> row_of_seq_;
    std::vector<float> logits_;
    bool device_sampling_ = false;  // this step: forward_sample instead of forward
    std::vector<DeviceSamplingRow> device_rows_;
    std::vector<int32_t> device_tokens_;
};

}  // namespace scr::engine
