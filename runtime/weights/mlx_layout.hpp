// mlx-lm's checkpoint layout (the mlx-community checkpoints), read into Scratchy's per-module plan.
//  - Stacked experts. mlx-lm's sanitize stacks `P.experts.{e}.{proj}.{weight,scales,biases}` into one
//    `P.switch_mlp.{proj}.{...}` of shape [E, ...] before quantizing (each expert's rows keep their
//    groups, so expert e is the e-th contiguous slice); Mixtral's w1 / w3 / w2 become gate_proj /
//    up_proj / down_proj. The plan names each expert's tensor; the loader reads its slice in place.
//  - Router overrides. mlx-lm's qwen3_moe quant_predicate quantizes the router `mlp.gate` at 8 bits,
//    group 64, recorded as a per-module entry of config.json's "quantization" block. The plan keeps
//    routers dense (f32 under the MLX presets), so the loader dequantizes them once: exact in f32.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace scr {

struct StackedExpert {
    std::string stacked_name;  // P.switch_mlp.{proj}.{suffix}
    int64_t expert = 0;
};
// The stacked tensor that holds `name` when `name` is a per-expert tensor (P.experts.{e}.{proj}.{suffix}).
std::optional<StackedExpert> stacked_expert_source(std::string_view name);

// An MLX affine quantization that the loader undoes: w = scale * q + bias, q of `bits` bits packed
// from the low bits of little-endian uint32 words, one scale and bias per `group_size` inputs.
struct MlxAffineOverride {
    int bits = 0;
    int group_size = 0;
};
using MlxRouterOverrides = std::map<std::string, MlxAffineOverride, std::less<>>;

// A MoE router's module path (mlx-lm: `...mlp.gate`, Mixtral's `...block_sparse_moe.gate`).
bool is_router_module(std::string_view path);
// Why per-module entry `key` -> `value` of an MLX "quantization" block cannot be served ("" when it
// can: a router quantized at 4 or 8 bits with group 32 / 64 / 128, or left dense with false).
std::string mlx_override_refusal(const std::string& key, const nlohmann::json& value);
// The router overrides of a checkpoint's quantization block (null or dense: none). Entries that are
// not router overrides are skipped here; quant_match refuses them before loading.
MlxRouterOverrides mlx_router_overrides(const nlohmann::json& quant_block);

}  // namespace scr
