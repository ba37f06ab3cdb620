#include "runtime/engine/spec_decode.hpp"

#include <algorithm>
#include <stdexcept>

namespace scr::engine {

int propose_ngram(std::span<const int32_t> tokens, const NgramConfig& c, int max_model_len, std::vector<int32_t>& draft) {
    draft.clear();
    if (c.min_n < 1 || c.max_n < c.min_n) throw std::invalid_argument("propose_ngram: need 1 <= min_n <= max_n");
    const int total = int(tokens.size());
    // vLLM: ngram_proposer.py: no draft for a context shorter than min_n, nor past max_model_len.
    const int k = std::min(c.k, max_model_len - total);
    if (k <= 0 || total < c.min_n) return 0;
    // Longest first: the first n with an earlier occurrence wins. An occurrence at s covers
    // [s, s + n) and must end before the last token (s + n <= total - 1), so something follows it.
    for (int n = std::min(c.max_n, total - 1); n >= c.min_n; --n) {
        const int32_t* suffix = tokens.data() + (total - n);
        for (int s = 0; s + n <= total - 1; ++s) {
            if (!std::equal(suffix, suffix + n, tokens.data() + s)) continue;
            const int from = s + n, count = std::min(k, total - from);
            draft.assign(tokens.begin() + from, tokens.begin() + from + count);
            return count;
        }
    }
    return 0;
}

}  // namespace scr::engine
