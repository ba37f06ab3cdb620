// A fixed pool of worker threads for the CPU kernels. `parallel_for(n, fn)` splits [0, n) into
// contiguous ranges, one per thread; the caller's thread takes part. No allocation per call, so
// the decode loop can call it per op. How work is split never changes a result: kernels
// parallelize over independent outputs, never over a reduction.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace scr {

class ThreadPool {
public:
    // threads <= 0: one per available core.
    explicit ThreadPool(int threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return int(workers_.size()) + 1; }

    // fn(begin, end, thread_index) over contiguous ranges of [0, n); ranges are multiples of `grain`
    // (except the last). Returns when all are done.
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

    // The process-wide pool the kernels use (sized by set_default_threads or the core count).
    static ThreadPool& global();
    static void set_default_threads(int threads);

private:
    using RangeFn = std::function<void(int)>;
    void run(const RangeFn& fn, int parts);
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_;
    const RangeFn* job_ = nullptr;
    int job_parts_ = 0;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> remaining_{0};
    bool stop_ = false;
};

}  // namespace scr
