// Per-step overhead of the kernel thread pool, before and after the dynamic split, side by side in
// one run: a decode-like step (72 ops: per layer 7 GEMVs on bf16 weights and 2 small row ops, as in
// a generated Llama forward) through
//   - `StaticPool`: the previous scr::ThreadPool (one contiguous range per thread, the caller waits
//     at every op for every thread), kept here verbatim as the baseline;
//   - `scr::ThreadPool`: chunks claimed from an atomic counter, the caller participates.
// Each with and without a competing busy-loop process (one core's worth of load, as another
// engineer's build would add). Run: build-*/bench/thread_pool_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "kernels/cpu/linear.hpp"
#include "runtime/core/thread_pool.hpp"

namespace {

namespace k = scr::kernels::cpu;

// ---- the previous pool, unchanged (runtime/core/thread_pool.{hpp,cpp} before this change) -------
class StaticPool {
public:
    explicit StaticPool(int threads) {
        for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
    }
    ~StaticPool() {
        {
            std::lock_guard lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        for (auto& t : workers_) t.join();
    }
    int size() const { return int(workers_.size()) + 1; }
    template <typename Fn>
    void parallel_for(int64_t n, Fn&& fn, int64_t grain = 1) {
        if (n <= 0) return;
        const int parts = int(std::min<int64_t>(size(), (n + grain - 1) / grain));
        if (parts <= 1) { fn(int64_t(0), n, 0); return; }
        RangeFn rf = [&](int part) {
            int64_t chunks = (n + grain - 1) / grain;
            int64_t b = chunks * part / parts * grain, e = std::min(n, chunks * (part + 1) / parts * grain);
            if (b < e) fn(b, e, part);
        };
        run(rf, parts);
    }

private:
    using RangeFn = std::function<void(int)>;
    void run(const RangeFn& fn, int parts) {
        {
            std::lock_guard lk(mu_);
            job_ = &fn;
            job_parts_ = parts;
            remaining_.store(parts - 1, std::memory_order_relaxed);
            generation_.fetch_add(1, std::memory_order_release);
        }
        cv_.notify_all();
        fn(0);
        while (remaining_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
        std::lock_guard lk(mu_);
        job_ = nullptr;
    }
    void worker_loop(int index) {
        uint64_t seen = 0;
        for (;;) {
            const RangeFn* job;
            int parts;
            for (int spin = 0; spin < 200000 && generation_.load(std::memory_order_acquire) == seen; ++spin)
                __builtin_ia32_pause();
            {
                std::unique_lock lk(mu_);
                cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_.load();
                job = job_;
                parts = job_parts_;
            }
            if (job && index < parts) (*job)(index);
            if (index < parts) remaining_.fetch_sub(1, std::memory_order_acq_rel);
        }
    }
    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_;
    const RangeFn* job_ = nullptr;
    int job_parts_ = 0;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};
    bool stop_ = false;
};

// ---- a decode-like step -------------------------------------------------------------------------
constexpr int kHidden = 512, kFfn = 1536, kKv = 128, kLayers = 8;

struct Weights {
    std::vector<scr::bf16_t> q, kv, o, gate, up, down;
    Weights() {
        std::mt19937 g(1);
        std::normal_distribution<float> d(0.0f, 0.05f);
        auto fill = [&](std::vector<scr::bf16_t>& w, size_t n) {
            w.resize(n);
            for (auto& x : w) x = scr::bf16_t{scr::f32_to_bf16(d(g))};
        };
        fill(q, size_t(kLayers) * kHidden * kHidden);
        fill(kv, size_t(kLayers) * 2 * kKv * kHidden);
        fill(o, size_t(kLayers) * kHidden * kHidden);
        fill(gate, size_t(kLayers) * kFfn * kHidden);
        fill(up, size_t(kLayers) * kFfn * kHidden);
        fill(down, size_t(kLayers) * kHidden * kFfn);
    }
};

// y[n] = W[n] . x over rows [0, N), split by the pool in tiles of 4 rows (the linear kernel's way).
template <int N, int K, typename Pool>
void gemv(Pool& pool, const float* x, const scr::bf16_t* w, float* y) {
    pool.parallel_for(N, [&](int64_t n0, int64_t n1, int) {
        for (int64_t n = n0; n < n1; n += 4) {
            float r[1][4];
            k::dot_tile<1, 4, K>(x, w + size_t(n) * K, r);
            for (int j = 0; j < 4; ++j) y[n + j] = r[0][j];
        }
    }, 4);
}

template <typename Pool>
void rows_op(Pool& pool, float* x) {  // a norm/rope-sized op: tiny work, one pool round trip
    pool.parallel_for(1, [&](int64_t, int64_t, int) {
        for (int i = 0; i < kHidden; ++i) x[i] = x[i] * 0.999f + 0.001f;
    });
}

template <typename Pool>
void decode_step(Pool& pool, const Weights& w, std::vector<float>& a, std::vector<float>& b) {
    for (int l = 0; l < kLayers; ++l) {
        rows_op(pool, a.data());
        gemv<kHidden, kHidden>(pool, a.data(), w.q.data() + size_t(l) * kHidden * kHidden, b.data());
        gemv<kKv, kHidden>(pool, a.data(), w.kv.data() + size_t(l) * 2 * kKv * kHidden, b.data() + kHidden);
        gemv<kKv, kHidden>(pool, a.data(), w.kv.data() + (size_t(l) * 2 + 1) * kKv * kHidden, b.data() + kHidden + kKv);
        gemv<kHidden, kHidden>(pool, b.data(), w.o.data() + size_t(l) * kHidden * kHidden, a.data());
        rows_op(pool, a.data());
        gemv<kFfn, kHidden>(pool, a.data(), w.gate.data() + size_t(l) * kFfn * kHidden, b.data());
        gemv<kFfn, kHidden>(pool, a.data(), w.up.data() + size_t(l) * kFfn * kHidden, b.data() + kFfn);
        gemv<kHidden, kFfn>(pool, b.data(), w.down.data() + size_t(l) * kHidden * kFfn, a.data());
    }
}

// A child process spinning on the CPU for as long as the benchmark runs.
struct BusyLoop {
    pid_t pid = -1;
    explicit BusyLoop(bool on) {
        if (!on) return;
        pid = fork();
        if (pid == 0) {
            volatile uint64_t x = 0;
            for (;;) x = x + 1;
        }
    }
    ~BusyLoop() {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    }
};

const Weights& weights() {
    static Weights w;
    return w;
}

template <typename Pool>
void BM_DecodeStep(benchmark::State& state) {
    const int threads = int(state.range(0));
    const bool load = state.range(1) != 0;
    Pool pool(threads);
    std::vector<float> a(kHidden, 0.5f), b(2 * kFfn, 0.0f);
    const Weights& w = weights();
    decode_step(pool, w, a, b);  // warm-up
    BusyLoop busy(load);
    for (auto _ : state) {
        decode_step(pool, w, a, b);
        benchmark::DoNotOptimize(a.data());
    }
    state.counters["ops_per_step"] = kLayers * 9;
    state.SetLabel(load ? "with a busy-loop process" : "no extra load");
}

BENCHMARK_TEMPLATE(BM_DecodeStep, StaticPool)->ArgNames({"threads", "busy"})
    ->Args({2, 0})->Args({2, 1})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_TEMPLATE(BM_DecodeStep, scr::ThreadPool)->ArgNames({"threads", "busy"})
    ->Args({2, 0})->Args({2, 1})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
