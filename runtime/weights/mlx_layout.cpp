#include "runtime/weights/mlx_layout.hpp"

#include <fmt/format.h>

#include <charconv>

namespace scr {

std::optional<StackedExpert> stacked_expert_source(std::string_view name) {
    // P.experts.{e}.{proj}.{suffix}: find the last ".experts." followed by a number.
    const size_t at = name.rfind(".experts.");
    if (at == std::string_view::npos) return std::nullopt;
    std::string_view rest = name.substr(at + 9);
    int64_t e = -1;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), e);
    if (ec != std::errc() || end == rest.data() || e < 0 || end == rest.data() + rest.size() || *end != '.') return std::nullopt;
    std::string_view tail = rest.substr(size_t(end - rest.data()) + 1);  // {proj}.{suffix}
    const size_t dot = tail.find('.');
    if (dot == std::string_view::npos || dot == 0) return std::nullopt;
    std::string_view proj = tail.substr(0, dot), suffix = tail.substr(dot + 1);
    // mlx-lm's mixtral / phimoe / minimax sanitize: w1 -> gate_proj, w2 -> down_proj, w3 -> up_proj.
    if (proj == "w1") proj = "gate_proj";
    else if (proj == "w2") proj = "down_proj";
    else if (proj == "w3") proj = "up_proj";
    return StackedExpert{fmt::format("{}.switch_mlp.{}.{}", name.substr(0, at), proj, suffix), e};
}

bool is_router_module(std::string_view path) { return path.ends_with(".mlp.gate") || path.ends_with(".block_sparse_moe.gate"); }

std::string mlx_override_refusal(const std::string& key, const nlohmann::json& value) {
    if (!is_router_module(key))
        return fmt::format("the checkpoint's quantization block has \"{}\" (a per-module override; only MoE routers "
                           "(...mlp.gate) may differ from the block's bits and group size)",
                           key);
    if (value.is_boolean()) return "";  // false: the router stays dense in the file; true: the block's own format
    if (!value.is_object()) return fmt::format("the quantization override \"{}\" is {}, not an object", key, value.dump());
    for (auto& [k, v] : value.items())
        if (k != "bits" && k != "group_size" && k != "mode")
            return fmt::format("the quantization override \"{}\" has an unknown field \"{}\"", key, k);
    if (value.contains("mode") && value["mode"] != "affine")
        return fmt::format("the quantization override \"{}\" has mode {} (only MLX affine is read)", key, value["mode"].dump());
    const auto& bits = value.value("bits", nlohmann::json());
    const auto& group = value.value("group_size", nlohmann::json());
    if (!bits.is_number_integer() || (bits != 4 && bits != 8))
        return fmt::format("the quantization override \"{}\" has bits {} (a router is read at 4 or 8 bits)", key, bits.dump());
    if (!group.is_number_integer() || (group != 32 && group != 64 && group != 128))
        return fmt::format("the quantization override \"{}\" has group_size {} (32, 64 or 128)", key, group.dump());
    return "";
}

MlxRouterOverrides mlx_router_overrides(const nlohmann::json& quant_block) {
    MlxRouterOverrides out;
    if (!quant_block.is_object()) return out;
    // config.json is untrusted: a field of another type counts as absent.
    auto int_field = [](const nlohmann::json& j, const char* key) {
        auto it = j.find(key);
        return it != j.end() && it->is_number_integer() ? it->get<int>() : 0;
    };
    const MlxAffineOverride block{int_field(quant_block, "bits"), int_field(quant_block, "group_size")};
    for (auto& [k, v] : quant_block.items()) {
        if (!is_router_module(k) || !mlx_override_refusal(k, v).empty()) continue;
        if (v.is_object()) out[k] = {int_field(v, "bits"), int_field(v, "group_size")};
        else if (v == true && (block.bits == 4 || block.bits == 8) && block.group_size > 0)  // the block's own format
            out[k] = block;
    }
    return out;
}

}  // namespace scr
