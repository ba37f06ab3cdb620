#include "runtime/engine/scheduler.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace scr::engine {

// ---- WaitingQueue -----------------------------------------------------------------------------------

bool WaitingQueue::runs_before(const Sequence* a, const Sequence* b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    if (a->arrival_time != b->arrival_time) return a->arrival_time < b->arrival_time;
    return a->arrival_order < b->arrival_order;
}

static bool heap_less(const Sequence* a, const Sequence* b) { return WaitingQueue::runs_before(b, a); }

// vLLM: vllm/v1/core/sched/request_queue.py:L80 (FCFS add_request), L146 (priority add_request)
void WaitingQueue::add(Sequence* s) {
    if (policy_ == EngineConfig::Policy::fcfs) { fcfs_.push_back(s); return; }
    heap_.push_back(s);
    std::push_heap(heap_.begin(), heap_.end(), heap_less);
}

Sequence* WaitingQueue::peek() const {
    if (empty()) throw std::logic_error("WaitingQueue::peek on an empty queue");
    return policy_ == EngineConfig::Policy::fcfs ? fcfs_.front() : heap_.front();
}

Sequence* WaitingQueue::pop() {
    Sequence* s = peek();
    if (policy_ == EngineConfig::Policy::fcfs) { fcfs_.pop_front(); return s; }
    std::pop_heap(heap_.begin(), heap_.end(), heap_less);
    heap_.pop_back();
    return s;
}

// vLLM: vllm/v1/core/sched/request_queue.py:L94 (FCFS prepend_request); a priority queue has no
// front, the sequence goes back by its key (L162).
void WaitingQueue::prepend(Sequence* s) {
    if (policy_ == EngineConfig::Policy::fcfs) fcfs_.push_front(s);
    else add(s);
}

bool WaitingQueue::remove(const Sequence* s) {
    if (policy_ == EngineConfig::Policy::fcfs) {
        auto it = std::find(fcfs_.begin(), fcfs_.end(), s);
        if (it == fcfs_.end()) return false;
        fcfs_.erase(it);
        return true;
    }
    auto it = std::find(heap_.begin(), heap_.end(), s);
    if (it == heap_.end()) return false;
    heap_.erase(it);
    std::make_heap(heap_.begin(), heap_.end(), heap_less);
    return true;
}

// ---- Scheduler --------------------------------------------------------------------------------------

Scheduler::Scheduler(SchedulerConfig config, KvCacheManager& kv)
    : config_(std::move(config)), kv_(kv), waiting_(config_.policy) {
    running_.reserve(size_t(config_.max_num_seqs));
    out_.seqs.reserve(size_t(config_.max_num_seqs));
    out_.preempted.reserve(size_t(config_.max_num_seqs));
}

// vLLM: vllm/v1/core/sched/scheduler.py:L1726 (add_request)
void Scheduler::add_request(Sequence* seq) {
    seq->status = SeqStatus::waiting;
    seq->update_block_hashes(kv_.block_size());
    waiting_.add(seq);
}

bool Scheduler::must_wait_for_sibling(const Sequence& seq) const {
    const Sequence* s = seq.wait_for;
    return s && kv_.pool().caching_enabled() && !is_finished(s->status) &&
           s->num_computed_tokens < s->num_prompt_tokens;
}

// vLLM: vllm/v1/core/sched/scheduler.py:L977 (_preempt_request)
void Scheduler::preempt(Sequence* seq) {
    kv_.free(*seq);
    seq->status = SeqStatus::preempted;
    seq->num_computed_tokens = 0;
    ++seq->num_preemptions;
    ++num_preemptions_;
    waiting_.prepend(seq);
}

// vLLM: vllm/v1/core/sched/scheduler.py:L372 (schedule)
const SchedulerOutput& Scheduler::schedule() {
    out_.seqs.clear();
    out_.preempted.clear();
    out_.total_tokens = 0;
    int token_budget = config_.max_num_batched_tokens;

    // First, the RUNNING sequences. vLLM: scheduler.py:L407.
    size_t req_index = 0;
    while (req_index < running_.size() && token_budget > 0) {
        Sequence* seq = running_[req_index];
        // vLLM: scheduler.py:L428.
        int num_new_tokens = seq->num_tokens() - seq->num_computed_tokens;
        num_new_tokens = std::min(num_new_tokens, token_budget);
        if (num_new_tokens == 0) {  // vLLM: scheduler.py:L473: nothing to do this step; keep going.
            ++req_index;
            continue;
        }
        // vLLM: scheduler.py:L493: allocate, preempting the lowest-priority sequence until it fits.
        bool allocated;
        while (true) {
            allocated = kv_.allocate_slots(*seq, num_new_tokens);
            if (allocated) break;
            Sequence* victim;
            if (config_.policy == EngineConfig::Policy::priority) {
                // vLLM: scheduler.py:L507: the running sequence that runs last by (priority, arrival).
                auto it = std::max_element(running_.begin(), running_.end(),
                                           [](const Sequence* a, const Sequence* b) {
                                               return WaitingQueue::runs_before(a, b);
                                           });
                victim = *it;
                size_t victim_index = size_t(it - running_.begin());
                running_.erase(it);
                auto sit = std::find_if(out_.seqs.begin(), out_.seqs.end(),
                                        [&](const ScheduledSeq& s) { return s.seq == victim; });
                if (sit != out_.seqs.end()) {  // vLLM: scheduler.py:L512: give its tokens back
                    token_budget += sit->num_tokens;
                    out_.seqs.erase(sit);
                }
                if (victim_index < req_index) --req_index;
            } else {
                victim = running_.back();  // vLLM: scheduler.py:L531
                running_.pop_back();
            }
            preempt(victim);
            out_.preempted.push_back(victim);
            if (victim == seq) break;  // nothing left to preempt: this one cannot run now
        }
        if (!allocated) break;  // vLLM: scheduler.py:L539

        out_.seqs.push_back({seq, seq->num_computed_tokens, num_new_tokens, false});
        token_budget -= num_new_tokens;
        ++req_index;
    }

    // Next, the WAITING sequences, unless this step preempted. vLLM: scheduler.py:L592.
    if (out_.preempted.empty()) {
        skipped_.clear();
        while (!waiting_.empty() && token_budget > 0) {
            if (int(running_.size()) >= config_.max_num_seqs) break;
            Sequence* seq = waiting_.peek();
            // A sample of n > 1 waits for its sibling's prompt (like vLLM's skipped requests that
            // wait for remote KV, scheduler.py:L606): then it hits the prefix cache.
            if (must_wait_for_sibling(*seq)) {
                waiting_.pop();
                skipped_.push_back(seq);
                continue;
            }
            // vLLM: scheduler.py:L662: cached prefix, only for a sequence not yet computed.
            int num_new_local_computed_tokens = 0;
            hit_blocks_.clear();
            if (seq->num_computed_tokens == 0)
                num_new_local_computed_tokens = kv_.get_computed_blocks(*seq, hit_blocks_);
            const int num_computed_tokens = seq->num_computed_tokens + num_new_local_computed_tokens;

            // vLLM: scheduler.py:L717: num_tokens, not the prompt, so resumed sequences recompute
            // their outputs too.
            int num_new_tokens = seq->num_tokens() - num_computed_tokens;
            // vLLM: scheduler.py:L725: without chunked prefill a prompt that does not fit ends the
            // waiting pass. (A resumed sequence may still be chunked; see docs/ENGINE.md.)
            if (!config_.enable_chunked_prefill && num_new_tokens > token_budget &&
                seq->num_output_tokens() == 0)
                break;
            num_new_tokens = std::min(num_new_tokens, token_budget);

            // vLLM: scheduler.py:L791.
            if (!kv_.allocate_slots(*seq, num_new_tokens, num_new_local_computed_tokens, hit_blocks_))
                break;

            waiting_.pop();
            running_.push_back(seq);
            seq->status = SeqStatus::running;
            seq->num_computed_tokens = num_computed_tokens;
            if (seq->num_cached_tokens < 0) seq->num_cached_tokens = num_computed_tokens;  // L864
            out_.seqs.push_back({seq, num_computed_tokens, num_new_tokens, false});
            token_budget -= num_new_tokens;
        }
        // vLLM: scheduler.py:L880: skipped sequences go back to the head, in order.
        for (size_t k = skipped_.size(); k-- > 0;) waiting_.prepend(skipped_[k]);
    }

    // vLLM: scheduler.py:L999 (_update_after_schedule): advance the computed counts now.
    for (ScheduledSeq& s : out_.seqs) {
        s.seq->num_computed_tokens = s.start + s.num_tokens;
        s.needs_sample = s.seq->num_computed_tokens == s.seq->num_tokens();
        out_.total_tokens += s.num_tokens;
    }
    if (out_.total_tokens > config_.max_num_batched_tokens || int(running_.size()) > config_.max_num_seqs)
        throw std::logic_error("scheduler exceeded its token or sequence budget");
    return out_;
}

// vLLM: vllm/v1/core/sched/utils.py:L104 (check_stop)
bool Scheduler::check_stop(Sequence& seq) const {
    const SamplingParams& p = *seq.params;
    if (seq.num_output_tokens() < p.min_tokens) return false;  // utils.py:L110
    const int32_t last = seq.last_token();
    if (!p.ignore_eos &&
        std::find(config_.eos_ids.begin(), config_.eos_ids.end(), last) != config_.eos_ids.end()) {
        seq.status = SeqStatus::finished_stopped;  // utils.py:L114
        return true;
    }
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end()) {
        seq.status = SeqStatus::finished_stopped;  // utils.py:L118
        seq.stop_reason = std::to_string(last);
        return true;
    }
    if (seq.num_tokens() >= config_.max_model_len || seq.num_output_tokens() >= p.max_tokens) {
        seq.status = SeqStatus::finished_length;  // utils.py:L122
        return true;
    }
    return false;
}

// vLLM: vllm/v1/core/sched/scheduler.py:L1323 (update_from_output) and L1620
// (_update_request_with_output).
void Scheduler::update_from_output(std::span<const int32_t> sampled) {
    if (sampled.size() != out_.seqs.size()) throw std::logic_error("update_from_output: size mismatch");
    bool any_stopped = false;
    for (size_t i = 0; i < out_.seqs.size(); ++i) {
        Sequence& seq = *out_.seqs[i].seq;
        if (is_finished(seq.status)) continue;  // aborted while the step ran
        kv_.cache_blocks(seq, seq.num_computed_tokens);
        if (sampled[i] < 0) continue;
        seq.append_token(sampled[i], kv_.block_size());
        if (check_stop(seq)) {
            kv_.free(seq);  // vLLM: scheduler.py:L1810 (_free_request)
            any_stopped = true;
        }
    }
    if (any_stopped)  // vLLM: scheduler.py:L1502 (remove_all)
        std::erase_if(running_, [](const Sequence* s) { return is_finished(s->status); });
}

// vLLM: vllm/v1/core/sched/scheduler.py:L1748 (finish_requests)
void Scheduler::finish_request(Sequence* seq, SeqStatus status) {
    if (is_finished(seq->status)) return;
    if (seq->status == SeqStatus::running) {
        std::erase(running_, seq);
    } else {
        waiting_.remove(seq);
    }
    seq->status = status;
    kv_.free(*seq);
}

}  // namespace scr::engine
