// Scheduler cases transcribed from the intent of vLLM's tests/v1/core/test_scheduler.py (each test
// names the vLLM case it follows), run without a model: "sampling" is done by the test.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "runtime/engine/scheduler.hpp"

using namespace scr::engine;
using scr::EngineConfig;
using scr::SamplingParams;

namespace {

struct Harness {
    SchedulerConfig cfg;
    std::unique_ptr<KvCacheManager> kv;
    std::unique_ptr<Scheduler> sched;
    std::vector<std::unique_ptr<Sequence>> seqs;
    std::vector<std::unique_ptr<SamplingParams>> params;
    int bs;

    Harness(int num_blocks, int block_size, int max_tokens_per_step, int max_seqs,
            EngineConfig::Policy policy = EngineConfig::Policy::fcfs, bool caching = true,
            bool chunked = true, int max_model_len = 1024)
        : bs(block_size) {
        cfg.max_num_seqs = max_seqs;
        cfg.max_num_batched_tokens = max_tokens_per_step;
        cfg.max_model_len = max_model_len;
        cfg.enable_chunked_prefill = chunked;
        cfg.policy = policy;
        cfg.eos_ids = {0};
        kv = std::make_unique<KvCacheManager>(num_blocks, block_size, max_model_len, caching);
        sched = std::make_unique<Scheduler>(cfg, *kv);
    }

    Sequence* add(int prompt_len, int max_tokens = 16, int priority = 0, double arrival = 0,
                  int first_token = -1, SamplingParams p = {}) {
        if (first_token < 0) first_token = 1 + 1000 * int(seqs.size());  // distinct prompts: no hits
        p.max_tokens = max_tokens;
        params.push_back(std::make_unique<SamplingParams>(p));
        auto s = std::make_unique<Sequence>();
        s->request_id = std::to_string(seqs.size());
        s->params = params.back().get();
        s->priority = priority;
        s->arrival_time = arrival ? arrival : double(seqs.size());
        s->arrival_order = seqs.size();
        for (int i = 0; i < prompt_len; ++i) s->tokens.push_back(first_token + i);
        s->num_prompt_tokens = prompt_len;
        sched->add_request(s.get());
        seqs.push_back(std::move(s));
        return seqs.back().get();
    }

    // One step: schedule, then "sample" token `next` for everything that completed its prompt.
    const SchedulerOutput& step(int32_t next = 7) {
        const SchedulerOutput& out = sched->schedule();
        std::vector<int32_t> sampled;
        for (const ScheduledSeq& s : out.seqs) sampled.push_back(s.needs_sample ? next : -1);
        sched->update_from_output(sampled);
        return out;
    }

    int scheduled_tokens(const SchedulerOutput& out, const Sequence* s) {
        for (const ScheduledSeq& x : out.seqs) if (x.seq == s) return x.num_tokens;
        return 0;
    }
};

}  // namespace

// vLLM: test_scheduler.py (test_schedule): with room, every waiting request is scheduled in one
// step with its whole prompt, in arrival order.
TEST(Scheduler, SchedulesAllWaitingRequests) {
    Harness h(100, 16, 512, 16);
    Sequence* a = h.add(10);
    Sequence* b = h.add(37);
    Sequence* c = h.add(5);
    const SchedulerOutput& out = h.sched->schedule();
    ASSERT_EQ(out.seqs.size(), 3u);
    EXPECT_EQ(out.seqs[0].seq, a);
    EXPECT_EQ(out.seqs[1].seq, b);
    EXPECT_EQ(out.seqs[2].seq, c);
    EXPECT_EQ(out.total_tokens, 52);
    for (const ScheduledSeq& s : out.seqs) {
        EXPECT_EQ(s.start, 0);
        EXPECT_EQ(s.num_tokens, s.seq->num_prompt_tokens);
        EXPECT_TRUE(s.needs_sample);
    }
    EXPECT_EQ(h.sched->num_running(), 3);
    EXPECT_EQ(h.sched->num_waiting(), 0);
}

// vLLM: test_scheduler.py (test_schedule_partial_requests): a token budget smaller than the prompts
// chunks the prefill; a chunk that does not reach the end of the prompt samples nothing.
TEST(Scheduler, ChunkedPrefillSplitsPromptsAcrossSteps) {
    Harness h(100, 16, 40, 16);
    Sequence* a = h.add(30);
    Sequence* b = h.add(30);
    const SchedulerOutput& o1 = h.step();
    EXPECT_EQ(h.scheduled_tokens(o1, a), 30);
    EXPECT_EQ(h.scheduled_tokens(o1, b), 10);  // what is left of the budget
    EXPECT_FALSE(o1.seqs[1].needs_sample);
    EXPECT_EQ(a->num_output_tokens(), 1);
    EXPECT_EQ(b->num_output_tokens(), 0);
    const SchedulerOutput& o2 = h.step();
    EXPECT_EQ(h.scheduled_tokens(o2, a), 1);    // decode
    EXPECT_EQ(h.scheduled_tokens(o2, b), 20);   // rest of the prompt
    EXPECT_EQ(b->num_computed_tokens, 30);
    EXPECT_EQ(b->num_output_tokens(), 1);
}

// Without chunked prefill a prompt larger than what is left of the budget waits for a step
// (vLLM: scheduler.py:L725 and test_scheduler.py (test_schedule_partial_requests) with
// enable_chunked_prefill=False).
TEST(Scheduler, NoChunkingWaitsForRoom) {
    Harness h(100, 16, 40, 16, EngineConfig::Policy::fcfs, true, /*chunked=*/false);
    Sequence* a = h.add(30);
    Sequence* b = h.add(30);
    const SchedulerOutput& o1 = h.step();
    EXPECT_EQ(h.scheduled_tokens(o1, a), 30);
    EXPECT_EQ(h.scheduled_tokens(o1, b), 0);
    const SchedulerOutput& o2 = h.step();
    EXPECT_EQ(h.scheduled_tokens(o2, b), 30);
}

// vLLM: test_scheduler.py (test_stop_via_update_from_output): eos, a stop token id and max_tokens
// each finish a request and free its blocks.
TEST(Scheduler, StopsOnEosStopTokenAndLength) {
    Harness h(100, 4, 512, 16);
    SamplingParams with_stop;
    with_stop.stop_token_ids = {42};
    Sequence* eos = h.add(5, 16);
    Sequence* stop = h.add(5, 16, 0, 0, -1, with_stop);
    Sequence* length = h.add(5, 2);
    const SchedulerOutput& out = h.sched->schedule();
    std::vector<int32_t> sampled;
    for (const ScheduledSeq& s : out.seqs)
        sampled.push_back(s.seq == eos ? 0 : s.seq == stop ? 42 : 9);
    h.sched->update_from_output(sampled);
    EXPECT_EQ(eos->status, SeqStatus::finished_stopped);
    EXPECT_EQ(stop->status, SeqStatus::finished_stopped);
    EXPECT_EQ(stop->stop_reason, "42");
    EXPECT_EQ(length->status, SeqStatus::running);
    h.step(9);
    EXPECT_EQ(length->status, SeqStatus::finished_length);
    EXPECT_EQ(length->num_output_tokens(), 2);
    EXPECT_FALSE(h.sched->has_unfinished());
    EXPECT_EQ(h.kv->pool().num_free_blocks(), 99);
}

// vLLM: test_scheduler.py (test_check_stop_min_tokens): eos before min_tokens does not stop.
TEST(Scheduler, MinTokensDefersEos) {
    Harness h(100, 4, 512, 16);
    SamplingParams p;
    p.min_tokens = 3;
    Sequence* s = h.add(5, 16, 0, 0, -1, p);
    h.step(0);
    h.step(0);
    EXPECT_EQ(s->status, SeqStatus::running);
    h.step(0);
    EXPECT_EQ(s->status, SeqStatus::finished_stopped);
    EXPECT_EQ(s->num_output_tokens(), 3);
}

// ignore_eos: eos never stops; max_tokens does.
TEST(Scheduler, IgnoreEos) {
    Harness h(100, 4, 512, 16);
    SamplingParams p;
    p.ignore_eos = true;
    Sequence* s = h.add(5, 4, 0, 0, -1, p);
    for (int i = 0; i < 4; ++i) h.step(0);
    EXPECT_EQ(s->status, SeqStatus::finished_length);
}

// max_num_seqs bounds the running set (vLLM: scheduler.py:L599 and test_scheduler.py
// (test_schedule with max_num_seqs)).
TEST(Scheduler, MaxNumSeqs) {
    Harness h(100, 4, 512, 2);
    h.add(5); h.add(5); Sequence* c = h.add(5);
    const SchedulerOutput& out = h.sched->schedule();
    EXPECT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(c->status, SeqStatus::waiting);
}

// vLLM: test_scheduler.py (test_priority_scheduling_basic_ordering,
// test_priority_scheduling_arrival_time_tiebreaker): lower priority value first, then earlier arrival.
TEST(Scheduler, PriorityOrdering) {
    Harness h(100, 4, 512, 16, EngineConfig::Policy::priority);
    Sequence* p2 = h.add(4, 8, 2, 1.0);
    Sequence* p0_late = h.add(4, 8, 0, 3.0);
    Sequence* p1 = h.add(4, 8, 1, 0.5);
    Sequence* p0_early = h.add(4, 8, 0, 2.0);
    const SchedulerOutput& out = h.sched->schedule();
    ASSERT_EQ(out.seqs.size(), 4u);
    EXPECT_EQ(out.seqs[0].seq, p0_early);
    EXPECT_EQ(out.seqs[1].seq, p0_late);
    EXPECT_EQ(out.seqs[2].seq, p1);
    EXPECT_EQ(out.seqs[3].seq, p2);
}

// vLLM: test_scheduler.py (test_priority_scheduling_preemption): when blocks run out, the running
// request that runs last by (priority, arrival) is preempted, not the newest; it resumes later
// and recomputes prompt + outputs.
TEST(Scheduler, PriorityPreemptsLowestPriority) {
    // 6 usable blocks of 4 tokens.
    Harness h(7, 4, 512, 16, EngineConfig::Policy::priority);
    Sequence* low = h.add(8, 16, 5, 1.0);   // 2 blocks + 1 when it grows
    Sequence* high = h.add(8, 16, 0, 2.0);  // 2 blocks
    h.step();                                 // both prefill: 4 blocks used, each has 9 tokens
    EXPECT_EQ(h.kv->pool().num_free_blocks(), 2);
    h.step();  // both decode token 9 -> need a 3rd block each: 2 free -> fine
    EXPECT_EQ(h.kv->pool().num_free_blocks(), 0);
    // Decode until a block boundary needs more: the low-priority one must be preempted.
    while (low->status == SeqStatus::running && high->status == SeqStatus::running) h.step();
    EXPECT_EQ(low->status, SeqStatus::preempted);
    EXPECT_EQ(low->num_computed_tokens, 0);
    EXPECT_EQ(low->num_preemptions, 1);
    EXPECT_EQ(h.sched->num_preemptions(), 1);
    EXPECT_EQ(high->status, SeqStatus::running);
}

// FCFS preempts the most recently started running request (vLLM: scheduler.py:L531,
// test_scheduler.py (test_preempt_during_execution intent)), and a step that preempts schedules
// no waiting request (scheduler.py:L592).
TEST(Scheduler, FcfsPreemptsNewestAndResumesByRecompute) {
    Harness h(7, 4, 512, 16);
    Sequence* first = h.add(8, 32);
    Sequence* second = h.add(8, 32);
    h.step();
    h.step();
    while (second->status == SeqStatus::running) {
        const SchedulerOutput& out = h.step();
        if (!out.preempted.empty()) {
            EXPECT_EQ(out.preempted[0], second);
            for (const ScheduledSeq& s : out.seqs) EXPECT_NE(s.seq, second);
        }
    }
    EXPECT_EQ(first->status, SeqStatus::running);
    EXPECT_EQ(second->status, SeqStatus::preempted);
    const int outputs_before = second->num_output_tokens();
    // Finish the first; the second resumes and recomputes its prompt and outputs in one chunk.
    h.sched->finish_request(first, SeqStatus::finished_aborted);
    const SchedulerOutput& out = h.sched->schedule();
    ASSERT_EQ(out.seqs.size(), 1u);
    EXPECT_EQ(out.seqs[0].seq, second);
    EXPECT_EQ(out.seqs[0].num_tokens, second->num_tokens() - out.seqs[0].start);
    EXPECT_EQ(out.seqs[0].start + out.seqs[0].num_tokens, 8 + outputs_before);
}

// vLLM: test_prefix_caching.py (test_prefill) through the scheduler: a request sharing a computed
// prefix starts with those tokens computed and records them as cached.
TEST(Scheduler, PrefixHitSkipsComputedTokens) {
    Harness h(100, 4, 512, 16);
    Sequence* a = h.add(18, 16, 0, 0, 1);
    h.step();
    Sequence* b = h.add(18, 16, 0, 0, 1);  // the same tokens 1..18
    const SchedulerOutput& out = h.step();
    ASSERT_EQ(out.seqs.size(), 2u);
    EXPECT_EQ(out.seqs[1].seq, b);
    EXPECT_EQ(out.seqs[1].start, 16);  // 4 full blocks hit; never the last token
    EXPECT_EQ(out.seqs[1].num_tokens, 2);
    EXPECT_EQ(b->num_cached_tokens, 16);
    EXPECT_EQ(b->blocks[0], a->blocks[0]);
    EXPECT_EQ(b->blocks[3], a->blocks[3]);
}

// With caching off, nothing hits.
TEST(Scheduler, PrefixCachingDisabled) {
    Harness h(100, 4, 512, 16, EngineConfig::Policy::fcfs, /*caching=*/false);
    h.add(18, 16, 0, 0, 1);
    h.step();
    Sequence* b = h.add(18, 16, 0, 0, 1);
    h.step();
    EXPECT_EQ(b->num_cached_tokens, 0);
}

// Continuous batching: a request added while others decode joins the next step, and finished ones
// leave it.
TEST(Scheduler, ContinuousBatching) {
    Harness h(100, 4, 512, 16);
    Sequence* a = h.add(5, 3);
    h.step();
    Sequence* b = h.add(6, 3);
    const SchedulerOutput& o2 = h.step();
    EXPECT_EQ(h.scheduled_tokens(o2, a), 1);
    EXPECT_EQ(h.scheduled_tokens(o2, b), 6);
    h.step();  // a finishes (3 outputs)
    EXPECT_EQ(a->status, SeqStatus::finished_length);
    const SchedulerOutput& o4 = h.step();
    EXPECT_EQ(h.scheduled_tokens(o4, a), 0);
    EXPECT_EQ(h.scheduled_tokens(o4, b), 1);
}
