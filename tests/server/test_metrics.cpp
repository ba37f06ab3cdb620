// Metrics rendering (Prometheus text exposition format) and the request mailbox.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "server/metrics.hpp"
#include "server/request_mailbox.hpp"

namespace scr::server {
namespace {

// The value of the sample line `name` (with labels, exactly as written), or NaN when absent.
double sample(const std::string& text, const std::string& name) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
    return std::nan("");
}

TEST(Metrics, HistogramBucketsAreCumulative) {
    Histogram h({0.1, 1.0});
    h.observe(0.05);
    h.observe(0.1);   // le is inclusive
    h.observe(0.5, 2);
    h.observe(7.0);
    std::string out;
    h.render(out, "lat", "help text");
    EXPECT_NE(out.find("# TYPE lat histogram\n"), std::string::npos);
    EXPECT_EQ(sample(out, "lat_bucket{le=\"0.1\"}"), 2);
    EXPECT_EQ(sample(out, "lat_bucket{le=\"1\"}"), 4);
    EXPECT_EQ(sample(out, "lat_bucket{le=\"+Inf\"}"), 5);
    EXPECT_EQ(sample(out, "lat_count"), 5);
    EXPECT_DOUBLE_EQ(sample(out, "lat_sum"), 0.05 + 0.1 + 1.0 + 7.0);
}

TEST(Metrics, RenderShowsEngineStateAndCounters) {
    ServerMetrics m;
    m.count_http("/v1/chat/completions", 200);
    m.count_http("/v1/chat/completions", 200);
    m.count_http("/v1/chat/completions", 400);
    m.count_finished(FinishReason::length);
    m.count_disconnect();
    m.time_to_first_token.observe(0.2);
    EngineStats e;
    e.num_running = 3;
    e.num_waiting = 2;
    e.kv_blocks_total = 100;
    e.kv_blocks_free = 75;
    e.prefix_cache_queries = 200;
    e.prefix_cache_hits = 50;
    e.prompt_tokens = 1234;
    e.generation_tokens = 99;
    const std::string text = m.render(e);
    EXPECT_EQ(sample(text, "scr_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"), 2);
    EXPECT_EQ(sample(text, "scr_http_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"), 1);
    EXPECT_EQ(sample(text, "scr_request_success_total{finished_reason=\"length\"}"), 1);
    EXPECT_EQ(sample(text, "scr_request_success_total{finished_reason=\"stop\"}"), 0);
    EXPECT_EQ(sample(text, "scr_client_disconnects_total"), 1);
    EXPECT_EQ(sample(text, "scr_num_requests_running"), 3);
    EXPECT_EQ(sample(text, "scr_num_requests_waiting"), 2);
    EXPECT_EQ(sample(text, "scr_kv_cache_blocks_free"), 75);
    EXPECT_DOUBLE_EQ(sample(text, "scr_kv_cache_usage_perc"), 0.25);
    EXPECT_DOUBLE_EQ(sample(text, "scr_prefix_cache_hit_rate"), 0.25);
    EXPECT_EQ(sample(text, "scr_prompt_tokens_total"), 1234);
    EXPECT_EQ(sample(text, "scr_generation_tokens_total"), 99);
    EXPECT_EQ(sample(text, "scr_time_to_first_token_seconds_count"), 1);
    // Every sample line belongs to a declared metric family.
    std::istringstream in(text);
    std::string line, family;
    while (std::getline(in, line)) {
        if (line.rfind("# TYPE ", 0) == 0) {
            family = line.substr(7, line.find(' ', 7) - 7);
        } else if (line[0] != '#') {
            EXPECT_EQ(line.rfind(family, 0), 0u) << line;
        }
    }
}

TEST(Mailbox, CoalescesUntilTakenAndTimesOut) {
    RequestMailbox box(2);
    std::vector<ChoiceDelta> taken;
    EXPECT_FALSE(box.take(taken, std::chrono::milliseconds(1)));
    RequestOutput a;
    a.new_text = "a";
    a.new_token_ids = {1};
    RequestOutput b = a;
    b.new_text = "b";
    box.post(1, a);
    box.post(1, b);
    ASSERT_TRUE(box.take(taken, std::chrono::milliseconds(1)));
    ASSERT_EQ(taken.size(), 2u);
    EXPECT_FALSE(taken[0].has_news);
    EXPECT_TRUE(taken[1].has_news);
    EXPECT_EQ(taken[1].text, "ab");
    EXPECT_EQ(taken[1].token_ids.size(), 2u);
    EXPECT_FALSE(box.take(taken, std::chrono::milliseconds(1)));
}

TEST(Mailbox, WakesAWaitingReader) {
    RequestMailbox box(1);
    std::thread poster([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        RequestOutput out;
        out.new_text = "x";
        out.finish_reason = FinishReason::stop;
        box.post(0, out);
    });
    std::vector<ChoiceDelta> taken;
    const auto start = std::chrono::steady_clock::now();
    ASSERT_TRUE(box.take(taken, std::chrono::seconds(10)));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(taken[0].finish, FinishReason::stop);
    poster.join();
}

}  // namespace
}  // namespace scr::server
