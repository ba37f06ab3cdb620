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

void store_float(void* dst, DType t, size_t j, float f, std::string_view model_name, const std::string& name) {
    switch (t) {
        case DType::f32: static_cast<float*>(dst)[j] = f; break;
        case DType::bf16: static_cast<uint16_t*>(dst)[j] = f32_to_bf16(f); break;
        case DType::f16: static_cast<uint16_t*>(dst)[j] = f32_to_f16(f); break;
        default: fail("model {}: tensor {}: the plan's dtype {} is not a float type", model_name, name, dtype_name(t));
    }
}

// A dense plan tensor (a MoE router) that the file holds MLX-quantized (an override of the
// checkpoint's quantization block): w = scale * q + bias, computed in f32 (exact for bf16 / f16
// scales: their products with q of at most 8 bits fit f32's mantissa; the bias adds one rounding).
template <class Buffer>
const void* dequantize_mlx_router(const Checkpoint& cp, const TensorSpec& spec, const std::string& module,
                                       MlxAffineOverride o, std::string_view model_name, Buffer&& owned_buffer) {
    const std::string name = module + ".weight";
    const auto* w = cp.find(name);
    const auto* s = cp.find(module + ".scales");
    const auto* b = cp.find(module + ".biases");
    if (!s || !b) fail("model {}: tensor {} is MLX-quantized ({} bits) but {}.{} is missing", model_name, name, o.bits, module, s ? "biases" : "scales");
    if (spec.rank != 2) fail("model {}: tensor {}: a quantized router must be a matrix, the plan's is rank {}", model_name, name, spec.rank);
    const int64_t n = spec.shape[0], k = spec.shape[1];
    const int64_t per_word = 32 / o.bits;
    const std::vector<int64_t> want_w{n, k / per_word}, want_s{n, k / o.group_size};
    if (k % o.group_size != 0 || k % per_word != 0)
        fail("model {}: tensor {}: the override's group size {} does not divide its {} inputs", model_name, name, o.group_size, k);
    if (w->entry->shape != want_w)
        fail("model {}: tensor {} in {} has shape {} but {}-bit MLX packing of the plan's {} expects {}", model_name, name,
             w->file->path().string(), shape_text(w->entry->shape), o.bits, shape_text(std::span(spec.shape, 2)), shape_text(want_w));
    for (const auto* p : {s, b}) {
        if (p->entry->shape != want_s)
            fail("model {}: tensor {} in {} has shape {} but group size {} expects {}", model_name, p->entry->name,
                 p->file->path().string(), shape_text(p->entry->shape), o.group_size, shape_text(want_s));
        if (!convertible(p->entry->dtype))
            fail("model {}: tensor {} is {}, not a float type", model_name, p->entry->name, dtype_name(p->entry->dtype));
    }
    const std::byte* words = w->file->data(*w->entry);
    const std::byte* sp = s->file->data(*s->entry);
    const std::byte* bp = b->file->data(*b->entry);
    void* dst = owned_buffer(size_t(n * k) * size_t(dtype_bytes(spec.dtype)), name);
    const uint32_t mask = (1u << o.bits) - 1;
    for (int64_t r = 0; r < n; ++r)
        for (int64_t c = 0; c < k; ++c) {
            uint32_t word;
            std::memcpy(&word, words + 4 * size_t(r * (k / per_word) + c / per_word), 4);
            const float q = float((word >> (o.bits * (c % per_word))) & mask);
            const size_t g = size_t(r * (k / o.group_size) + c / o.group_size);
            store_float(dst, spec.dtype, size_t(r * k + c), load_as_f32(sp, s->entry->dtype, g) * q + load_as_f32(bp, b->entry->dtype, g),
                        model_name, name);
        }
    return dst;
}

}  // namespace

WeightSet::WeightSet(std::span<const TensorSpec> specs, std::shared_ptr<Checkpoint> checkpoint, std::string_view model_name,
                     bool huge_pages, const MlxRouterOverrides& routers)
    : checkpoint_(std::move(checkpoint)) {
    ptrs_.assign(specs.size(), nullptr);
    mapped_size_.assign(specs.size(), 0);
    auto owned_buffer = [&](size_t bytes, const std::string& name) {
        void* dst = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!dst) fail("out of memory converting tensor {}", name);
        owned_.push_back(dst);
        converted_bytes_ += int64_t(bytes);
        return dst;
    };
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& spec = specs[i];
        std::string name(spec.name);
        std::span<const int64_t> want(spec.shape, size_t(spec.rank));
        constexpr std::string_view kWeight = ".weight";
        if (spec.dtype != DType::u32 && name.ends_with(kWeight)) {
            const std::string module = name.substr(0, name.size() - kWeight.size());
            if (auto it = routers.find(module); it != routers.end()) {
                if (const auto* f = checkpoint_->find(name); f && f->entry->dtype == DType::u32) {
                    ptrs_[i] = dequantize_mlx_router(*checkpoint_, spec, module, it->second, model_name, owned_buffer);
                    continue;
                }
            }
        }
        const auto* found = checkpoint_->find(name);
        std::optional<StackedExpert> stacked;
        if (!found && (stacked = stacked_expert_source(name))) found = checkpoint_->find(stacked->stacked_name);
        if (!found) {
            if (spec.optional) continue;
            fail("model {}: tensor {} is missing from {}{}", model_name, name, checkpoint_->describe(),
                 stacked ? fmt::format(" (nor is its stacked form {})", stacked->stacked_name) : std::string());
        }
        const TensorEntry& e = *found->entry;
        const std::byte* src = found->file->data(e);
        size_t bytes = size_t(e.end - e.begin);
        if (stacked) {
            // [E, plan's shape...]: expert e's slice, read in place.
            const bool fits = e.shape.size() == size_t(spec.rank) + 1 && std::equal(want.begin(), want.end(), e.shape.begin() + 1);
            if (!fits)
                fail("model {}: tensor {} in {} has shape {} but the compiled plan expects [experts, {}] for {}", model_name,
                     stacked->stacked_name, found->file->path().string(), shape_text(e.shape),
                     fmt::join(want, ", "), name);
            if (stacked->expert >= e.shape[0])
                fail("model {}: tensor {} in {} holds {} experts, the compiled plan reads expert {} ({})", model_name,
                     stacked->stacked_name, found->file->path().string(), e.shape[0], stacked->expert, name);
            bytes /= size_t(e.shape[0]);
            src += size_t(stacked->expert) * bytes;
        } else if (e.shape.size() != size_t(spec.rank) || !std::equal(want.begin(), want.end(), e.shape.begin())) {
            fail("model {}: tensor {} in {} has shape {} but the compiled plan expects {}", model_name, name,
                 found->file->path().string(), shape_text(e.shape), shape_text(want));
        }
        size_t elems = 1;
        for (auto d : want) elems *= size_t(d);
        if (e.dtype == spec.dtype) {
            ptrs_[i] = src;
            mapped_size_[i] = bytes;
            mapped_bytes_ += int64_t(bytes);
            continue;
        }
        if (!convertible(e.dtype))
            fail("model {}: tensor {} in {} is {}, which cannot be converted to {}", model_name, stacked ? stacked->stacked_name : name,
                 found->file->path().string(), dtype_name(e.dtype), dtype_name(spec.dtype));
        void* dst = owned_buffer(elems * size_t(dtype_bytes(spec.dtype)), name);
        for (size_t j = 0; j < elems; ++j) store_float(dst, spec.dtype, j, load_as_f32(src, e.dtype, j), model_name, name);
        ptrs_[i] = dst;
    }
    if (huge_pages && mapped_bytes_ >= kMinHugePageCopyBytes && transparent_huge_pages_available()) copy_mapped_to_huge_pages();
}

bool WeightSet::transparent_huge_pages_available() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    std::getline(f, modes);
    return f && modes.find("[never]") == std::string::npos;  // "[always]" or "[madvise]"
}

void WeightSet::copy_mapped_to_huge_pages() {
    constexpr size_t kHuge = 2u << 20;
    std::vector<size_t> offsets(ptrs_.size(), SIZE_MAX);
    size_t total = 0;
    for (size_t i = 0; i < ptrs_.size(); ++i) {
        if (mapped_size_[i] == 0) continue;  // converted or absent
        offsets[i] = total;
        total += (mapped_size_[i] + 63) / 64 * 64;
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
    ThreadPool::global().parallel_for(int64_t(ptrs_.size()), [&](int64_t b, int64_t e, int) {
        for (auto i = size_t(b); i < size_t(e); ++i) {
            if (offsets[i] == SIZE_MAX) continue;
            const size_t n = mapped_size_[i];
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
