// A few hundred mutated request bodies through the fuzz entry point (fuzz_request.cpp), so CI runs the
// parser's worst inputs under ASan/UBSan (-DSCR_SANITIZE=ON) without libFuzzer. Mutations are seeded
// and deterministic: byte flips, truncations, splices of JSON tokens, and type swaps of every field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>

#include "tests/server/fuzz_request.hpp"

namespace scr::server::testing {
namespace {

using nlohmann::json;

const char* const kSeeds[] = {
    R"({"model": "scripted", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "temperature": 0.5, "top_p": 0.9, "n": 2, "stop": ["x"], "max_tokens": 5, "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}], "tool_choice": "auto", "seed": 3, "logit_bias": {"5": 1}})",
    R"({"prompt": ["a", [5, 6, 7]], "max_tokens": 3, "echo": true, "n": 2, "logprobs": null, "stop": "z", "min_tokens": 1})",
    R"({"model": "scripted", "max_tokens": 8, "system": "sys", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]}]}], "tools": [{"name": "f", "input_schema": {"type": "object"}}], "stop_sequences": ["S"], "stream": true})",
    R"({"prompt": "hello", "add_special_tokens": false, "return_token_strs": true})",
    R"({"tokens": [5, 6, 7, 1, 0]})",
    R"({"messages": [{"role": "user", "content": "hi"}], "continue_final_message": false, "chat_template_kwargs": {"enable_thinking": false}})",
};

const json kOddValues[] = {nullptr, true, -1, 0, 1e308, -1e308, 3.5, 4294967296LL, "", "x", json::array(),
                           json::array({1, "a"}), json::object(), json({{"k", nullptr}})};

// Replaces one randomly chosen value anywhere in the document with an odd one.
void swap_a_value(json& doc, std::mt19937& rng) {
    std::vector<json*> nodes;
    std::function<void(json&)> walk = [&](json& j) {
        nodes.push_back(&j);
        if (j.is_structured())
            for (auto& child : j) walk(child);
    };
    walk(doc);
    *nodes[rng() % nodes.size()] = kOddValues[rng() % std::size(kOddValues)];
}

std::string mutate(const std::string& seed, std::mt19937& rng) {
    std::string s = seed;
    switch (rng() % 5) {
        case 0:  // flip bytes
            for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) s[rng() % s.size()] ^= char(1u << (rng() % 8));
            break;
        case 1:  // truncate
            s.resize(rng() % s.size());
            break;
        case 2: {  // splice a JSON token in
            static const char* tokens[] = {"{", "}", "[", "]", "\"", ",", ":", "null", "1e999", "-0", "\\u0000",
                                           "\xff", "[[[[[[[[", "\"\\ud800\""};
            s.insert(rng() % s.size(), tokens[rng() % std::size(tokens)]);
            break;
        }
        default: {  // type swaps, structurally valid JSON
            json doc = json::parse(seed);
            for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) swap_a_value(doc, rng);
            s = doc.dump();
        }
    }
    return s;
}

TEST(FuzzBodies, MutatedBodiesGetA4xxOrSucceed) {
    std::mt19937 rng(20240601);
    int inputs = 0;
    for (int round = 0; round < 100; ++round) {
        for (const char* seed : kSeeds) {
            const std::string body = mutate(seed, rng);
            for (uint8_t endpoint = 0; endpoint < 6; ++endpoint) {
                std::string input(1, char(endpoint | uint8_t(rng() & 0xF8)));
                input += body;
                SCOPED_TRACE(input);
                EXPECT_NO_THROW((void)fuzz_one_request(reinterpret_cast<const uint8_t*>(input.data()), input.size()));
                ++inputs;
            }
        }
    }
    EXPECT_EQ(inputs, 100 * int(std::size(kSeeds)) * 6);
}

TEST(FuzzBodies, SeedsThemselvesParse) {
    // Each seed is accepted by the endpoint it was written for (so mutations start from valid requests).
    const uint8_t endpoints[] = {0, 1, 2, 3, 4, 0};
    for (size_t i = 0; i < std::size(kSeeds); ++i) {
        std::string input(1, char(endpoints[i]));
        input += kSeeds[i];
        EXPECT_TRUE(fuzz_one_request(reinterpret_cast<const uint8_t*>(input.data()), input.size())) << kSeeds[i];
    }
}

}  // namespace
}  // namespace scr::server::testing
