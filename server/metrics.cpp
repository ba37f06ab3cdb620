#include "server/metrics.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "server/protocol.hpp"

namespace scr::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
    for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double value, uint64_t times) {
    const size_t bucket = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
    buckets_[bucket].fetch_add(times, std::memory_order_relaxed);
    count_.fetch_add(times, std::memory_order_relaxed);
    sum_.fetch_add(value * double(times), std::memory_order_relaxed);
}

void Histogram::render(std::string& out, std::string_view name, std::string_view help) const {
    auto it = std::back_inserter(out);
    fmt::format_to(it, "# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cumulative += buckets_[i].load(std::memory_order_relaxed);
        fmt::format_to(it, "{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
    }
    cumulative += buckets_[bounds_.size()].load(std::memory_order_relaxed);
    fmt::format_to(it, "{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cumulative, name,
                   sum_.load(std::memory_order_relaxed), name, cumulative);
}

ServerMetrics::ServerMetrics()
    : time_to_first_token({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                           7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0}),
      inter_token_latency({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                           0.75, 1.0, 2.5, 5.0, 10.0, 20.0}),
      e2e_latency({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0}) {}

void ServerMetrics::count_http(std::string_view endpoint, int status) {
    std::lock_guard lock(mutex_);
    ++http_[{std::string(endpoint), status}];
}

void ServerMetrics::count_finished(FinishReason reason) {
    finished_[size_t(reason)].fetch_add(1, std::memory_order_relaxed);
}

std::string ServerMetrics::render(const EngineStats& e) const {
    std::string out;
    auto it = std::back_inserter(out);
    auto metric = [&](const char* name, const char* type, const char* help, auto value) {
        fmt::format_to(it, "# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };

    fmt::format_to(it, "# HELP scr_http_requests_total HTTP requests answered, by endpoint and status.\n"
                       "# TYPE scr_http_requests_total counter\n");
    {
        std::lock_guard lock(mutex_);
        for (const auto& [key, count] : http_)
            fmt::format_to(it, "scr_http_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first,
                           key.second, count);
    }
    fmt::format_to(it, "# HELP scr_request_success_total Finished generations (choices), by finish reason.\n"
                       "# TYPE scr_request_success_total counter\n");
    for (FinishReason r : {FinishReason::stop, FinishReason::length, FinishReason::abort, FinishReason::error})
        fmt::format_to(it, "scr_request_success_total{{finished_reason=\"{}\"}} {}\n", openai_finish_reason(r),
                       finished_[size_t(r)].load(std::memory_order_relaxed));
    metric("scr_client_disconnects_total", "counter", "Generations aborted because the client went away.",
           disconnects_.load(std::memory_order_relaxed));
    metric("scr_http_active_generations", "gauge", "Generation requests being served over HTTP.",
           active_generations.load(std::memory_order_relaxed));

    metric("scr_num_requests_running", "gauge", "Requests the engine is running.", e.num_running);
    metric("scr_num_requests_waiting", "gauge", "Requests waiting to be scheduled.", e.num_waiting);
    metric("scr_kv_cache_blocks_total", "gauge", "KV cache blocks in the pool.", e.kv_blocks_total);
    metric("scr_kv_cache_blocks_free", "gauge", "KV cache blocks free (cached prefix blocks count as free).",
           e.kv_blocks_free);
    const double usage = e.kv_blocks_total > 0 ? 1.0 - double(e.kv_blocks_free) / double(e.kv_blocks_total) : 0.0;
    metric("scr_kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use (0-1).", usage);
    metric("scr_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
           e.prefix_cache_queries);
    metric("scr_prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", e.prefix_cache_hits);
    const double hit_rate = e.prefix_cache_queries > 0 ? double(e.prefix_cache_hits) / double(e.prefix_cache_queries)
                                                       : 0.0;
    metric("scr_prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries since start (tokens).", hit_rate);
    metric("scr_prompt_tokens_total", "counter", "Prompt tokens processed.", e.prompt_tokens);
    metric("scr_generation_tokens_total", "counter", "Tokens generated.", e.generation_tokens);
    metric("scr_num_preemptions_total", "counter", "Requests preempted for KV cache space.", e.num_preemptions);
    metric("scr_engine_steps_total", "counter", "Engine steps run.", e.steps);
    metric("scr_engine_requests_finished_total", "counter", "Requests the engine finished.", e.requests_finished);
    metric("scr_engine_requests_aborted_total", "counter", "Requests the engine aborted.", e.requests_aborted);

    time_to_first_token.render(out, "scr_time_to_first_token_seconds", "Time from request arrival to its first token.");
    inter_token_latency.render(out, "scr_inter_token_latency_seconds", "Time between successive tokens of a sample.");
    e2e_latency.render(out, "scr_e2e_request_latency_seconds", "Time from request arrival to its last token.");
    return out;
}

}  // namespace scr::server
