#include "runtime/model/sequence_runner.hpp"

#include <cstdlib>
#include <cstring>
#include <numeric>

#include "runtime/core/error.hpp"

namespace scr {

SequenceRunner::SequenceRunner(CompiledModel& model, int max_len) : model_(model), info_(model.info()) {
    capacity_ = std::min(max_len, info_.max_position_embeddings);
    if (capacity_ < 1) fail("sequence capacity must be positive");
    const int blocks = (capacity_ + info_.block_size - 1) / info_.block_size;
    kv_bytes_ = size_t(blocks) * size_t(info_.kv_bytes_per_block);
    kv_ = static_cast<std::byte*>(std::aligned_alloc(4096, (kv_bytes_ + 4095) / 4096 * 4096));
    if (!kv_) fail("cannot allocate {} bytes of KV cache", kv_bytes_);
    // Unwritten KV bytes are never read (attention stops at each token's position), but keep
    // them defined so sanitizers and reruns see the same memory.
    std::memset(kv_, 0, kv_bytes_);
    pool_.data = kv_;
    pool_.num_blocks = blocks;
    block_table_.resize(size_t(blocks));
    std::iota(block_table_.begin(), block_table_.end(), 0);
}

SequenceRunner::~SequenceRunner() { std::free(kv_); }

std::vector<float> SequenceRunner::feed(std::span<const int32_t> ids, bool all_rows, int chunk) {
    if (ids.empty()) fail("no tokens to feed");
    if (len_ + int(ids.size()) > capacity_)
        fail("sequence of {} tokens is longer than the context of {} ({} tokens)", len_ + ids.size(), info_.stem, capacity_);
    int step = chunk > 0 ? chunk : info_.max_batch_tokens;
    step = std::min(step, info_.max_batch_tokens);
    if (all_rows) step = std::min(step, info_.max_logit_rows);
    const size_t vocab = size_t(info_.vocab_size);
    std::vector<float> out(all_rows ? ids.size() * vocab : vocab);
    std::vector<int32_t> positions(static_cast<size_t>(step)), rows(static_cast<size_t>(step));
    std::vector<int64_t> slots(static_cast<size_t>(step));
    for (size_t done = 0; done < ids.size();) {
        const int n = int(std::min<size_t>(size_t(step), ids.size() - done));
        for (int i = 0; i < n; ++i) {
            positions[size_t(i)] = len_ + i;
            slots[size_t(i)] = int64_t(len_ + i);  // block table is the identity
            rows[size_t(i)] = i;
        }
        const bool last = done + size_t(n) == ids.size();
        int32_t qs[2] = {0, n};
        int32_t seq_len = len_ + n;
        StepBatch b;
        b.num_tokens = n;
        b.token_ids = ids.data() + done;
        b.positions = positions.data();
        b.slot_mapping = slots.data();
        b.num_seqs = 1;
        b.query_start = qs;
        b.seq_lens = &seq_len;
        b.block_tables = block_table_.data();
        b.block_table_stride = int(block_table_.size());
        if (all_rows) {
            b.num_logits = n;
            b.logit_rows = rows.data();
            model_.forward(b, pool_, out.data() + done * vocab);
        } else if (last) {
            int32_t row = n - 1;
            b.num_logits = 1;
            b.logit_rows = &row;
            model_.forward(b, pool_, out.data());
        } else {
            b.num_logits = 0;
            model_.forward(b, pool_, nullptr);
        }
        len_ += n;
        done += size_t(n);
    }
    return out;
}

int32_t argmax(std::span<const float> logits) {
    int32_t best = 0;
    for (size_t i = 1; i < logits.size(); ++i)
        if (logits[i] > logits[size_t(best)]) best = int32_t(i);
    return best;
}

}  // namespace scr
