#include "runtime/model/generated_support.hpp"

#include <sys/mman.h>

#include <cstdlib>

#include "runtime/core/error.hpp"

namespace scr {

GeneratedModel::GeneratedModel(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, int64_t scratch_floats)
    : info_(info), pool_(pool) {
    if (weights.size() != info.tensors.size())
        fail("model {}: weight set has {} tensors, the plan {}", info.stem, weights.size(), info.tensors.size());
    weights_.resize(weights.size());
    for (size_t i = 0; i < weights.size(); ++i) weights_[i] = weights.data(i);
    size_t bytes = (size_t(scratch_floats) * 4 + 4095) / 4096 * 4096;
    scratch_ = static_cast<float*>(std::aligned_alloc(4096, bytes ? bytes : 4096));
    if (!scratch_) fail("cannot allocate {} bytes of scratch for {}", bytes, info.stem);
    seq_of_token_.resize(size_t(info.max_batch_tokens));
}

GeneratedModel::~GeneratedModel() { std::free(scratch_); }

void GeneratedModel::begin_step(const StepBatch& b, const KvPool& kv) {
    const ModelInfo& m = info_;
    if (b.num_tokens < 1 || b.num_tokens > m.max_batch_tokens)
        fail("step of {} tokens: {} is compiled for 1..{} tokens per forward", b.num_tokens, m.stem, m.max_batch_tokens);
    if (b.num_logits < 0 || b.num_logits > m.max_logit_rows || b.num_logits > b.num_tokens)
        fail("step asks for {} logit rows; {} allows at most {} (and no more than its tokens)", b.num_logits, m.stem,
             m.max_logit_rows);
    if (b.num_seqs < 1 || b.query_start[0] != 0 || b.query_start[b.num_seqs] != b.num_tokens)
        fail("step: query_start must run from 0 to num_tokens over {} sequences", b.num_seqs);
    const int64_t slots = int64_t(kv.num_blocks) * m.block_size;
    for (int s = 0; s < b.num_seqs; ++s) {
        const int begin = b.query_start[s], end = b.query_start[s + 1];
        if (end < begin) fail("step: query_start is not increasing at sequence {}", s);
        const int len = b.seq_lens[s];
        if (len < 1 || len > m.max_position_embeddings)
            fail("step: sequence {} has length {}; the model's context is {}", s, len, m.max_position_embeddings);
        const int blocks = (len + m.block_size - 1) / m.block_size;
        if (blocks > b.block_table_stride) fail("step: sequence {} needs {} blocks but the block table has {}", s, blocks, b.block_table_stride);
        for (int j = 0; j < blocks; ++j) {
            int32_t blk = b.block_tables[size_t(s) * b.block_table_stride + j];
            if (blk < 0 || blk >= kv.num_blocks) fail("step: sequence {} block {} is {}, outside the pool of {}", s, j, blk, kv.num_blocks);
        }
        for (int t = begin; t < end; ++t) {
            seq_of_token_[size_t(t)] = s;
            if (b.positions[t] < 0 || b.positions[t] >= len) fail("step: token {} has position {} outside its sequence of {}", t, b.positions[t], len);
        }
    }
    for (int t = 0; t < b.num_tokens; ++t) {
        if (b.token_ids[t] < 0 || b.token_ids[t] >= m.vocab_size)
            fail("token id {} is outside the vocabulary of {} ({} ids)", b.token_ids[t], m.stem, m.vocab_size);
        if (b.slot_mapping[t] < 0 || b.slot_mapping[t] >= slots)
            fail("step: token {} maps to KV slot {}, outside the pool of {} slots", t, b.slot_mapping[t], slots);
    }
    for (int r = 0; r < b.num_logits; ++r)
        if (b.logit_rows[r] < 0 || b.logit_rows[r] >= b.num_tokens) fail("step: logit row {} is not a token of the step", b.logit_rows[r]);
}

kernels::cpu::AttnBatch GeneratedModel::attn_batch(const StepBatch& b) const {
    kernels::cpu::AttnBatch a;
    a.num_tokens = b.num_tokens;
    a.positions = b.positions;
    a.slot_mapping = b.slot_mapping;
    a.seq_of_token = seq_of_token_.data();
    a.block_tables = b.block_tables;
    a.seq_lens = b.seq_lens;
    a.block_table_stride = b.block_table_stride;
    return a;
}

}  // namespace scr
