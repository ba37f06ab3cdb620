// Quantization presets (models/quant/<name>.json): which dtype each role of tensor is stored and
// read in, and the KV cache dtype. Part of the input triple, so every choice is a constant.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/core/dtype.hpp"

namespace scr::quant {

struct Preset {
    std::string name;
    std::string description;
    DType linear = DType::bf16;     // projection / expert / lm_head weights
    DType embedding = DType::bf16;  // token embedding table
    DType norm = DType::f32;        // norm weights and biases (tiny; kept exact)
    DType router = DType::f32;      // MoE router
    DType kv_cache = DType::bf16;
    nlohmann::json raw;             // the file, for formats that add fields (group size, bits...)
};

// Throws scr::Error naming the file and the field on anything malformed or unsupported.
Preset load_preset(const std::string& path);
Preset parse_preset(const nlohmann::json& j, const std::string& origin);

}  // namespace scr::quant
