#include "runtime/model/quant_match.hpp"

#include <fmt/format.h>

#include "runtime/weights/mlx_layout.hpp"

namespace scr {

using nlohmann::json;

json checkpoint_quantization(const json& config) {
    if (config.contains("quantization_config") && config["quantization_config"].is_object()) return config["quantization_config"];
    if (config.contains("quantization") && config["quantization"].is_object()) return config["quantization"];
    return nullptr;
}

namespace {

const json* ct_weights(const json& q) {
    if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty()) return nullptr;
    const json& g = q["config_groups"].begin().value();
    return g.contains("weights") && g["weights"].is_object() ? &g["weights"] : nullptr;
}

std::string field(const json& j, const char* key) { return j.contains(key) ? j[key].dump() : "absent"; }

}  // namespace

std::string quant_difference(const json& ck, std::string_view preset_json, std::string_view name) {
    if (preset_json.empty()) {
        if (ck.is_null()) return "";
        return fmt::format("the checkpoint is quantized ({}) but preset {} is dense", ck.dump(), name);
    }
    const json want = json::parse(preset_json);
    if (ck.is_null())
        return fmt::format("preset {} expects a quantized checkpoint ({}) but config.json has no quantization_config "
                           "(make one with `scr quantize IN OUT --preset {}`)",
                           name, want.dump(), name);
    if (want.value("quant_method", "") == "compressed-tensors") {
        if (ck.value("quant_method", "") != "compressed-tensors")
            return fmt::format("preset {} reads compressed-tensors checkpoints, this one's quant_method is {}", name,
                               field(ck, "quant_method"));
        const std::string fmt_have = ck.value("format", ""), fmt_want = want.value("format", "");
        if (fmt_have != fmt_want && fmt_have != "naive-quantized")
            return fmt::format("preset {} reads format \"{}\", the checkpoint is \"{}\"", name, fmt_want, fmt_have);
        const json* h = ct_weights(ck);
        const json* w = ct_weights(want);
        if (!h) return fmt::format("the checkpoint's quantization_config has no config_groups weights entry (preset {})", name);
        for (const char* k : {"num_bits", "type", "strategy", "symmetric"})
            if (field(*h, k) != field(*w, k))
                return fmt::format("weights.{} is {} in the checkpoint but {} in preset {}", k, field(*h, k), field(*w, k), name);
        return "";
    }
    // MLX: {"group_size": G, "bits": B} (optionally "mode": "affine"), plus router overrides.
    if (ck.contains("quant_method"))
        return fmt::format("the checkpoint's quant_method is {} but preset {} is MLX affine", ck["quant_method"].dump(), name);
    // Per-module overrides: only MoE routers (mlx-lm's qwen3_moe quantizes mlp.gate at 8 bits), which the
    // plan keeps dense and the loader dequantizes (runtime/weights/mlx_layout.hpp).
    for (auto& [k, v] : ck.items())
        if (k != "group_size" && k != "bits" && k != "mode")
            if (std::string why = mlx_override_refusal(k, v); !why.empty()) return fmt::format("{}; preset {}", why, name);
    if (ck.contains("mode") && ck["mode"] != "affine")
        return fmt::format("quantization mode {} is not MLX affine (preset {})", ck["mode"].dump(), name);
    for (const char* k : {"bits", "group_size"})
        if (field(ck, k) != field(want, k))
            return fmt::format("quantization {} is {} in the checkpoint but {} in preset {}", k, field(ck, k), field(want, k), name);
    return "";
}

}  // namespace scr
