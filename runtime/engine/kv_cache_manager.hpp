// Allocates KV blocks to sequences: prefix-cache lookup, slot allocation for the tokens a step
// computes, caching of full blocks, freeing on finish/abort/preemption.
// vLLM: vllm/v1/core/kv_cache_manager.py:L94 (KVCacheManager) with the single full-attention group
// of vllm/v1/core/single_type_kv_cache_manager.py:L400 (FullAttentionManager).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/block_pool.hpp"
#include "runtime/engine/sequence.hpp"

namespace scr::engine {

class KvCacheManager {
public:
    // sliding_window > 0: every layer attends to at most that many tokens (ModelInfo::sliding_window),
    // so blocks wholly behind the window are freed while a sequence runs.
    KvCacheManager(int32_t num_blocks, int block_size, int max_model_len, bool enable_caching,
                   int sliding_window = 0);

    int block_size() const { return block_size_; }
    BlockPool& pool() { return pool_; }
    const BlockPool& pool() const { return pool_; }

    // The longest run of cached full blocks that prefixes seq's tokens, never covering the last
    // token (its logits must be computed). Fills hit_blocks; returns the number of hit tokens.
    // vLLM: kv_cache_manager.py:L164 (get_computed_blocks).
    int get_computed_blocks(const Sequence& seq, std::vector<int32_t>& hit_blocks);

    // Gives seq slots for num_new_tokens more tokens after its computed ones (plus the prefix-hit
    // blocks on a sequence's first allocation). False, changing nothing, when the pool is short.
    // vLLM: kv_cache_manager.py:L206 (allocate_slots).
    bool allocate_slots(Sequence& seq, int num_new_tokens, int num_new_computed_tokens = 0,
                        std::span<const int32_t> new_computed_blocks = {});

    // Registers seq's full blocks among its first num_tokens tokens in the prefix cache. Called
    // once their KV has been written (vLLM caches at allocation; see docs/ENGINE.md).
    // vLLM: single_type_kv_cache_manager.py:L235 (cache_blocks).
    void cache_blocks(Sequence& seq, int num_tokens);

    // Returns seq's blocks to the pool, tail first so the tail is evicted first.
    // vLLM: kv_cache_manager.py:L378 (free), single_type_kv_cache_manager.py:L261.
    void free(Sequence& seq);

    bool reset_prefix_cache() { return pool_.reset_prefix_cache(); }

    // Frees the blocks no step from position num_computed_tokens on will read, leaving the null
    // block in their table entries. vLLM: single_type_kv_cache_manager.py:L343
    // (remove_skipped_blocks) with SlidingWindowManager.get_num_skipped_tokens.
    void remove_skipped_blocks(Sequence& seq, int num_computed_tokens);

    int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // tokens

private:
    int block_size_;
    int max_model_len_;
    int sliding_window_;
    std::vector<int32_t> removed_;
    BlockPool pool_;
};

}  // namespace scr::engine
