// Host emulation of the CUDA features kernels/cuda/sample.cuh uses, for tests that run without a GPU
// (tests/cuda/sample_test_emu.cpp): one block at a time, its threads as ucontext coroutines switched
// at every barrier (block or warp), so __syncthreads and the warp intrinsics keep their exact meaning
// (every lane of a warp must reach a warp intrinsic, as on the device with a full mask). Shared memory
// is a function-static variable; shared atomics are plain adds (one coroutine runs at a time).
// Only what sample.cuh needs; not a general CUDA emulator.
#pragma once
#include <cmath>
#include <cstdint>
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
struct emu_dim3 { unsigned x, y, z; };
namespace emu {
inline int nthreads = SCR_EMU_THREADS;
inline int cur = 0;
inline unsigned block = 0;

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
inline Barrier block_bar;
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
inline void run_block(unsigned b, std::function<void()> f) {
    constexpr size_t kStack = 256 * 1024;
    static std::vector<std::vector<char>> stacks;
    block = b;
    body = std::move(f);
    sp.assign(size_t(nthreads), nullptr);
    done.assign(size_t(nthreads), 0);
    stacks.resize(size_t(nthreads));
    block_bar = Barrier{nthreads};
    warp_bar.assign(size_t(nthreads / 32), Barrier{32});
    slots.assign(size_t(nthreads), 0);
    for (int t = 0; t < nthreads; ++t) {
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
        for (int t = 0; t < nthreads; ++t) {
            if (done[size_t(t)]) continue;
            any = true;
            cur = t;
            scr_emu_switch(&main_sp, sp[size_t(t)]);
        }
    }
}
}  // namespace emu
#define threadIdx (emu_dim3{unsigned(emu::cur), 0, 0})
#define blockIdx (emu_dim3{emu::block, 0, 0})
inline void __syncthreads() { emu::block_bar.wait(); }
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
inline unsigned long long __float2ull_rn(float x) { return (unsigned long long)std::nearbyint(double(x)); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p += v; return o; }
inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
using std::fmaxf;
