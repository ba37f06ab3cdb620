// The scheduler: each step, a token budget is spent on running sequences first, then on waiting
// ones; prompts are chunked to fit (chunked prefill); sequences join and leave every step
// (continuous batching); when blocks run out the lowest-priority running sequence is preempted and
// later recomputed. vLLM: vllm/v1/core/sched/scheduler.py:L372 (Scheduler.schedule).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "runtime/engine/kv_cache_manager.hpp"
#include "runtime/engine/sequence.hpp"

namespace scr::engine {

struct SchedulerConfig {
    int max_num_seqs = 64;
    int max_num_batched_tokens = 512;
    int max_model_len = 2048;
    bool enable_chunked_prefill = true;
    EngineConfig::Policy policy = EngineConfig::Policy::fcfs;
    std::vector<int32_t> eos_ids;  // end generation unless ignore_eos
};

// The waiting queue. vLLM: vllm/v1/core/sched/request_queue.py:L77 (FCFSRequestQueue, a deque) and
// L133 (PriorityRequestQueue, a heap on (priority, arrival_time)).
class WaitingQueue {
public:
    explicit WaitingQueue(EngineConfig::Policy policy) : policy_(policy) {}
    bool empty() const { return fcfs_.empty() && heap_.empty(); }
    size_t size() const { return fcfs_.size() + heap_.size(); }
    void add(Sequence* s);
    Sequence* peek() const;
    Sequence* pop();
    void prepend(Sequence* s);  // FCFS: to the front (a preempted sequence resumes first)
    bool remove(const Sequence* s);
    // vLLM Request.__lt__: priority, then arrival time (then arrival order here).
    static bool runs_before(const Sequence* a, const Sequence* b);

private:
    EngineConfig::Policy policy_;
    std::deque<Sequence*> fcfs_;
    std::vector<Sequence*> heap_;  // std::push_heap with the inverse of runs_before
};

struct ScheduledSeq {
    Sequence* seq;
    int start;          // first position computed this step (num_computed_tokens before the step)
    int num_tokens;     // tokens computed this step
    bool needs_sample;  // the step reaches the sequence's last token: sample the next one
};

struct SchedulerOutput {
    std::vector<ScheduledSeq> seqs;       // running sequences first, then newly scheduled ones
    std::vector<Sequence*> preempted;
    int total_tokens = 0;
    bool empty() const { return seqs.empty(); }
};

class Scheduler {
public:
    Scheduler(SchedulerConfig config, KvCacheManager& kv);

    const SchedulerConfig& config() const { return config_; }
    KvCacheManager& kv() { return kv_; }

    // vLLM: scheduler.py:L1726 (add_request).
    void add_request(Sequence* seq);
    // vLLM: scheduler.py:L372 (schedule). Advances num_computed_tokens of what it schedules, as
    // vLLM's _update_after_schedule (scheduler.py:L999) does.
    const SchedulerOutput& schedule();
    // After the forward of the last schedule(): registers newly computed full blocks in the prefix
    // cache, appends the sampled tokens (sampled[i] for output().seqs[i]; -1: none) and stops
    // sequences (token-level checks). vLLM: scheduler.py:L1323 (update_from_output).
    void update_from_output(std::span<const int32_t> sampled);
    // Finishes a sequence from outside (abort, stop string): off the queues, KV freed.
    // vLLM: scheduler.py:L1748 (finish_requests).
    void finish_request(Sequence* seq, SeqStatus status);

    const SchedulerOutput& output() const { return out_; }
    int num_running() const { return int(running_.size()); }
    int num_waiting() const { return int(waiting_.size()); }
    bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
    int64_t num_preemptions() const { return num_preemptions_; }
    const std::vector<Sequence*>& running() const { return running_; }

private:
    void preempt(Sequence* seq);                // vLLM: scheduler.py:L977 (_preempt_request)
    bool check_stop(Sequence& seq) const;       // vLLM: vllm/v1/core/sched/utils.py:L104 (check_stop)
    bool must_wait_for_sibling(const Sequence& seq) const;

    SchedulerConfig config_;
    KvCacheManager& kv_;
    WaitingQueue waiting_;
    std::vector<Sequence*> running_;
    SchedulerOutput out_;
    std::vector<Sequence*> skipped_;
    std::vector<int32_t> hit_blocks_;
    int64_t num_preemptions_ = 0;
};

}  // namespace scr::engine
