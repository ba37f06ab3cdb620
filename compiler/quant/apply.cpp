#include "compiler/quant/apply.hpp"

#include <regex>

#include "runtime/core/error.hpp"

namespace scr::quant {

std::string module_of(const std::string& name) {
    const std::string suffix = ".weight";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        return name.substr(0, name.size() - suffix.size());
    return name;
}

namespace {

// compressed-tensors' ignore list: plain module names, or "re:<regex>" matched against the module.
bool ignored(const Preset& p, const std::string& module) {
    const auto& qc = p.quantization_config;
    if (!qc.contains("ignore") || !qc["ignore"].is_array()) return module == "lm_head";
    for (auto& e : qc["ignore"]) {
        if (!e.is_string()) continue;
        const std::string s = e.get<std::string>();
        if (s.rfind("re:", 0) == 0 ? std::regex_match(module, std::regex(s.substr(3))) : s == module) return true;
    }
    return false;
}

bool quantizes(const Preset& p, const ir::Tensor& t) {
    if (t.shape.size() != 2) return false;
    if (p.format == WeightFormat::mlx_affine)
        return (t.role == ir::TensorRole::linear || t.role == ir::TensorRole::embedding) && t.shape[1] % p.group_size == 0;
    return t.role == ir::TensorRole::linear && !ignored(p, module_of(t.name));
}

}  // namespace

void apply_preset(ir::Graph& g, const Preset& p) {
    if (!p.quantized()) return;
    for (auto& op : g.ops) {
        // MoE: per-expert projections (Qwen3-MoE, Mixtral, DeepSeek's routed experts) are quantized like
        // any linear, every one of them (a preset that would leave one dense, e.g. an MLX group that does
        // not divide the expert width, is refused: the experts' kernel reads one format). The router
        // stays dense, as compressed-tensors MoE recipes keep it (their ignore lists). GPT-OSS's stacked
        // [E, K, N] experts and MLA are not read quantized yet.
        const bool stacked_experts = op.kind == ir::OpKind::moe && op.attr.count("layout") && op.attr.at("layout") != 0.0;
        if (op.kind == ir::OpKind::mla || stacked_experts)
            fail("quant preset {}: the {} op (layer {}{}) cannot read quantized weights yet; this architecture is "
                 "refused with quantized presets (use a dense preset such as bf16)",
                 p.name, ir::op_name(op.kind), op.layer, stacked_experts ? ", stacked experts" : "");
        if (op.kind == ir::OpKind::moe) {
            const int experts = int(op.attr.at("experts"));
            for (int j = 1; j <= 3 * experts; ++j) {
                const ir::Tensor& t = g.tensors[size_t(op.weights[size_t(j)])];
                if (!quantizes(p, t))
                    fail("quant preset {}: expert weight {} (input dim {}) is not quantized by this preset ({}), so layer "
                         "{}'s experts would mix dense and quantized weights",
                         p.name, t.name, t.shape.size() > 1 ? t.shape[1] : 0,
                         p.format == WeightFormat::mlx_affine ? fmt::format("not a multiple of group {}", p.group_size)
                                                              : std::string("its ignore list"),
                         op.layer);
            }
        }
    }
    std::vector<ir::Tensor> out;
    std::vector<int> remap(g.tensors.size(), -1);
    for (size_t i = 0; i < g.tensors.size(); ++i) {
        ir::Tensor t = g.tensors[i];
        remap[i] = int(out.size());
        if (!quantizes(p, t)) {
            out.push_back(std::move(t));
            continue;
        }
        const int64_t n = t.shape[0], k = t.shape[1];
        const std::string module = module_of(t.name);
        t.logical = t.shape;
        t.dtype = p.packed;
        ir::Tensor scales;
        scales.role = t.role;
        scales.dtype = p.scale_dtype;
        scales.optional = t.optional;
        ir::Tensor biases = scales;
        if (p.format == WeightFormat::mlx_affine) {
            t.shape = {n, k * p.bits / 32};
            scales.name = module + ".scales";
            scales.shape = {n, k / p.group_size};
            biases.name = module + ".biases";
            biases.shape = scales.shape;
        } else {
            scales.name = module + ".weight_scale";
            scales.shape = p.per_tensor ? std::vector<int64_t>{1} : std::vector<int64_t>{n, 1};
        }
        const int base = int(out.size());
        t.scales = base + 1;
        if (p.format == WeightFormat::mlx_affine) t.biases = base + 2;
        out.push_back(std::move(t));
        out.push_back(std::move(scales));
        if (p.format == WeightFormat::mlx_affine) out.push_back(std::move(biases));
    }
    for (auto& op : g.ops)
        for (int& w : op.weights)
            if (w >= 0) w = remap[size_t(w)];
    g.tensors = std::move(out);
}

}  // namespace scr::quant
