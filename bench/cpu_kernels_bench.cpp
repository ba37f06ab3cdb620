// CPU kernel benchmarks: the decode GEMV (one row against a bf16 weight matrix) and a prefill
// GEMM, each beside a plain streaming read of the same weight bytes measured in the same run, so
// the ratio (GEMV bytes/s over read bytes/s) says how close the kernel is to the memory floor.
// Shapes are Llama-3.2-1B's: 2048x2048 (q/o), 8192x2048 (gate/up), 128256x2048 (lm_head).
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/linear.hpp"

namespace k = scr::kernels::cpu;

namespace {

// One large buffer on 2 MiB pages, filled once.
struct Weights {
    scr::bf16_t* data;
    size_t count;
    explicit Weights(size_t n) : count(n) {
        size_t bytes = (n * 2 + (2u << 20) - 1) / (2u << 20) * (2u << 20);
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(p, bytes, MADV_HUGEPAGE);
        data = static_cast<scr::bf16_t*>(p);
        std::mt19937 rng(1);
        for (size_t i = 0; i < n; ++i) data[i].bits = scr::f32_to_bf16(float(int(rng() % 2001) - 1000) * 1e-3f);
    }
};

template <int N, int K>
Weights& weights() {
    static Weights w(static_cast<size_t>(N) * K);
    return w;
}

template <int N, int K>
void BM_ReadFloor(benchmark::State& st) {
    auto& w = weights<N, K>();
    scr::ThreadPool& pool = scr::ThreadPool::global();
    std::vector<float> sums(size_t(pool.size()) * 16);
    for (auto _ : st) {
        pool.parallel_for(int64_t(w.count / 32), [&](int64_t b, int64_t e, int t) {
            k::vf acc = k::vzero();
            for (int64_t i = b; i < e; ++i) {
                acc = k::vadd(acc, k::vload(w.data + i * 32));
                acc = k::vadd(acc, k::vload(w.data + i * 32 + 16));
            }
            sums[size_t(t) * 16] += k::vsum(acc);
        }, 1024);
        benchmark::DoNotOptimize(sums.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(w.count) * 2);
}

template <int N, int K>
void BM_DecodeGemv(benchmark::State& st) {
    auto& w = weights<N, K>();
    std::vector<float> x(K, 0.5f), y(N);
    for (auto _ : st) {
        k::linear<N, K, scr::bf16_t>(1, x.data(), w.data, nullptr, nullptr, y.data(), scr::ThreadPool::global());
        benchmark::DoNotOptimize(y.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * int64_t(N) * K * 2);
}

template <int N, int K>
void BM_PrefillGemm(benchmark::State& st) {
    auto& w = weights<N, K>();
    const int rows = int(st.range(0));
    std::vector<float> x(size_t(rows) * K, 0.25f), y(size_t(rows) * N);
    for (auto _ : st) {
        k::linear<N, K, scr::bf16_t>(rows, x.data(), w.data, nullptr, nullptr, y.data(), scr::ThreadPool::global());
        benchmark::DoNotOptimize(y.data());
    }
    st.counters["GFLOP/s"] = benchmark::Counter(double(st.iterations()) * 2.0 * rows * N * K / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_ReadFloor<8192, 2048>)->UseRealTime();
BENCHMARK(BM_DecodeGemv<8192, 2048>)->UseRealTime();
BENCHMARK(BM_ReadFloor<2048, 2048>)->UseRealTime();
BENCHMARK(BM_DecodeGemv<2048, 2048>)->UseRealTime();
BENCHMARK(BM_ReadFloor<128256, 2048>)->UseRealTime();
BENCHMARK(BM_DecodeGemv<128256, 2048>)->UseRealTime();
BENCHMARK(BM_PrefillGemm<2048, 2048>)->Arg(64)->Arg(256)->UseRealTime();

BENCHMARK_MAIN();
