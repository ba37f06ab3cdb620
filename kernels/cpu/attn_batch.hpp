// What the attention kernel needs to know of a step: where each token's K/V goes and which
// blocks each token's sequence occupies. Plain pointers; no notion of a request.
#pragma once

#include <cstdint>

namespace scr::kernels::cpu {

struct AttnBatch {
    int num_tokens = 0;
    const int32_t* positions = nullptr;     // [num_tokens]
    const int64_t* slot_mapping = nullptr;  // [num_tokens] block * block_size + offset
    const int32_t* seq_of_token = nullptr;  // [num_tokens]
    const int32_t* block_tables = nullptr;  // [num_seqs * block_table_stride]
    const int32_t* seq_lens = nullptr;      // [num_seqs], context length after this step (longrope)
    int block_table_stride = 0;
};

}  // namespace scr::kernels::cpu
