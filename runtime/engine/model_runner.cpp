#include "runtime/engine/model_runner.hpp"

#include <algorithm>
#include <stdexcept>

#include "runtime/engine/sampler.hpp"

namespace scr::engine {

ModelRunner::ModelRunner(CompiledModel& model, int max_num_seqs, int max_model_len)
    : model_(model), vocab_(model.info().vocab_size) {
    const ModelInfo& info = model.info();
    stride_ = (max_model_len + info.block_size - 1) / info.block_size;
    token_ids_.resize(size_t(info.max_batch_tokens));
    positions_.resize(size_t(info.max_batch_tokens));
    slot_mapping_.resize(size_t(info.max_batch_tokens));
    query_start_.resize(size_t(max_num_seqs) + 1);
    seq_lens_.resize(size_t(max_num_seqs));
    block_tables_.assign(size_t(max_num_seqs) * size_t(stride_), 0);
    logit_rows_.resize(size_t(max_num_seqs));
    row_of_seq_.resize(size_t(max_num_seqs));
    logits_.resize(size_t(max_num_seqs) * size_t(vocab_));
    device_rows_.resize(size_t(max_num_seqs));
    device_tokens_.resize(size_t(max_num_seqs));
    ahead_ids_.assign(size_t(max_num_seqs), 0);
    ahead_positions_.resize(size_t(max_num_seqs));
    ahead_slot_mapping_.resize(size_t(max_num_seqs));
    ahead_query_start_.resize(size_t(max_num_seqs) + 1);
    ahead_seq_lens_.resize(size_t(max_num_seqs));
    ahead_block_tables_.assign(size_t(max_num_seqs) * size_t(stride_), 0);
    ahead_logit_rows_.resize(size_t(max_num_seqs));
    ahead_rows_.resize(size_t(max_num_seqs));
    ahead_seqs_.reserve(size_t(max_num_seqs));
    dropped_tokens_.resize(size_t(max_num_seqs));
}

// vLLM: vllm/v1/worker/gpu_model_runner.py (_prepare_inputs): per scheduled request, its tokens
// [num_computed, num_computed + num_scheduled) are laid out contiguously; each token's slot is
// block_table[pos / block_size] * block_size + pos % block_size; query_start_loc is the running
// sum of scheduled tokens and seq_lens the context after the step; only the last token of a
// request that completes its prompt (or decodes) yields logits.
const StepBatch& ModelRunner::prepare(const SchedulerOutput& out, int block_size) {
    batch_block_size_ = block_size;
    if (out.seqs.size() > seq_lens_.size() || out.total_tokens > int(token_ids_.size()))
        throw std::logic_error("ModelRunner::prepare: batch larger than the buffers");
    int t = 0, num_logits = 0;
    query_start_[0] = 0;
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const ScheduledSeq& sch = out.seqs[s];
        const Sequence& seq = *sch.seq;
        const int32_t* table = seq.blocks.data();
        for (int j = 0; j < sch.num_tokens; ++j, ++t) {
            const int pos = sch.start + j;
            token_ids_[size_t(t)] = seq.tokens[size_t(pos)];
            positions_[size_t(t)] = pos;
            slot_mapping_[size_t(t)] = int64_t(table[pos / block_size]) * block_size + pos % block_size;
        }
        query_start_[s + 1] = t;
        const int seq_len = sch.start + sch.num_tokens;
        seq_lens_[s] = seq_len;
        const int used_blocks = (seq_len + block_size - 1) / block_size;
        if (used_blocks > stride_ || used_blocks > int(seq.blocks.size()))
            throw std::logic_error("ModelRunner::prepare: sequence has fewer blocks than tokens need");
        std::copy(table, table + used_blocks, block_tables_.begin() + ptrdiff_t(s) * stride_);
        if (sch.needs_sample) {
            logit_rows_[size_t(num_logits)] = t - 1;
            row_of_seq_[s] = num_logits++;
        } else {
            row_of_seq_[s] = -1;
        }
    }
    batch_.num_tokens = t;
    batch_.token_ids = token_ids_.data();
    batch_.positions = positions_.data();
    batch_.slot_mapping = slot_mapping_.data();
    batch_.num_seqs = int(out.seqs.size());
    batch_.query_start = query_start_.data();
    batch_.seq_lens = seq_lens_.data();
    batch_.block_tables = block_tables_.data();
    batch_.block_table_stride = stride_;
    batch_.num_logits = num_logits;
    batch_.logit_rows = logit_rows_.data();
    device_sampling_ = false;
    return batch_;
}

bool ModelRunner::plan_device_sampling(const SchedulerOutput& out, Rng& (*rng_of)(Sequence&)) {
    device_sampling_ = false;
    if (batch_.num_logits == 0 || !model_.can_sample_on_device()) return false;
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const ScheduledSeq& sch = out.seqs[s];
        if (sch.needs_sample && !Sampler::device_supports(*sch.seq->params, sch.seq->num_output_tokens())) return false;
    }
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const int r = row_of_seq_[s];
        if (r < 0) continue;
        const SamplingParams& p = *out.seqs[s].seq->params;
        DeviceSamplingRow& row = device_rows_[size_t(r)];
        row.temperature = p.temperature;
        row.top_k = p.top_k;
        row.top_p = p.top_p;
        row.min_p = p.min_p;
        // Sampler::sample draws one uniform for a non-greedy token and none for a greedy one.
        row.uniform = p.temperature < Sampler::kSamplingEps ? 0.0 : rng_of(*out.seqs[s].seq).uniform();
    }
    device_sampling_ = true;
    return true;
}

void ModelRunner::launch(KvPool& kv) {
    const std::span<const DeviceSamplingRow> rows(device_rows_.data(), size_t(batch_.num_logits));
    launched_async_ = false;
    if (device_sampling_ && model_.can_run_ahead()) {
        model_.launch_sample(batch_, kv, rows, /*feed_previous=*/false);
        launched_async_ = true;
    } else if (device_sampling_) {
        model_.forward_sample(batch_, kv, rows, device_tokens_.data());
    } else {
        model_.forward(batch_, kv, logits_.data());
    }
}

void ModelRunner::finish() {
    if (!launched_async_) return;
    launched_async_ = false;
    model_.wait_sample(device_tokens_.data());
}

// vLLM: vllm/v1/core/sched/async_scheduler.py:L18 (_update_after_schedule: each scheduled decode
// gets an output placeholder) and vllm/v1/worker/gpu_model_runner.py (_prepare_input_ids: the ids of
// requests in the previous batch come from its sampled tensor on the device). Ours predicts the
// whole next step instead of scheduling around placeholders, and checks the prediction against the
// real schedule (ahead_matches).
bool ModelRunner::launch_ahead(const SchedulerOutput& out, KvPool& kv, int block_size, int max_model_len,
                               bool more_work_waiting, Rng& (*rng_of)(Sequence&)) {
    if (has_ahead_) throw std::logic_error("ModelRunner::launch_ahead: a step is already launched ahead");
    if (!launched_async_ || more_work_waiting || out.seqs.empty()) return false;
    const int S = int(out.seqs.size());
    for (int s = 0; s < S; ++s) {
        const ScheduledSeq& sch = out.seqs[size_t(s)];
        const Sequence& seq = *sch.seq;
        const int next = sch.start + sch.num_tokens;
        if (!sch.needs_sample || row_of_seq_[size_t(s)] != s || seq.num_tokens() != next) return false;
        // The draw this step makes must not end it by length (an end by EOS or a stop string cannot
        // be known: then the step is dropped).
        if (next + 1 >= max_model_len || seq.num_output_tokens() + 1 >= seq.params->max_tokens) return false;
        if (next / block_size >= int(seq.blocks.size()) || (next + 1 + block_size - 1) / block_size > stride_) return false;
        if (!Sampler::device_supports(*seq.params, seq.num_output_tokens() + 1)) return false;
    }
    ahead_seqs_.clear();
    for (int s = 0; s < S; ++s) {
        Sequence& seq = *out.seqs[size_t(s)].seq;
        const int pos = out.seqs[size_t(s)].start + out.seqs[size_t(s)].num_tokens;
        const int32_t* table = seq.blocks.data();
        ahead_ids_[size_t(s)] = 0;  // fed on the device
        ahead_positions_[size_t(s)] = pos;
        ahead_slot_mapping_[size_t(s)] = int64_t(table[pos / block_size]) * block_size + pos % block_size;
        ahead_query_start_[size_t(s)] = s;
        ahead_seq_lens_[size_t(s)] = pos + 1;
        const int used_blocks = (pos + 1 + block_size - 1) / block_size;
        std::copy(table, table + used_blocks, ahead_block_tables_.begin() + ptrdiff_t(s) * stride_);
        ahead_logit_rows_[size_t(s)] = s;
        const SamplingParams& p = *seq.params;
        Rng& rng = rng_of(seq);
        ahead_seqs_.push_back(AheadSeq{&seq, pos, rng});
        DeviceSamplingRow& row = ahead_rows_[size_t(s)];
        row.temperature = p.temperature;
        row.top_k = p.top_k;
        row.top_p = p.top_p;
        row.min_p = p.min_p;
        row.uniform = p.temperature < Sampler::kSamplingEps ? 0.0 : rng.uniform();  // as plan_device_sampling
    }
    ahead_query_start_[size_t(S)] = S;
    StepBatch& b = ahead_batch_;
    b.num_tokens = S;
    b.token_ids = ahead_ids_.data();
    b.positions = ahead_positions_.data();
    b.slot_mapping = ahead_slot_mapping_.data();
    b.num_seqs = S;
    b.query_start = ahead_query_start_.data();
    b.seq_lens = ahead_seq_lens_.data();
    b.block_tables = ahead_block_tables_.data();
    b.block_table_stride = stride_;
    b.num_logits = S;
    b.logit_rows = ahead_logit_rows_.data();
    try {
        model_.launch_sample(b, kv, std::span<const DeviceSamplingRow>(ahead_rows_.data(), size_t(S)), /*feed_previous=*/true);
    } catch (...) {
        for (AheadSeq& a : ahead_seqs_) rng_of(*a.seq) = a.rng_before;
        ahead_seqs_.clear();
        throw;
    }
    has_ahead_ = true;
    rng_of_ = rng_of;
    return true;
}

bool ModelRunner::ahead_matches(const SchedulerOutput& out) const {
    if (!has_ahead_ || out.seqs.size() != ahead_seqs_.size()) return false;
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const ScheduledSeq& sch = out.seqs[s];
        const AheadSeq& a = ahead_seqs_[s];
        if (sch.seq != a.seq || sch.start != a.position || sch.num_tokens != 1 || !sch.needs_sample) return false;
        const int used = (a.position + 1 + batch_block_size_ - 1) / batch_block_size_;
        if (int(sch.seq->blocks.size()) < used ||
            !std::equal(sch.seq->blocks.begin(), sch.seq->blocks.begin() + used,
                        ahead_block_tables_.begin() + ptrdiff_t(s) * stride_))
            return false;
    }
    return true;
}

void ModelRunner::adopt_ahead() {
    if (!has_ahead_) throw std::logic_error("ModelRunner::adopt_ahead: nothing launched ahead");
    has_ahead_ = false;
    ahead_seqs_.clear();
    device_sampling_ = true;
    launched_async_ = true;
}

void ModelRunner::recover() noexcept {
    if (launched_async_) {
        launched_async_ = false;
        try {
            model_.wait_sample(device_tokens_.data());
        } catch (...) {
        }
    }
    try {
        drop_ahead();
    } catch (...) {
        has_ahead_ = false;
        ahead_seqs_.clear();
    }
}

void ModelRunner::drop_ahead() {
    if (!has_ahead_) return;
    if (launched_async_) throw std::logic_error("ModelRunner::drop_ahead before the current step finished");
    has_ahead_ = false;
    for (AheadSeq& a : ahead_seqs_) rng_of_(*a.seq) = a.rng_before;
    ahead_seqs_.clear();
    model_.wait_sample(dropped_tokens_.data());
}

}  // namespace scr::engine
