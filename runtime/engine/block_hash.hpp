// Chained block hashes for prefix caching: the hash of block i covers its tokens, the hash of block
// i-1 and (for block 0) the request's extra keys, so equal hashes mean equal whole prefixes.
// vLLM: vllm/v1/core/kv_cache_utils.py:L535 (hash_block_tokens) and L565 (get_request_block_hasher).
//
// vLLM hashes with sha256 (or its builtin hash) over a pickled tuple; we use two independent 64-bit
// lanes (128 bits) of a multiply-xorshift mix. Collisions are as unlikely as vLLM's for honest
// traffic, but this is not a cryptographic hash: a client who can choose prompts could in principle
// construct a collision (see docs/ENGINE.md).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace scr::engine {

struct BlockHash {
    uint64_t lo = 0, hi = 0;
    bool operator==(const BlockHash&) const = default;
};

namespace detail {
inline uint64_t fmix64(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}
struct HashLanes {
    uint64_t a = 0x6a09e667f3bcc908ULL, b = 0xbb67ae8584caa73bULL;
    void add(uint64_t w) {
        a = fmix64(a ^ (w + 0x9e3779b97f4a7c15ULL)) * 0x100000001b3ULL + 0x51;
        b = fmix64(b + (w ^ 0xd1b54a32d192ed03ULL)) ^ (b >> 29);
    }
};
}  // namespace detail

// The extra key of a request (vLLM: generate_block_hash_extra_keys, kv_cache_utils.py:L497): we have
// one, the cache salt, which like vLLM's enters only the first block's hash. 0 = none.
inline uint64_t hash_extra_key(std::string_view salt) {
    if (salt.empty()) return 0;
    detail::HashLanes h;
    for (unsigned char c : salt) h.add(c);
    h.add(salt.size());
    return h.a ^ (h.b << 1) ^ 1;  // never 0
}

// vLLM: vllm/v1/core/kv_cache_utils.py:L535 (hash_block_tokens): parent == nullptr for the first
// block (vLLM then uses NONE_HASH, a per-process seed; our seed is the lanes' initial state).
inline BlockHash hash_block_tokens(const BlockHash* parent, std::span<const int32_t> tokens,
                                   uint64_t extra_key) {
    detail::HashLanes h;
    if (parent) { h.add(parent->lo); h.add(parent->hi); } else { h.add(0x4e4f4e45ULL); }
    for (int32_t t : tokens) h.add(uint32_t(t));
    h.add(tokens.size());
    h.add(extra_key);
    return {h.a, h.b};
}

}  // namespace scr::engine
