// A fixed pool of worker threads for the CPU kernels. `parallel_for(n, fn, grain)` cuts [0, n) into
// chunks (multiples of `grain`) that threads claim one at a time from a shared counter; the calling
// thread claims chunks too. So a worker the OS has descheduled costs nothing: the others take its
// share, and when it wakes it finds no work left (the caller only ever waits for chunks that were
// actually claimed). Waiting is cheap: workers spin briefly, then sleep on a futex.
//
// How work is split never changes a result: kernels parallelize over independent outputs whose
// arithmetic does not depend on which chunk (or thread) computes them, never over a reduction.
// No allocation per call, so the decode loop can call it per op.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
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

    // fn(begin, end, thread_index) over disjoint ranges covering [0, n) once; every range starts at
    // a multiple of `grain` and is a multiple of it long (except the one ending at n). thread_index
    // is in [0, size()): 0 is the calling thread; one thread may get several ranges. Returns when all
    // are done; the first exception thrown by fn is rethrown here after every claimed range ended.
    // Called from inside fn (nested), it runs inline on the current thread.
    template <typename Fn>
    void parallel_for(int64_t n, Fn&& fn, int64_t grain = 1) {
        if (n <= 0) return;
        grain = std::max<int64_t>(grain, 1);
        const int64_t units = (n + grain - 1) / grain;
        if (units <= 1 || size() <= 1 || current_pool_ == this) {
            fn(int64_t(0), n, current_pool_ == this ? current_index_ : 0);
            return;
        }
        using F = std::remove_reference_t<Fn>;
        Job job;
        job.call = [](void* ctx, int64_t b, int64_t e, int t) { (*static_cast<F*>(ctx))(b, e, t); };
        job.ctx = const_cast<void*>(static_cast<const void*>(&fn));
        job.n = n;
        job.chunk = chunk_size(units, grain);
        run(job);
    }

    // The process-wide pool the kernels use (sized by set_default_threads or the core count).
    static ThreadPool& global();
    static void set_default_threads(int threads);

private:
    struct Job {
        void (*call)(void*, int64_t, int64_t, int) = nullptr;
        void* ctx = nullptr;
        int64_t n = 0, chunk = 0;
    };

    // About kChunksPerThread chunks per thread: enough that a late or slow thread's share is taken
    // by the others, few enough that claiming (one atomic per chunk) stays negligible.
    static constexpr int64_t kChunksPerThread = 8;
    int64_t chunk_size(int64_t units, int64_t grain) const {
        const int64_t want = int64_t(size()) * kChunksPerThread;
        int64_t per = std::max<int64_t>(1, units / want);
        per = std::max(per, (units + 0x7fffffff - 1) / 0x7fffffff);  // chunk indices fit in 32 bits
        return per * grain;
    }

    void run(const Job& job);
    void worker_loop(int index);
    // Claims and runs chunks of the published job until none is left (a late worker finds the job
    // finished or replaced and returns at once).
    void work_on_current_job(int index);

    std::vector<std::thread> workers_;
    std::mutex submit_mu_;  // one job at a time (callers from different threads queue here)

    // The job, readable by workers while its generation is current. Fields are atomics so a late
    // worker's read that races with the next job's writes is well defined (and then discarded).
    std::atomic<void (*)(void*, int64_t, int64_t, int)> job_call_{nullptr};
    std::atomic<void*> job_ctx_{nullptr};
    std::atomic<int64_t> job_n_{0}, job_chunk_{0}, job_chunks_{0};
    // (generation << 32) | next unclaimed chunk. A claim is a CAS that keeps the generation, and the
    // caller closes the cursor (next generation, index all ones) before it rewrites the fields above
    // and opens it after, so a worker holding a stale or half-rewritten view never wins a claim.
    std::atomic<uint64_t> cursor_{0};
    std::atomic<uint32_t> epoch_{0};       // bumped per job (and at stop): what sleeping workers wait on
    std::atomic<uint32_t> done_{0};        // chunks of the current job finished
    std::atomic<int> sleepers_{0};         // workers in (or entering) epoch_.wait
    std::atomic<bool> caller_sleeping_{false};
    std::atomic<bool> failed_{false};
    std::exception_ptr error_;             // first exception of the current job (set once, under failed_)
    std::atomic<bool> stop_{false};

    static thread_local const ThreadPool* current_pool_;
    static thread_local int current_index_;
};

}  // namespace scr
