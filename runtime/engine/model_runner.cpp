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
}

// vLLM: vllm/v1/worker/gpu_model_runner.py (_prepare_inputs): per scheduled request, its tokens
// [num_computed, num_computed + num_scheduled) are laid out contiguously; each token's slot is
// block_table[pos / block_size] * block_size + pos % block_size; query_start_loc is the running
// sum of scheduled tokens and seq_lens the context after the step; only the last token of a
// request that completes its prompt (or decodes) yields logits.
const StepBatch& ModelRunner::prepare(const SchedulerOutput& out, int block_size) {
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

void ModelRunner::execute(KvPool& kv) {
    if (device_sampling_)
        model_.forward_sample(batch_, kv, std::span<const DeviceSamplingRow>(device_rows_.data(), size_t(batch_.num_logits)),
                              device_tokens_.data());
    else
        model_.forward(batch_, kv, logits_.data());
}

}  // namespace scr::engine
