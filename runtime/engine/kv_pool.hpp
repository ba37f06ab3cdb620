// The KV pool's memory: one anonymous mapping, 2 MiB aligned and advised for transparent huge
// pages (fewer TLB misses when attention walks the blocks), zero until written.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/model/compiled_model.hpp"

namespace scr::engine {

class KvPoolMemory {
public:
    KvPoolMemory(int32_t num_blocks, int64_t bytes_per_block);
    ~KvPoolMemory();
    KvPoolMemory(const KvPoolMemory&) = delete;
    KvPoolMemory& operator=(const KvPoolMemory&) = delete;

    KvPool& pool() { return pool_; }
    size_t bytes() const { return bytes_; }

    // Bytes of MemAvailable in /proc/meminfo; 0 when unknown.
    static int64_t available_memory_bytes();

private:
    KvPool pool_;
    void* mapping_ = nullptr;
    size_t mapping_bytes_ = 0;
    size_t bytes_ = 0;
};

}  // namespace scr::engine
