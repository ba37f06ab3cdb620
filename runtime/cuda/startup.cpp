#include "runtime/cuda/startup.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "kernels/cuda/env_switch.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/model/device_open.hpp"
#include "runtime/weights/weight_set.hpp"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older kernels answer EINVAL and we touch the pages instead
#endif

namespace scr::cuda_startup {

namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define SCR_CUDA(call) check((call), #call)

// ---- Opening the device in the background.
// cudaFree(nullptr) creates the primary context, which every later runtime call on any thread uses.
// Its result is not kept: the model's own first calls report a missing or broken device by name.
// Right after it, the same thread pins the upload's staging buffers one by one, and the upload
// takes each as soon as it is there: pinning costs ~0.5 ms per MiB on the H200's host (~50 ms for
// three 32 MiB buffers), and the host has usually finished loading before the context is open, so
// that time sat on the path to the first token (docs/CUDA.md, "Session 25").
struct Opener {
    std::mutex mutex;  // start / finish
    std::thread thread;
    std::atomic<bool> running{false};
    std::atomic<bool> context_ready{false};
    std::atomic<void*> staging[kStagingBuffers] = {};  // pinned by the opening, taken by upload_weights
    std::atomic<int> progress{0};  // bumped (and notified) at each of the above, and at the end
    OpenTimes times;               // read after the thread is joined
};

Opener& opener() {
    static Opener o;
    return o;
}

void bump(Opener& o) {
    o.progress.fetch_add(1);
    o.progress.notify_all();
}

// Blocks until done() holds or the opening thread has ended.
template <class Done>
void wait_opening(Opener& o, Done&& done) {
    for (;;) {
        const int seen = o.progress.load();
        if (done() || !o.running.load()) return;
        o.progress.wait(seen);
    }
}

void start_open() {
    Opener& o = opener();
    std::lock_guard lock(o.mutex);
    if (o.thread.joinable()) return;  // one opening at a time
    o.running = true;
    o.context_ready = false;
    o.times.started = std::chrono::steady_clock::now();
    auto open = [&o] {
        const bool opened = cudaFree(nullptr) == cudaSuccess;
        o.times.context_ready = std::chrono::steady_clock::now();
        o.context_ready = opened;
        bump(o);
        for (int k = 0; opened && k < kStagingBuffers; ++k) {
            if (o.staging[k].load()) continue;  // still there from an earlier opening
            void* p = nullptr;
            if (cudaMallocHost(&p, kStagingBytes) != cudaSuccess) {
                cudaGetLastError();  // upload_weights allocates (and reports) it itself
                break;
            }
            o.staging[k] = p;
            bump(o);
        }
        o.times.ended = std::chrono::steady_clock::now();
        o.running = false;
        bump(o);
    };
    try {
        o.thread = std::thread(open);
    } catch (...) {
        o.running = false;  // nobody would ever end the wait for it
        throw;
    }
}

void finish_open() {
    Opener& o = opener();
    std::lock_guard lock(o.mutex);
    if (o.thread.joinable()) o.thread.join();
}

// Staging buffer k once the opening has pinned it, or null if it will not; the caller owns it.
void* take_staging(int k) {
    Opener& o = opener();
    wait_opening(o, [&] { return o.staging[k].load() != nullptr; });
    return o.staging[k].exchange(nullptr);
}

[[maybe_unused]] const bool registered = register_device_opener("cuda", DeviceOpener{&start_open, &finish_open});

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A tensor's bytes in host memory and where they go on the device.
struct Piece {
    const std::byte* src;
    size_t dev_offset;
    size_t bytes;
};

// The present tensors in device-offset order, and the total allocation.
std::vector<Piece> layout(const ModelInfo& info, const WeightSet& weights, std::vector<size_t>& offsets, size_t& total) {
    std::vector<Piece> pieces;
    offsets.assign(info.tensors.size(), SIZE_MAX);
    total = 0;
    for (size_t i = 0; i < info.tensors.size(); ++i) {
        if (!weights.data(i)) continue;
        const TensorSpec& t = info.tensors[i];
        size_t n = size_t(dtype_bytes(t.dtype));
        for (int d = 0; d < t.rank; ++d) n *= size_t(t.shape[d]);
        offsets[i] = total;
        if (n > 0) pieces.push_back({static_cast<const std::byte*>(weights.data(i)), total, n});
        total += align_up(n);
    }
    return pieces;
}

// Calls fn(src, dev_offset, bytes) for every part of a piece inside device range [begin, end).
template <class Fn>
void for_each_part(const std::vector<Piece>& pieces, size_t begin, size_t end, Fn&& fn) {
    // First piece ending after `begin`.
    auto it = std::partition_point(pieces.begin(), pieces.end(), [&](const Piece& p) { return p.dev_offset + p.bytes <= begin; });
    for (; it != pieces.end() && it->dev_offset < end; ++it) {
        const size_t b = std::max(begin, it->dev_offset), e = std::min(end, it->dev_offset + it->bytes);
        if (b < e) fn(it->src + (b - it->dev_offset), b, e - b);
    }
}

}  // namespace

void wait_device_open() {
    Opener& o = opener();
    wait_opening(o, [&] { return o.context_ready.load(); });
}

OpenTimes open_times() {
    finish_open();
    return opener().times;
}

bool device_opening() {
    const Opener& o = opener();
    return o.running.load() && !o.context_ready.load();
}

size_t prefault_while_opening(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool) {
    // Off unless SCR_CUDA_PREFAULT=1: measured on the H200 right after `scr make-random` wrote the
    // file, faulting 16 GB in from every thread slowed the context's own opening (both take the
    // process's mmap lock): 8B first token at 1.6 s, against 0.8 s in session 3 without it. On files
    // a process had mapped before it gave 0.69 s, with no run without it to compare. Kept as an
    // option until both cases are measured both ways (docs/CUDA.md, "Session 4").
    static const bool enabled = kernels::cuda::env_flag_switch("SCR_CUDA_PREFAULT", false);
    if (!enabled || !device_opening()) return 0;
    std::vector<size_t> offsets;
    size_t total = 0;
    const auto pieces = layout(info, weights, offsets, total);
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    std::atomic<size_t> covered{0};
    constexpr int64_t kChunk = int64_t(8) << 20;
    pool.parallel_for(int64_t(total), [&](int64_t b, int64_t e, int) {
        for (int64_t c = b; c < e; c += kChunk) {
            if (!device_opening()) return;  // the upload takes over from here
            for_each_part(pieces, size_t(c), size_t(std::min(e, c + kChunk)), [&](const std::byte* src, size_t, size_t n) {
                const uintptr_t first = reinterpret_cast<uintptr_t>(src) / page * page;
                const uintptr_t last = reinterpret_cast<uintptr_t>(src) + n;
                if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_READ) != 0) {
                    // Not supported here (or not a mapping): touch one byte per page.
                    volatile const std::byte* v = src;
                    for (size_t k = 0; k < n; k += page) (void)v[k];
                }
                covered += n;
            });
        }
    }, kChunk);
    return covered.load();
}

DeviceWeights upload_weights(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, cudaStream_t stream) {
    const auto t0 = std::chrono::steady_clock::now();
    DeviceWeights out;
    std::vector<size_t> offsets;
    const auto pieces = layout(info, weights, offsets, out.bytes);
    SCR_CUDA(cudaMalloc(&out.base, std::max(out.bytes, kAlign)));
    std::byte* dev = static_cast<std::byte*>(out.base);
    out.tensors.assign(info.tensors.size(), nullptr);
    for (size_t i = 0; i < offsets.size(); ++i)
        if (offsets[i] != SIZE_MAX) out.tensors[i] = dev + offsets[i];

    // The device range is cut into windows of one staging buffer each: all host threads fill a
    // window (across tensor boundaries, so 18,867 small expert tensors copy as fast as one big one)
    // while up to kStagingBuffers - 1 earlier windows are on the copy engine. Alignment gaps go up as
    // whatever the buffer held (they are padding nobody reads).
    void* stage[kStagingBuffers] = {};
    cudaEvent_t free_again[kStagingBuffers] = {};
    try {
        int k = 0;
        for (size_t win = 0; win < out.bytes; win += kStagingBytes, k = (k + 1) % kStagingBuffers) {
            const size_t len = std::min(kStagingBytes, out.bytes - win);
            if (!stage[k]) {  // first use: the opening's buffer, as soon as it is pinned
                stage[k] = take_staging(k);
                if (!stage[k]) SCR_CUDA(cudaMallocHost(&stage[k], kStagingBytes));
                SCR_CUDA(cudaEventCreateWithFlags(&free_again[k], cudaEventDisableTiming));
            }
            SCR_CUDA(cudaEventSynchronize(free_again[k]));  // this buffer's previous copy has ended
            std::byte* buf = static_cast<std::byte*>(stage[k]);
            pool.parallel_for(int64_t(len), [&](int64_t b, int64_t e, int) {
                for_each_part(pieces, win + size_t(b), win + size_t(e),
                              [&](const std::byte* src, size_t at, size_t n) { std::memcpy(buf + (at - win), src, n); });
            }, int64_t(1) << 20);
            SCR_CUDA(cudaMemcpyAsync(dev + win, buf, len, cudaMemcpyHostToDevice, stream));
            SCR_CUDA(cudaEventRecord(free_again[k], stream));
        }
        SCR_CUDA(cudaStreamSynchronize(stream));
        // Buffers the windows did not need (a small model): whatever the opening pinned.
        for (int j = 0; j < kStagingBuffers; ++j)
            if (!stage[j]) stage[j] = take_staging(j);
    } catch (...) {
        cudaStreamSynchronize(stream);
        for (int j = 0; j < kStagingBuffers; ++j) {
            if (stage[j]) cudaFreeHost(stage[j]);
            if (free_again[j]) cudaEventDestroy(free_again[j]);
        }
        cudaFree(out.base);
        throw;
    }
    for (int j = 0; j < kStagingBuffers; ++j) {
        if (free_again[j]) cudaEventDestroy(free_again[j]);
        out.staging[j] = stage[j];  // the caller keeps them as its own pinned buffers, or frees them
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

}  // namespace scr::cuda_startup
