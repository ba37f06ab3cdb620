// Quantized decode GEMV (kernels/cpu/quant_linear.hpp) side by side in one run with the bf16 GEMV
// (linear.hpp) and a plain streaming read of the int4 packed bytes, at Llama-3.2-1B shapes
// (2048x2048 q/o, 8192x2048 gate/up); and int4 vs bf16 at 32 rows (prefill). bytes/s counts the bytes each kernel must read (packed
// weights + scales/biases), so GEMV bytes/s over the read's bytes/s is its distance to the memory
// floor, and the time ratio to bf16 is the decode speed-up. The machine is shared: compare ratios.
#include <benchmark/benchmark.h>

#include <sys/mman.h>

#include <random>
#include <vector>

#include "kernels/cpu/quant_linear.hpp"

namespace k = scr::kernels::cpu;

namespace {

constexpr int kGroup = 64;

// A buffer on 2 MiB pages filled with random bytes once.
void* huge_buffer(size_t bytes) {
    bytes = (bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(p, bytes, MADV_HUGEPAGE);
    std::mt19937 rng(7);
    auto* b = static_cast<uint32_t*>(p);
    for (size_t i = 0; i < bytes / 4; ++i) b[i] = rng() & 0x3f3f3f3fu;  // small bf16 / fp8 values, no NaN
    return p;
}

template <int N, int K>
struct Model {
    scr::bf16_t* dense = static_cast<scr::bf16_t*>(huge_buffer(size_t(N) * K * 2));
    uint32_t* packed = static_cast<uint32_t*>(huge_buffer(size_t(N) * K / 2));
    int8_t* q8 = static_cast<int8_t*>(huge_buffer(size_t(N) * K));
    scr::bf16_t* scales = static_cast<scr::bf16_t*>(huge_buffer(size_t(N) * (K / kGroup) * 2));
    scr::bf16_t* biases = static_cast<scr::bf16_t*>(huge_buffer(size_t(N) * (K / kGroup) * 2));
    static constexpr int kPrefillRows = 32;
    std::vector<float> x = std::vector<float>(size_t(K) * kPrefillRows), y = std::vector<float>(size_t(N) * kPrefillRows);
    // Scales, biases and activations of a real model's magnitude (random bytes would make some bf16
    // scales denormal, and the products with them take microcode assists that no model sees).
    Model() {
        std::mt19937 rng(11);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (size_t i = 0; i < size_t(N) * (K / kGroup); ++i) {
            scales[i] = scr::bf16_t{scr::f32_to_bf16(0.002f + 0.004f * std::fabs(u(rng)))};
            biases[i] = scr::bf16_t{scr::f32_to_bf16(-0.03f * std::fabs(u(rng)))};
        }
        for (auto& v : x) v = u(rng);
        for (size_t i = 0; i < size_t(N) * K; ++i) dense[i] = scr::bf16_t{scr::f32_to_bf16(0.05f * u(rng))};
    }
    static Model& get() {
        static Model m;
        return m;
    }
};

template <int N, int K>
void BM_Bf16Gemv(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    for (auto _ : st) k::linear<N, K, scr::bf16_t>(1, m.x.data(), m.dense, nullptr, nullptr, m.y.data(), scr::ThreadPool::global());
    st.SetBytesProcessed(int64_t(st.iterations()) * N * K * 2);
}

template <int N, int K>
void BM_Int4Gemv(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    const k::AffineW<K, 4, kGroup, scr::bf16_t> w{m.packed, m.scales, m.biases};
    for (auto _ : st) k::qlinear<N, K>(1, m.x.data(), w, nullptr, nullptr, m.y.data(), scr::ThreadPool::global());
    st.SetBytesProcessed(int64_t(st.iterations()) * (int64_t(N) * K / 2 + int64_t(N) * (K / kGroup) * 4));
}

// Prefill-like: 32 activation rows at once (tokens/s = 32 rows per iteration).
template <int N, int K>
void BM_Int4Prefill32(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    const k::AffineW<K, 4, kGroup, scr::bf16_t> w{m.packed, m.scales, m.biases};
    for (auto _ : st) k::qlinear<N, K>(m.kPrefillRows, m.x.data(), w, nullptr, nullptr, m.y.data(), scr::ThreadPool::global());
    st.SetItemsProcessed(int64_t(st.iterations()) * m.kPrefillRows);
}

template <int N, int K>
void BM_Bf16Prefill32(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    for (auto _ : st) k::linear<N, K, scr::bf16_t>(m.kPrefillRows, m.x.data(), m.dense, nullptr, nullptr, m.y.data(), scr::ThreadPool::global());
    st.SetItemsProcessed(int64_t(st.iterations()) * m.kPrefillRows);
}

template <int N, int K>
void BM_Int8Gemv(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    const k::ChannelW<K, int8_t, scr::bf16_t, false> w{m.q8, m.scales};
    for (auto _ : st) k::qlinear<N, K>(1, m.x.data(), w, nullptr, nullptr, m.y.data(), scr::ThreadPool::global());
    st.SetBytesProcessed(int64_t(st.iterations()) * (int64_t(N) * K + N * 2));
}

template <int N, int K>
void BM_Fp8Gemv(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    const k::ChannelW<K, k::fp8e4m3, scr::bf16_t, false> w{reinterpret_cast<const k::fp8e4m3*>(m.q8), m.scales};
    for (auto _ : st) k::qlinear<N, K>(1, m.x.data(), w, nullptr, nullptr, m.y.data(), scr::ThreadPool::global());
    st.SetBytesProcessed(int64_t(st.iterations()) * (int64_t(N) * K + N * 2));
}

// The floor: every packed int4 byte read once, summed.
template <int N, int K>
void BM_ReadPackedInt4(benchmark::State& st) {
    auto& m = Model<N, K>::get();
    scr::ThreadPool& pool = scr::ThreadPool::global();
    const auto* bytes = reinterpret_cast<const float*>(m.packed);
    const int64_t chunks = int64_t(N) * K / 2 / 4 / 32;  // 32 floats (128 bytes) per chunk
    std::vector<float> sums(size_t(pool.size()) * 16);
    for (auto _ : st) {
        pool.parallel_for(chunks, [&](int64_t b, int64_t e, int t) {
            k::vf acc = k::vzero();
            for (int64_t i = b; i < e; ++i)
                for (int j = 0; j < 32; j += k::kLanes) acc = k::vadd(acc, k::vload(bytes + i * 32 + j));
            sums[size_t(t) * 16] += k::vsum(acc);
        }, 1024);
        benchmark::DoNotOptimize(sums.data());
    }
    st.SetBytesProcessed(int64_t(st.iterations()) * N * K / 2);
}

}  // namespace

#define SHAPES(BM) BENCHMARK(BM<2048, 2048>)->UseRealTime(); BENCHMARK(BM<8192, 2048>)->UseRealTime();
SHAPES(BM_ReadPackedInt4)
SHAPES(BM_Int4Gemv)
SHAPES(BM_Int8Gemv)
SHAPES(BM_Fp8Gemv)
SHAPES(BM_Bf16Gemv)
SHAPES(BM_Int4Prefill32)
SHAPES(BM_Bf16Prefill32)

BENCHMARK_MAIN();
