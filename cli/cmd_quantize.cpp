// `scr quantize IN_DIR OUT_DIR --preset mlx-int4-g64`: writes a quantized checkpoint in the layout
// the preset's loaders expect (docs/QUANT.md), from a bf16/f32/f16 checkpoint (sharded or not),
// with config.json's quantization block and the tokenizer files copied over.
//
// Every float tensor is first rounded to bf16 (as `mlx_lm.convert --dtype bfloat16` casts the
// model), and the quantization arithmetic then runs in bf16 the way MLX's and torch's CPU ops do
// for bf16 tensors: each op computed in f32 and rounded to bf16. Rounding is half to even.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/weights/safetensors_writer.hpp"
#include "runtime/weights/weight_set.hpp"

namespace scr::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum class Format { mlx_affine, int8_channel, fp8 };

struct QuantPreset {
    const char* name;
    Format format;
    int group_size;   // MLX only
    bool per_tensor;  // fp8 only
};

// The presets of models/quant/ this command writes (their "quantization_config" blocks are
// rebuilt below; tests/quant checks they equal the preset files').
constexpr QuantPreset kPresets[] = {
    {"mlx-int4-g32", Format::mlx_affine, 32, false},  {"mlx-int4-g64", Format::mlx_affine, 64, false},
    {"mlx-int4-g128", Format::mlx_affine, 128, false}, {"int8", Format::int8_channel, 0, false},
    {"fp8", Format::fp8, 0, false},                    {"fp8-tensor", Format::fp8, 0, true},
};

json quantization_config(const QuantPreset& p) {
    if (p.format == Format::mlx_affine) return {{"group_size", p.group_size}, {"bits", 4}};
    const bool fp8 = p.format == Format::fp8;
    const std::string strategy = p.per_tensor ? "tensor" : "channel";
    json weights = {{"num_bits", 8}, {"type", fp8 ? "float" : "int"}, {"symmetric", true}, {"strategy", strategy}, {"dynamic", false}};
    json acts = fp8 ? json{{"num_bits", 8}, {"type", "float"}, {"symmetric", true}, {"strategy", "token"}, {"dynamic", true}}
                    : json(nullptr);
    return {{"quant_method", "compressed-tensors"},
            {"format", fp8 ? "float-quantized" : "int-quantized"},
            {"ignore", {"lm_head"}},
            {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}}}};
}

// One op of bf16 arithmetic: the f32 result rounded to bf16.
float bf(float x) { return bf16_to_f32(f32_to_bf16(x)); }

float load_f32(const std::byte* p, DType t, size_t i) {
    switch (t) {
        case DType::f32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
        case DType::bf16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_f32(h); }
        case DType::f16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return f16_to_f32(h); }
        default: fail("unreachable dtype");
    }
}

// MLX affine quantization of one group, as mlx/ops.cpp affine_quantize (its CPU fallback) computes it:
//   scale = max((w_max - w_min) / 15, 1e-7), negated unless |w_min| > |w_max|;
//   edge = |w_min| > |w_max| ? w_min : w_max;  q0 = round(edge / scale);
//   if q0 != 0: scale = edge / q0, bias = edge; else bias = 0;
//   q = clip(round((w - bias) / scale), 0, 15).
// (ml-explore/mlx, mlx/ops.cpp: affine_quantize and pack_and_quantize.)
void mlx_quantize_group(const float* w, int g, uint8_t* q, float& scale_out, float& bias_out) {
    float w_max = w[0], w_min = w[0];
    for (int i = 1; i < g; ++i) w_max = std::max(w_max, w[i]), w_min = std::min(w_min, w[i]);
    const bool mask = std::fabs(w_min) > std::fabs(w_max);
    float scale = std::max(bf(bf(w_max - w_min) / 15.0f), bf(1e-7f));
    if (!mask) scale = -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = std::nearbyint(bf(edge / scale));
    if (q0 != 0) scale = bf(edge / q0);
    const float bias = q0 == 0 ? 0.0f : edge;
    for (int i = 0; i < g; ++i) q[i] = uint8_t(std::clamp(std::nearbyint(bf(bf(w[i] - bias) / scale)), 0.0f, 15.0f));
    scale_out = scale;
    bias_out = bias;
}

// f32 -> OCP fp8 e4m3fn, round to nearest even, saturating at +-448.
uint8_t f32_to_fp8e4m3(float v) {
    const uint8_t sign = std::signbit(v) ? 0x80 : 0;
    const float a = std::fabs(v);
    if (!(a < 448.0f)) return sign | 0x7e;
    if (a < std::ldexp(1.0f, -6)) return sign | uint8_t(std::nearbyint(a * 512.0f));  // subnormals (8 -> the smallest normal)
    int e;
    std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
    int exp = e - 1;
    int man = int(std::nearbyint((std::ldexp(a, -exp) - 1.0f) * 8.0f));
    if (man == 8) man = 0, ++exp;
    const int code = std::min(((exp + 7) << 3) | man, 0x7e);
    return sign | uint8_t(code);
}

// compressed-tensors symmetric scale (calculate_qparams): max|w| / (bit_range / 2), clamped to f32 eps.
float symmetric_scale(const float* w, size_t n, float half_range) {
    float m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
    return std::max(bf(m / half_range), bf(std::numeric_limits<float>::epsilon()));
}

uint8_t quantize_symmetric(float w, float scale, Format f) {
    if (f == Format::int8_channel) return uint8_t(int8_t(std::clamp(std::nearbyint(bf(w / scale)), -128.0f, 127.0f)));
    return f32_to_fp8e4m3(std::clamp(bf(w / scale), -448.0f, 448.0f));
}

// Which tensors a preset quantizes, by the checkpoint producers' rules (compiler/quant/apply.cpp
// decides the same from the architecture's roles): rank-2 `.weight` tensors — MLX: every Linear and
// Embedding whose input dim divides by the group size; compressed-tensors: Linear layers except
// lm_head (embeddings, model.embed_tokens, stay dense). A MoE router (a module named `gate`, as
// Qwen-MoE's and DeepSeek's `mlp.gate` and Mixtral's `block_sparse_moe.gate`) stays dense under
// both, as the compiler expects (its role is router, not linear).
bool quantizes(const QuantPreset& p, const std::string& name, const TensorEntry& e) {
    const std::string suffix = ".weight";
    if (e.shape.size() != 2 || name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix))
        return false;
    const std::string module = name.substr(0, name.size() - suffix.size());
    if (module == "gate" || (module.size() > 5 && module.compare(module.size() - 5, 5, ".gate") == 0)) return false;
    if (p.format == Format::mlx_affine) return e.shape[1] % p.group_size == 0;
    const bool embedding = module.size() >= 12 && module.compare(module.size() - 12, 12, "embed_tokens") == 0;
    return !embedding && module != "lm_head";
}

void setup(CLI::App& app) {
    auto* c = app.add_subcommand("quantize", "write a quantized checkpoint (MLX affine int4, int8, fp8) from a bf16/f32 one");
    auto in = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto preset = std::make_shared<std::string>();
    std::vector<std::string> names;
    for (auto& p : kPresets) names.push_back(p.name);
    c->add_option("in", *in, "input model folder (config.json + safetensors)")->required();
    c->add_option("out", *out, "output folder")->required();
    c->add_option("--preset", *preset, "quant preset")->required()->check(CLI::IsMember(names));
    c->callback([=] {
        const QuantPreset& p = *std::find_if(std::begin(kPresets), std::end(kPresets), [&](auto& q) { return *preset == q.name; });
        const fs::path src(*in), dst(*out);
        std::ifstream cin(src / "config.json");
        if (!cin) fail("{}: no config.json", src.string());
        json cfg;
        try {
            cfg = json::parse(cin);
        } catch (const json::exception& e) {
            fail("{}: malformed JSON ({})", (src / "config.json").string(), e.what());
        }
        if (cfg.contains("quantization_config") || cfg.contains("quantization"))
            fail("{}: the checkpoint is already quantized (config.json has a quantization block)", src.string());
        if (fs::exists(dst) && fs::equivalent(src, dst)) fail("OUT_DIR must differ from IN_DIR");
        auto ckpt = Checkpoint::open(src);
        std::vector<TensorToWrite> tensors;
        int quantized = 0;
        for (const std::string& name : ckpt->tensor_names()) {
            const auto* found = ckpt->find(name);
            const TensorEntry& e = *found->entry;
            if (e.dtype != DType::f32 && e.dtype != DType::bf16 && e.dtype != DType::f16)
                fail("{}: tensor {} is {}; quantize reads f32, bf16 or f16 checkpoints", src.string(), name, dtype_name(e.dtype));
            const std::byte* data = found->file->data(e);
            const DType src_dtype = e.dtype;
            size_t elems = 1;
            for (auto d : e.shape) elems *= size_t(d);
            // The source rounded to bf16 (the output's float dtype).
            auto load_bf16 = [=](std::vector<float>& w) {
                w.resize(elems);
                for (size_t i = 0; i < elems; ++i) w[i] = bf(load_f32(data, src_dtype, i));
            };
            if (!quantizes(p, name, e)) {
                tensors.push_back({name, DType::bf16, e.shape, [=](std::byte* bytes, size_t) {
                                       std::vector<float> w;
                                       load_bf16(w);
                                       for (size_t i = 0; i < elems; ++i) reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_bf16(w[i]);
                                   }});
                continue;
            }
            ++quantized;
            const int64_t n = e.shape[0], k = e.shape[1];
            const std::string module = name.substr(0, name.size() - 7);
            if (p.format == Format::mlx_affine) {
                // Quantized once, when the packed weight is written; scales and biases follow it.
                auto groups = std::make_shared<std::vector<float>>(size_t(n * (k / p.group_size)) * 2);
                const int g = p.group_size;
                tensors.push_back({name, DType::u32, {n, k / 8}, [=](std::byte* bytes, size_t) {
                                       std::vector<float> w;
                                       load_bf16(w);
                                       auto* words = reinterpret_cast<uint32_t*>(bytes);
                                       ThreadPool::global().parallel_for(n, [&](int64_t r0, int64_t r1, int) {
                                           std::vector<uint8_t> q(static_cast<size_t>(g));
                                           for (int64_t r = r0; r < r1; ++r)
                                               for (int64_t gi = 0; gi < k / g; ++gi) {
                                                   const size_t at = size_t(r * (k / g) + gi);
                                                   mlx_quantize_group(w.data() + size_t(r * k + gi * g), g, q.data(),
                                                                      (*groups)[2 * at], (*groups)[2 * at + 1]);
                                                   for (int i = 0; i < g; i += 8) {
                                                       uint32_t word = 0;
                                                       for (int j = 0; j < 8; ++j) word |= uint32_t(q[size_t(i + j)]) << (4 * j);
                                                       words[size_t(r * (k / 8) + (gi * g + i) / 8)] = word;
                                                   }
                                               }
                                       });
                                   }});
                for (int which = 0; which < 2; ++which)
                    tensors.push_back({module + (which ? ".biases" : ".scales"), DType::bf16, {n, k / g},
                                       [=](std::byte* bytes, size_t) {
                                           for (size_t i = 0; i < groups->size() / 2; ++i)
                                               reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_bf16((*groups)[2 * i + size_t(which)]);
                                       }});
                continue;
            }
            auto scales = std::make_shared<std::vector<float>>(p.per_tensor ? 1 : size_t(n));
            tensors.push_back({name, p.format == Format::int8_channel ? DType::i8 : DType::f8e4m3, e.shape,
                               [=](std::byte* bytes, size_t) {
                                   std::vector<float> w;
                                   load_bf16(w);
                                   const float half = p.format == Format::int8_channel ? 127.5f : 448.0f;
                                   if (p.per_tensor) (*scales)[0] = symmetric_scale(w.data(), w.size(), half);
                                   ThreadPool::global().parallel_for(n, [&](int64_t r0, int64_t r1, int) {
                                       for (int64_t r = r0; r < r1; ++r) {
                                           const float* row = w.data() + size_t(r * k);
                                           const float s = p.per_tensor ? (*scales)[0] : symmetric_scale(row, size_t(k), half);
                                           if (!p.per_tensor) (*scales)[size_t(r)] = s;
                                           for (int64_t i = 0; i < k; ++i)
                                               reinterpret_cast<uint8_t*>(bytes)[size_t(r * k + i)] = quantize_symmetric(row[i], s, p.format);
                                       }
                                   });
                               }});
            tensors.push_back({module + ".weight_scale", DType::bf16,
                               p.per_tensor ? std::vector<int64_t>{1} : std::vector<int64_t>{n, 1},
                               [=](std::byte* bytes, size_t) {
                                   for (size_t i = 0; i < scales->size(); ++i)
                                       reinterpret_cast<uint16_t*>(bytes)[i] = f32_to_bf16((*scales)[i]);
                               }});
        }
        if (quantized == 0)  // as mlx-lm: the quantization block is written, every layer stays dense
            fmt::print(stderr, "warning: no tensor of {} has an input dim divisible by preset {}'s group size\n", src.string(), p.name);
        fs::create_directories(dst);
        // Tokenizer, generation config, chat template...: everything but the weights and config.json.
        for (auto& f : fs::directory_iterator(src)) {
            const std::string fname = f.path().filename().string();
            if (!f.is_regular_file() || f.path().extension() == ".safetensors" || fname == "config.json" ||
                fname == "model.safetensors.index.json")
                continue;
            fs::copy_file(f.path(), dst / fname, fs::copy_options::overwrite_existing);
        }
        cfg["torch_dtype"] = "bfloat16";
        cfg["quantization_config"] = quantization_config(p);
        if (p.format == Format::mlx_affine) cfg["quantization"] = quantization_config(p);
        std::ofstream(dst / "config.json") << cfg.dump(2) << "\n";
        write_safetensors(dst / "model.safetensors", tensors, [](size_t done, size_t total) {
            constexpr int kWidth = 30;
            const int filled = total ? int(kWidth * done / total) : kWidth;
            fmt::print(stderr, "\rquantize [{}{}] {}/{} tensors", std::string(size_t(filled), '#'),
                       std::string(size_t(kWidth - filled), ' '), done, total);
            if (done == total) fmt::print(stderr, "\n");
        });
        fmt::print("wrote {} ({} of {} tensors quantized, preset {})\n", dst.string(), quantized, ckpt->tensor_names().size(), p.name);
    });
}

CommandRegistrar reg(&setup);

}  // namespace
}  // namespace scr::cli
