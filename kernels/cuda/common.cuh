// Shared device helpers: element conversions that round exactly as the CPU kernels do, 16-byte
// weight loads that bypass L1, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kernels/cuda/env_switch.hpp"
#include "kernels/cuda/step.hpp"
#include "runtime/core/dtype.hpp"

namespace scr::kernels::cuda {

constexpr int kWarp = 32;

// Host and device (the host self-tests run kernels' row functions); the device code is the intrinsics.
__host__ __device__ __forceinline__ float to_f32(float x) { return x; }
__host__ __device__ __forceinline__ float to_f32(bf16_t x) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(uint32_t(x.bits) << 16);
#else
    return bf16_to_f32(x.bits);
#endif
}
__host__ __device__ __forceinline__ float to_f32(f16_t x) {
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(x.bits));
#else
    return f16_to_f32(x.bits);
#endif
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
    return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(x))};  // nearest-even, as f32_to_bf16
}
template <> __device__ __forceinline__ f16_t from_f32<f16_t>(float x) { return f16_t{__half_as_ushort(__float2half_rn(x))}; }

// A 16-byte load of weights that are read once per step: no L1 allocation, so the activations
// that every warp re-reads stay in L1.
__device__ __forceinline__ uint4 load_stream16(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// Elements of type T in 16 bytes, and their unpacking to floats.
template <typename T> struct Vec16;
template <> struct Vec16<float> {
    static constexpr int n = 4;
    __device__ __forceinline__ static void unpack(uint4 v, float (&f)[4]) {
        f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y); f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
    }
};
template <> struct Vec16<bf16_t> {
    static constexpr int n = 8;
    __device__ __forceinline__ static void unpack(uint4 v, float (&f)[8]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};
template <> struct Vec16<f16_t> {
    static constexpr int n = 8;
    __device__ __forceinline__ static void unpack(uint4 v, float (&f)[8]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __half2float(__ushort_as_half(uint16_t(w[i] & 0xffffu)));
            f[2 * i + 1] = __half2float(__ushort_as_half(uint16_t(w[i] >> 16)));
        }
    }
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float silu(float g) { return g * (1.0f / (1.0f + expf(-g))); }

__host__ __device__ constexpr int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// The last of a group of blocks to be done, where each block wrote its results to global memory and
// one of them must combine them all: every thread's writes are published (fence) before thread 0
// takes the block's ticket; `take_ticket()` (thread 0 only) does the atomic and says whether this
// block is the last (and may reset the counter for the next launch). Every thread of the block
// returns that answer through `flag` (the caller's __shared__ word); the last block fences again
// before it reads the other blocks' writes. Used by the decode attention's context split and the
// wide quantized GEMM's K split.
template <class Flag, class TakeTicket>
__device__ __forceinline__ bool last_block_to_arrive(Flag& flag, TakeTicket&& take_ticket) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) flag = take_ticket();
    __syncthreads();
    if (!flag) return false;
    __threadfence();
    return true;
}

// Programmatic dependent launch (Hopper). A kernel launched by `launch` below may start while the
// kernel before it in the stream is still running: it must call pdl_wait() before its first global
// write and before reading anything an earlier kernel wrote (only weights may be read before it).
// pdl_trigger() lets the next kernel start launching once every block of this one has called it.
// Both are no-ops for a kernel launched the ordinary way.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Where a kernel calls pdl_trigger(), for the kernels that take it as an argument: at its start,
// once the previous kernel is done (right after its pdl_wait()), or after its main loop. Only the
// scheduling changes, never a value. The next launch's blocks then take the SM slots this grid
// leaves free and issue their first weight loads while it runs. Earliest is not best everywhere: a
// trigger at the start also lets the launch after next start, whose loads then probably compete
// with the running kernel's stream (H200, device time per token: the one-row int4 GEMV after its
// wait 5 % faster than after its loop and ~1 % faster than at its start; docs/CUDA.md "Session 19").
// `env` (start / wait / loop) overrides `fallback`, for A/B runs; any other value is named on stderr
// (an A/B run must not measure the default while believing it measures a variant) and ignored.
enum class PdlTrigger : int { after_loop = 0, after_wait = 1, start = 2 };

// The current device's SM count, read once (the launchers that size grids by it: attention's head
// split and context split, the GEMV's persistent grid, the quantized kernels' waves); at least 1.
inline int device_sm_count() {
    static const int sms = [] {
        int dev = 0, n = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        return n > 0 ? n : 1;
    }();
    return sms;
}
inline PdlTrigger pdl_trigger_choice(const char* env, PdlTrigger fallback) {
    return env_choice_switch(env, fallback,
                             {{"start", PdlTrigger::start}, {"wait", PdlTrigger::after_wait}, {"loop", PdlTrigger::after_loop}},
                             "the default");
}

// ---- L2 prefetch of upcoming weights (issue #6) ----
// A latency-bound launch (decode attention, a GEMV that leaves HBM half idle) asks the L2 to fetch
// bytes that the next launches will stream, so those are served partly from L2. Only the memory
// traffic changes, never an operand: results are bit-identical with the prefetch on or off.
// What a kernel receives: the upcoming ranges cut to the run-time budget (16-byte multiples).
struct L2Plan {
    const char* ptr[kL2MaxRanges];
    uint32_t bytes[kL2MaxRanges];
    int n = 0;
    int64_t total = 0;
    bool after_wait = false;  // issue only once the previous kernel is done (pdl_wait), not beside it
};

// Off by default: measured on an H200 (docs/CUDA.md, "Session 5") the consumers barely speed up
// when their bytes come from L2 (o_proj 6.2 -> 5.9 us with no DRAM reads at all), while the
// prefetch's own traffic slows the launches it overlaps. SCR_CUDA_L2_PREFETCH=1 turns it on with
// the best variant measured: SCR_CUDA_L2_PREFETCH_MB (decode attention launches, default 12) and
// SCR_CUDA_L2_PREFETCH_NEXT_MB (the GEMV that ends a layer, prefetching the next layer's first
// launches, default 0) set the byte budgets, 0 turning that site off.
enum class L2Site { attention, gemv };
inline int64_t l2_prefetch_budget(L2Site site) {
    auto megabytes = [](const char* name, long long fallback) {  // whole MiB, at most L2's 50 MiB
        return int64_t(env_int_switch(name, fallback, [](long long mb) { return mb >= 0 && mb <= 50; }, "a whole MiB count from 0 to 50")) *
               1048576;
    };
    static const bool on = env_flag_switch("SCR_CUDA_L2_PREFETCH", false);
    static const int64_t attention = megabytes("SCR_CUDA_L2_PREFETCH_MB", 12);
    static const int64_t gemv = megabytes("SCR_CUDA_L2_PREFETCH_NEXT_MB", 0);
    if (!on) return 0;
    return site == L2Site::attention ? attention : gemv;
}

// The attention's prefetch blocks wait for the kernel before it (the QKV GEMV, itself
// latency-bound) instead of competing with its loads; SCR_CUDA_L2_PREFETCH_WAIT=0: they issue at
// once (measured 1-2 % slower end to end).
inline bool l2_prefetch_after_wait() {
    static const bool on = env_flag_switch("SCR_CUDA_L2_PREFETCH_WAIT", true);
    return on;
}

// Stages in order while the budget lasts; the stage that does not fit whole gets the rest,
// shared in proportion to its ranges' sizes (gate and up are read row for row together).
inline L2Plan l2_plan(const L2Prefetch& want, L2Site site) {
    L2Plan p;
    p.after_wait = site == L2Site::attention && l2_prefetch_after_wait();
    int64_t left = l2_prefetch_budget(site);
    for (int i = 0; i < want.n && left >= 16;) {
        int j = i;
        int64_t stage_bytes = 0;
        while (j < want.n && want.r[j].stage == want.r[i].stage) stage_bytes += want.r[j++].bytes;
        const bool whole = stage_bytes <= left;
        int64_t used = 0;
        for (int m = i; m < j; ++m) {
            int64_t b = whole ? want.r[m].bytes : int64_t(double(want.r[m].bytes) * double(left) / double(stage_bytes));
            b = std::min<int64_t>(b, int64_t(UINT32_MAX)) / 16 * 16;
            if (b <= 0 || !want.r[m].ptr) continue;
            p.ptr[p.n] = static_cast<const char*>(want.r[m].ptr);
            p.bytes[p.n++] = uint32_t(b);
            used += b;
        }
        p.total += used;
        left -= used;
        if (!whole) break;
        i = j;
    }
    return p;
}

// Bytes one thread asks for per instruction: enough threads share a budget to spread the requests
// over many SMs' copy engines.
constexpr int64_t kL2PrefetchPiece = 2048;

// Part `part` of `parts` equal slices of the plan's bytes, issued by this block's threads as bulk L2
// prefetches (no registers, no waiting: the block may exit at once).
__device__ __forceinline__ void l2_prefetch_part(const L2Plan& p, int64_t part, int64_t parts) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int64_t units = p.total / 16;  // 16-byte units
    const int64_t u0 = units * part / parts, u1 = units * (part + 1) / parts;
    constexpr int64_t kPieceUnits = kL2PrefetchPiece / 16;
    for (int64_t a = u0 + int64_t(threadIdx.x) * kPieceUnits; a < u1; a += int64_t(blockDim.x) * kPieceUnits) {
        const int64_t b = min(a + kPieceUnits, u1);
        int64_t base = 0;
        for (int i = 0; i < p.n && base < b; ++i) {
            const int64_t ru = p.bytes[i] / 16;
            const int64_t lo = max(a, base), hi = min(b, base + ru);
            if (lo < hi)
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.ptr[i] + (lo - base) * 16), "r"(uint32_t((hi - lo) * 16))
                             : "memory");
            base += ru;
        }
    }
#else
    (void)p; (void)part; (void)parts;
#endif
}

// Blocks that issue a plan beside a kernel's own: ~one piece per thread, at most 128 blocks.
inline int l2_prefetch_blocks(const L2Plan& p, int threads_per_block) {
    if (p.total <= 0) return 0;
    const int64_t per_block = int64_t(threads_per_block) * kL2PrefetchPiece;
    return int(std::min<int64_t>(128, (p.total + per_block - 1) / per_block));
}

// Asynchronous 16-byte copies global -> shared (LDGSTS, no L1 allocation). They complete in the
// order of their commit groups; cp_async_wait(n) returns once at most n of this thread's groups are
// still in flight, and only this thread's copies are then visible to it (others: a barrier).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait(int n) {  // n = 0..3 (wait_group takes an immediate)
    if (n <= 0) asm volatile("cp.async.wait_group 0;" ::: "memory");
    else if (n == 1) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else if (n == 2) asm volatile("cp.async.wait_group 2;" ::: "memory");
    else asm volatile("cp.async.wait_group 3;" ::: "memory");
}

// bf16 tensor-core MMA, D (16 x 8, f32) += A (16 x 16) B (16 x 8): the register layouts of
// mma.m16n8k16 (lane g = lane / 4, t = lane % 4: a0 = A[g][2t..], a1 = A[g + 8][2t..], a2 = A[g][2t + 8..],
// a3 = A[g + 8][2t + 8..]; b0 = B[2t..][g], b1 = B[2t + 8..][g]; d = D[g][2t..], D[g + 8][2t..]).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as a bf16x2 register (the first in the low half, as the MMA expects the lower k).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo_k, float hi_k) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo_k, hi_k);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// Two floats as bf16 hi + lo pairs (hi = the nearest bf16, lo = the rest rounded to bf16: ~2^-17
// relative together), each pair packed as pack_bf16x2 does.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
    const float ha = __bfloat162float(__float2bfloat16_rn(a)), hb = __bfloat162float(__float2bfloat16_rn(b));
    hi = pack_bf16x2(ha, hb);
    lo = pack_bf16x2(a - ha, b - hb);
}

// Launches `kernel` on the step's stream with `smem` bytes of dynamic shared memory, as a
// programmatic dependent of the previous kernel when the context asks for it (Ctx::pdl), in
// clusters of `cluster_z` blocks along z when that is above 1 (the split-K kernels' meeting).
// Every kernel launched through here calls pdl_wait(). Returns the launch's error, unconsumed.
template <typename... Params, typename... Args>
cudaError_t launch_ex(const Ctx& c, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, int cluster_z, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c.stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = c.pdl ? 1 : 0;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = 1;
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = unsigned(cluster_z > 1 ? cluster_z : 1);
    cfg.attrs = attr;
    cfg.numAttrs = cluster_z > 1 ? 2 : 1;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
// Queues on_main(c) on the step's stream and on_side(side) on Ctx::side, forked after what the
// stream holds and joined before whatever it is given next, so the two parts may run at once (in a
// graph capture the fork and join become the graph's edges). The parts must not read or write each
// other's outputs. Without a side stream both run on the step's stream, the main part first. The
// side part's kernels are not programmatic dependents (their predecessor is the fork's wait). A
// failed event call is left, as a failed launch is, for the caller's cudaGetLastError().
template <class Main, class Side>
void fork_join(const Ctx& c, Main&& on_main, Side&& on_side) {
    if (!c.side) {
        on_main(c);
        on_side(c);
        return;
    }
    Ctx side = c;
    side.stream = c.side.stream;
    side.side = {};
    side.pdl = false;
    cudaEventRecord(c.side.fork, c.stream);
    cudaStreamWaitEvent(c.side.stream, c.side.fork, 0);
    on_main(c);
    on_side(side);
    cudaEventRecord(c.side.join, c.side.stream);
    cudaStreamWaitEvent(c.stream, c.side.join, 0);
}

template <typename... Params, typename... Args>
void launch_smem(const Ctx& c, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
    launch_ex(c, kernel, grid, block, smem, 1, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
void launch(const Ctx& c, void (*kernel)(Params...), dim3 grid, dim3 block, Args&&... args) {
    launch_smem(c, kernel, grid, block, 0, std::forward<Args>(args)...);
}

}  // namespace scr::kernels::cuda
