// The KV block pool: fixed-size blocks, reference counts, a null block, an LRU free queue, and the
// prefix cache (block hash -> block). vLLM: vllm/v1/core/block_pool.py:L128 (BlockPool) and
// vllm/v1/core/kv_cache_utils.py:L110 (KVCacheBlock), L158 (FreeKVCacheBlockQueue).
//
// Blocks are referred to by id (0 .. num_blocks-1); block 0 is the null block, never handed out
// (vLLM: block_pool.py:L174), so a block table padded with 0 points at harmless memory.
// Nothing here allocates after construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/block_hash.hpp"

namespace scr::engine {

// A doubly linked list of free block ids with fake head/tail sentinels, so removing a block from
// the middle (a prefix-cache hit on an eviction candidate) is O(1).
// vLLM: vllm/v1/core/kv_cache_utils.py:L158 (FreeKVCacheBlockQueue).
// Order = eviction order: the front is taken first. Initially ordered by id.
class FreeBlockQueue {
public:
    explicit FreeBlockQueue(int32_t num_blocks);
    int32_t size() const { return size_; }
    bool contains(int32_t id) const { return prev_[id] != kNone; }

    int32_t popleft();                                  // vLLM: kv_cache_utils.py:L210
    void popleft_n(int32_t n, std::vector<int32_t>& out);  // vLLM: kv_cache_utils.py:L247 (appends to out)
    void remove(int32_t id);                            // vLLM: kv_cache_utils.py:L280
    void append(int32_t id);                            // vLLM: kv_cache_utils.py:L300
    void prepend(int32_t id);                           // the front: used first (block_pool.py:L421)
    std::vector<int32_t> to_vector() const;             // front to back, for tests

private:
    static constexpr int32_t kNone = -1;
    void link_after(int32_t at, int32_t id);
    int32_t head_, tail_;                 // sentinel ids: num_blocks, num_blocks + 1
    std::vector<int32_t> prev_, next_;    // kNone: not in the queue
    int32_t size_ = 0;
};

struct KvBlock {
    int32_t ref_cnt = 0;
    bool has_hash = false;       // full and registered in the prefix cache
    BlockHash hash;
    int32_t next_same_hash = -1; // other cached blocks with the same hash (vLLM keeps duplicates)
};

class BlockPool {
public:
    BlockPool(int32_t num_blocks, bool enable_caching);

    static constexpr int32_t kNullBlock = 0;
    int32_t num_blocks() const { return int32_t(blocks_.size()); }
    int32_t num_free_blocks() const { return free_.size(); }
    double usage() const;  // vLLM: block_pool.py:L487 (get_usage), null block excluded
    bool caching_enabled() const { return enable_caching_; }

    // vLLM: block_pool.py:L182 (get_cached_block). -1 on a miss.
    int32_t get_cached_block(const BlockHash& hash) const;
    // Registers blocks[num_cached, num_full) under hashes[i]. Blocks that already carry a hash (they
    // came from a prefix hit) must carry the expected one. vLLM: block_pool.py:L209 (cache_full_blocks).
    void cache_full_blocks(std::span<const int32_t> blocks, std::span<const BlockHash> hashes,
                           int num_cached_blocks, int num_full_blocks);
    // Takes n blocks from the front of the free queue (evicting their cached hashes), ref_cnt = 1,
    // appended to out. The caller checks num_free_blocks() first. vLLM: block_pool.py:L311.
    void get_new_blocks(int32_t n, std::vector<int32_t>& out);
    // ref_cnt += 1, taking eviction candidates out of the free queue. vLLM: block_pool.py:L383 (touch).
    void touch(std::span<const int32_t> blocks);
    // ref_cnt -= 1; blocks reaching 0 go back to the free queue: uncached ones to the front (reused
    // first), cached ones to the back (kept longest for hits), in the given order.
    // vLLM: block_pool.py:L400 (free_blocks).
    void free_blocks(std::span<const int32_t> ordered_blocks);
    // Drops every cached hash; only when no block is in use. vLLM: block_pool.py:L444.
    bool reset_prefix_cache();

    const KvBlock& block(int32_t id) const { return blocks_[id]; }
    const FreeBlockQueue& free_queue() const { return free_; }
    int32_t num_cached_blocks() const { return cache_.size(); }

private:
    // vLLM: block_pool.py:L343 (_maybe_evict_cached_block).
    bool maybe_evict_cached_block(int32_t id);

    // Open-addressing hash -> first block id, sized once for every block (vLLM: block_pool.py:L32,
    // BlockHashToBlockMap, a dict). Duplicates hang off KvBlock::next_same_hash.
    class HashTable {
    public:
        explicit HashTable(int32_t num_blocks);
        int32_t find(const BlockHash& h) const;         // first block or -1
        void insert(const BlockHash& h, int32_t id, std::vector<KvBlock>& blocks);
        bool erase(const BlockHash& h, int32_t id, std::vector<KvBlock>& blocks);
        int32_t size() const { return size_; }
        void clear();
    private:
        size_t slot_of(const BlockHash& h) const { return size_t(h.lo ^ (h.hi >> 7)) & mask_; }
        std::vector<BlockHash> keys_;
        std::vector<int32_t> heads_;  // -1: empty slot
        size_t mask_;
        int32_t size_ = 0;
    };

    bool enable_caching_;
    std::vector<KvBlock> blocks_;
    FreeBlockQueue free_;
    HashTable cache_;
};

}  // namespace scr::engine
