// The engine on the real tiny compiled models (tests/fixtures: Llama, Qwen3, Qwen3-MoE, and a
// Mistral with a 16-token sliding window from tests/models/fixtures, made with transformers): greedy equals the fixture's transformers greedy_16, and a request's tokens and
// logprobs are bit-identical alone, batched, chunked, with prefix-cache hits and under preemption,
// and equal to the lead's SequenceRunner (one sequence, its own KV) driving the same model.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/engine/engine.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/model/sequence_runner.hpp"
#include "tests/engine/engine_test_util.hpp"

using namespace scr;
using namespace scr::test;

namespace {

const std::filesystem::path kFixtures = SCR_FIXTURES_DIR;

struct Case { std::string id; std::vector<int32_t> prompt; };

std::vector<Case> random_cases(int n, int vocab, int max_len, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<Case> out;
    for (int i = 0; i < n; ++i) {
        Case c{"p" + std::to_string(i), {}};
        const int len = 1 + int(g() % uint32_t(max_len));
        for (int j = 0; j < len; ++j) c.prompt.push_back(int32_t(g() % uint32_t(vocab)));
        out.push_back(std::move(c));
    }
    return out;
}

Request greedy(const Case& c, int max_tokens) {
    Request r;
    r.id = c.id;
    r.prompt_ids = c.prompt;
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.logprobs = 0;  // the sampled token's logprob: a bit-exact probe of the whole logits row
    return r;
}

struct Outcome { std::vector<int32_t> ids; std::vector<float> logprobs; int cached = 0; };
using Outcomes = std::map<std::string, Outcome>;

Outcomes run(CompiledModel& model, EngineConfig cfg, const std::vector<Case>& cases, int max_tokens,
             bool one_at_a_time, EngineStats* stats_out = nullptr) {
    Engine engine(model, nullptr, cfg);
    Results res;
    auto add = [&](const Case& c) { engine.add_request(greedy(c, max_tokens), collect_into(res)); };
    if (one_at_a_time) {
        for (const Case& c : cases) { add(c); run_to_completion(engine); }
    } else {
        for (const Case& c : cases) add(c);
        run_to_completion(engine);
    }
    Outcomes out;
    for (const Case& c : cases) {
        Collected& col = at(res, c.id);
        EXPECT_EQ(col.reason, FinishReason::length) << c.id << " " << col.error;
        Outcome o{col.ids, {}, col.num_cached_tokens};
        for (const TokenLogprob& lp : col.logprobs) o.logprobs.push_back(lp.logprob);
        out[c.id] = o;
    }
    EngineStats s = engine.stats();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
    if (stats_out) *stats_out = s;
    return out;
}

void expect_same(const Outcomes& a, const Outcomes& b, const std::string& what) {
    for (const auto& [id, x] : a) {
        const Outcome& y = b.at(id);
        EXPECT_EQ(x.ids, y.ids) << what << ": " << id;
        ASSERT_EQ(x.logprobs.size(), y.logprobs.size()) << what;
        for (size_t i = 0; i < x.logprobs.size(); ++i)  // bit-exact, not approximately equal
            EXPECT_EQ(std::bit_cast<uint32_t>(x.logprobs[i]), std::bit_cast<uint32_t>(y.logprobs[i]))
                << what << ": " << id << " token " << i << " " << x.logprobs[i] << " vs " << y.logprobs[i];
    }
}

// Greedy through SequenceRunner, with the logprob computed as the sampler does (double
// log-sum-exp over the raw row), so equal logits give equal bits.
Outcome sequence_runner_greedy(CompiledModel& model, const std::vector<int32_t>& prompt, int max_tokens) {
    SequenceRunner runner(model, int(prompt.size()) + max_tokens);
    Outcome o;
    std::vector<float> logits = runner.feed(prompt);
    for (int i = 0; i < max_tokens; ++i) {
        const int32_t t = argmax(logits);
        float m = -INFINITY;
        for (float x : logits) m = std::max(m, x);
        double s = 0;
        for (float x : logits) s += std::exp(double(x) - m);
        o.ids.push_back(t);
        o.logprobs.push_back(float(double(logits[size_t(t)]) - (double(m) + std::log(s))));
        if (i + 1 < max_tokens) logits = runner.feed(std::span<const int32_t>(&t, 1));
    }
    return o;
}

class EngineOnModel : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(EngineOnModel, MatchesTransformersAndIsBatchInvariant) {
    const std::filesystem::path dir = kFixtures / GetParam();
    LoadOptions lo;
    lo.threads = 1;  // results do not depend on it; one thread is kinder to a shared CI machine
    LoadedModel lm = load_model(dir.string(), lo);
    CompiledModel& model = *lm.model;
    const ModelInfo& info = model.info();
    std::ifstream in(dir / "reference.json");
    const nlohmann::json ref = nlohmann::json::parse(in);

    // 1. transformers' greedy continuation of input 0.
    {
        Case c{"ref", ref["inputs"][0].get<std::vector<int32_t>>()};
        EngineConfig cfg;
        cfg.kv_cache_bytes = info.kv_bytes_per_block * 64;
        Outcomes o = run(model, cfg, {c}, 16, true);
        EXPECT_EQ(o["ref"].ids, ref["greedy_16"].get<std::vector<int32_t>>());
    }

    // 2. Many prompts crossing block boundaries, in every scheduling regime.
    const int max_tokens = 6;
    auto cases = random_cases(12, info.vocab_size, 3 * info.block_size + 20, 17);
    EngineConfig base;
    base.kv_cache_bytes = info.kv_bytes_per_block * 400;
    const Outcomes alone = run(model, base, cases, max_tokens, true);
    expect_same(alone, run(model, base, cases, max_tokens, false), "batched");
    EngineConfig chunked = base;
    chunked.max_num_batched_tokens = 7;
    expect_same(alone, run(model, chunked, cases, max_tokens, false), "chunked by 7");
    EngineConfig no_cache = base;
    no_cache.enable_prefix_caching = false;
    no_cache.max_num_batched_tokens = 29;
    expect_same(alone, run(model, no_cache, cases, max_tokens, false), "no prefix cache, chunks of 29");
    EngineConfig tiny = base;
    // 7 usable blocks: room for the longest request, never for all of them.
    tiny.kv_cache_bytes = info.kv_bytes_per_block * 8;
    EngineStats tiny_stats;
    expect_same(alone, run(model, tiny, cases, max_tokens, false, &tiny_stats), "tiny KV pool");
    // (With a sliding window each sequence holds only its window's blocks, so 7 may be enough.)
    if (info.sliding_window == 0) EXPECT_GT(tiny_stats.num_preemptions, 0);
    for (size_t i = 0; i < 4; ++i) {
        const Case& c = cases[i];
        Outcomes single;
        single[c.id] = sequence_runner_greedy(model, c.prompt, max_tokens);
        Outcomes mine;
        mine[c.id] = alone.at(c.id);
        expect_same(single, mine, "SequenceRunner");
    }

    // 3. Prefix-cache hits: the same prompts again in one engine skip their cached blocks and give
    // the same bits.
    {
        std::vector<Case> twice = cases;
        for (const Case& c : cases) twice.push_back({c.id + "-again", c.prompt});
        EngineStats st;
        Outcomes o = run(model, base, twice, max_tokens, true, &st);
        int64_t cached = 0;
        for (const Case& c : cases) {
            Outcome a = o[c.id + "-again"];
            a.cached = 0;
            Outcomes x, y;
            x[c.id] = alone.at(c.id);
            y[c.id] = a;
            expect_same(x, y, "prefix-cache hit");
            cached += o[c.id + "-again"].cached;
            EXPECT_EQ(o[c.id + "-again"].cached, (int(c.prompt.size()) - 1) / info.block_size * info.block_size);
        }
        EXPECT_GT(cached, 0);
        int64_t prompt_total = 0;
        for (const Case& c : twice) prompt_total += int64_t(c.prompt.size());
        EXPECT_EQ(st.prompt_tokens_computed, prompt_total - cached);
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineOnModel,
                         ::testing::Values("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
                                           "long/LlamaForCausalLM", "long/Qwen3ForCausalLM",
                                           "long/Qwen3MoeForCausalLM",
                                           // sliding window 16: blocks behind the window are freed
                                           "../models/fixtures/MistralForCausalLM-sw16"),
                         [](const auto& info) {
                             std::string s = info.param;
                             if (s.rfind("../", 0) == 0) s = s.substr(3);
                             for (char& ch : s) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                             return s;
                         });
