// ThreadPool: every index runs exactly once in grain-aligned ranges, exceptions reach the caller,
// nested and zero-size calls, concurrent callers, and a kernel's bits do not depend on the thread
// count or on how the pool happened to split the work.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/cpu/linear.hpp"
#include "runtime/core/thread_pool.hpp"

namespace scr {
namespace {

struct Coverage {
    std::vector<std::atomic<int>> hits;
    std::atomic<bool> misaligned{false}, bad_thread{false};
    explicit Coverage(int64_t n) : hits(size_t(n)) {}
};

void check_once(ThreadPool& pool, int64_t n, int64_t grain) {
    Coverage c(n);
    pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
        // Ranges start on the grain and are whole grains long unless they end at n.
        if (b % grain != 0 || (e != n && (e - b) % grain != 0) || b >= e) c.misaligned = true;
        if (t < 0 || t >= pool.size()) c.bad_thread = true;
        for (int64_t i = b; i < e; ++i) c.hits[size_t(i)].fetch_add(1);
    }, grain);
    EXPECT_FALSE(c.misaligned) << "n=" << n << " grain=" << grain;
    EXPECT_FALSE(c.bad_thread);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(c.hits[size_t(i)].load(), 1) << "index " << i << " of n=" << n << " grain=" << grain;
}

TEST(ThreadPool, EveryIndexExactlyOnce) {
    for (int threads : {1, 2, 3, 8}) {
        ThreadPool pool(threads);
        EXPECT_EQ(pool.size(), threads);
        for (int64_t n : {1, 2, 3, 7, 64, 1000, 4099, 100003})
            for (int64_t grain : {1, 4, 16, 1000}) check_once(pool, n, grain);
    }
}

TEST(ThreadPool, ManyBackToBackJobs) {
    // The decode loop's pattern: hundreds of small jobs in a row; a lost wake-up would hang here.
    ThreadPool pool(4);
    std::vector<int64_t> sum(64);
    for (int job = 0; job < 20000; ++job) {
        const int64_t n = 1 + job % 64;
        pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
            for (int64_t i = b; i < e; ++i) sum[size_t(i)] += 1;
        });
    }
    for (int64_t i = 0; i < 64; ++i) {
        int64_t want = 0;
        for (int job = 0; job < 20000; ++job) want += (1 + job % 64) > i;
        ASSERT_EQ(sum[size_t(i)], want) << i;
    }
}

TEST(ThreadPool, ZeroAndNegativeSizesCallNothing) {
    ThreadPool pool(2);
    int calls = 0;
    pool.parallel_for(0, [&](int64_t, int64_t, int) { ++calls; });
    pool.parallel_for(-5, [&](int64_t, int64_t, int) { ++calls; });
    pool.parallel_for(0, [&](int64_t, int64_t, int) { ++calls; }, 16);
    EXPECT_EQ(calls, 0);
}

TEST(ThreadPool, ExceptionReachesTheCallerAndPoolStaysUsable) {
    for (int threads : {1, 2, 4}) {
        ThreadPool pool(threads);
        for (int64_t bad : {int64_t(0), int64_t(517), int64_t(999)}) {
            std::atomic<int64_t> ran{0};
            try {
                pool.parallel_for(1000, [&](int64_t b, int64_t e, int) {
                    if (bad >= b && bad < e) throw std::runtime_error("index " + std::to_string(bad));
                    ran += e - b;
                });
                FAIL() << "no exception for bad index " << bad;
            } catch (const std::runtime_error& e) {
                EXPECT_EQ(std::string(e.what()), "index " + std::to_string(bad));
            }
            EXPECT_LT(ran.load(), 1000);
        }
        check_once(pool, 5000, 4);  // still works after errors
    }
}

TEST(ThreadPool, NestedCallsRunInlineWithoutDeadlock) {
    ThreadPool pool(3);
    constexpr int64_t kOuter = 37, kInner = 101;
    std::vector<std::atomic<int>> hits(kOuter * kInner);
    pool.parallel_for(kOuter, [&](int64_t b, int64_t e, int t) {
        for (int64_t o = b; o < e; ++o)
            pool.parallel_for(kInner, [&](int64_t ib, int64_t ie, int inner_t) {
                EXPECT_EQ(inner_t, t) << "a nested call runs on the thread that made it";
                for (int64_t i = ib; i < ie; ++i) hits[size_t(o * kInner + i)].fetch_add(1);
            });
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, ConcurrentCallersFromSeveralThreads) {
    ThreadPool pool(2);
    std::vector<std::thread> callers;
    std::atomic<int> failures{0};
    for (int c = 0; c < 3; ++c)
        callers.emplace_back([&, c] {
            for (int rep = 0; rep < 300; ++rep) {
                const int64_t n = 100 + 37 * c + rep;
                std::vector<int> hits(static_cast<size_t>(n));
                pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
                    for (int64_t i = b; i < e; ++i) ++hits[size_t(i)];
                });
                for (int h : hits) failures += h != 1;
            }
        });
    for (auto& t : callers) t.join();
    EXPECT_EQ(failures.load(), 0);
}

TEST(ThreadPool, OtherThreadsTakeTheShareOfAStalledOne) {
    // The first chunk claimed stalls (as a descheduled thread would) until every other index is
    // done. With a static split this waits out the deadline; with dynamic claiming the other
    // thread (worker or caller) takes all remaining chunks.
    ThreadPool pool(2);
    std::atomic<int64_t> done{0};
    std::atomic<bool> stalled_taken{false}, hit_deadline{false};
    const int64_t n = 64;
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
        if (!stalled_taken.exchange(true)) {
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
            while (done.load() < n - (e - b))
                if (std::chrono::steady_clock::now() > deadline) { hit_deadline = true; break; }
                else std::this_thread::yield();
        }
        done += e - b;
    });
    EXPECT_EQ(done.load(), n);
    EXPECT_FALSE(hit_deadline.load()) << "the remaining chunks waited for the stalled thread";
}

// The linear kernel's outputs are bit-identical whatever the pool size (and hence the split), and
// close to a float64 reference.
TEST(ThreadPool, LinearKernelBitsIndependentOfThreads) {
    constexpr int N = 259, K = 67;  // odd sizes: tails in both dimensions
    const int rows = 5;
    std::mt19937 g(7);
    std::normal_distribution<float> d;
    std::vector<float> x(size_t(rows) * K), bias(N);
    std::vector<bf16_t> w(size_t(N) * K);
    for (auto& v : x) v = d(g);
    for (auto& v : bias) v = d(g);
    for (auto& v : w) v = bf16_t{f32_to_bf16(d(g))};
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        std::vector<float> y(size_t(rows) * N);
        kernels::cpu::linear<N, K, bf16_t>(rows, x.data(), w.data(), bias.data(), nullptr, y.data(), pool);
        outs.push_back(y);
    }
    for (size_t i = 1; i < outs.size(); ++i)
        EXPECT_EQ(std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * sizeof(float)), 0) << "pool size index " << i;
    for (int t = 0; t < rows; ++t)
        for (int n = 0; n < N; ++n) {
            double ref = bias[size_t(n)];
            for (int k = 0; k < K; ++k) ref += double(x[size_t(t) * K + k]) * bf16_to_f32(w[size_t(n) * K + k].bits);
            ASSERT_NEAR(outs[0][size_t(t) * N + n], ref, 1e-4 * (1 + std::abs(ref))) << t << "," << n;
        }
}

}  // namespace
}  // namespace scr
