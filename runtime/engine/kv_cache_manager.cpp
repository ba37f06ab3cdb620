#include "runtime/engine/kv_cache_manager.hpp"

#include <algorithm>
#include <stdexcept>

namespace scr::engine {

KvCacheManager::KvCacheManager(int32_t num_blocks, int block_size, int max_model_len, bool enable_caching,
                               int sliding_window)
    : block_size_(block_size), max_model_len_(max_model_len), sliding_window_(sliding_window),
      pool_(num_blocks, enable_caching) {
    removed_.reserve(size_t(max_model_len / block_size + 1));
}

// vLLM: vllm/v1/core/kv_cache_manager.py:L164 (get_computed_blocks)
int KvCacheManager::get_computed_blocks(const Sequence& seq, std::vector<int32_t>& hit_blocks) {
    hit_blocks.clear();
    if (!pool_.caching_enabled()) return 0;
    // vLLM: kv_cache_manager.py:L189: a full hit must still recompute the last token for logits.
    const int max_cache_hit_length = seq.num_tokens() - 1;
    const int max_blocks = std::min<int>(max_cache_hit_length / block_size_, int(seq.block_hashes.size()));
    if (sliding_window_ <= 0) {
        // vLLM: single_type_kv_cache_manager.py:L402 (FullAttentionManager.find_longest_cache_hit):
        // walk the hash chain until the first miss.
        for (int i = 0; i < max_blocks; ++i) {
            int32_t id = pool_.get_cached_block(seq.block_hashes[i]);
            if (id < 0) break;
            hit_blocks.push_back(id);
        }
    } else {
        // vLLM: SlidingWindowManager.find_longest_cache_hit: only the blocks the next token's window
        // reaches must be cached. Search right to left for ceil((window - 1) / block_size)
        // contiguous hits; the blocks before them become the null block. Without such a run, the
        // run of hits that starts at block 0 (if any) is the hit.
        const int needed = std::max(1, (sliding_window_ - 1 + block_size_ - 1) / block_size_);
        hit_blocks.assign(size_t(max_blocks), BlockPool::kNullBlock);
        int contiguous = 0, end = -1;
        for (int i = max_blocks - 1; i >= 0 && end < 0; --i) {
            const int32_t id = pool_.get_cached_block(seq.block_hashes[size_t(i)]);
            if (id < 0) { contiguous = 0; continue; }
            hit_blocks[size_t(i)] = id;
            if (++contiguous >= needed) end = i + contiguous;
        }
        hit_blocks.resize(size_t(end >= 0 ? end : contiguous));
    }
    const int hit_tokens = int(hit_blocks.size()) * block_size_;
    prefix_cache_queries += seq.num_tokens();
    prefix_cache_hits += hit_tokens;
    return hit_tokens;
}

// vLLM: vllm/v1/core/kv_cache_manager.py:L206 (allocate_slots)
bool KvCacheManager::allocate_slots(Sequence& seq, int num_new_tokens, int num_new_computed_tokens,
                                    std::span<const int32_t> new_computed_blocks) {
    if (num_new_tokens <= 0) throw std::logic_error("allocate_slots: num_new_tokens must be > 0");
    const int num_computed = seq.num_computed_tokens + num_new_computed_tokens;
    // vLLM: kv_cache_manager.py:L316: free what the window has passed before counting free blocks.
    if (sliding_window_ > 0 && seq.kv_allocated) remove_skipped_blocks(seq, num_computed);
    const int num_tokens_need_slot = std::min(num_computed + num_new_tokens, max_model_len_);
    const int num_required_blocks = (num_tokens_need_slot + block_size_ - 1) / block_size_;

    // vLLM: single_type_kv_cache_manager.py:L73 (get_num_blocks_to_allocate).
    int num_to_allocate;
    if (seq.kv_allocated) {
        num_to_allocate = std::max(num_required_blocks - int(seq.blocks.size()), 0);
    } else {
        num_to_allocate = std::max(num_required_blocks - int(new_computed_blocks.size()), 0);
        // Hits that sit in the free queue (ref_cnt 0) leave it when touched: count them too.
        for (int32_t id : new_computed_blocks)
            if (id != BlockPool::kNullBlock && pool_.block(id).ref_cnt == 0) ++num_to_allocate;
    }
    if (num_to_allocate > pool_.num_free_blocks()) return false;

    if (!seq.kv_allocated) {
        // vLLM: single_type_kv_cache_manager.py:L137 (allocate_new_computed_blocks).
        pool_.touch(new_computed_blocks);
        seq.blocks.assign(new_computed_blocks.begin(), new_computed_blocks.end());
        seq.num_cached_blocks = int(seq.blocks.size());
        seq.kv_allocated = true;
    }
    // vLLM: single_type_kv_cache_manager.py:L208 (allocate_new_blocks).
    const int num_new_blocks = num_required_blocks - int(seq.blocks.size());
    if (num_new_blocks > 0) pool_.get_new_blocks(num_new_blocks, seq.blocks);
    return true;
}

// vLLM: vllm/v1/core/single_type_kv_cache_manager.py:L343 (remove_skipped_blocks);
// SlidingWindowManager.get_num_skipped_tokens: the token at position P sees [P - window + 1, P].
void KvCacheManager::remove_skipped_blocks(Sequence& seq, int num_computed_tokens) {
    const int num_skipped_tokens = std::max(0, num_computed_tokens - sliding_window_ + 1);
    const int num_skipped_blocks = std::min<int>(num_skipped_tokens / block_size_, int(seq.blocks.size()));
    removed_.clear();
    for (int i = num_skipped_blocks - 1; i >= 0; --i) {
        if (seq.blocks[size_t(i)] == BlockPool::kNullBlock) break;  // earlier ones were freed before
        removed_.push_back(seq.blocks[size_t(i)]);
        seq.blocks[size_t(i)] = BlockPool::kNullBlock;
    }
    pool_.free_blocks(removed_);
}

// vLLM: vllm/v1/core/single_type_kv_cache_manager.py:L235 (cache_blocks)
void KvCacheManager::cache_blocks(Sequence& seq, int num_tokens) {
    if (!pool_.caching_enabled()) return;
    const int num_full_blocks = std::min<int>(num_tokens / block_size_, int(seq.blocks.size()));
    if (seq.num_cached_blocks >= num_full_blocks) return;
    seq.update_block_hashes(block_size_);
    pool_.cache_full_blocks(seq.blocks, seq.block_hashes, seq.num_cached_blocks, num_full_blocks);
    seq.num_cached_blocks = num_full_blocks;
}

// vLLM: vllm/v1/core/single_type_kv_cache_manager.py:L261 (free): reversed so tail blocks are
// evicted first.
void KvCacheManager::free(Sequence& seq) {
    std::reverse(seq.blocks.begin(), seq.blocks.end());
    pool_.free_blocks(seq.blocks);
    seq.blocks.clear();
    seq.num_cached_blocks = 0;
    seq.kv_allocated = false;
}

}  // namespace scr::engine
