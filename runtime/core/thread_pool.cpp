#include "runtime/core/thread_pool.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

namespace scr {

namespace {

// Raw futex calls: libstdc++ 12's std::atomic::wait/notify can miss a wake-up (seen here as a hang
// in the pool's destructor), and we only need the two primitive operations.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
    static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>& word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Busy-wait this many pause instructions (~100-200 us on current x86) before sleeping: the decode
// loop issues ops back to back, so a worker usually finds the next job while still spinning.
constexpr int kSpinIterations = 1 << 14;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

constexpr uint64_t kIndexMask = 0xffffffffull;

}  // namespace

thread_local const ThreadPool* ThreadPool::current_pool_ = nullptr;
thread_local int ThreadPool::current_index_ = 0;

ThreadPool::ThreadPool(int threads) {
    if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    futex_wake_all(epoch_);
    for (auto& t : workers_) t.join();
}

void ThreadPool::run(const Job& job) {
    std::lock_guard lock(submit_mu_);
    const int64_t chunks = (job.n + job.chunk - 1) / job.chunk;
    // Close the cursor before rewriting the job's fields: a worker that read the previous job's
    // cursor and then some of the fields below could otherwise still win its claim (the cursor
    // unchanged) and run a chunk of this job with a mix of both jobs' fields, counted twice in done_
    // (seen as a hang of ThreadPool.ManyBackToBackJobs under ASan). Closed = the next generation with
    // an index no job reaches; the fence pairs with the one in work_on_current_job.
    const uint64_t generation = (cursor_.load(std::memory_order_relaxed) >> 32) + 1;
    cursor_.store((generation << 32) | kIndexMask, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    job_call_.store(job.call, std::memory_order_relaxed);
    job_ctx_.store(job.ctx, std::memory_order_relaxed);
    job_n_.store(job.n, std::memory_order_relaxed);
    job_chunk_.store(job.chunk, std::memory_order_relaxed);
    job_chunks_.store(chunks, std::memory_order_relaxed);
    cursor_.store(generation << 32, std::memory_order_release);  // opens it: publishes the fields above
    epoch_.fetch_add(1);
    if (sleepers_.load() > 0) futex_wake_all(epoch_);

    // The caller works too, as thread 0; nested parallel_for calls from fn run inline.
    const ThreadPool* outer_pool = current_pool_;
    const int outer_index = current_index_;
    current_pool_ = this;
    current_index_ = 0;
    work_on_current_job(0);
    current_pool_ = outer_pool;
    current_index_ = outer_index;

    // Wait only for chunks other threads claimed and are still running.
    const auto total = uint32_t(chunks);
    for (int spin = 0; spin < kSpinIterations && done_.load(std::memory_order_acquire) != total; ++spin) cpu_relax();
    if (done_.load(std::memory_order_acquire) != total) {
        caller_sleeping_.store(true);
        for (uint32_t d; (d = done_.load()) != total;) futex_wait(done_, d);
        caller_sleeping_.store(false);
    }
    if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
}

void ThreadPool::work_on_current_job(int index) {
    uint64_t c = cursor_.load(std::memory_order_acquire);
    const auto call = job_call_.load(std::memory_order_relaxed);
    void* const ctx = job_ctx_.load(std::memory_order_relaxed);
    const int64_t n = job_n_.load(std::memory_order_relaxed);
    const int64_t chunk = job_chunk_.load(std::memory_order_relaxed);
    const int64_t chunks = job_chunks_.load(std::memory_order_relaxed);
    // If any field above was already rewritten for a newer job, the cursor was closed before that
    // write (run's release fence), so the claim below sees the newer generation and fails.
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t generation = c >> 32;
    for (;;) {
        const auto i = int64_t(c & kIndexMask);
        if ((c >> 32) != generation || i >= chunks) return;  // replaced, or no work left
        // The CAS keeps the generation: if it succeeds, the fields read above belong to this job
        // (a newer job closes the cursor before touching them, and is only submitted after every
        // chunk of this one was claimed and finished).
        if (!cursor_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
        if (!failed_.load(std::memory_order_relaxed)) {
            try {
                call(ctx, i * chunk, std::min(n, (i + 1) * chunk), index);
            } catch (...) {
                if (!failed_.exchange(true)) error_ = std::current_exception();
            }
        }
        if (done_.fetch_add(1) + 1 == uint32_t(chunks) && caller_sleeping_.load()) futex_wake_all(done_);
        c = cursor_.load(std::memory_order_acquire);
    }
}

void ThreadPool::worker_loop(int index) {
    current_pool_ = this;
    current_index_ = index;
    // Start from the pool's first epoch, not the current one: a thread that starts late must still
    // see the jobs (and the stop) published before it ran.
    uint32_t seen = 0;
    for (;;) {
        for (int spin = 0; spin < kSpinIterations && epoch_.load(std::memory_order_acquire) == seen; ++spin) cpu_relax();
        if (epoch_.load() == seen) {
            sleepers_.fetch_add(1);
            while (epoch_.load() == seen) futex_wait(epoch_, seen);
            sleepers_.fetch_sub(1);
        }
        if (stop_.load()) return;
        seen = epoch_.load();
        work_on_current_job(index);
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
