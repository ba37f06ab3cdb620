// Host emulation of the CUDA features kernels/cuda/sample.cuh uses, for tests that run without a GPU
// (tests/cuda/sample_test_emu.cpp): one cluster of blocks at a time (a lone block is a cluster of one),
// all of its threads as coroutines switched at every barrier (block, cluster or warp), so
// __syncthreads, the cluster barrier and the warp intrinsics keep their exact meaning (every lane of a
// warp must reach a warp intrinsic, as on the device with a full mask). A kernel's shared state is
// emu::block_shared<T>() (one T per block of the cluster; cluster_peer maps a pointer into it to a
// peer's copy, as distributed shared memory does); shared atomics are plain adds (one coroutine runs
// at a time).
// Only what sample.cuh needs; not a general CUDA emulator.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <functional>
#include "cuda_runtime_api.h"

#if !defined(__x86_64__)
#error "the host emulation's coroutines are written for x86-64"
#endif
#ifdef SCR_SAMPLE_THREADS
#define SCR_EMU_THREADS SCR_SAMPLE_THREADS
#else
#define SCR_EMU_THREADS 1024
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __restrict__ __restrict
struct float4 { float x, y, z, w; } __attribute__((aligned(16)));
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint2 { unsigned x, y; } __attribute__((aligned(8)));
struct uint4 { unsigned x, y, z, w; } __attribute__((aligned(16)));
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
struct emu_dim3 { unsigned x, y, z; };
namespace emu {
inline int nthreads = SCR_EMU_THREADS;  // threads per block
inline int cur = 0;                     // the running thread, counted across the cluster's blocks
inline unsigned block = 0;              // the cluster's first block
inline int cluster_blocks = 1;

// Coroutines: a context switch saves the callee-saved registers on the running stack and swaps stack
// pointers (x86-64 System V; ucontext would make two system calls per switch, 100x slower).
extern "C" void scr_emu_switch(void** save_sp, void* new_sp);
asm(R"(
.text
.globl scr_emu_switch
.type scr_emu_switch, @function
scr_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size scr_emu_switch, .-scr_emu_switch
)");

inline void* main_sp = nullptr;
inline std::vector<void*> sp;
inline std::vector<char> done;
inline void yield() { scr_emu_switch(&sp[size_t(cur)], main_sp); }
struct Barrier {
    int count = 0, arrived = 0;
    unsigned gen = 0;
    void wait() {
        unsigned g = gen;
        if (++arrived == count) { arrived = 0; ++gen; }
        else while (gen == g) yield();
    }
};
inline std::vector<Barrier> block_bar;  // [block of the cluster]
inline Barrier cluster_bar;
inline std::vector<Barrier> warp_bar;
inline std::vector<uint64_t> slots;  // [warp][32]
template <typename T> uint64_t bits(T v) { uint64_t b = 0; std::memcpy(&b, &v, sizeof(T)); return b; }
template <typename T> T unbits(uint64_t b) { T v; std::memcpy(&v, &b, sizeof(T)); return v; }
inline int lane() { return cur % 32; }
inline int warp() { return cur / 32; }
// All 32 lanes publish a value; f reads every lane's; then all leave together.
template <typename T, typename F> auto collective(T v, F f) {
    slots[size_t(warp()) * 32 + size_t(lane())] = bits(v);
    warp_bar[size_t(warp())].wait();
    const uint64_t* s = &slots[size_t(warp()) * 32];
    auto r = f(s);
    warp_bar[size_t(warp())].wait();
    return r;
}
inline std::function<void()> body;
[[noreturn]] inline void entry() {
    body();
    done[size_t(cur)] = 1;
    void* unused;
    scr_emu_switch(&unused, main_sp);
    __builtin_unreachable();
}
// Per-block shared state: one T per block of the running cluster, made by the first thread that asks
// in each cluster (run_cluster clears shared_base), zeroed (the device's is not, and the kernel does not
// rely on either). One kernel's T at a time.
inline std::vector<char*> shared_base;  // [block of the cluster]
inline size_t shared_bytes = 0;
template <typename T> T& block_shared() {
    static std::vector<T> store;
    if (shared_base.empty()) {
        store.assign(size_t(cluster_blocks), T{});
        shared_base.clear();
        for (auto& t : store) shared_base.push_back(reinterpret_cast<char*>(&t));
        shared_bytes = sizeof(T);
    }
    return store[size_t(cur / nthreads)];
}
template <typename T> T* cluster_peer(T* local, int rank) {
    char* mine = shared_base.at(size_t(cur / nthreads));
    const ptrdiff_t off = reinterpret_cast<char*>(local) - mine;
    if (off < 0 || size_t(off) >= shared_bytes || rank < 0 || rank >= cluster_blocks) std::abort();  // not shared state
    return reinterpret_cast<T*>(shared_base[size_t(rank)] + off);
}
inline void cluster_sync() { cluster_bar.wait(); }

// Runs blocks first .. first + blocks - 1 as one cluster.
inline void run_cluster(unsigned first, int blocks, std::function<void()> f) {
    constexpr size_t kStack = 256 * 1024;
    static std::vector<std::vector<char>> stacks;
    const int all = nthreads * blocks;
    block = first;
    cluster_blocks = blocks;
    shared_base.clear();
    body = std::move(f);
    sp.assign(size_t(all), nullptr);
    done.assign(size_t(all), 0);
    stacks.resize(size_t(all));
    block_bar.assign(size_t(blocks), Barrier{nthreads});
    cluster_bar = Barrier{all};
    warp_bar.assign(size_t(all / 32), Barrier{32});
    slots.assign(size_t(all), 0);
    for (int t = 0; t < all; ++t) {
        stacks[size_t(t)].resize(kStack);
        // The first switch pops six registers and returns into entry() with the stack as after a call.
        uintptr_t top = (reinterpret_cast<uintptr_t>(stacks[size_t(t)].data()) + kStack) & ~uintptr_t(15);
        void** s = reinterpret_cast<void**>(top);
        *--s = nullptr;                                  // entry()'s return address slot: keeps rsp % 16 == 8
        *--s = reinterpret_cast<void*>(&entry);
        for (int r = 0; r < 6; ++r) *--s = nullptr;
        sp[size_t(t)] = s;
    }
    for (bool any = true; any;) {
        any = false;
        for (int t = 0; t < all; ++t) {
            if (done[size_t(t)]) continue;
            any = true;
            cur = t;
            scr_emu_switch(&main_sp, sp[size_t(t)]);
        }
    }
}
inline void run_block(unsigned b, std::function<void()> f) { run_cluster(b, 1, std::move(f)); }
}  // namespace emu
#define threadIdx (emu_dim3{unsigned(emu::cur % emu::nthreads), 0, 0})
#define blockIdx (emu_dim3{emu::block + unsigned(emu::cur / emu::nthreads), 0, 0})
inline void __syncthreads() { emu::block_bar[size_t(emu::cur / emu::nthreads)].wait(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int o) {
    return emu::collective(v, [&](const uint64_t* s) { return emu::unbits<T>(s[emu::lane() ^ o]); });
}
template <typename T> T __shfl_up_sync(unsigned, T v, int o) {
    return emu::collective(v, [&](const uint64_t* s) { return emu::lane() >= o ? emu::unbits<T>(s[emu::lane() - o]) : v; });
}
template <typename T> T __shfl_sync(unsigned, T v, int src) {
    return emu::collective(v, [&](const uint64_t* s) { return emu::unbits<T>(s[src]); });
}
inline unsigned __ballot_sync(unsigned, bool p) {
    return emu::collective(int(p), [&](const uint64_t* s) { unsigned m = 0; for (int l = 0; l < 32; ++l) if (s[l]) m |= 1u << l; return m; });
}
inline bool __any_sync(unsigned m, bool p) { return __ballot_sync(m, p) != 0; }
inline unsigned __match_any_sync(unsigned, uint32_t v) {
    return emu::collective(v, [&](const uint64_t* s) { unsigned m = 0; for (int l = 0; l < 32; ++l) if (uint32_t(s[l]) == v) m |= 1u << l; return m; });
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v) {
    return emu::collective(v, [&](const uint64_t* s) { unsigned r = 0; for (int l = 0; l < 32; ++l) if (mask >> l & 1) r += unsigned(s[l]); return r; });
}
inline int __ffs(unsigned x) { return __builtin_ffs(int(x)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline unsigned long long __float2ull_rn(float x) { return (unsigned long long)std::nearbyint(double(x)); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p += v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { auto o = *p; *p += v; return o; }
inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
using std::fmaxf;
