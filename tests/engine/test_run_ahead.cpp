// The engine's run-ahead (ModelRunner::launch_ahead; vLLM's async scheduling) on FakeModel with its
// device sampling and asynchronous launches (tests/engine/fake_model.hpp): every output must be the
// one the engine gives without run-ahead, token for token, through arrivals, EOS and stop tokens,
// aborts from callbacks and between steps, preemption and seeded sampling; steps launched ahead must
// really be adopted; and nothing may stay pending on the model.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "runtime/engine/engine.hpp"
#include "tests/engine/engine_test_util.hpp"
#include "tests/engine/fake_model.hpp"

using namespace scr;
using namespace scr::test;

namespace {

EngineConfig small_config(int64_t kv_blocks, int block_size, int max_seqs = 8) {
    EngineConfig c;
    c.kv_cache_bytes = kv_blocks * 8 * block_size;
    c.max_num_batched_tokens = 32;
    c.max_num_seqs = max_seqs;
    return c;
}

Request greedy(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
    Request r;
    r.id = id;
    r.prompt_ids = std::move(prompt);
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    return r;
}

struct WorkloadRun {
    Results results;
    EngineStats stats;
    int forwards = 0, launches_fed = 0;
};

// A mixed workload: greedy and seeded non-greedy requests, EOS and stop tokens, arrivals every few
// steps, an abort from a callback and one between steps. Deterministic for a given shape.
WorkloadRun run_workload(FakeModelShape shape, EngineConfig cfg, bool run_ahead, uint32_t seed) {
    FakeModel model(shape);
    model.device_sampling = true;
    model.run_ahead = run_ahead;
    cfg.run_ahead = true;  // the model decides
    WorkloadRun run;
    {
        Engine engine(model, nullptr, cfg);
        std::mt19937 g(seed);
        std::vector<Request> requests;
        for (int i = 0; i < 14; ++i) {
            Request r;
            r.id = "q" + std::to_string(i);
            const int len = 1 + int(g() % 11);
            for (int j = 0; j < len; ++j) r.prompt_ids.push_back(int32_t(g() % uint32_t(shape.vocab)));
            r.params.max_tokens = 3 + int(g() % 30);
            if (i % 3 == 1) {
                r.params.temperature = 0.9f;
                r.params.seed = 1000 + uint64_t(i);
            } else {
                r.params.temperature = 0;
            }
            if (i % 5 == 2) r.params.stop_token_ids = {int32_t(g() % uint32_t(shape.vocab))};
            if (i % 4 == 3) r.params.ignore_eos = true;
            if (i == 2 || i == 5) {  // the aborted ones: long enough to be running when aborted
                r.params.max_tokens = 60;
                r.params.ignore_eos = true;
                r.params.stop_token_ids.clear();
            }
            requests.push_back(std::move(r));
        }
        size_t next = 0;
        bool aborted_between = false;
        int step = 0;
        auto add = [&](size_t i) {
            auto collect = collect_into(run.results);
            const bool abort_in_callback = i == 5;
            const std::string id = requests[i].id;
            engine.add_request(requests[i], [&, collect, abort_in_callback, id](const RequestOutput& o) {
                collect(o);
                if (abort_in_callback && !o.finished() && o.num_output_tokens == 4) {
                    EXPECT_TRUE(engine.abort(id));
                }
            });
        };
        add(next++);
        while (engine.has_unfinished() || next < requests.size()) {
            if (next < requests.size() && (step % 7 == 3 || !engine.has_unfinished())) add(next++);
            engine.step();
            ++step;
            if (!aborted_between && step == 40 && at(run.results, "q2").finals == 0) {
                EXPECT_TRUE(engine.abort("q2"));
                aborted_between = true;
            }
            if (step > 100000) {
                ADD_FAILURE() << "engine did not finish";
                break;
            }
        }
        run.stats = engine.stats();
        EXPECT_EQ(run.stats.kv_blocks_free, run.stats.kv_blocks_total) << "blocks leaked";
    }
    EXPECT_EQ(model.pending(), 0) << "the engine left a launched step on the model";
    run.forwards = model.forwards;
    run.launches_fed = model.launches_fed;
    return run;
}

void expect_same_outputs(const Results& a, const Results& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (const auto& [key, c] : a) {
        auto it = b.find(key);
        ASSERT_NE(it, b.end()) << what << ": " << key.first;
        EXPECT_EQ(c.ids, it->second.ids) << what << ": " << key.first;
        EXPECT_EQ(c.reason, it->second.reason) << what << ": " << key.first;
        EXPECT_EQ(c.finals, 1) << what << ": " << key.first;
    }
}

}  // namespace

TEST(RunAhead, SameOutputsAsWithoutThroughArrivalsStopsAndAborts) {
    FakeModelShape shape;
    shape.eos = 7;
    for (uint32_t seed : {1u, 2u, 3u}) {
        const WorkloadRun sync = run_workload(shape, small_config(400, 4), false, seed);
        const WorkloadRun ahead = run_workload(shape, small_config(400, 4), true, seed);
        expect_same_outputs(sync.results, ahead.results, "run-ahead vs synchronous");
        EXPECT_EQ(sync.stats.run_ahead_launched, 0);
        EXPECT_GT(ahead.stats.run_ahead_adopted, 20) << "seed " << seed;
        EXPECT_GT(ahead.stats.run_ahead_dropped, 0) << "seed " << seed;  // arrivals and stops drop it
        EXPECT_EQ(ahead.stats.run_ahead_launched, ahead.stats.run_ahead_adopted + ahead.stats.run_ahead_dropped);
        EXPECT_EQ(ahead.launches_fed, ahead.stats.run_ahead_launched);
        // A dropped step is the only extra work.
        EXPECT_EQ(ahead.forwards, sync.forwards + ahead.stats.run_ahead_dropped);
        int aborted = 0;
        for (const auto& [key, c] : ahead.results) aborted += c.reason == FinishReason::abort;
        EXPECT_EQ(aborted, 2);
    }
}

// Preemption (a KV pool too small for everything running) changes the schedule: the step launched
// ahead is dropped and the outputs stay the same.
TEST(RunAhead, SameOutputsUnderPreemption) {
    FakeModelShape shape;
    const WorkloadRun sync = run_workload(shape, small_config(14, 4), false, 5);
    const WorkloadRun ahead = run_workload(shape, small_config(14, 4), true, 5);
    expect_same_outputs(sync.results, ahead.results, "preemption");
    EXPECT_GT(ahead.stats.num_preemptions, 0);
    EXPECT_GT(ahead.stats.run_ahead_adopted, 0);
}

// One greedy sequence decoding alone: every step but those crossing into a new KV block is launched
// ahead and adopted, none is wasted (the last token's step is not launched ahead: the length ends
// it), and the tokens are the reference's.
TEST(RunAhead, BatchOneDecodeAdoptsAndWastesNothing) {
    FakeModelShape shape;
    shape.block_size = 4;
    FakeModel model(shape);
    model.device_sampling = true;
    model.run_ahead = true;
    Results res;
    const std::vector<int32_t> prompt{3, 1, 4, 1, 5};
    const int max_tokens = 40;
    {
        Engine engine(model, nullptr, small_config(100, 4));
        engine.add_request(greedy("solo", prompt, max_tokens), collect_into(res));
        run_to_completion(engine);
        const EngineStats s = engine.stats();
        EXPECT_EQ(s.run_ahead_dropped, 0);
        EXPECT_EQ(s.run_ahead_launched, s.run_ahead_adopted);
        // 40 steps (prefill + 39 decodes); positions 5..43 are computed by steps 2..40, and a step
        // is launched ahead unless its position starts a new block (8, 12, ..., 40: 9 of them) or
        // it is the prefill.
        EXPECT_EQ(s.steps, max_tokens);
        EXPECT_EQ(s.run_ahead_adopted, max_tokens - 1 - 9);
    }
    EXPECT_EQ(at(res, "solo").ids, reference_greedy(prompt, shape.vocab, max_tokens));
    EXPECT_EQ(model.forwards, max_tokens);
    EXPECT_EQ(model.pending(), 0);
}

// An engine destroyed while a step is launched ahead waits for it: the model is left with nothing
// pending, and a new engine on it serves correctly.
TEST(RunAhead, EngineDestroyedMidGenerationLeavesNothingPending) {
    FakeModel model;
    model.device_sampling = true;
    model.run_ahead = true;
    const std::vector<int32_t> prompt{9, 8, 7};
    {
        Engine engine(model, nullptr, small_config(100, 4));
        Results res;
        engine.add_request(greedy("cut", prompt, 30), collect_into(res));
        for (int i = 0; i < 4; ++i) engine.step();
        EXPECT_GT(engine.stats().run_ahead_launched, 0);
        EXPECT_EQ(model.pending(), 1);  // the step launched ahead
    }
    EXPECT_EQ(model.pending(), 0);
    Engine again(model, nullptr, small_config(100, 4));
    Results res;
    again.add_request(greedy("again", prompt, 12), collect_into(res));
    run_to_completion(again);
    EXPECT_EQ(at(res, "again").ids, reference_greedy(prompt, 97, 12));
}

// EngineConfig::run_ahead = false keeps every step synchronous on a model that could run ahead.
TEST(RunAhead, ConfigSwitchTurnsItOff) {
    FakeModel model;
    model.device_sampling = true;
    model.run_ahead = true;
    EngineConfig cfg = small_config(100, 4);
    cfg.run_ahead = false;
    Engine engine(model, nullptr, cfg);
    Results res;
    engine.add_request(greedy("off", {1, 2, 3}, 10), collect_into(res));
    run_to_completion(engine);
    EXPECT_EQ(engine.stats().run_ahead_launched, 0);
    EXPECT_EQ(model.launches_fed, 0);
    EXPECT_EQ(at(res, "off").ids, reference_greedy({1, 2, 3}, 97, 10));
}
