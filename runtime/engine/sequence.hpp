// One sequence the scheduler tracks: a prompt plus the tokens sampled so far (one per sample of a
// request; n > 1 makes n sequences). vLLM: vllm/v1/request.py (Request), re-expressed: the KV block
// list lives here rather than in a per-manager dict, so the runner reads the block table directly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine/block_hash.hpp"
#include "runtime/engine/engine.hpp"

namespace scr::engine {

enum class SeqStatus : uint8_t {
    waiting, running, preempted,
    finished_stopped, finished_length, finished_aborted, finished_error
};

inline bool is_finished(SeqStatus s) { return s >= SeqStatus::finished_stopped; }

struct Sequence {
    std::string request_id;
    int sample_index = 0;
    const SamplingParams* params = nullptr;  // shared by the samples of one request
    int priority = 0;
    double arrival_time = 0;
    uint64_t arrival_order = 0;              // tie-break after arrival_time, deterministic

    std::vector<int32_t> tokens;             // prompt then outputs (vLLM: Request.all_token_ids)
    int num_prompt_tokens = 0;
    int num_computed_tokens = 0;             // tokens whose KV is written (or scheduled to be)
    int num_cached_tokens = -1;              // prefix-cache hit at first scheduling; -1: not yet
    int num_preemptions = 0;
    SeqStatus status = SeqStatus::waiting;
    std::string stop_reason;

    // KV state (owned by KvCacheManager).
    std::vector<int32_t> blocks;             // block table, one id per block_size tokens
    int num_cached_blocks = 0;               // leading blocks registered in the prefix cache
    bool kv_allocated = false;               // vLLM: request_id in num_cached_block (a running request)
    std::vector<BlockHash> block_hashes;     // one per full block of `tokens`
    uint64_t extra_key = 0;                  // the cache salt's hash (first block only)

    // n > 1: this sample waits until `wait_for` has computed its prompt, then reuses its blocks
    // through the prefix cache instead of computing the same prompt again.
    const Sequence* wait_for = nullptr;

    int num_tokens() const { return int(tokens.size()); }
    int num_output_tokens() const { return int(tokens.size()) - num_prompt_tokens; }
    int32_t last_token() const { return tokens.back(); }

    // vLLM: vllm/v1/core/kv_cache_utils.py:L573 (request_block_hasher): hash every newly full block.
    void update_block_hashes(int block_size) {
        while (int(block_hashes.size() + 1) * block_size <= num_tokens()) {
            size_t b = block_hashes.size();
            const BlockHash* parent = b ? &block_hashes[b - 1] : nullptr;
            block_hashes.push_back(hash_block_tokens(
                parent, std::span<const int32_t>(tokens.data() + b * block_size, size_t(block_size)),
                b == 0 ? extra_key : 0));
        }
    }
    void append_token(int32_t id, int block_size) {
        tokens.push_back(id);
        update_block_hashes(block_size);
    }
};

}  // namespace scr::engine
