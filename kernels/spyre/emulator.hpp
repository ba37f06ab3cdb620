// The Spyre host emulator: device memory, 32 cores with a scratchpad (LX) of exactly the planned
// usable size each, and explicit stick-granular loads/stores between the two.
//
// Nothing here is a cache or an allocator: a kernel names a buffer of its plan (plan.hpp), the
// core hands back a view of exactly that buffer's bytes at exactly its planned offset, and every
// access through a view and every DMA is bounds-checked (an scr::Error naming the core, the
// buffer and the range, never a silent overrun). Values in LX are fp16 bit patterns; kernels
// compute in f32 and round to fp16 whenever a result lands in a tile that is stored.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kernels/spyre/plan.hpp"
#include "runtime/core/dtype.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"

namespace scr::kernels::spyre {

// ---- fp16 (IEEE binary16, round to nearest even), the element type of device memory and LX ---------
inline float h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return f16_to_f32(h);
#endif
}
inline uint16_t f2h(float f) {
#if defined(__F16C__)
    return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return f32_to_f16(f);
#endif
}

// Dot product of two fp16 vectors with f32 products and a fixed accumulation order (8 lanes, then
// a fixed horizontal sum), so a result never depends on which tile or batch it falls in.
inline float dot_f16(const uint16_t* a, const uint16_t* b, int64_t n) {
#if defined(__F16C__) && defined(__FMA__) && defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
        __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
        acc = _mm256_fmadd_ps(va, vb, acc);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    const int tail = int(n - i);  // 0..7: lane j takes element i + j, as the scalar path does
    for (int j = 0; j < tail && j < 8; ++j) lanes[j] = std::fma(h2f(a[i + j]), h2f(b[i + j]), lanes[j]);
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
#else
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t i = 0; i < n; ++i) lanes[i % 8] = std::fma(h2f(a[i]), h2f(b[i]), lanes[i % 8]);
    return ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
#endif
}

// A range of device memory a kernel may touch (a tensor, an activation, the KV pool).
struct DevRegion {
    std::byte* base = nullptr;
    int64_t bytes = 0;
    const char* what = "";
};

// A typed window onto one buffer copy in one core's LX. `span(i, n)` is the only way to touch its
// elements and checks [i, i + n) against the buffer.
template <typename T>
class LxView {
public:
    LxView() = default;
    LxView(T* data, int64_t count, int64_t lx_offset, const char* name, int core)
        : data_(data), count_(count), lx_offset_(lx_offset), name_(name), core_(core) {}
    T* span(int64_t i, int64_t n) const {
        if (i < 0 || n < 0 || i + n > count_)
            fail("spyre core {}: access to elements [{}, {}) of LX buffer '{}', which holds {} elements", core_, i, i + n,
                 name_, count_);
        return data_ + i;
    }
    T& at(int64_t i) const { return *span(i, 1); }
    int64_t count() const { return count_; }
    int64_t lx_offset() const { return lx_offset_; }
    const char* name() const { return name_; }

private:
    T* data_ = nullptr;
    int64_t count_ = 0, lx_offset_ = 0;
    const char* name_ = "";
    int core_ = 0;
};

class Core {
public:
    Core(int id, int64_t lx_bytes) : id_(id), lx_bytes_(lx_bytes) {
        lx_.reset(static_cast<std::byte*>(std::aligned_alloc(kStickBytes, size_t(stick_round(lx_bytes)))));
        if (!lx_) fail("spyre emulator: cannot allocate the scratchpad of core {}", id);
        std::memset(lx_.get(), 0, size_t(stick_round(lx_bytes)));
    }
    int id() const { return id_; }
    int64_t lx_bytes() const { return lx_bytes_; }

    // Buffer `index` (copy 0 or 1) of plan p, typed T. The plan's layout must fit this core's LX.
    template <typename T, class P>
    LxView<T> buf(const P& p, int index, int copy = 0) {
        const LxBuffer b = p.buffer(index);
        const int64_t off = lx_offset(p, index, copy % b.copies);
        if (off + b.bytes > lx_bytes_)
            fail("spyre core {}: LX buffer '{}' at [{}, {}) lies outside the {}-byte scratchpad", id_, b.name, off,
                 off + b.bytes, lx_bytes_);
        return LxView<T>(reinterpret_cast<T*>(lx_.get() + off), b.bytes / int64_t(sizeof(T)), off, b.name, id_);
    }

    // Device memory -> LX: `bytes` (whole sticks) from src at a stick-aligned offset into dst
    // starting at element dst_elem.
    template <typename T>
    void load(const LxView<T>& dst, int64_t dst_elem, const DevRegion& src, int64_t src_off, int64_t bytes) {
        check_dma("load", src, src_off, bytes, dst.name(), dst.lx_offset() + dst_elem * int64_t(sizeof(T)));
        std::memcpy(dst.span(dst_elem, bytes / int64_t(sizeof(T))), src.base + src_off, size_t(bytes));
        loaded_ += bytes;
    }
    // LX -> device memory.
    template <typename T>
    void store(const DevRegion& dst, int64_t dst_off, const LxView<T>& src, int64_t src_elem, int64_t bytes) {
        check_dma("store", dst, dst_off, bytes, src.name(), src.lx_offset() + src_elem * int64_t(sizeof(T)));
        std::memcpy(dst.base + dst_off, src.span(src_elem, bytes / int64_t(sizeof(T))), size_t(bytes));
        stored_ += bytes;
    }
    // Loads the sticks covering elements [first, first + n) of an index array (ids, positions,
    // slots) and returns where element `first` landed in dst.
    template <typename T>
    int64_t load_index(const LxView<T>& dst, const DevRegion& src, int64_t first, int64_t n) {
        const int64_t begin = first * int64_t(sizeof(T)) / kStickBytes * kStickBytes;
        const int64_t end = stick_round((first + n) * int64_t(sizeof(T)));
        load(dst, 0, src, begin, end - begin);
        return first - begin / int64_t(sizeof(T));
    }

    int64_t bytes_loaded() const { return loaded_; }
    int64_t bytes_stored() const { return stored_; }
    void reset_counters() { loaded_ = stored_ = 0; }

private:
    void check_dma(const char* dir, const DevRegion& r, int64_t off, int64_t bytes, const char* buf, int64_t lx_off) const {
        if (bytes <= 0 || bytes % kStickBytes != 0 || off % kStickBytes != 0 || lx_off % kStickBytes != 0)
            fail("spyre core {}: {} of {} bytes at device offset {} / LX offset {} (buffer '{}') is not whole aligned "
                 "128-byte sticks",
                 id_, dir, bytes, off, lx_off, buf);
        if (off < 0 || off + bytes > r.bytes)
            fail("spyre core {}: {} of device bytes [{}, {}) outside '{}' ({} bytes)", id_, dir, off, off + bytes, r.what,
                 r.bytes);
    }

    struct FreeDeleter {
        void operator()(std::byte* p) const { std::free(p); }
    };
    int id_;
    int64_t lx_bytes_;
    std::unique_ptr<std::byte, FreeDeleter> lx_;
    int64_t loaded_ = 0, stored_ = 0;
};

// The card: device memory (one allocation, laid out by the compiler) and 32 cores.
class Device {
public:
    Device(int64_t device_bytes, int64_t lx_bytes, ThreadPool& pool) : bytes_(device_bytes), pool_(pool) {
        if (lx_bytes < 1 || lx_bytes > kLxPhysicalBytes)
            fail("spyre emulator: a scratchpad budget of {} bytes is outside 1..{} (the physical LX)", lx_bytes,
                 kLxPhysicalBytes);
        mem_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, size_t(round_up(device_bytes, 4096)))));
        if (!mem_) fail("spyre emulator: cannot allocate {} bytes of device memory", device_bytes);
        std::memset(mem_.get(), 0, size_t(round_up(device_bytes, 4096)));
        cores_.reserve(kCores);
        for (int c = 0; c < kCores; ++c) cores_.emplace_back(c, lx_bytes);
    }

    DevRegion region(int64_t off, int64_t bytes, const char* what) {
        if (off < 0 || bytes < 0 || off + bytes > bytes_)
            fail("spyre emulator: region '{}' [{}, {}) is outside the {} bytes of device memory", what, off, off + bytes,
                 bytes_);
        return {mem_.get() + off, bytes, what};
    }
    std::byte* host_view(int64_t off) { return mem_.get() + off; }  // host-side transfers (upload, step inputs, logits)
    int64_t bytes() const { return bytes_; }
    Core& core(int c) { return cores_[size_t(c)]; }

    // Runs fn(core) on cores [0, n), in parallel over the host's threads. An error on any core is
    // rethrown here once all have stopped.
    template <typename Fn>
    void run(int n, Fn&& fn) {
        for (auto& e : errors_) e = nullptr;
        pool_.parallel_for(n, [&](int64_t b, int64_t e, int) {
            for (int64_t c = b; c < e; ++c) {
                try {
                    fn(cores_[size_t(c)]);
                } catch (...) {
                    errors_[size_t(c)] = std::current_exception();
                }
            }
        });
        for (auto& e : errors_)
            if (e) std::rethrow_exception(e);
    }

    int64_t bytes_moved() const {
        int64_t s = 0;
        for (auto& c : cores_) s += c.bytes_loaded() + c.bytes_stored();
        return s;
    }

private:
    struct FreeDeleter {
        void operator()(std::byte* p) const { std::free(p); }
    };
    int64_t bytes_;
    std::unique_ptr<std::byte, FreeDeleter> mem_;
    std::vector<Core> cores_;
    std::exception_ptr errors_[kCores];
    ThreadPool& pool_;
};

// Rows [begin, end) of `rows` that core c of `cores` owns in a row split.
struct RowRange {
    int64_t begin, end;
};
inline RowRange rows_of_core(int64_t rows, int cores, int c) {
    const int64_t per = ceil_div(rows, cores);
    const int64_t b = std::min(rows, per * c);
    return {b, std::min(rows, b + per)};
}
// Cores that get at least one row.
inline int cores_for_rows(int64_t rows, int cores) {
    if (rows <= 0) return 0;
    return int(ceil_div(rows, ceil_div(rows, cores)));
}

}  // namespace scr::kernels::spyre
