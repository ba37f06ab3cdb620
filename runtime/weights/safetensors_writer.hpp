// Writes safetensors files (used by `scr make-random` and `scr quantize`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "runtime/core/dtype.hpp"

namespace scr {

struct TensorToWrite {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    // Fills `bytes` (already sized to the tensor) with the data; called once, in header order.
    std::function<void(std::byte* bytes, size_t size)> fill;
};

// Tensors are laid out in the given order, each 64-byte aligned relative to the data section.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                       const std::function<void(size_t done, size_t total)>& progress = {});

}  // namespace scr
