// Start-up probe (docs/CUDA.md, "Session 25"): where the CUDA context's opening goes (cuInit, the
// primary context, pinning), and how fast a page-cached file goes up to the device by three methods:
// copying from the mapping into pinned staging buffers (what scr does), pread into them, and
// cudaHostRegister of the mapped file (DMA straight from the page cache). One variant per process
// (a fresh context and mapping each time); a thread is started per window here, so the first two
// run slower than scr's thread pool does. On the GPU machine:
//   scr_cuda_upload_probe /dev/shm/f make 15     # writes a 15 GiB pattern file
//   scr_cuda_upload_probe /dev/shm/f ctx|mmap|pread|register [stage_mib stages threads]
// Prints one JSON line per run; "bad" counts sampled words that did not come up as written.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
using Clock = std::chrono::steady_clock;
static auto T0 = Clock::now();
static double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

template <class F> void par(int nt, F f) { std::vector<std::thread> t; for (int i = 0; i < nt; ++i) t.emplace_back(f, i); for (auto& x : t) x.join(); }

int main(int argc, char** argv) {
    if (argc < 3) { fprintf(stderr, "usage: FILE make GB | FILE ctx|mmap|pread|register [stage_mib stages threads]\n"); return 2; }
    const char* path = argv[1];
    std::string v = argv[2];
    if (v == "make") {
        size_t bytes = size_t(atof(argv[3]) * (1ull << 30));
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (ftruncate(fd, bytes)) return 1;
        par(16, [&](int t) {
            std::vector<uint64_t> buf(1 << 20);
            size_t per = bytes / 16, b = per * t, e = t == 15 ? bytes : b + per;
            for (size_t o = b; o < e; o += buf.size() * 8) {
                size_t n = std::min(buf.size() * 8, e - o);
                for (size_t i = 0; i < n / 8; ++i) buf[i] = (o / 8 + i) * 0x9E3779B97F4A7C15ull;
                if (pwrite(fd, buf.data(), n, o) != ssize_t(n)) abort();
            }
        });
        close(fd);
        return 0;
    }
    const size_t stage = size_t(argc > 3 ? atoi(argv[3]) : 32) << 20;
    const int stages = argc > 4 ? atoi(argv[4]) : 3;
    const int nt = argc > 5 ? atoi(argv[5]) : 16;
    int fd = open(path, O_RDONLY);
    struct stat st; fstat(fd, &st);
    const size_t bytes = size_t(st.st_size);
    auto t_main = Clock::now();
    // Context parts, timed on this thread (the real engine does this on a background thread).
    auto a = Clock::now();
    cuInit(0);
    auto b = Clock::now();
    CK(cudaFree(nullptr));
    auto c = Clock::now();
    void* dev; CK(cudaMalloc(&dev, bytes));
    auto d = Clock::now();
    std::vector<void*> buf(stages);
    if (v != "register") for (auto& p : buf) CK(cudaMallocHost(&p, stage));
    auto e = Clock::now();
    cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> ev(std::max(stages, 1));
    for (auto& x : ev) CK(cudaEventCreateWithFlags(&x, cudaEventDisableTiming));
    auto u0 = Clock::now();
    if (v == "mmap" || v == "pread") {
        const std::byte* map = nullptr;
        if (v == "mmap") map = (const std::byte*)mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        int k = 0;
        for (size_t w = 0; w < bytes; w += stage, k = (k + 1) % stages) {
            size_t len = std::min(stage, bytes - w);
            CK(cudaEventSynchronize(ev[k]));
            std::byte* dst = (std::byte*)buf[k];
            size_t per = (len + nt - 1) / nt; per = (per + 4095) / 4096 * 4096;
            par(nt, [&](int t) {
                size_t b0 = std::min(len, per * t), e0 = std::min(len, b0 + per);
                if (b0 >= e0) return;
                if (map) memcpy(dst + b0, map + w + b0, e0 - b0);
                else for (size_t o = b0; o < e0;) { ssize_t r = pread(fd, dst + o, e0 - o, w + o); if (r <= 0) abort(); o += r; }
            });
            CK(cudaMemcpyAsync((std::byte*)dev + w, dst, len, cudaMemcpyHostToDevice, s));
            CK(cudaEventRecord(ev[k], s));
        }
        CK(cudaStreamSynchronize(s));
    } else if (v == "register") {
        std::byte* map = (std::byte*)mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        // Chunks registered by the threads ahead of the copy engine; each copied then unregistered.
        const size_t nchunk = (bytes + stage - 1) / stage;
        std::vector<std::atomic<int>> ready(nchunk);
        std::atomic<size_t> next{0};
        std::vector<std::thread> th;
        for (int t = 0; t < nt; ++t) th.emplace_back([&] {
            for (size_t i; (i = next++) < nchunk;) {
                size_t len = std::min(stage, bytes - i * stage);
                cudaError_t r = cudaHostRegister(map + i * stage, len, cudaHostRegisterReadOnly);
                ready[i] = r == cudaSuccess ? 1 : -1;
                if (r != cudaSuccess) fprintf(stderr, "register: %s\n", cudaGetErrorString(r));
            }
        });
        for (size_t i = 0; i < nchunk; ++i) {
            while (ready[i].load() == 0) std::this_thread::yield();
            if (ready[i] < 0) return 1;
            size_t len = std::min(stage, bytes - i * stage);
            CK(cudaMemcpyAsync((std::byte*)dev + i * stage, map + i * stage, len, cudaMemcpyHostToDevice, s));
        }
        CK(cudaStreamSynchronize(s));
        auto ur = Clock::now();
        for (auto& x : th) x.join();
        for (size_t i = 0; i < nchunk; ++i) cudaHostUnregister(map + i * stage);
        fprintf(stderr, "unregister %.0f ms\n", ms(ur, Clock::now()));
    }
    auto u1 = Clock::now();
    // Check: sampled words of the pattern came up.
    int bad = 0;
    if (v != "ctx") for (int i = 0; i < 64; ++i) {
        size_t o = (bytes / 8 / 64) * i * 8 + 8 * (i * 7919 % 1000);
        uint64_t x; CK(cudaMemcpy(&x, (std::byte*)dev + o, 8, cudaMemcpyDeviceToHost));
        if (x != (o / 8) * 0x9E3779B97F4A7C15ull) ++bad;
    }
    printf("{\"variant\":\"%s\",\"stage_mib\":%zu,\"stages\":%d,\"threads\":%d,\"gb\":%.2f,\"to_main_ms\":%.1f,\"cuinit_ms\":%.1f,\"ctx_ms\":%.1f,"
           "\"malloc_ms\":%.1f,\"pinned_ms\":%.1f,\"upload_ms\":%.1f,\"gbs\":%.1f,\"bad\":%d}\n",
           v.c_str(), stage >> 20, stages, nt, bytes / 1e9, ms(T0, t_main), ms(a, b), ms(b, c), ms(c, d), ms(d, e), ms(u0, u1),
           v == "ctx" ? 0.0 : bytes / 1e6 / ms(u0, u1), bad);
    return 0;
}
