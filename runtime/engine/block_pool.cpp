#include "runtime/engine/block_pool.hpp"

#include <stdexcept>

#include "runtime/core/error.hpp"

namespace scr::engine {

// ---- FreeBlockQueue --------------------------------------------------------------------------------

// vLLM: vllm/v1/core/kv_cache_utils.py:L180 (FreeKVCacheBlockQueue.__init__): consecutive ids
// linked in order between a fake head and a fake tail.
FreeBlockQueue::FreeBlockQueue(int32_t num_blocks)
    : head_(num_blocks), tail_(num_blocks + 1),
      prev_(size_t(num_blocks) + 2, kNone), next_(size_t(num_blocks) + 2, kNone) {
    int32_t last = head_;
    for (int32_t id = 0; id < num_blocks; ++id) {
        next_[last] = id;
        prev_[id] = last;
        last = id;
    }
    next_[last] = tail_;
    prev_[tail_] = last;
    size_ = num_blocks;
}

void FreeBlockQueue::link_after(int32_t at, int32_t id) {
    int32_t after = next_[at];
    next_[at] = id;
    prev_[id] = at;
    next_[id] = after;
    prev_[after] = id;
    ++size_;
}

// vLLM: vllm/v1/core/kv_cache_utils.py:L210 (popleft)
int32_t FreeBlockQueue::popleft() {
    if (size_ == 0) throw std::logic_error("FreeBlockQueue::popleft on an empty queue");
    int32_t id = next_[head_];
    remove(id);
    return id;
}

// vLLM: vllm/v1/core/kv_cache_utils.py:L247 (popleft_n)
void FreeBlockQueue::popleft_n(int32_t n, std::vector<int32_t>& out) {
    if (n > size_) throw std::logic_error("FreeBlockQueue::popleft_n: not enough free blocks");
    int32_t cur = next_[head_];
    for (int32_t i = 0; i < n; ++i) {
        int32_t nxt = next_[cur];
        prev_[cur] = next_[cur] = kNone;
        out.push_back(cur);
        cur = nxt;
    }
    next_[head_] = cur;
    prev_[cur] = head_;
    size_ -= n;
}

// vLLM: vllm/v1/core/kv_cache_utils.py:L280 (remove)
void FreeBlockQueue::remove(int32_t id) {
    if (prev_[id] == kNone || next_[id] == kNone)
        throw std::logic_error("FreeBlockQueue::remove: block is not in the free queue");
    next_[prev_[id]] = next_[id];
    prev_[next_[id]] = prev_[id];
    prev_[id] = next_[id] = kNone;
    --size_;
}

// vLLM: vllm/v1/core/kv_cache_utils.py:L300 (append)
void FreeBlockQueue::append(int32_t id) {
    if (prev_[id] != kNone) throw std::logic_error("FreeBlockQueue::append: block already free");
    link_after(prev_[tail_], id);
}

void FreeBlockQueue::prepend(int32_t id) {
    if (prev_[id] != kNone) throw std::logic_error("FreeBlockQueue::prepend: block already free");
    link_after(head_, id);
}

std::vector<int32_t> FreeBlockQueue::to_vector() const {
    std::vector<int32_t> v;
    for (int32_t id = next_[head_]; id != tail_; id = next_[id]) v.push_back(id);
    return v;
}

// ---- BlockPool::HashTable ---------------------------------------------------------------------------

BlockPool::HashTable::HashTable(int32_t num_blocks) {
    size_t cap = 16;
    while (cap < size_t(num_blocks) * 2) cap <<= 1;
    keys_.resize(cap);
    heads_.assign(cap, -1);
    mask_ = cap - 1;
}

int32_t BlockPool::HashTable::find(const BlockHash& h) const {
    for (size_t s = slot_of(h);; s = (s + 1) & mask_) {
        if (heads_[s] < 0) return -1;
        if (keys_[s] == h) return heads_[s];
    }
}

void BlockPool::HashTable::insert(const BlockHash& h, int32_t id, std::vector<KvBlock>& blocks) {
    size_t s = slot_of(h);
    for (;; s = (s + 1) & mask_) {
        if (heads_[s] < 0) break;
        if (keys_[s] == h) {  // a duplicate: keep the first block as the one lookups return
            blocks[id].next_same_hash = blocks[heads_[s]].next_same_hash;
            blocks[heads_[s]].next_same_hash = id;
            return;
        }
    }
    keys_[s] = h;
    heads_[s] = id;
    blocks[id].next_same_hash = -1;
    ++size_;
}

bool BlockPool::HashTable::erase(const BlockHash& h, int32_t id, std::vector<KvBlock>& blocks) {
    size_t s = slot_of(h);
    for (;; s = (s + 1) & mask_) {
        if (heads_[s] < 0) return false;
        if (keys_[s] == h) break;
    }
    if (heads_[s] != id) {  // unlink from the duplicate chain
        for (int32_t cur = heads_[s]; blocks[cur].next_same_hash >= 0; cur = blocks[cur].next_same_hash) {
            if (blocks[cur].next_same_hash == id) {
                blocks[cur].next_same_hash = blocks[id].next_same_hash;
                blocks[id].next_same_hash = -1;
                return true;
            }
        }
        return false;
    }
    if (blocks[id].next_same_hash >= 0) {  // promote the next duplicate
        heads_[s] = blocks[id].next_same_hash;
        blocks[id].next_same_hash = -1;
        return true;
    }
    // Remove the slot with backward-shift deletion so probe chains stay unbroken.
    heads_[s] = -1;
    --size_;
    for (size_t hole = s, j = (s + 1) & mask_; heads_[j] >= 0; j = (j + 1) & mask_) {
        size_t home = slot_of(keys_[j]);
        // Move j into the hole if its home is not in the cyclic range (hole, j].
        bool home_in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!home_in_range) {
            keys_[hole] = keys_[j];
            heads_[hole] = heads_[j];
            heads_[j] = -1;
            hole = j;
        }
    }
    return true;
}

void BlockPool::HashTable::clear() {
    std::fill(heads_.begin(), heads_.end(), -1);
    size_ = 0;
}

// ---- BlockPool --------------------------------------------------------------------------------------

BlockPool::BlockPool(int32_t num_blocks, bool enable_caching)
    : enable_caching_(enable_caching), blocks_(size_t(std::max(num_blocks, 0))),
      free_(std::max(num_blocks, 0)), cache_(std::max(num_blocks, 1)) {
    if (num_blocks < 2)
        fail("KV pool of {} blocks: need at least 2 (the null block and one usable block)", num_blocks);
    // vLLM: vllm/v1/core/block_pool.py:L174: the null block is the first one taken and never returned.
    int32_t null_id = free_.popleft();
    (void)null_id;  // == kNullBlock
}

// vLLM: vllm/v1/core/block_pool.py:L487 (get_usage)
double BlockPool::usage() const {
    int32_t total = num_blocks() - 1;
    return total ? 1.0 - double(num_free_blocks()) / total : 0.0;
}

// vLLM: vllm/v1/core/block_pool.py:L182 (get_cached_block)
int32_t BlockPool::get_cached_block(const BlockHash& hash) const { return cache_.find(hash); }

// vLLM: vllm/v1/core/block_pool.py:L209 (cache_full_blocks)
void BlockPool::cache_full_blocks(std::span<const int32_t> blocks, std::span<const BlockHash> hashes,
                                  int num_cached_blocks, int num_full_blocks) {
    if (num_cached_blocks >= num_full_blocks) return;
    if (int(hashes.size()) < num_full_blocks || int(blocks.size()) < num_full_blocks)
        throw std::logic_error("cache_full_blocks: fewer hashes or blocks than full blocks");
    for (int i = num_cached_blocks; i < num_full_blocks; ++i) {
        int32_t id = blocks[i];
        if (id == kNullBlock) continue;
        KvBlock& b = blocks_[id];
        if (b.has_hash) {
            // vLLM: block_pool.py:L263: a block from a prefix hit must carry this position's hash.
            if (!(b.hash == hashes[i])) throw std::logic_error("cached block has the wrong hash");
            continue;
        }
        b.has_hash = true;
        b.hash = hashes[i];
        cache_.insert(b.hash, id, blocks_);
    }
}

// vLLM: vllm/v1/core/block_pool.py:L311 (get_new_blocks)
void BlockPool::get_new_blocks(int32_t n, std::vector<int32_t>& out) {
    if (n > num_free_blocks())
        throw std::logic_error("get_new_blocks: not enough free blocks (caller must check)");
    size_t first = out.size();
    free_.popleft_n(n, out);
    for (size_t i = first; i < out.size(); ++i) {
        int32_t id = out[i];
        if (enable_caching_) maybe_evict_cached_block(id);
        if (blocks_[id].ref_cnt != 0) throw std::logic_error("free block with nonzero ref_cnt");
        blocks_[id].ref_cnt = 1;
    }
}

// vLLM: vllm/v1/core/block_pool.py:L343 (_maybe_evict_cached_block)
bool BlockPool::maybe_evict_cached_block(int32_t id) {
    KvBlock& b = blocks_[id];
    if (!b.has_hash) return false;
    bool erased = cache_.erase(b.hash, id, blocks_);
    b.has_hash = false;
    b.hash = {};
    return erased;
}

// vLLM: vllm/v1/core/block_pool.py:L383 (touch)
void BlockPool::touch(std::span<const int32_t> blocks) {
    for (int32_t id : blocks) {
        if (id == kNullBlock) continue;
        if (blocks_[id].ref_cnt == 0) free_.remove(id);  // an eviction candidate comes back
        ++blocks_[id].ref_cnt;
    }
}

// vLLM: vllm/v1/core/block_pool.py:L400 (free_blocks)
void BlockPool::free_blocks(std::span<const int32_t> ordered_blocks) {
    for (int32_t id : ordered_blocks) {
        if (id == kNullBlock) continue;
        if (blocks_[id].ref_cnt <= 0) throw std::logic_error("free_blocks: double free of a KV block");
        --blocks_[id].ref_cnt;
    }
    // Uncached blocks go to the front in the given order (prepend the last first), cached ones to
    // the back so they survive longest as prefix-cache hits.
    for (size_t k = ordered_blocks.size(); k-- > 0;) {
        int32_t id = ordered_blocks[k];
        if (id != kNullBlock && blocks_[id].ref_cnt == 0 && !blocks_[id].has_hash && !free_.contains(id))
            free_.prepend(id);
    }
    for (int32_t id : ordered_blocks) {
        if (id != kNullBlock && blocks_[id].ref_cnt == 0 && blocks_[id].has_hash && !free_.contains(id))
            free_.append(id);
    }
}

// vLLM: vllm/v1/core/block_pool.py:L444 (reset_prefix_cache)
bool BlockPool::reset_prefix_cache() {
    if (num_blocks() - num_free_blocks() != 1) return false;  // only the null block may be in use
    cache_.clear();
    for (KvBlock& b : blocks_) { b.has_hash = false; b.hash = {}; b.next_same_hash = -1; }
    return true;
}

}  // namespace scr::engine
