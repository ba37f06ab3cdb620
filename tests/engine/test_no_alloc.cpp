// No heap allocation per step in steady state: count operator new calls across decode steps of
// a warmed-up batch (greedy, no tokenizer; the callback itself does not allocate).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "runtime/engine/engine.hpp"
#include "tests/engine/fake_model.hpp"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
void* counted(std::size_t n) {
    if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

TEST(Engine, NoHeapAllocationPerStepInSteadyState) {
    scr::test::FakeModelShape shape;
    shape.context = 512;
    scr::test::FakeModel model(shape);
    scr::EngineConfig cfg;
    cfg.kv_cache_bytes = 2000 * 8 * 4;
    cfg.max_num_seqs = 8;
    scr::Engine engine(model, nullptr, cfg);
    long outputs = 0;
    for (int i = 0; i < 8; ++i) {
        scr::Request r;
        r.id = "r" + std::to_string(i);
        for (int j = 0; j < 10 + 3 * i; ++j) r.prompt_ids.push_back((j * 13 + i) % 97);
        r.params.temperature = i % 2 ? 0.0f : 0.8f;
        r.params.top_p = 0.9f;
        r.params.seed = uint64_t(i);
        r.params.max_tokens = 300;
        r.params.ignore_eos = true;
        engine.add_request(r, [&outputs](const scr::RequestOutput& o) { outputs += long(o.new_token_ids.size()); });
    }
    for (int i = 0; i < 20; ++i) engine.step();  // warm up: prefills done, buffers sized
    g_allocs = 0;
    g_counting = true;
    for (int i = 0; i < 100; ++i) engine.step();
    g_counting = false;
    EXPECT_EQ(g_allocs.load(), 0) << "heap allocations during 100 decode steps";
    EXPECT_GT(outputs, 8 * 100);
}
