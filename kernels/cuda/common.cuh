// Shared device helpers: element conversions that round exactly as the CPU kernels do, 16-byte
// weight loads that bypass L1, warp reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/step.hpp"
#include "runtime/core/dtype.hpp"

namespace scr::kernels::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16_t x) { return __uint_as_float(uint32_t(x.bits) << 16); }
__device__ __forceinline__ float to_f32(f16_t x) { return __half2float(__ushort_as_half(x.bits)); }

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

// Launches `kernel` on the step's stream, as a programmatic dependent of the previous kernel when
// the context asks for it (Ctx::pdl). Every kernel launched through here calls pdl_wait().
template <typename... Params, typename... Args>
void launch(const Ctx& c, void (*kernel)(Params...), dim3 grid, dim3 block, Args&&... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = 0;
    cfg.stream = c.stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = c.pdl ? 1 : 0;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace scr::kernels::cuda
