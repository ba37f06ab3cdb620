// The weights of one compiled specialization, checked against its plan: every tensor's name,
// shape and dtype. A tensor whose dtype the preset shares is a pointer into the mapped file (no
// copy); any other is converted once at load into an aligned buffer. mlx-lm's layout is read too
// (runtime/weights/mlx_layout.hpp): a per-expert tensor from its slice of the stacked
// `switch_mlp` tensor, and a router the file quantizes (an override) dequantized into the plan's dtype.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/model/compiled_model.hpp"
#include "runtime/weights/mlx_layout.hpp"
#include "runtime/weights/safetensors.hpp"

namespace scr {

// Every safetensors file of a model folder: model.safetensors, or the shards listed by
// model.safetensors.index.json.
class Checkpoint {
public:
    static std::shared_ptr<Checkpoint> open(const std::filesystem::path& dir);
    struct Found {
        const SafetensorsFile* file;
        const TensorEntry* entry;
    };
    const Found* find(const std::string& name) const;
    std::string describe() const;  // the files, for messages
    std::vector<std::string> tensor_names() const;  // every tensor of every file, sorted by name

private:
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::map<std::string, Found, std::less<>> index_;
};

class WeightSet {
public:
    // Throws scr::Error naming the tensor and file on a missing tensor or a wrong shape.
    // huge_pages: copy the mapped tensors once into anonymous 2 MiB pages (madvise(MADV_HUGEPAGE)).
    // Page-cache pages are 4 KiB; on the 2-core Zen 4 reference machine a decode step streams
    // weights about 1.4x faster from huge pages, which is worth a one-time copy for serving.
    // Skipped (the file stays mapped with no copy) below kMinHugePageCopyBytes of mapped weights,
    // where a step is dominated by other costs, and when transparent huge pages are disabled.
    // routers: the checkpoint's MLX router overrides (mlx_router_overrides), dequantized at load.
    WeightSet(std::span<const TensorSpec> specs, std::shared_ptr<Checkpoint> checkpoint, std::string_view model_name,
              bool huge_pages = false, const MlxRouterOverrides& routers = {});
    ~WeightSet();
    const void* data(size_t index) const { return ptrs_[index]; }
    size_t size() const { return ptrs_.size(); }
    int64_t mapped_bytes() const { return mapped_bytes_; }
    int64_t converted_bytes() const { return converted_bytes_; }
    int64_t huge_page_bytes() const { return huge_bytes_; }
    static constexpr int64_t kMinHugePageCopyBytes = int64_t(64) << 20;
    static bool transparent_huge_pages_available();

private:
    void copy_mapped_to_huge_pages();
    std::shared_ptr<Checkpoint> checkpoint_;
    std::vector<const void*> ptrs_;
    std::vector<size_t> mapped_size_;  // per tensor: its bytes when ptrs_ points into the file, else 0
    std::vector<void*> owned_;
    int64_t mapped_bytes_ = 0, converted_bytes_ = 0, huge_bytes_ = 0;
    void* huge_ = nullptr;
};

}  // namespace scr
