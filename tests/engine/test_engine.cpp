// The engine end to end on FakeModel (tests/engine/fake_model.hpp), whose logits are a function of
// the whole context read back through the paged KV pool: greedy alone == batched == chunked ==
// reference, prefix-cache hits that skip prefill, preemption under a tiny KV budget, n > 1,
// aborts, errors, logprobs, AsyncEngine.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/engine/engine_test_util.hpp"
#include "tests/engine/fake_model.hpp"

using namespace scr;
using namespace scr::test;

namespace {

struct Prompt {
    std::string id;
    std::vector<int32_t> ids;
    int max_tokens;
};

std::vector<Prompt> random_prompts(int n, int vocab, int max_len, uint32_t seed) {
    std::mt19937 g(seed);
    std::vector<Prompt> out;
    for (int i = 0; i < n; ++i) {
        Prompt p;
        p.id = "r" + std::to_string(i);
        const int len = 1 + int(g() % uint32_t(max_len));
        for (int j = 0; j < len; ++j) p.ids.push_back(int32_t(g() % uint32_t(vocab)));
        p.max_tokens = 1 + int(g() % 20);
        out.push_back(std::move(p));
    }
    return out;
}

EngineConfig config_with(int64_t kv_blocks, int block_size, int budget = 64, int max_seqs = 16) {
    EngineConfig c;
    c.kv_cache_bytes = kv_blocks * 8 * block_size;
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = max_seqs;
    return c;
}

Request greedy_request(const Prompt& p) {
    Request r;
    r.id = p.id;
    r.prompt_ids = p.ids;
    r.params.temperature = 0;
    r.params.max_tokens = p.max_tokens;
    return r;
}

Results run_greedy(FakeModel& model, EngineConfig cfg, const std::vector<Prompt>& prompts, bool one_at_a_time) {
    Engine engine(model, nullptr, cfg);
    Results results;
    if (one_at_a_time) {
        for (const Prompt& p : prompts) {
            engine.add_request(greedy_request(p), collect_into(results));
            run_to_completion(engine);
        }
    } else {
        for (const Prompt& p : prompts) engine.add_request(greedy_request(p), collect_into(results));
        run_to_completion(engine);
    }
    EngineStats s = engine.stats();
    EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total) << "blocks leaked";
    return results;
}

void expect_matches_reference(const Results& results, const std::vector<Prompt>& prompts, int vocab,
                              const char* what) {
    for (const Prompt& p : prompts) {
        auto it = results.find({p.id, 0});
        ASSERT_NE(it, results.end()) << what << ": no output for " << p.id;
        const Collected& c = it->second;
        EXPECT_EQ(c.ids, reference_greedy(p.ids, vocab, p.max_tokens)) << what << ": " << p.id;
        EXPECT_EQ(c.finals, 1) << what;
        EXPECT_EQ(c.reason, FinishReason::length) << what;
    }
}

}  // namespace

// Batch invariance: the same greedy tokens alone, batched, heavily chunked, with and without
// prefix caching, and equal to the reference computed without the engine.
TEST(Engine, GreedyAloneBatchedChunkedAgreeWithReference) {
    FakeModelShape shape;
    FakeModel model(shape);
    const auto prompts = random_prompts(40, shape.vocab, 70, 1);
    expect_matches_reference(run_greedy(model, config_with(400, 4), prompts, true), prompts, shape.vocab, "alone");
    expect_matches_reference(run_greedy(model, config_with(400, 4), prompts, false), prompts, shape.vocab, "batched");
    expect_matches_reference(run_greedy(model, config_with(400, 4, /*budget=*/7), prompts, false), prompts,
                             shape.vocab, "chunked");
    EngineConfig no_cache = config_with(400, 4, 13);
    no_cache.enable_prefix_caching = false;
    expect_matches_reference(run_greedy(model, no_cache, prompts, false), prompts, shape.vocab, "no cache");
    EXPECT_GT(model.max_batch_seen, 8);  // it really batched
}

// Prefix caching: a repeated prompt computes only what the cache cannot give (at least the last
// token), the saving is visible in the model's token count, and outputs are identical.
TEST(Engine, PrefixCacheHitSkipsPrefill) {
    FakeModel model;
    Engine engine(model, nullptr, config_with(200, 4));
    Prompt p{"a", {}, 8};
    for (int i = 0; i < 41; ++i) p.ids.push_back(int32_t((i * 7) % 97));
    Results results;
    engine.add_request(greedy_request(p), collect_into(results));
    run_to_completion(engine);
    const int64_t computed_first = model.tokens_computed;
    const int64_t prompt_tokens_first = engine.stats().prompt_tokens_computed;
    EXPECT_EQ(prompt_tokens_first, 41);

    Prompt q = p;
    q.id = "b";
    engine.add_request(greedy_request(q), collect_into(results));
    run_to_completion(engine);
    EXPECT_EQ(at(results, "b", 0).num_cached_tokens, 40);  // 10 full blocks; 41st token recomputed
    EXPECT_EQ(engine.stats().prompt_tokens_computed - prompt_tokens_first, 1);
    EXPECT_EQ(model.tokens_computed - computed_first, 1 + 7);  // 1 prompt token + 7 decodes
    EXPECT_EQ(at(results, "b", 0).ids, at(results, "a", 0).ids);
    EXPECT_EQ(engine.stats().prefix_cache_hits, 40);

    // A shared 32-token prefix with a different tail hits 32 tokens and still matches the reference.
    Prompt r{"c", std::vector<int32_t>(p.ids.begin(), p.ids.begin() + 32), 8};
    r.ids.insert(r.ids.end(), {5, 6, 7, 8, 9});
    engine.add_request(greedy_request(r), collect_into(results));
    run_to_completion(engine);
    EXPECT_EQ(at(results, "c", 0).num_cached_tokens, 32);
    EXPECT_EQ(at(results, "c", 0).ids, reference_greedy(r.ids, 97, 8));

    // A prompt that fills whole blocks still recomputes its last block (never a full hit).
    Prompt whole{"e", std::vector<int32_t>(p.ids.begin(), p.ids.begin() + 40), 3};
    engine.add_request(greedy_request(whole), collect_into(results));
    run_to_completion(engine);
    engine.add_request(greedy_request(Prompt{"f", whole.ids, 3}), collect_into(results));
    run_to_completion(engine);
    EXPECT_EQ(at(results, "f", 0).num_cached_tokens, 36);
    EXPECT_EQ(at(results, "f", 0).ids, reference_greedy(whole.ids, 97, 3));

    // A different cache salt shares nothing.
    Request salted = greedy_request(q);
    salted.id = "d";
    salted.cache_salt = "tenant-2";
    engine.add_request(salted, collect_into(results));
    run_to_completion(engine);
    EXPECT_EQ(at(results, "d", 0).num_cached_tokens, 0);
    EXPECT_EQ(at(results, "d", 0).ids, at(results, "a", 0).ids);
}

// Preemption by recompute: a pool far too small for the batch still completes every request with
// the reference output, under both policies.
TEST(Engine, PreemptionUnderTinyKvBudgetCompletesIdentically) {
    for (auto policy : {EngineConfig::Policy::fcfs, EngineConfig::Policy::priority}) {
        FakeModel model;
        EngineConfig cfg = config_with(/*blocks=*/14, 4, 32);
        cfg.policy = policy;
        Engine engine(model, nullptr, cfg);
        EXPECT_EQ(engine.config().max_model_len, 13 * 4);  // clamped to what the pool holds
        auto prompts = random_prompts(12, 97, 24, 5);
        Results results;
        int k = 0;
        for (const Prompt& p : prompts) {
            Request r = greedy_request(p);
            r.params.max_tokens = 16;
            r.priority = k++ % 3;
            engine.add_request(r, collect_into(results));
        }
        run_to_completion(engine);
        EXPECT_GT(engine.stats().num_preemptions, 0) << "the budget was meant to force preemption";
        for (const Prompt& p : prompts)
            EXPECT_EQ(at(results, p.id, 0).ids, reference_greedy(p.ids, 97, 16)) << p.id;
        EXPECT_EQ(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);
    }
}

// n > 1: samples after the first reuse the prompt's blocks through the prefix cache; seeded
// sampling is reproducible whatever else shares the batch.
TEST(Engine, ParallelSamplesSharePromptAndAreReproducible) {
    FakeModel model;
    Prompt p{"n", {}, 12};
    for (int i = 0; i < 23; ++i) p.ids.push_back(int32_t(3 + i));
    auto make = [&](const std::string& id) {
        Request r;
        r.id = id;
        r.prompt_ids = p.ids;
        r.params.n = 4;
        r.params.temperature = 1.0f;
        r.params.top_p = 0.9f;
        r.params.seed = 1234;
        r.params.max_tokens = 12;
        r.params.ignore_eos = true;
        return r;
    };
    Results alone, crowded;
    {
        Engine engine(model, nullptr, config_with(200, 4));
        const int64_t before = model.tokens_computed;
        engine.add_request(make("x"), collect_into(alone));
        run_to_completion(engine);
        for (int i = 1; i < 4; ++i) EXPECT_EQ(at(alone, "x", i).num_cached_tokens, 20) << i;
        // The prompt is computed once in full, then 3 more tokens per other sample.
        EXPECT_EQ(engine.stats().prompt_tokens_computed, 23 + 3 * 3);
        EXPECT_EQ(model.tokens_computed - before, 23 + 3 * 3 + 4 * 11);
    }
    {
        Engine engine(model, nullptr, config_with(200, 4, 9));
        for (const Prompt& q : random_prompts(6, 97, 30, 77)) engine.add_request(greedy_request(q), collect_into(crowded));
        engine.add_request(make("x"), collect_into(crowded));
        run_to_completion(engine);
    }
    std::set<std::vector<int32_t>> distinct;
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(at(alone, "x", i).ids, at(crowded, "x", i).ids) << "sample " << i;
        EXPECT_EQ(at(alone, "x", i).ids.size(), 12u);
        distinct.insert(at(alone, "x", i).ids);
    }
    EXPECT_GT(distinct.size(), 1u) << "samples with seed + i should differ";
}

// Aborts at random moments (including from inside output callbacks) deliver exactly one final
// output, stop all further outputs, leak no block, and leave other requests' outputs intact.
TEST(Engine, AbortsAtAnyTime) {
    FakeModel model;
    Engine engine(model, nullptr, config_with(60, 4, 16, 8));
    auto prompts = random_prompts(30, 97, 30, 9);
    Results results;
    std::mt19937 g(3);
    std::set<std::string> aborted;
    for (const Prompt& p : prompts) {
        Request r = greedy_request(p);
        r.params.max_tokens = 10;
        auto collect = collect_into(results);
        engine.add_request(r, [&, collect, id = p.id](const RequestOutput& o) {
            collect(o);
            if (!o.finished() && g() % 17 == 0 && !aborted.count(id)) {  // abort from the callback
                aborted.insert(id);
                EXPECT_TRUE(engine.abort(id));
            }
        });
    }
    int steps = 0;
    while (engine.has_unfinished()) {
        engine.step();
        if (++steps % 3 == 0) {  // and between steps, including requests still waiting
            const Prompt& p = prompts[g() % prompts.size()];
            if (!aborted.count(p.id) && at(results, p.id, 0).finals == 0) {
                aborted.insert(p.id);
                EXPECT_TRUE(engine.abort(p.id));
            }
        }
    }
    EXPECT_FALSE(engine.abort("r0") && false);
    int n_aborted = 0;
    for (const Prompt& p : prompts) {
        const Collected& c = at(results, p.id, 0);
        EXPECT_EQ(c.finals, 1) << p.id;
        if (aborted.count(p.id) && c.reason == FinishReason::abort) {
            ++n_aborted;
            auto ref = reference_greedy(p.ids, 97, 10);
            ASSERT_LE(c.ids.size(), ref.size());
            EXPECT_TRUE(std::equal(c.ids.begin(), c.ids.end(), ref.begin())) << p.id;
        } else {
            EXPECT_EQ(c.ids, reference_greedy(p.ids, 97, 10)) << p.id;
        }
    }
    EXPECT_GT(n_aborted, 3);
    EXPECT_EQ(engine.stats().requests_aborted, n_aborted);
    EXPECT_EQ(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);
    EXPECT_FALSE(engine.abort("no-such-request"));
}

// Sliding window (ModelInfo::sliding_window): blocks wholly behind the window are freed while a
// sequence runs, so long generations fit a pool far smaller than their length; outputs still equal
// the windowed reference; repeated prompts hit the blocks the window needs.
TEST(Engine, SlidingWindowFreesBlocksBehindTheWindow) {
    FakeModelShape shape;
    shape.sliding_window = 10;
    shape.context = 400;
    FakeModel model(shape);
    // 30 usable blocks of 4 tokens = 120 tokens; four sequences of up to 330 tokens run together.
    EngineConfig cfg = config_with(31, 4, 32, 4);
    Engine engine(model, nullptr, cfg);
    auto prompts = random_prompts(4, 97, 30, 41);
    Results res;
    int64_t min_free = engine.stats().kv_blocks_total;
    for (const Prompt& p : prompts) {
        Request r = greedy_request(p);
        r.params.max_tokens = 300;
        engine.add_request(r, collect_into(res));
    }
    while (engine.has_unfinished()) {
        ASSERT_TRUE(engine.step());
        min_free = std::min(min_free, engine.stats().kv_blocks_free);
    }
    for (const Prompt& p : prompts)
        EXPECT_EQ(at(res, p.id).ids, reference_greedy(p.ids, 97, 300, -1, false, 10)) << p.id;
    EXPECT_EQ(engine.stats().num_preemptions, 0);
    EXPECT_GE(min_free, 30 - 4 * 5) << "each sequence should hold about window/block_size + 2 blocks";
    EXPECT_EQ(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);

    EXPECT_EQ(engine.config().max_model_len, 400);  // not clamped to the pool: the window bounds use
}

// Prefix hit with a window: a prompt continuing a finished sequence needs only the blocks its last
// token's window reaches (vLLM's SlidingWindowManager.find_longest_cache_hit); the rest are null.
TEST(Engine, SlidingWindowPrefixHit) {
    FakeModelShape shape;
    shape.sliding_window = 10;
    FakeModel model(shape);
    Engine engine(model, nullptr, config_with(31, 4, 32, 4));
    Prompt a{"a", {}, 60};
    for (int i = 0; i < 20; ++i) a.ids.push_back(int32_t((i * 5 + 1) % 97));
    Results res;
    engine.add_request(greedy_request(a), collect_into(res));
    run_to_completion(engine);
    Prompt b{"b", a.ids, 5};
    b.ids.insert(b.ids.end(), at(res, "a").ids.begin(), at(res, "a").ids.end());  // 80 tokens
    engine.add_request(greedy_request(b), collect_into(res));
    run_to_completion(engine);
    EXPECT_EQ(at(res, "b").num_cached_tokens, 76);  // (80 - 1) / 4 blocks, the window's 3 of them real
    EXPECT_EQ(at(res, "b").ids, reference_greedy(b.ids, 97, 5, -1, false, 10));
    EXPECT_EQ(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);
}

TEST(Engine, RejectsBadRequestsWithClearErrors) {
    FakeModelShape shape;
    shape.context = 64;
    FakeModel model(shape);
    Engine engine(model, nullptr, config_with(100, 4));
    auto expect_error = [&](Request r, const std::vector<std::string>& needles) {
        try {
            engine.add_request(std::move(r), [](const RequestOutput&) {});
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            for (const auto& n : needles)
                EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
        }
    };
    Request ok;
    ok.id = "ok";
    ok.prompt_ids = {1, 2, 3};
    Request r = ok;
    r.prompt_ids.assign(65, 1);
    expect_error(r, {"65", "64"});
    r = ok; r.prompt_ids.clear();
    expect_error(r, {"empty"});
    r = ok; r.prompt_ids = {1, 97};
    expect_error(r, {"97", "position 1"});
    r = ok; r.params.min_tokens = 20; r.params.max_tokens = 5;
    expect_error(r, {"min_tokens"});
    r = ok; r.params.stop = {"x"};
    expect_error(r, {"tokenizer"});
    r = ok; r.params.top_p = 0;
    expect_error(r, {"top_p"});
    r = ok; r.params.logit_bias = {{500, 1.f}};
    expect_error(r, {"logit_bias", "500"});
    engine.add_request(ok, [](const RequestOutput&) {});
    expect_error(ok, {"ok", "already"});
    // A prompt exactly as long as the context is served: one token, then length.
    Results res;
    r = ok; r.id = "full"; r.prompt_ids.assign(64, 2);
    engine.add_request(r, collect_into(res));
    run_to_completion(engine);
    EXPECT_EQ(at(res, "full", 0).ids.size(), 1u);
    EXPECT_EQ(at(res, "full", 0).reason, FinishReason::length);
    EXPECT_THROW(Engine(model, nullptr, config_with(1, 4)), Error);  // a pool of 1 block
}

TEST(Engine, EosStopTokensAndMinTokens) {
    FakeModelShape shape;
    FakeModel model(shape);
    // Find a prompt whose greedy continuation contains some token early; call it "eos".
    auto prompts = random_prompts(20, 97, 20, 31);
    const Prompt& p = prompts[0];
    auto ref = reference_greedy(p.ids, 97, 30);
    const int32_t eos = ref[3];
    const size_t first = size_t(std::find(ref.begin(), ref.end(), eos) - ref.begin());
    shape.eos = eos;
    FakeModel with_eos(shape);
    Results res;
    Engine engine(with_eos, nullptr, config_with(200, 4));
    Request r = greedy_request(p);
    r.params.max_tokens = 30;
    engine.add_request(r, collect_into(res));
    Request stop_tok = r;
    stop_tok.id = "stop-token";
    stop_tok.params.ignore_eos = true;
    stop_tok.params.stop_token_ids = {ref[5]};
    engine.add_request(stop_tok, collect_into(res));
    Request ignore = r;
    ignore.id = "ignore";
    ignore.params.ignore_eos = true;
    ignore.params.max_tokens = 10;
    engine.add_request(ignore, collect_into(res));
    run_to_completion(engine);
    EXPECT_EQ(at(res, p.id, 0).ids, std::vector<int32_t>(ref.begin(), ref.begin() + ptrdiff_t(first) + 1));
    EXPECT_EQ(at(res, p.id, 0).reason, FinishReason::stop);
    const size_t stop_at = size_t(std::find(ref.begin(), ref.end(), ref[5]) - ref.begin());
    EXPECT_EQ(at(res, "stop-token", 0).ids.size(), stop_at + 1);
    EXPECT_EQ(at(res, "stop-token", 0).stop_reason, std::to_string(ref[5]));
    EXPECT_EQ(at(res, "ignore", 0).ids, std::vector<int32_t>(ref.begin(), ref.begin() + 10));
}

TEST(Engine, LogprobsMatchTheModelsLogSoftmax) {
    FakeModel model;
    Engine engine(model, nullptr, config_with(100, 4));
    Prompt p{"lp", {4, 8, 15, 16, 23, 42}, 6};
    Request r = greedy_request(p);
    r.params.logprobs = 3;
    Results res;
    engine.add_request(r, collect_into(res));
    run_to_completion(engine);
    const Collected& c = at(res, "lp", 0);
    ASSERT_EQ(c.logprobs.size(), 6u);
    std::vector<int32_t> ctx = p.ids;
    std::vector<float> logits(97);
    for (size_t i = 0; i < c.ids.size(); ++i) {
        FakeModel::reference_logits(ctx, 97, logits.data());
        double m = *std::max_element(logits.begin(), logits.end()), z = 0;
        for (float x : logits) z += std::exp(double(x) - m);
        EXPECT_NEAR(c.logprobs[i].logprob, double(logits[size_t(c.ids[i])]) - m - std::log(z), 1e-5);
        ASSERT_EQ(c.logprobs[i].top.size(), 3u);
        EXPECT_EQ(c.logprobs[i].top[0].first, c.ids[i]);  // greedy: the sampled token is the best
        ctx.push_back(c.ids[i]);
    }
}

TEST(Engine, ForwardFailureFailsItsRequestsAndEngineContinues) {
    FakeModel model;
    Engine engine(model, nullptr, config_with(100, 4));
    Results res;
    auto prompts = random_prompts(3, 97, 10, 4);
    for (const Prompt& p : prompts) engine.add_request(greedy_request(p), collect_into(res));
    model.fail_next = true;
    engine.step();
    for (const Prompt& p : prompts) {
        EXPECT_EQ(at(res, p.id, 0).reason, FinishReason::error);
        EXPECT_NE(at(res, p.id, 0).error.find("injected"), std::string::npos);
    }
    EXPECT_FALSE(engine.has_unfinished());
    Prompt q{"after", {1, 2, 3}, 4};
    engine.add_request(greedy_request(q), collect_into(res));
    run_to_completion(engine);
    EXPECT_EQ(at(res, "after", 0).ids, reference_greedy(q.ids, 97, 4));
    EXPECT_EQ(engine.stats().kv_blocks_free, engine.stats().kv_blocks_total);
}

TEST(AsyncEngine, ConcurrentSubmitAbortAndDrain) {
    FakeModel model;
    Results res;
    std::mutex mu;
    std::condition_variable cv;
    int finals = 0;
    auto prompts = random_prompts(40, 97, 30, 21);
    {
        AsyncEngine engine(model, nullptr, config_with(300, 4, 32, 8));
        auto cb = [&](const RequestOutput& o) {  // runs on the engine thread
            std::lock_guard lock(mu);
            collect_into(res)(o);
            if (o.finished()) { ++finals; cv.notify_all(); }
        };
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t)
            threads.emplace_back([&, t] {
                for (int i = t; i < 40; i += 4) engine.submit(greedy_request(prompts[size_t(i)]), cb);
            });
        for (auto& t : threads) t.join();
        engine.abort("r7");
        EXPECT_THROW(engine.submit(Request{}, cb), Error);  // validation on the caller's thread
        {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return finals == 40; });
        }
        engine.drain(5.0);  // after drain the stats snapshot includes the last step
        EngineStats s = engine.stats();
        EXPECT_EQ(s.requests_finished + s.requests_aborted, 40);
        EXPECT_THROW(engine.submit(greedy_request(prompts[0]), cb), Error);  // draining
    }
    for (const Prompt& p : prompts) {
        const Collected& c = at(res, p.id, 0);
        EXPECT_EQ(c.finals, 1);
        if (c.reason == FinishReason::abort) continue;
        EXPECT_EQ(c.ids, reference_greedy(p.ids, 97, p.max_tokens)) << p.id;
    }
}

TEST(AsyncEngine, DrainTimeoutAbortsTheRest) {
    FakeModel model;
    std::atomic<int> aborted{0}, finals{0};
    std::atomic<bool> draining{false};
    AsyncEngine engine(model, nullptr, config_with(300, 4, 8, 4));
    for (const Prompt& p : random_prompts(20, 97, 30, 5)) {
        Request r = greedy_request(p);
        r.params.max_tokens = 200;
        r.params.ignore_eos = true;
        engine.submit(r, [&](const RequestOutput& o) {
            // The engine thread's first output holds it until drain() has been called, and then
            // long enough for drain(0.0) to find it busy: the fake model could otherwise finish all
            // 20 requests before the drain (it did once under a loaded parallel ctest), leaving none to abort.
            if (!draining.load()) {
                while (!draining.load()) std::this_thread::yield();
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
            if (o.finish_reason == FinishReason::abort) ++aborted;
            if (o.finished()) ++finals;
        });
    }
    draining = true;
    engine.drain(0.0);
    EXPECT_EQ(finals.load(), 20);
    EXPECT_GT(aborted.load(), 0);
}
