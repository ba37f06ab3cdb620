// safetensors checkpoints: the header parsed and checked, the data memory-mapped with no copy.
// Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the data. Every offset and size is checked against the file before any pointer is made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/core/dtype.hpp"

namespace scr {

struct TensorEntry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

// Parses and validates a header (the JSON text) for a data section of `data_bytes` bytes.
// Throws scr::Error naming `origin` and the tensor on any inconsistency. Exposed for fuzzing.
std::vector<TensorEntry> parse_safetensors_header(std::string_view json_text, uint64_t data_bytes,
                                                  const std::string& origin);

class MappedFile {
public:
    explicit MappedFile(const std::filesystem::path& path);  // read-only, private mapping
    ~MappedFile();
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    const std::byte* data() const { return data_; }
    size_t size() const { return size_; }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
    const std::byte* data_ = nullptr;
    size_t size_ = 0;
};

class SafetensorsFile {
public:
    static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
    const std::vector<TensorEntry>& tensors() const { return tensors_; }
    const std::byte* data(const TensorEntry& t) const { return data_start_ + t.begin; }
    const std::filesystem::path& path() const { return file_->path(); }

private:
    std::unique_ptr<MappedFile> file_;
    const std::byte* data_start_ = nullptr;
    std::vector<TensorEntry> tensors_;
};

}  // namespace scr
