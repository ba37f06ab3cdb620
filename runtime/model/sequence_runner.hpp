// The smallest driver of a compiled model: one sequence, its own KV blocks, prefill in chunks of
// the compiled step size, then one token at a time. Used by `scr logits`/`scr complete --ids` and
// by tests as the "alone" reference the batched engine must equal.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/model/compiled_model.hpp"

namespace scr {

class SequenceRunner {
public:
    // max_len: most tokens the sequence will hold (prompt + generated); clamped to the context.
    SequenceRunner(CompiledModel& model, int max_len);
    ~SequenceRunner();

    // Appends tokens and returns the logits of the last one ([vocab]); with all_rows, of every
    // appended token ([n][vocab]). chunk: most tokens per forward (0: the compiled maximum).
    std::vector<float> feed(std::span<const int32_t> ids, bool all_rows = false, int chunk = 0);
    int length() const { return len_; }

private:
    CompiledModel& model_;
    const ModelInfo& info_;
    int capacity_;
    int len_ = 0;
    std::byte* kv_ = nullptr;
    size_t kv_bytes_ = 0;
    KvPool pool_;
    std::vector<int32_t> block_table_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace scr
