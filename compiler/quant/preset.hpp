// Quantization presets (models/quant/<name>.json): which dtype each role of tensor is stored and
// read in, and the KV cache dtype. Part of the input triple, so every choice is a constant.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "runtime/core/dtype.hpp"

namespace scr::quant {

// How linear (and, for MLX, embedding) weights are stored. dense: one float tensor per weight.
//   mlx_affine: MLX affine groups — <m>.weight uint32 [out, in*bits/32] (element 0 in the low bits),
//               <m>.scales / <m>.biases [out, in/group_size]; w = scale * q + bias.
//   compressed_tensors: symmetric, no zero point — <m>.weight I8 or F8_E4M3 [out, in],
//               <m>.weight_scale [out, 1] (channel) or [1] (tensor); w = scale * q.
enum class WeightFormat { dense, mlx_affine, compressed_tensors };

struct Preset {
    std::string name;
    std::string description;
    DType linear = DType::bf16;     // projection / expert / lm_head weights
    DType embedding = DType::bf16;  // token embedding table
    DType norm = DType::f32;        // norm weights and biases (tiny; kept exact)
    DType router = DType::f32;      // MoE router
    DType kv_cache = DType::bf16;
    WeightFormat format = WeightFormat::dense;
    int bits = 0;                   // quantized formats: 4 (MLX) or 8 (int8 / fp8)
    int group_size = 0;             // mlx_affine: input elements per scale/bias
    bool per_tensor = false;        // compressed_tensors: one scale for the whole tensor
    DType packed = DType::u32;      // the quantized weight's stored dtype: u32 (MLX), i8, f8e4m3
    DType scale_dtype = DType::bf16;
    nlohmann::json quantization_config;  // what a checkpoint's config.json carries for this preset
    bool quantized() const { return format != WeightFormat::dense; }
    nlohmann::json raw;             // the file, for formats that add fields (group size, bits...)
};

// Throws scr::Error naming the file and the field on anything malformed or unsupported.
Preset load_preset(const std::string& path);
Preset parse_preset(const nlohmann::json& j, const std::string& origin);

}  // namespace scr::quant
