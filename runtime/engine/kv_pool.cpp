#include "runtime/engine/kv_pool.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "runtime/core/error.hpp"

namespace scr::engine {

namespace { constexpr size_t kHugePage = size_t(2) << 20; }

KvPoolMemory::KvPoolMemory(int32_t num_blocks, int64_t bytes_per_block) {
    if (num_blocks < 2 || bytes_per_block <= 0)
        fail("KV pool: {} blocks of {} bytes is not a usable pool", num_blocks, bytes_per_block);
    bytes_ = size_t(num_blocks) * size_t(bytes_per_block);
    const size_t rounded = (bytes_ + kHugePage - 1) / kHugePage * kHugePage;
    mapping_bytes_ = rounded + kHugePage;  // room to align the start to 2 MiB
    mapping_ = mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapping_ == MAP_FAILED) {
        mapping_ = nullptr;
        fail("KV pool: cannot map {} bytes ({} blocks of {} bytes): {}", mapping_bytes_, num_blocks,
             bytes_per_block, std::strerror(errno));
    }
    auto start = (reinterpret_cast<uintptr_t>(mapping_) + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
    madvise(reinterpret_cast<void*>(start), rounded, MADV_HUGEPAGE);  // advisory: ignore failure
    pool_.data = reinterpret_cast<std::byte*>(start);
    pool_.num_blocks = num_blocks;
}

KvPoolMemory::~KvPoolMemory() {
    if (mapping_) munmap(mapping_, mapping_bytes_);
}

int64_t KvPoolMemory::available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;  // kB
    return 0;
}

}  // namespace scr::engine
