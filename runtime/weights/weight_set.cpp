#include "runtime/weights/weight_set.hpp"

#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"

namespace scr {

namespace fs = std::filesystem;

std::shared_ptr<Checkpoint> Checkpoint::open(const fs::path& dir) {
    auto cp = std::make_shared<Checkpoint>();
    std::vector<fs::path> files;
    fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
        std::ifstream in(index);
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(in);
        } catch (const nlohmann::json::exception& e) {
            fail("{}: malformed JSON ({})", index.string(), e.what());
        }
        if (!j.contains("weight_map") || !j["weight_map"].is_object())
            fail("{}: no \"weight_map\" object", index.string());
        std::set<std::string> shards;
        for (auto& [name, file] : j["weight_map"].items()) {
            if (!file.is_string()) fail("{}: weight_map entry {} is not a file name", index.string(), name);
            auto f = file.get<std::string>();
            if (f.find('/') != std::string::npos || f.find("..") != std::string::npos)
                fail("{}: shard name {} must be a plain file name", index.string(), f);
            shards.insert(f);
        }
        for (auto& s : shards) files.push_back(dir / s);
    } else if (fs::exists(dir / "model.safetensors")) {
        files.push_back(dir / "model.safetensors");
    } else {
        for (auto& e : fs::directory_iterator(dir))
            if (e.path().extension() == ".safetensors") files.push_back(e.path());
        std::sort(files.begin(), files.end());
    }
    if (files.empty()) fail("{}: no model.safetensors, shard index or *.safetensors file", dir.string());
    for (auto& f : files) {
        if (!fs::exists(f)) fail("{}: shard {} listed in the index is missing", dir.string(), f.filename().string());
        cp->files_.push_back(SafetensorsFile::open(f));
        auto* file = cp->files_.back().get();
        for (auto& t : file->tensors()) {
            auto [it, fresh] = cp->index_.emplace(t.name, Found{file, &t});
            if (!fresh)
                fail("tensor {} appears in both {} and {}", t.name, it->second.file->path().string(), f.string());
        }
    }
    return cp;
}

const Checkpoint::Found* Checkpoint::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &it->second;
}

std::vector<std::string> Checkpoint::tensor_names() const {
    std::vector<std::string> names;
    for (auto& [name, found] : index_) names.push_back(name);
    return names;
}

std::string Checkpoint::describe() const {
    std::string s;
    for (auto& f : files_) s += (s.empty() ? "" : ", ") + f->path().string();
    return s;
}

namespace {

std::string shape_text(std::span<const int64_t> s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

float load_as_f32(const std::byte* p, DType t, size_t i) {
    switch (t) {
        case DType::f32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
        case DType::bf16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h); }
        case DType::f16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h); }
        case DType::f64: { double d; std::memcpy(&d, p + 8 * i, 8); return float(d); }
        default: return 0;
    }
}

bool convertible(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::f64; }

}  // namespace

WeightSet::WeightSet(std::span<const TensorSpec> specs, std::shared_ptr<Checkpoint> checkpoint, std::string_view model_name,
                     bool huge_pages)
    : checkpoint_(std::move(checkpoint)) {
    ptrs_.assign(specs.size(), nullptr);
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& spec = specs[i];
        std::string name(spec.name);
        const auto* found = checkpoint_->find(name);
        if (!found) {
            if (spec.optional) continue;
            fail("model {}: tensor {} is missing from {}", model_name, name, checkpoint_->describe());
        }
        const TensorEntry& e = *found->entry;
        std::span<const int64_t> want(spec.shape, size_t(spec.rank));
        if (e.shape.size() != size_t(spec.rank) || !std::equal(want.begin(), want.end(), e.shape.begin()))
            fail("model {}: tensor {} in {} has shape {} but the compiled plan expects {}", model_name, name,
                 found->file->path().string(), shape_text(e.shape), shape_text(want));
        const std::byte* src = found->file->data(*found->entry);
        size_t elems = 1;
        for (auto d : e.shape) elems *= size_t(d);
        if (e.dtype == spec.dtype) {
            ptrs_[i] = src;
            mapped_bytes_ += int64_t(e.end - e.begin);
            continue;
        }
        if (!convertible(e.dtype))
            fail("model {}: tensor {} in {} is {}, which cannot be converted to {}", model_name, name,
                 found->file->path().string(), dtype_name(e.dtype), dtype_name(spec.dtype));
        size_t bytes = elems * size_t(dtype_bytes(spec.dtype));
        void* dst = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!dst) fail("out of memory converting tensor {}", name);
        owned_.push_back(dst);
        for (size_t j = 0; j < elems; ++j) {
            float f = load_as_f32(src, e.dtype, j);
            switch (spec.dtype) {
                case DType::f32: static_cast<float*>(dst)[j] = f; break;
                case DType::bf16: static_cast<uint16_t*>(dst)[j] = f32_to_bf16(f); break;
                case DType::f16: static_cast<uint16_t*>(dst)[j] = f32_to_f16(f); break;
                default: fail("model {}: tensor {}: the plan's dtype {} is not a float type", model_name, name, dtype_name(spec.dtype));
            }
        }
        ptrs_[i] = dst;
        converted_bytes_ += int64_t(bytes);
    }
    if (huge_pages && mapped_bytes_ >= kMinHugePageCopyBytes && transparent_huge_pages_available())
        copy_mapped_to_huge_pages(specs);
}

bool WeightSet::transparent_huge_pages_available() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    std::getline(f, modes);
    return f && modes.find("[never]") == std::string::npos;  // "[always]" or "[madvise]"
}

void WeightSet::copy_mapped_to_huge_pages(std::span<const TensorSpec> specs) {
    constexpr size_t kHuge = 2u << 20;
    std::vector<size_t> offsets(ptrs_.size(), SIZE_MAX);
    size_t total = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
        const auto* found = ptrs_[i] ? checkpoint_->find(std::string(specs[i].name)) : nullptr;
        if (!found || found->file->data(*found->entry) != ptrs_[i]) continue;  // converted or absent
        offsets[i] = total;
        total += (size_t(found->entry->end - found->entry->begin) + 63) / 64 * 64;
    }
    const size_t bytes = (total + kHuge - 1) / kHuge * kHuge;
    void* p = ::mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("cannot reserve {} bytes for huge-page weights", bytes);
    // Align to 2 MiB so every page can be a huge page.
    auto base = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) / kHuge * kHuge);
    ::madvise(base, bytes, MADV_HUGEPAGE);
    huge_ = p;
    huge_bytes_ = int64_t(bytes + kHuge);
    // Copy with every core (a 1B model is 2.5 GB), then drop the file pages from this process's
    // resident set: the model reads only the copy from now on (the page cache keeps the file).
    ThreadPool::global().parallel_for(int64_t(specs.size()), [&](int64_t b, int64_t e, int) {
        for (auto i = size_t(b); i < size_t(e); ++i) {
            if (offsets[i] == SIZE_MAX) continue;
            const auto* found = checkpoint_->find(std::string(specs[i].name));
            const size_t n = size_t(found->entry->end - found->entry->begin);
            std::memcpy(base + offsets[i], ptrs_[i], n);
            const size_t page = size_t(sysconf(_SC_PAGESIZE));
            const auto src = reinterpret_cast<uintptr_t>(ptrs_[i]);
            const uintptr_t first = (src + page - 1) / page * page, last = (src + n) / page * page;
            if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advisory
            ptrs_[i] = base + offsets[i];
        }
    });
}

WeightSet::~WeightSet() {
    for (void* p : owned_) std::free(p);
    if (huge_) ::munmap(huge_, size_t(huge_bytes_));
}

}  // namespace scr
