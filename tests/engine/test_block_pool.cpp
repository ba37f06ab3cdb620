// Block pool, free queue and KV cache manager: unit cases transcribed from the intent of vLLM's
// tests/v1/core/test_kv_cache_utils.py and test_prefix_caching.py, plus a randomized invariant test.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include "runtime/core/error.hpp"
#include "runtime/engine/block_pool.hpp"
#include "runtime/engine/kv_cache_manager.hpp"

using namespace scr::engine;

namespace {
BlockHash H(uint64_t x) { return {x * 0x9e3779b97f4a7c15ULL + 1, x ^ 0xabcdef}; }
}  // namespace

// vLLM: tests/v1/core/test_kv_cache_utils.py (test_free_kv_cache_block_queue_initialization,
// test_free_kv_cache_block_queue_operations): order by id, O(1) removal from the middle.
TEST(FreeBlockQueue, OrderAndMiddleRemoval) {
    FreeBlockQueue q(6);
    EXPECT_EQ(q.to_vector(), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
    EXPECT_EQ(q.popleft(), 0);
    q.remove(3);
    EXPECT_EQ(q.to_vector(), (std::vector<int32_t>{1, 2, 4, 5}));
    q.append(3);
    q.prepend(0);
    EXPECT_EQ(q.to_vector(), (std::vector<int32_t>{0, 1, 2, 4, 5, 3}));
    std::vector<int32_t> got;
    q.popleft_n(4, got);
    EXPECT_EQ(got, (std::vector<int32_t>{0, 1, 2, 4}));
    EXPECT_EQ(q.size(), 2);
    EXPECT_THROW(q.remove(1), std::logic_error);   // not in the queue
    EXPECT_THROW(q.append(5), std::logic_error);   // already in it
    q.popleft_n(2, got);
    EXPECT_EQ(q.size(), 0);
    EXPECT_THROW(q.popleft(), std::logic_error);
}

TEST(BlockPool, NullBlockIsNeverHandedOut) {
    BlockPool pool(5, true);
    EXPECT_EQ(pool.num_free_blocks(), 4);
    std::vector<int32_t> got;
    pool.get_new_blocks(4, got);
    EXPECT_EQ(std::count(got.begin(), got.end(), BlockPool::kNullBlock), 0);
    for (int32_t id : got) EXPECT_EQ(pool.block(id).ref_cnt, 1);
    EXPECT_EQ(pool.num_free_blocks(), 0);
    EXPECT_THROW(pool.get_new_blocks(1, got), std::logic_error);
    EXPECT_THROW(BlockPool(1, true), scr::Error);
}

// vLLM: tests/v1/core/test_prefix_caching.py (test_evict, test_free_block_order): freed uncached
// blocks are reused first; cached ones wait at the back in LRU order and are evicted from the
// front, losing their hash.
TEST(BlockPool, FreeOrderAndLazyEviction) {
    BlockPool pool(7, true);
    std::vector<int32_t> a, b;
    pool.get_new_blocks(3, a);  // 1 2 3
    pool.get_new_blocks(3, b);  // 4 5 6
    const BlockHash ha[3] = {H(1), H(2), H(3)};
    pool.cache_full_blocks(a, ha, 0, 2);  // 1 and 2 become cached, 3 stays uncached
    EXPECT_EQ(pool.num_cached_blocks(), 2);
    std::vector<int32_t> rev(a.rbegin(), a.rend());  // free tail first, as a request does
    pool.free_blocks(rev);
    // 3 (uncached) at the front; cached 2 then 1 at the back (tail block evicted first).
    EXPECT_EQ(pool.free_queue().to_vector(), (std::vector<int32_t>{3, 2, 1}));
    EXPECT_EQ(pool.get_cached_block(H(1)), 1);
    EXPECT_EQ(pool.get_cached_block(H(2)), 2);
    std::vector<int32_t> c;
    pool.get_new_blocks(2, c);  // takes 3, then evicts 2
    EXPECT_EQ(c, (std::vector<int32_t>{3, 2}));
    EXPECT_EQ(pool.get_cached_block(H(2)), -1);
    EXPECT_FALSE(pool.block(2).has_hash);
    EXPECT_EQ(pool.get_cached_block(H(1)), 1);  // still cached, still free
    // A hit on a free cached block takes it out of the free queue (vLLM: test_prefill touch).
    int32_t hit = pool.get_cached_block(H(1));
    pool.touch(std::span<const int32_t>(&hit, 1));
    EXPECT_EQ(pool.block(1).ref_cnt, 1);
    EXPECT_TRUE(pool.free_queue().to_vector().empty());
    EXPECT_THROW(pool.free_blocks(std::vector<int32_t>{1, 1}), std::logic_error);  // double free
}

// vLLM keeps duplicate cached blocks (block_pool.py:L32 BlockHashToBlockMap): evicting one leaves
// the other reachable.
TEST(BlockPool, DuplicateHashes) {
    BlockPool pool(4, true);
    std::vector<int32_t> a, b;
    pool.get_new_blocks(1, a);
    pool.get_new_blocks(1, b);
    const BlockHash h[1] = {H(9)};
    pool.cache_full_blocks(a, h, 0, 1);
    pool.cache_full_blocks(b, h, 0, 1);
    EXPECT_EQ(pool.get_cached_block(H(9)), a[0]);
    pool.free_blocks(a);
    std::vector<int32_t> c;
    pool.get_new_blocks(2, c);  // block 3 (fresh) then a[0], evicted
    EXPECT_EQ(pool.get_cached_block(H(9)), b[0]);
}

// vLLM: tests/v1/core/test_prefix_caching.py (test_reset_prefix_cache).
TEST(BlockPool, ResetPrefixCacheOnlyWhenIdle) {
    BlockPool pool(4, true);
    std::vector<int32_t> a;
    pool.get_new_blocks(2, a);
    const BlockHash h[2] = {H(1), H(2)};
    pool.cache_full_blocks(a, h, 0, 2);
    EXPECT_FALSE(pool.reset_prefix_cache());
    pool.free_blocks(a);
    EXPECT_TRUE(pool.reset_prefix_cache());
    EXPECT_EQ(pool.get_cached_block(H(1)), -1);
    EXPECT_EQ(pool.num_cached_blocks(), 0);
}

// The open-addressing table under churn: compare against std::map after every operation.
TEST(BlockPool, HashTableMatchesReferenceUnderChurn) {
    const int N = 200;
    BlockPool pool(N, true);
    std::mt19937 rng(7);
    std::map<int32_t, uint64_t> cached;  // block -> key, for blocks registered and not evicted
    for (int round = 0; round < 3000; ++round) {
        if (pool.num_free_blocks() == 0 || rng() % 3 == 0) {
            // free a random in-use block
            std::vector<int32_t> used;
            for (int32_t id = 1; id < N; ++id) if (pool.block(id).ref_cnt > 0) used.push_back(id);
            if (used.empty()) continue;
            int32_t id = used[rng() % used.size()];
            pool.free_blocks(std::span<const int32_t>(&id, 1));
        } else {
            std::vector<int32_t> got;
            pool.get_new_blocks(1, got);
            cached.erase(got[0]);  // evicted if it was cached
            uint64_t key = rng() % 64;  // few keys: many duplicates
            const BlockHash h[1] = {H(key)};
            pool.cache_full_blocks(got, h, 0, 1);
            cached[got[0]] = key;
        }
        // Every key with a live cached block must be found, and map to a block holding it.
        std::set<uint64_t> keys;
        for (auto [id, k] : cached) keys.insert(k);
        for (uint64_t k = 0; k < 64; ++k) {
            int32_t id = pool.get_cached_block(H(k));
            if (keys.count(k)) {
                ASSERT_GE(id, 1) << "key " << k << " lost at round " << round;
                ASSERT_EQ(cached.at(id), k);
            } else {
                ASSERT_EQ(id, -1) << "key " << k << " found after eviction at round " << round;
            }
        }
    }
}

// ---- KvCacheManager ------------------------------------------------------------------------------

namespace {
scr::SamplingParams default_params;

std::unique_ptr<Sequence> make_seq(std::vector<int32_t> prompt, int block_size) {
    auto s = std::make_unique<Sequence>();
    s->params = &default_params;
    s->tokens = std::move(prompt);
    s->num_prompt_tokens = int(s->tokens.size());
    s->update_block_hashes(block_size);
    return s;
}
}  // namespace

// vLLM: tests/v1/core/test_prefix_caching.py (test_prefill): a second request with the same
// prefix gets the same physical blocks for its full common blocks, never the last token.
TEST(KvCacheManager, PrefixHitReturnsIdenticalBlocks) {
    const int bs = 4;
    KvCacheManager kv(20, bs, 64, true);
    std::vector<int32_t> common = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    auto a = make_seq(common, bs);
    a->tokens.push_back(50);
    a->num_prompt_tokens++;
    a->update_block_hashes(bs);
    std::vector<int32_t> hits;
    EXPECT_EQ(kv.get_computed_blocks(*a, hits), 0);
    ASSERT_TRUE(kv.allocate_slots(*a, a->num_tokens()));
    EXPECT_EQ(a->blocks.size(), 3u);
    a->num_computed_tokens = a->num_tokens();
    kv.cache_blocks(*a, a->num_computed_tokens);  // blocks 0..2 full (12 tokens)

    auto b = make_seq(common, bs);  // 11 tokens: max hit = 10 tokens -> 2 blocks
    b->tokens.push_back(60);        // 12 tokens: max hit 11 -> still 2 blocks (block 3 differs)
    b->num_prompt_tokens++;
    b->update_block_hashes(bs);
    EXPECT_EQ(kv.get_computed_blocks(*b, hits), 8);
    EXPECT_EQ(hits, std::vector<int32_t>(a->blocks.begin(), a->blocks.begin() + 2));
    ASSERT_TRUE(kv.allocate_slots(*b, 4, 8, hits));
    EXPECT_EQ(kv.pool().block(a->blocks[0]).ref_cnt, 2);
    EXPECT_NE(b->blocks[2], a->blocks[2]);

    // A request equal to a's whole prompt hits all but its last block (last token recomputed).
    auto c = make_seq(a->tokens, bs);
    EXPECT_EQ(kv.get_computed_blocks(*c, hits), 8);

    kv.free(*a);
    kv.free(*b);
    EXPECT_EQ(kv.pool().num_free_blocks(), 19);
}

// vLLM: tests/v1/core/test_prefix_caching.py (test_prefill_not_enough_free_blocks_with_computed_blocks):
// when the pool is short, allocate_slots changes nothing.
TEST(KvCacheManager, ShortPoolLeavesStateUnchanged) {
    const int bs = 4;
    KvCacheManager kv(4, bs, 64, true);  // 3 usable blocks
    auto a = make_seq({1, 2, 3, 4, 5, 6, 7, 8, 9}, bs);
    ASSERT_TRUE(kv.allocate_slots(*a, 9));  // 3 blocks: fits
    auto b = make_seq({9, 9, 9, 9, 9}, bs);
    EXPECT_FALSE(kv.allocate_slots(*b, 5));
    EXPECT_TRUE(b->blocks.empty());
    EXPECT_FALSE(b->kv_allocated);
    EXPECT_EQ(kv.pool().num_free_blocks(), 0);
}

// Random allocate / append / cache / free / preempt sequences: ref counts always equal the number
// of sequences holding a block; free + used == total; nothing leaks; a hit returns exactly the
// blocks that hold that prefix.
TEST(KvCacheManager, RandomOperationsKeepInvariants) {
    const int bs = 4, num_blocks = 40;
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 20; ++trial) {
        KvCacheManager kv(num_blocks, bs, 128, trial % 4 != 3);
        std::vector<std::unique_ptr<Sequence>> live;
        // A few shared prefixes so hits happen.
        std::vector<std::vector<int32_t>> prefixes;
        for (int p = 0; p < 3; ++p) {
            std::vector<int32_t> v;
            for (int i = 0; i < 3 + int(rng() % 10); ++i) v.push_back(int32_t(rng() % 5));
            prefixes.push_back(v);
        }
        auto check = [&](const char* where) {
            std::map<int32_t, int> refs;
            for (auto& s : live)
                for (int32_t id : s->blocks) refs[id]++;
            int used = 0;
            for (int32_t id = 1; id < num_blocks; ++id) {
                int expect = refs.count(id) ? refs[id] : 0;
                ASSERT_EQ(kv.pool().block(id).ref_cnt, expect) << where << " block " << id;
                ASSERT_EQ(kv.pool().free_queue().contains(id), expect == 0) << where << " block " << id;
                used += expect > 0;
            }
            ASSERT_EQ(refs.count(BlockPool::kNullBlock), 0u);
            ASSERT_EQ(kv.pool().num_free_blocks() + used, num_blocks - 1) << where;
            // Every cached block holds the hash of the tokens of any live sequence using it there.
            for (auto& s : live)
                for (int i = 0; i < s->num_cached_blocks; ++i) {
                    const KvBlock& b = kv.pool().block(s->blocks[size_t(i)]);
                    ASSERT_TRUE(b.has_hash) << where;
                    ASSERT_TRUE(b.hash == s->block_hashes[size_t(i)]) << where;
                }
        };
        std::vector<int32_t> hits;
        for (int op = 0; op < 400; ++op) {
            const int kind = int(rng() % 10);
            if (kind < 4 || live.empty()) {  // a new sequence, prefix-hit then allocate its prompt
                auto s = make_seq(prefixes[rng() % prefixes.size()], bs);
                for (int i = 0, n = int(rng() % 9); i < n; ++i) s->tokens.push_back(int32_t(rng() % 5));
                s->num_prompt_tokens = s->num_tokens();
                s->update_block_hashes(bs);
                int hit = kv.get_computed_blocks(*s, hits);
                ASSERT_EQ(hit % bs, 0);
                ASSERT_LT(hit, s->num_tokens());
                // The hit blocks are exactly those cached under the sequence's own hashes.
                for (size_t i = 0; i < hits.size(); ++i)
                    ASSERT_TRUE(kv.pool().block(hits[i]).hash == s->block_hashes[i]);
                if (kv.allocate_slots(*s, s->num_tokens() - hit, hit, hits)) {
                    s->num_computed_tokens = s->num_tokens();
                    kv.cache_blocks(*s, s->num_computed_tokens);
                    live.push_back(std::move(s));
                }
            } else if (kind < 7) {  // decode one token
                auto& s = live[rng() % live.size()];
                s->append_token(int32_t(rng() % 5), bs);
                if (kv.allocate_slots(*s, 1)) {
                    s->num_computed_tokens = s->num_tokens();
                    kv.cache_blocks(*s, s->num_computed_tokens);
                } else {  // preempt: free and forget its progress (recompute later)
                    kv.free(*s);
                    s->num_computed_tokens = 0;
                    live.erase(std::find(live.begin(), live.end(), s));
                }
            } else {  // finish
                size_t i = rng() % live.size();
                kv.free(*live[i]);
                ASSERT_TRUE(live[i]->blocks.empty());
                live.erase(live.begin() + ptrdiff_t(i));
            }
            check("after op");
        }
        for (auto& s : live) kv.free(*s);
        live.clear();
        check("at end");
        ASSERT_EQ(kv.pool().num_free_blocks(), num_blocks - 1);
    }
}
