#include "runtime/core/thread_pool.hpp"

#include <memory>

namespace scr {

ThreadPool::ThreadPool(int threads) {
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::run(const RangeFn& fn, int parts) {
    {
        std::lock_guard lk(mu_);
        job_ = &fn;
        job_parts_ = parts;
        remaining_.store(parts - 1, std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    fn(0);
    // Spin briefly, then yield: per-op waits are microseconds in the decode loop.
    while (remaining_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
    std::lock_guard lk(mu_);
    job_ = nullptr;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        const RangeFn* job;
        int parts;
        // Busy-wait a little before sleeping so back-to-back ops do not pay a futex wake.
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

namespace {
int g_default_threads = 0;
}

void ThreadPool::set_default_threads(int threads) { g_default_threads = threads; }

ThreadPool& ThreadPool::global() {
    static ThreadPool pool(g_default_threads);
    return pool;
}

}  // namespace scr
