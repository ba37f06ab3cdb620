// The serving engine's public face: requests in, streamed outputs out.
//
// `Engine` is synchronous and single-threaded (offline use: `scr complete`, `scr chat`, bench,
// tests): add requests, call `step()` until idle. `AsyncEngine` runs the same loop on its own
// thread for the server: `submit` and `abort` are thread-safe, outputs arrive through a callback
// invoked on the engine thread (it must not block; the server pushes into a per-stream queue).
//
// Algorithms (block pool, KV cache manager, scheduler, sampler, detokenizer) are vLLM v1's,
// re-expressed here; each site cites vLLM's file and line. See docs/ARCHITECTURE.md#engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace scr {
class CompiledModel;
struct KvPool;
namespace text { class Tokenizer; }

struct SamplingParams {
    int n = 1;                          // independent samples of one prompt
    float temperature = 1.0f;           // 0: greedy
    int top_k = 0;                      // 0 or -1: off
    float top_p = 1.0f;
    float min_p = 0.0f;
    float repetition_penalty = 1.0f;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    std::vector<std::pair<int32_t, float>> logit_bias;
    std::optional<uint64_t> seed;       // per-request generator; reproducible when set
    int max_tokens = 16;                // new tokens; the engine also stops at the model's context
    int min_tokens = 0;
    bool ignore_eos = false;
    std::vector<int32_t> stop_token_ids;
    std::vector<std::string> stop;      // stop strings; matched on detokenized text, held back while partial
    bool include_stop_str_in_output = false;
    int logprobs = -1;                  // -1: none; k >= 0: sampled token's logprob plus top-k
    bool skip_special_tokens = true;
};

struct EngineConfig {
    int max_num_seqs = 64;
    int max_num_batched_tokens = 0;     // 0: the model's compiled max_batch_tokens (its step size); clamped to it
    int max_model_len = 0;              // 0: the model's context
    int64_t kv_cache_bytes = 0;         // 0: sized from kv_cache_fraction of free RAM (CPU)
    bool enable_prefix_caching = true;
    bool enable_chunked_prefill = true;
    enum class Policy { fcfs, priority } policy = Policy::fcfs;
    double kv_cache_fraction = 0.25;    // of MemAvailable, when kv_cache_bytes is 0
    // Run-ahead (vLLM's async scheduling): when the model samples on an asynchronous device
    // (CompiledModel::can_run_ahead), a decode step's successor is enqueued before the step's tokens
    // are back, and adopted when the next schedule is that step (ModelRunner::launch_ahead).
    bool run_ahead = true;
};

struct Request {
    std::string id;
    std::vector<int32_t> prompt_ids;
    SamplingParams params;
    int priority = 0;                   // lower runs first under Policy::priority
    double arrival_time = 0;            // seconds, steady clock; 0: now
    std::string cache_salt;             // extra prefix-cache key: only requests with the same salt share blocks
};

struct TokenLogprob {
    int32_t token_id;
    float logprob;
    std::vector<std::pair<int32_t, float>> top;  // top-k alternatives, best first
};

enum class FinishReason { none, stop, length, abort, error };
const char* finish_reason_name(FinishReason r);

// What one step produced for one sample (`index` < n) of one request.
struct RequestOutput {
    std::string request_id;
    int index = 0;
    std::vector<int32_t> new_token_ids;
    std::string new_text;               // valid UTF-8; concatenation of all chunks == full text
    std::vector<TokenLogprob> logprobs; // one per new token when requested
    FinishReason finish_reason = FinishReason::none;
    std::string stop_reason;            // the stop string or token that matched, if any
    std::string error;                  // set with FinishReason::error
    int num_prompt_tokens = 0;
    int num_output_tokens = 0;          // so far, this sample
    int num_cached_tokens = 0;          // prompt tokens served from the prefix cache
    bool finished() const { return finish_reason != FinishReason::none; }
};

using OutputCallback = std::function<void(const RequestOutput&)>;

struct EngineStats {
    int num_running = 0, num_waiting = 0;
    int64_t kv_blocks_total = 0, kv_blocks_free = 0;
    int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // in tokens
    int64_t prompt_tokens = 0, generation_tokens = 0;
    int64_t num_preemptions = 0, steps = 0;
    int64_t requests_finished = 0, requests_aborted = 0;
    // Cumulative wall time per phase of step(); engine overhead = everything but forward.
    double time_schedule_s = 0, time_prepare_s = 0, time_forward_s = 0, time_sample_s = 0,
           time_output_s = 0;
    int64_t forward_tokens = 0;         // tokens computed by forwards (prefill chunks + decodes)
    int64_t prompt_tokens_computed = 0; // prompt tokens actually run through the model
    // Run-ahead: steps launched ahead, adopted by the next schedule, and dropped (a sequence ended
    // by EOS or a stop string, a request arrived or was aborted, a preemption).
    int64_t run_ahead_launched = 0, run_ahead_adopted = 0, run_ahead_dropped = 0;
};

class Engine {
public:
    // The tokenizer may be null: then no text is produced and stop strings are refused.
    Engine(CompiledModel& model, const text::Tokenizer* tokenizer, EngineConfig config);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Throws scr::Error for a request the engine cannot serve (prompt over the context, bad ids, ...).
    void add_request(Request request, OutputCallback on_output);
    // The checks add_request makes that need no engine state (all but the duplicate id); const and
    // safe to call from any thread.
    void validate(const Request& request) const;
    bool abort(const std::string& request_id);
    int abort_all();  // returns how many requests were aborted
    // One scheduling step + forward + sampling. Returns false when there was nothing to do.
    bool step();
    bool has_unfinished() const;
    EngineStats stats() const;
    const EngineConfig& config() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

class AsyncEngine {
public:
    AsyncEngine(CompiledModel& model, const text::Tokenizer* tokenizer, EngineConfig config);
    ~AsyncEngine();  // aborts what is in flight and joins the loop

    // Thread-safe. Validation errors are thrown here, on the caller's thread.
    void submit(Request request, OutputCallback on_output);
    void abort(const std::string& request_id);
    EngineStats stats() const;
    // Stop taking requests; wait up to timeout for in-flight ones, then abort the rest.
    void drain(double timeout_seconds);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace scr
