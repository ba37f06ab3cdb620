// Speculative decoding's n-gram proposer (runtime/engine/spec_decode.hpp) against vLLM's documented
// example and against an independent enumeration of every match on random token strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "runtime/engine/spec_decode.hpp"

using namespace scr::engine;

namespace {

// Every (n, start) whose n tokens equal the last n and end before the last token, then the one with
// the largest n and, of those, the smallest start; the draft is what follows it.
std::vector<int32_t> reference_draft(const std::vector<int32_t>& t, int min_n, int max_n, int k, int max_model_len) {
    const int total = int(t.size());
    k = std::min(k, max_model_len - total);
    if (k <= 0) return {};
    std::vector<std::pair<int, int>> matches;  // (n, start)
    for (int n = min_n; n <= max_n; ++n)
        for (int s = 0; s + n < total; ++s) {
            bool eq = true;
            for (int i = 0; i < n && eq; ++i) eq = t[size_t(s + i)] == t[size_t(total - n + i)];
            if (eq) matches.emplace_back(n, s);
        }
    if (matches.empty()) return {};
    const auto best = std::min_element(matches.begin(), matches.end(), [](auto a, auto b) {
        return std::make_tuple(-a.first, a.second) < std::make_tuple(-b.first, b.second);
    });
    const int from = best->first + best->second;
    return std::vector<int32_t>(t.begin() + from, t.begin() + std::min(total, from + k));
}

}  // namespace

TEST(SpecDecode, NgramProposerMatchesVllmExample) {
    // vLLM's docstring: [1,2,3,4,2,3], min 2, max 3, k 4: [4,2,3] has no earlier occurrence, [2,3]
    // has one at 1, followed by only three tokens.
    std::vector<int32_t> draft;
    const std::vector<int32_t> t = {1, 2, 3, 4, 2, 3};
    EXPECT_EQ(propose_ngram(t, {2, 3, 4}, 1000, draft), 3);
    EXPECT_EQ(draft, (std::vector<int32_t>{4, 2, 3}));
    // max_model_len leaves room for one more token only.
    EXPECT_EQ(propose_ngram(t, {2, 3, 4}, 7, draft), 1);
    EXPECT_EQ(draft, (std::vector<int32_t>{4}));
    // No room, no n-gram, too short, k = 0: nothing.
    EXPECT_EQ(propose_ngram(t, {2, 3, 4}, 6, draft), 0);
    EXPECT_TRUE(draft.empty());
    EXPECT_EQ(propose_ngram(std::vector<int32_t>{1, 2, 3, 4, 5}, {1, 3, 4}, 100, draft), 0);
    EXPECT_EQ(propose_ngram(std::vector<int32_t>{7}, {1, 3, 4}, 100, draft), 0);
    EXPECT_EQ(propose_ngram(t, {2, 3, 0}, 100, draft), 0);
    EXPECT_THROW(propose_ngram(t, {0, 3, 4}, 100, draft), std::invalid_argument);
    EXPECT_THROW(propose_ngram(t, {3, 2, 4}, 100, draft), std::invalid_argument);
}

TEST(SpecDecode, NgramProposerPrefersLongerThenEarlier) {
    std::vector<int32_t> draft;
    // [5 6] occurs at 0 and 3; [9 5 6] only at 2: the longer match wins.
    EXPECT_EQ(propose_ngram(std::vector<int32_t>{5, 6, 9, 5, 6, 1, 9, 5, 6}, {1, 3, 2}, 100, draft), 2);
    EXPECT_EQ(draft, (std::vector<int32_t>{1, 9}));
    // [5 6] at 0 and 3, nothing longer: the earlier occurrence's continuation.
    EXPECT_EQ(propose_ngram(std::vector<int32_t>{5, 6, 1, 5, 6, 2, 5, 6}, {1, 3, 2}, 100, draft), 2);
    EXPECT_EQ(draft, (std::vector<int32_t>{1, 5}));
}

TEST(SpecDecode, NgramProposerMatchesEnumeration) {
    std::mt19937 g(77);
    std::vector<int32_t> draft;
    int with_draft = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        const int len = 1 + int(g() % 60), alphabet = 2 + int(g() % 5);
        std::vector<int32_t> t(static_cast<size_t>(len));
        for (int32_t& x : t) x = int32_t(g() % uint32_t(alphabet));
        const int min_n = 1 + int(g() % 3), max_n = min_n + int(g() % 4), k = int(g() % 6);
        const int max_model_len = len + int(g() % 8);
        const std::vector<int32_t> want = reference_draft(t, min_n, max_n, k, max_model_len);
        ASSERT_EQ(propose_ngram(t, {min_n, max_n, k}, max_model_len, draft), int(want.size())) << "trial " << trial;
        ASSERT_EQ(draft, want) << "trial " << trial;
        with_draft += !want.empty();
    }
    EXPECT_GT(with_draft, 1000);  // the random strings do exercise matches
}
