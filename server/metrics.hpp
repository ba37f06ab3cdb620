// Server metrics in Prometheus' text format (GET /metrics): HTTP request counts, finished requests by
// reason, the engine's queue and KV-cache gauges, prefix-cache hit rate, token counters, and TTFT /
// inter-token / end-to-end latency histograms. Observations are lock-free (atomics) because TTFT and
// ITL are recorded on the engine thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/engine/engine.hpp"

namespace scr::server {

class Histogram {
public:
    explicit Histogram(std::vector<double> upper_bounds);
    void observe(double value, uint64_t times = 1);
    void render(std::string& out, std::string_view name, std::string_view help) const;
    uint64_t count() const { return count_.load(std::memory_order_relaxed); }

private:
    std::vector<double> bounds_;
    std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // per bound, not cumulative; last is +Inf
    std::atomic<uint64_t> count_{0};
    std::atomic<double> sum_{0.0};
};

class ServerMetrics {
public:
    ServerMetrics();

    void count_http(std::string_view endpoint, int status);
    void count_finished(FinishReason reason);
    void count_disconnect() { disconnects_.fetch_add(1, std::memory_order_relaxed); }

    Histogram time_to_first_token;   // seconds from request arrival to its first token
    Histogram inter_token_latency;   // seconds between tokens of one sample
    Histogram e2e_latency;           // seconds from arrival to the last byte queued
    std::atomic<int64_t> active_generations{0};  // generation requests an HTTP thread is serving

    std::string render(const EngineStats& engine) const;

private:
    mutable std::mutex mutex_;
    std::map<std::pair<std::string, int>, uint64_t> http_;  // (endpoint, status) -> count
    std::atomic<uint64_t> finished_[5] = {};                 // by FinishReason
    std::atomic<uint64_t> disconnects_{0};
};

}  // namespace scr::server
