// Applies a quantized preset to a bound graph: the weights the format quantizes get their packed
// dtype and shape, and their scale (and bias) tensors are added to the table right after them.
#pragma once

#include "compiler/ir/graph.hpp"
#include "compiler/quant/preset.hpp"

namespace scr::quant {

// Which tensors are quantized mirrors the checkpoint producers:
//   mlx-affine: every Linear and Embedding weight whose input dim divides by the group size
//               (mlx-lm's nn.quantize predicate), tied lm_head included (it is the embedding);
//   compressed-tensors: every Linear weight except the modules of quantization_config.ignore
//               (default ["lm_head"]); embeddings stay dense.
// MoE routers stay dense; per-expert projections are quantized (all of them, or the preset is
// refused). Ops that cannot read quantized weights yet (mla, GPT-OSS's stacked experts) are refused
// by name.
void apply_preset(ir::Graph& g, const Preset& preset);

// The module a weight belongs to: "model.layers.0.mlp.up_proj.weight" -> "model.layers.0.mlp.up_proj".
std::string module_of(const std::string& tensor_name);

}  // namespace scr::quant
