#include "runtime/engine/model_runner.hpp"

#include <algorithm>
#include <stdexcept>

#include "runtime/engine/sampler.hpp"

namespace scr::engine {

ModelRunner::ModelRunner(CompiledModel& model, int max_num_seqs, int max_model_len)
    : model_(model), vocab_(model.info().vocab_size), block_size_(model.info().block_size) {
    const ModelInfo& info = model.info();
    stride_ = (max_model_len + info.block_size - 1) / info.block_size;
    step_.size_for(info.max_batch_tokens, max_num_seqs, stride_);
    ahead_.size_for(max_num_seqs, max_num_seqs, stride_);  // one token per sequence
    row_of_seq_.resize(size_t(max_num_seqs));
    logits_.resize(size_t(max_num_seqs) * size_t(vocab_));
    device_rows_.resize(size_t(max_num_seqs));
    device_tokens_.resize(size_t(max_num_seqs));
    ahead_rows_.resize(size_t(max_num_seqs));
    ahead_seqs_.reserve(size_t(max_num_seqs));
}

void ModelRunner::StepArrays::size_for(int max_tokens, int max_seqs, int stride) {
    token_ids.assign(size_t(max_tokens), 0);
    positions.resize(size_t(max_tokens));
    slot_mapping.resize(size_t(max_tokens));
    query_start.resize(size_t(max_seqs) + 1);
    seq_lens.resize(size_t(max_seqs));
    block_tables.assign(size_t(max_seqs) * size_t(stride), 0);
    logit_rows.resize(size_t(max_seqs));
}

const StepBatch& ModelRunner::StepArrays::view(int num_tokens, int num_seqs, int num_logits, int stride) {
    batch.num_tokens = num_tokens;
    batch.token_ids = token_ids.data();
    batch.positions = positions.data();
    batch.slot_mapping = slot_mapping.data();
    batch.num_seqs = num_seqs;
    batch.query_start = query_start.data();
    batch.seq_lens = seq_lens.data();
    batch.block_tables = block_tables.data();
    batch.block_table_stride = stride;
    batch.num_logits = num_logits;
    batch.logit_rows = logit_rows.data();
    return batch;
}

DeviceSamplingRow ModelRunner::device_row(const SamplingParams& p, Rng& rng) {
    DeviceSamplingRow row;
    row.temperature = p.temperature;
    row.top_k = p.top_k;
    row.top_p = p.top_p;
    row.min_p = p.min_p;
    // Sampler::sample draws one uniform for a non-greedy token and none for a greedy one.
    row.uniform = p.temperature < Sampler::kSamplingEps ? 0.0 : rng.uniform();
    return row;
}

// vLLM: vllm/v1/worker/gpu_model_runner.py (_prepare_inputs): per scheduled request, its tokens
// [num_computed, num_computed + num_scheduled) are laid out contiguously; each token's slot is
// block_table[pos / block_size] * block_size + pos % block_size; query_start_loc is the running
// sum of scheduled tokens and seq_lens the context after the step; only the last token of a
// request that completes its prompt (or decodes) yields logits.
const StepBatch& ModelRunner::prepare(const SchedulerOutput& out) {
    const int block_size = block_size_;
    StepArrays& a = step_;
    if (out.seqs.size() > a.seq_lens.size() || out.total_tokens > int(a.token_ids.size()))
        throw std::logic_error("ModelRunner::prepare: batch larger than the buffers");
    int t = 0, num_logits = 0;
    a.query_start[0] = 0;
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const ScheduledSeq& sch = out.seqs[s];
        const Sequence& seq = *sch.seq;
        const int32_t* table = seq.blocks.data();
        for (int j = 0; j < sch.num_tokens; ++j, ++t) {
            const int pos = sch.start + j;
            a.token_ids[size_t(t)] = seq.tokens[size_t(pos)];
            a.positions[size_t(t)] = pos;
            a.slot_mapping[size_t(t)] = int64_t(table[pos / block_size]) * block_size + pos % block_size;
        }
        a.query_start[s + 1] = t;
        const int seq_len = sch.start + sch.num_tokens;
        a.seq_lens[s] = seq_len;
        const int used_blocks = (seq_len + block_size - 1) / block_size;
        if (used_blocks > stride_ || used_blocks > int(seq.blocks.size()))
            throw std::logic_error("ModelRunner::prepare: sequence has fewer blocks than tokens need");
        std::copy(table, table + used_blocks, a.block_tables.begin() + ptrdiff_t(s) * stride_);
        if (sch.needs_sample) {
            a.logit_rows[size_t(num_logits)] = t - 1;
            row_of_seq_[s] = num_logits++;
        } else {
            row_of_seq_[s] = -1;
        }
    }
    device_sampling_ = false;
    return a.view(t, int(out.seqs.size()), num_logits, stride_);
}

bool ModelRunner::plan_device_sampling(const SchedulerOutput& out, Rng& (*rng_of)(Sequence&)) {
    device_sampling_ = false;
    if (step_.batch.num_logits == 0 || !model_.can_sample_on_device()) return false;
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const ScheduledSeq& sch = out.seqs[s];
        if (sch.needs_sample && !Sampler::device_supports(*sch.seq->params, sch.seq->num_output_tokens())) return false;
    }
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const int r = row_of_seq_[s];
        if (r >= 0) device_rows_[size_t(r)] = device_row(*out.seqs[s].seq->params, rng_of(*out.seqs[s].seq));
    }
    device_sampling_ = true;
    return true;
}

void ModelRunner::launch(KvPool& kv) {
    const std::span<const DeviceSamplingRow> rows(device_rows_.data(), size_t(step_.batch.num_logits));
    launched_async_ = false;
    if (device_sampling_ && model_.can_run_ahead()) {
        model_.launch_sample(step_.batch, kv, rows, /*feed_previous=*/false);
        launched_async_ = true;
    } else if (device_sampling_) {
        model_.forward_sample(step_.batch, kv, rows, device_tokens_.data());
    } else {
        model_.forward(step_.batch, kv, logits_.data());
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
bool ModelRunner::launch_ahead(const SchedulerOutput& out, KvPool& kv, int max_model_len, bool more_work_waiting,
                               Rng& (*rng_of)(Sequence&)) {
    if (has_ahead()) throw std::logic_error("ModelRunner::launch_ahead: a step is already launched ahead");
    const int block_size = block_size_;
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
    StepArrays& a = ahead_;
    for (int s = 0; s < S; ++s) {
        Sequence& seq = *out.seqs[size_t(s)].seq;
        const int pos = out.seqs[size_t(s)].start + out.seqs[size_t(s)].num_tokens;
        const int32_t* table = seq.blocks.data();
        a.token_ids[size_t(s)] = 0;  // fed on the device
        a.positions[size_t(s)] = pos;
        a.slot_mapping[size_t(s)] = int64_t(table[pos / block_size]) * block_size + pos % block_size;
        a.query_start[size_t(s)] = s;
        a.seq_lens[size_t(s)] = pos + 1;
        const int used_blocks = (pos + 1 + block_size - 1) / block_size;
        std::copy(table, table + used_blocks, a.block_tables.begin() + ptrdiff_t(s) * stride_);
        a.logit_rows[size_t(s)] = s;
        Rng& rng = rng_of(seq);
        ahead_seqs_.push_back(AheadSeq{&seq, pos, &rng, rng});
        ahead_rows_[size_t(s)] = device_row(*seq.params, rng);  // the draw plan_device_sampling would make
    }
    a.query_start[size_t(S)] = S;
    const StepBatch& b = a.view(S, S, S, stride_);
    try {
        model_.launch_sample(b, kv, std::span<const DeviceSamplingRow>(ahead_rows_.data(), size_t(S)), /*feed_previous=*/true);
    } catch (...) {
        for (const AheadSeq& ahead : ahead_seqs_) *ahead.rng = ahead.rng_before;
        ahead_seqs_.clear();
        throw;
    }
    return true;
}

bool ModelRunner::ahead_matches(const SchedulerOutput& out) const {
    if (!has_ahead() || out.seqs.size() != ahead_seqs_.size()) return false;
    for (size_t s = 0; s < out.seqs.size(); ++s) {
        const ScheduledSeq& sch = out.seqs[s];
        const AheadSeq& a = ahead_seqs_[s];
        if (sch.seq != a.seq || sch.start != a.position || sch.num_tokens != 1 || !sch.needs_sample) return false;
        const int used = (a.position + 1 + block_size_ - 1) / block_size_;
        if (int(sch.seq->blocks.size()) < used ||
            !std::equal(sch.seq->blocks.begin(), sch.seq->blocks.begin() + used,
                        ahead_.block_tables.begin() + ptrdiff_t(s) * stride_))
            return false;
    }
    return true;
}

void ModelRunner::adopt_ahead() {
    if (!has_ahead()) throw std::logic_error("ModelRunner::adopt_ahead: nothing launched ahead");
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
        ahead_seqs_.clear();
    }
}

void ModelRunner::drop_ahead() {
    if (!has_ahead()) return;
    if (launched_async_) throw std::logic_error("ModelRunner::drop_ahead before the current step finished");
    for (const AheadSeq& ahead : ahead_seqs_) *ahead.rng = ahead.rng_before;
    ahead_seqs_.clear();
    model_.wait_sample(nullptr);  // its tokens are discarded
}

}  // namespace scr::engine
