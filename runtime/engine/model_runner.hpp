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
    const StepBatch& prepare(const SchedulerOutput& out);

    // After prepare: sample this step on the model's device (CompiledModel::forward_sample) when the
    // model can and every row asks only for what a device sampler does (Sampler::device_supports);
    // otherwise execute() brings the logits back for the engine's Sampler. Each non-greedy row takes
    // its uniform from its sequence's generator (rng_of), as Sampler::sample would: one draw per
    // token either way, so a seeded request sees the same stream on both paths.
    bool plan_device_sampling(const SchedulerOutput& out, Rng& (*rng_of)(Sequence&));
    // Runs the prepared step: launch() starts it, finish() waits until its tokens or logits are
    // back; execute() is both. A device-sampled step on a model that can run ahead is only
    // enqueued by launch(); anything else runs to completion in launch().
    void execute(KvPool& kv) {
        launch(kv);
        finish();
    }
    void launch(KvPool& kv);
    void finish();

    // ---- Run-ahead (vLLM's async scheduling: vllm/v1/core/sched/async_scheduler.py, with the
    // worker feeding the previous step's sampled ids on the device). Between launch() and finish()
    // of step n the engine may enqueue step n + 1 as the schedule will most likely be: every
    // sequence of step n decodes one more token at its next position, its id the one step n draws
    // on the device. The host's work between steps then overlaps the device's. The next schedule
    // adopts it when it is exactly that step (ahead_matches), and drops it otherwise.
    //
    // launch_ahead launches it when the model can run ahead, step n samples every sequence on the
    // device, each continues (its draw cannot end it by length; its next position's block is
    // allocated; the device can still sample it) and `more_work_waiting` is false. Non-greedy rows
    // draw their uniforms now, in the order the step would; drop_ahead puts the generators back.
    bool launch_ahead(const SchedulerOutput& out, KvPool& kv, int max_model_len, bool more_work_waiting,
                      Rng& (*rng_of)(Sequence&));
    bool has_ahead() const { return !ahead_seqs_.empty(); }
    // Whether `out`, the next schedule, is the step launched ahead: the same sequences in the same
    // order, one token each at the predicted position, the same block tables.
    bool ahead_matches(const SchedulerOutput& out) const;
    // After prepare(out) for a matching `out`: the step launched ahead becomes the current step
    // (sampled on the device; finish() waits for it). No plan_device_sampling: its draws are made.
    void adopt_ahead();
    // Waits for the step launched ahead, discards its tokens and restores its sequences'
    // generators. Every sequence it carries must still exist.
    void drop_ahead();
    // After a failure: waits for whatever this runner launched (current step, step ahead), errors
    // ignored, so that the model has nothing pending.
    void recover() noexcept;
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
    const StepBatch& batch() const { return step_.batch; }
    int block_table_stride() const { return stride_; }

private:
    // One step's arrays, sized once, and the StepBatch that points into them.
    struct StepArrays {
        std::vector<int32_t> token_ids, positions, query_start, seq_lens, block_tables, logit_rows;
        std::vector<int64_t> slot_mapping;
        StepBatch batch;
        void size_for(int max_tokens, int max_seqs, int stride);
        const StepBatch& view(int num_tokens, int num_seqs, int num_logits, int stride);
    };
    // How a row with parameters p is drawn on the device; its uniform from rng, as Sampler::sample
    // would (one draw for a non-greedy token, none for a greedy one).
    static DeviceSamplingRow device_row(const SamplingParams& p, Rng& rng);

    CompiledModel& model_;
    int vocab_;
    int block_size_;                // the model's KV block size
    int stride_;                    // blocks per block-table row: ceil(max_model_len / block_size)
    StepArrays step_;               // the current step
    std::vector<int> row_of_seq_;
    std::vector<float> logits_;
    bool device_sampling_ = false;  // this step: forward_sample instead of forward
    bool launched_async_ = false;   // this step was enqueued (launch_sample); finish() waits for it
    std::vector<DeviceSamplingRow> device_rows_;
    std::vector<int32_t> device_tokens_;

    // The step launched ahead (none when ahead_seqs_ is empty): its batch (token ids fed on the
    // device) and what it assumed of each sequence.
    struct AheadSeq {
        Sequence* seq;
        int position;
        Rng* rng;        // the sequence's generator
        Rng rng_before;  // ... before this step's draw
    };
    StepArrays ahead_;
    std::vector<DeviceSamplingRow> ahead_rows_;
    std::vector<AheadSeq> ahead_seqs_;
};

}  // namespace scr::engine
