// Helpers for engine tests: collecting outputs per (request, sample) and running to completion.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine/engine.hpp"

namespace scr::test {

struct Collected {
    std::vector<int32_t> ids;
    std::string text;
    std::vector<std::string> chunks;
    std::vector<TokenLogprob> logprobs;
    FinishReason reason = FinishReason::none;
    std::string stop_reason, error;
    int finals = 0;
    int num_cached_tokens = -1;
    int num_output_tokens = 0;
};

using Results = std::map<std::pair<std::string, int>, Collected>;

inline Collected& at(Results& r, const std::string& id, int index = 0) { return r[{id, index}]; }

inline OutputCallback collect_into(Results& results) {
    return [&results](const RequestOutput& o) {
        Collected& c = results[{o.request_id, o.index}];
        EXPECT_EQ(c.finals, 0) << "output after the final one for " << o.request_id;
        c.ids.insert(c.ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        c.text += o.new_text;
        if (!o.new_text.empty()) c.chunks.push_back(o.new_text);
        c.logprobs.insert(c.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
        c.num_cached_tokens = o.num_cached_tokens;
        c.num_output_tokens = o.num_output_tokens;
        if (o.finished()) {
            ++c.finals;
            c.reason = o.finish_reason;
            c.stop_reason = o.stop_reason;
            c.error = o.error;
        }
    };
}

inline void run_to_completion(Engine& e, int max_steps = 200000) {
    int steps = 0;
    while (e.has_unfinished()) {
        ASSERT_TRUE(e.step()) << "unfinished requests but nothing was scheduled";
        ASSERT_LT(++steps, max_steps) << "engine did not finish";
    }
}

}  // namespace scr::test
