#include "compiler/targets/emit.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

namespace scr::emit {

std::string cpp_string(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            default: out += c;
        }
    }
    return out + "\"";
}

std::string float_literal(double v) {
    std::string s = fmt::format("{:.9g}", float(v));
    if (s.find_first_of(".einf") == std::string::npos) s += ".0";
    if (s == "inf") return "std::numeric_limits<float>::infinity()";
    return s + "f";
}

std::string symbol_for(const bind::Bound& b, const std::string& target) {
    std::string s = b.stem + "__" + b.preset.name + "__" + target;
    for (auto& c : s)
        if (!std::isalnum((unsigned char)c)) c = '_';
    return "m_" + s;
}

int freeable_window(const ir::Graph& g) {
    int w = 0;
    for (auto& kv : g.kv) {
        if (kv.window <= 0) return 0;  // a full-attention layer keeps every block alive
        w = std::max(w, kv.window);
    }
    return w;
}

Sizes sizes_of(const bind::Bound& b) {
    Sizes s;
    const auto& g = b.graph;
    for (auto& t : g.tensors) {
        int64_t n = dtype_bytes(t.dtype);
        for (auto d : t.shape) n *= d;
        s.weight_bytes += n;
    }
    s.active_weight_bytes = s.weight_bytes;
    // An embedding table that only the embed op reads (untied, as Llama-3.1-8B's) costs one row per
    // token, not the whole table (a tied one is read whole by the LM head, counted there).
    const auto own_bytes = [&](int id) {
        int64_t n = dtype_bytes(g.tensors[id].dtype);
        for (auto d : g.tensors[id].shape) n *= d;
        return n;
    };
    // A quantized weight is stored as codes plus companion tensors (scales, MLX biases) that are not
    // in any op's weight list (compiler/quant/apply.cpp): a weight that is not read costs all three.
    const auto bytes_of = [&](int id) {
        const auto& t = g.tensors[id];
        int64_t n = own_bytes(id);
        if (t.scales >= 0) n += own_bytes(t.scales);
        if (t.biases >= 0) n += own_bytes(t.biases);
        return n;
    };
    for (auto& op : g.ops) {
        if (op.kind != ir::OpKind::embed) continue;
        for (int id : op.weights) {
            if (id < 0 || g.tensors[id].shape.empty() || g.tensors[id].shape[0] <= 0) continue;
            const bool read_elsewhere = std::any_of(g.ops.begin(), g.ops.end(), [&](const ir::Op& o) {
                return o.kind != ir::OpKind::embed && std::find(o.weights.begin(), o.weights.end(), id) != o.weights.end();
            });
            if (!read_elsewhere) s.active_weight_bytes -= bytes_of(id) - bytes_of(id) / g.tensors[id].shape[0];
        }
    }
    for (auto& op : g.ops) {
        if (op.kind != ir::OpKind::moe) continue;
        int64_t experts = int64_t(op.attr.at("experts")), top_k = int64_t(op.attr.at("top_k"));
        int64_t expert_bytes = 0;
        for (size_t i = 1; i < op.weights.size(); ++i) expert_bytes += bytes_of(op.weights[i]);
        s.active_weight_bytes -= expert_bytes * (experts - top_k) / experts;
    }
    const int64_t kvb = dtype_bytes(b.preset.kv_cache);
    int64_t off = 0;
    for (auto& kv : g.kv) {
        int64_t one = int64_t(kv.kv_heads) * b.params.block_size * kv.head_dim * kvb;
        const int parts = kv.v_shared ? 1 : 2;  // MLA caches one latent row per token
        s.k_offsets.push_back(off);
        s.v_offsets.push_back(kv.v_shared ? off : off + one);
        off += parts * one;
        s.kv_bytes_per_token += parts * int64_t(kv.kv_heads) * kv.head_dim * kvb;
    }
    s.kv_block_bytes = off;
    s.scratch_bytes = g.scratch_floats * 4;
    return s;
}

std::string plan_text(const bind::Bound& b, const Sizes& s) {
    const auto& g = b.graph;
    std::string o;
    o += fmt::format("model {} ({}, {}) for {}, quant {}\n", b.stem, b.arch, b.hf_architecture,
                     b.config_path, b.preset.name);
    o += "constants:";
    for (auto& [n, v] : b.consts) o += fmt::format(" {}={}", n, v);
    o += "\n";
    o += fmt::format("weights: {} tensors, {} bytes ({:.1f} MiB); read per decode token: {} bytes\n", g.tensors.size(),
                     s.weight_bytes, s.weight_bytes / 1048576.0, s.active_weight_bytes);
    o += fmt::format("kv cache: {} bytes per token, block of {} tokens = {} bytes, {} attention layers, dtype {}\n",
                     s.kv_bytes_per_token, b.params.block_size, s.kv_block_bytes, g.kv.size(),
                     dtype_name(b.preset.kv_cache));
    std::vector<int> windows;
    for (auto& kv : g.kv) windows.push_back(kv.window);
    if (std::any_of(windows.begin(), windows.end(), [](int w) { return w > 0; }))
        o += fmt::format("sliding windows per layer (0 = full): [{}]; blocks freeable behind a window of {}\n",
                         fmt::join(windows, ", "), freeable_window(g));
    o += fmt::format("scratch: {} bytes ({:.1f} MiB) for up to {} tokens and {} logit rows per step\n", s.scratch_bytes,
                     s.scratch_bytes / 1048576.0, b.params.max_batch_tokens, b.params.max_logit_rows);
    o += "ops (layer, op, output [rows x shape] @ scratch float offset):\n";
    int shown_layer = -2;
    for (auto& op : g.ops) {
        if (op.layer > 0 && shown_layer >= 0 && op.layer != shown_layer) {
            // Layers after the first print only a count when they repeat.
            continue;
        }
        shown_layer = op.layer;
        std::string outs;
        for (int v : op.out) {
            auto& val = g.values[v];
            outs += fmt::format(" [{} x {}] @{}", val.rows == ir::Rows::tokens ? "T" : "R", fmt::join(val.dims, "x"),
                                v == g.output ? std::string("logits") : std::to_string(val.offset));
        }
        o += fmt::format("  {:>3} {:<14}{}{}\n", op.layer < 0 ? std::string("-") : std::to_string(op.layer),
                         ir::op_name(op.kind), outs, op.residual >= 0 ? " (+residual)" : "");
    }
    if (b.layers > 1) o += fmt::format("  (layers 1..{} repeat layer 0's ops)\n", b.layers - 1);
    return o;
}

std::string info_tables(const bind::Bound& b, const Sizes& s, const std::string& target) {
    const auto& g = b.graph;
    std::string o;
    // Names as ""sv literals: a string_view built from a plain literal runs char_traits::length at
    // compile time, and nvcc's constant evaluator gives up on tables of ~19k tensors (Qwen3-30B-A3B).
    o += "using namespace std::string_view_literals;\n";
    o += "constexpr TensorSpec kTensors[] = {\n";
    for (auto& t : g.tensors) {
        int64_t sh[4] = {0, 0, 0, 0};
        for (size_t i = 0; i < t.shape.size() && i < 4; ++i) sh[i] = t.shape[i];
        o += fmt::format("    {{{}sv, {}, {{{}, {}, {}, {}}}, DType::{}, {}}},\n", cpp_string(t.name), t.shape.size(), sh[0],
                         sh[1], sh[2], sh[3], dtype_name(t.dtype), t.optional ? "true" : "false");
    }
    o += "};\n\n";
    o += "// Every config.json value this code was specialized from; a model must match them all.\n";
    o += "constexpr ConfigKey kConfigKeys[] = {\n";
    for (auto& k : b.keys) o += fmt::format("    {{{}, {}}},\n", cpp_string(k.pointer), cpp_string(k.value_json));
    o += "};\n\n";
    o += "constexpr char kPlan[] = R\"PLAN(" + plan_text(b, s) + ")PLAN\";\n\n";
    int kv_heads = g.kv.empty() ? 0 : g.kv[0].kv_heads, head_dim = g.kv.empty() ? 0 : g.kv[0].head_dim;
    o += "constexpr ModelInfo kInfo{\n";
    o += fmt::format("    .stem = {}, .arch = {}, .quant = {}, .target = {}, .hf_architecture = {},\n", cpp_string(b.stem),
                     cpp_string(b.arch), cpp_string(b.preset.name), cpp_string(target), cpp_string(b.hf_architecture));
    o += fmt::format("    .vocab_size = {}, .hidden_size = {}, .num_layers = {}, .num_kv_heads = {}, .head_dim = {},\n",
                     b.vocab, b.hidden, b.layers, kv_heads, head_dim);
    o += fmt::format("    .max_position_embeddings = {}, .block_size = {}, .max_batch_tokens = {}, .max_logit_rows = {},\n",
                     b.max_position, b.params.block_size, b.params.max_batch_tokens, b.params.max_logit_rows);
    o += fmt::format("    .bos_token_id = {}, .eos_token_id = {},\n", b.bos, b.eos);
    o += fmt::format("    .kv_dtype = DType::{}, .kv_bytes_per_token = {}, .kv_bytes_per_block = {},\n",
                     dtype_name(b.preset.kv_cache), s.kv_bytes_per_token, s.kv_block_bytes);
    o += fmt::format("    .weight_bytes = {}, .scratch_bytes = {}, .active_weight_bytes = {},\n", s.weight_bytes,
                     s.scratch_bytes, s.active_weight_bytes);
    o += fmt::format("    .tensors = kTensors, .config_keys = kConfigKeys, .plan_text = kPlan, .sliding_window = {},\n",
                     freeable_window(g));
    if (b.preset.quantized())
        o += fmt::format("    .quant_config_json = {},\n", cpp_string(b.preset.quantization_config.dump()));
    o += "};\n";
    return o;
}

}  // namespace scr::emit
