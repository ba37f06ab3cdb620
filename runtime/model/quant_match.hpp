// Matching a checkpoint's own quantization block against a compiled preset's. A quantized
// checkpoint carries it in config.json: "quantization_config" (compressed-tensors, and MLX writes
// it too) or "quantization" (MLX). Bits, group size, number type and scale strategy must agree with
// the compiled constants; the tensors' packed shapes are then checked by WeightSet.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace scr {

// The checkpoint's quantization block, or null for a dense checkpoint.
nlohmann::json checkpoint_quantization(const nlohmann::json& config);

// "" when a specialization compiled with `preset_json` (ModelInfo::quant_config_json, "" = dense)
// serves a checkpoint with `checkpoint` (null = dense); else what differs, for error messages.
std::string quant_difference(const nlohmann::json& checkpoint, std::string_view preset_json, std::string_view preset_name);

}  // namespace scr
