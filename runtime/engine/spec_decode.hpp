// Speculative decoding's first parts: the n-gram ("prompt lookup") proposer. The check of a draft
// token against its row is Sampler::verify_draft (sampler.hpp). The scheduler, runner and engine do
// not use them yet: the wiring is planned in docs/ENGINE.md ("Speculative decoding: the plan").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace scr::engine {

struct NgramConfig {
    int min_n = 1;  // shortest n-gram that may match (vLLM: prompt_lookup_min)
    int max_n = 4;  // longest (vLLM: prompt_lookup_max)
    int k = 0;      // most tokens proposed (vLLM: num_speculative_tokens); 0: none
};

// The longest n-gram, n in [min_n, max_n], that ends `tokens` and also occurs earlier in them (of
// equally long ones, the earliest occurrence); `draft` becomes the tokens that followed that
// occurrence, at most c.k of them and none at or past max_model_len. Returns the draft's length
// (0: no match). O(max_n^2 x tokens) in the worst case, comparisons of int32s.
// vLLM: vllm/v1/spec_decode/ngram_proposer.py@016e8ede870e3c087fdcdfb36ed3622112712f10
// (_find_longest_matched_ngram_and_propose_tokens: the same choice, found there with a KMP table).
int propose_ngram(std::span<const int32_t> tokens, const NgramConfig& c, int max_model_len, std::vector<int32_t>& draft);

}  // namespace scr::engine
