// Quant presets and their application to the graph, at the compiler level: every shipped preset
// parses; malformed ones are an scr::Error naming the field; a quantized preset types the packed
// weights and adds their scale tensors; MoE experts are quantized in table order; MLA and stacked
// experts are refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "compiler/bind/binder.hpp"
#include "compiler/dsl/parser.hpp"
#include "runtime/core/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace scr;

namespace {

const fs::path kRoot = SCR_SOURCE_DIR;

json preset_json(const char* name) {
    std::ifstream in(kRoot / "models/quant" / (std::string(name) + ".json"));
    return json::parse(in);
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

std::string parse_error(json j) { return error_of([&] { quant::parse_preset(j, "p.json"); }); }

bind::Bound bind_real(const char* arch, const char* config, const char* q) {
    auto prog = dsl::parse_file((kRoot / "models/arch" / arch).string());
    std::ifstream in(kRoot / "models/configs" / config);
    auto p = quant::load_preset((kRoot / "models/quant" / (std::string(q) + ".json")).string());
    return bind::bind(prog, json::parse(in), config, "test", p, bind::BuildParams{});
}

}  // namespace

TEST(QuantPreset, ShippedPresetsParse) {
    for (const char* name : {"mlx-int4-g32", "mlx-int4-g64", "mlx-int4-g128", "int8", "fp8", "fp8-tensor"}) {
        auto p = quant::parse_preset(preset_json(name), name);
        EXPECT_TRUE(p.quantized()) << name;
        EXPECT_EQ(p.name, name);
    }
    auto g64 = quant::parse_preset(preset_json("mlx-int4-g64"), "g64");
    EXPECT_EQ(g64.bits, 4);
    EXPECT_EQ(g64.group_size, 64);
    EXPECT_EQ(g64.packed, DType::u32);
    EXPECT_EQ(quant::parse_preset(preset_json("int8"), "i").packed, DType::i8);
    EXPECT_TRUE(quant::parse_preset(preset_json("fp8-tensor"), "f").per_tensor);
}

TEST(QuantPreset, BadPresetsNameTheField) {
    auto g = preset_json("mlx-int4-g64");
    auto with = [&](const char* key, json v) {
        json j = g;
        j[key] = v;
        return parse_error(j);
    };
    EXPECT_NE(with("format", "gguf").find("weight format \"gguf\" is not supported"), std::string::npos);
    EXPECT_NE(with("bits", 3).find("bits 3"), std::string::npos);
    EXPECT_NE(with("group_size", 48).find("group_size 48"), std::string::npos);
    EXPECT_NE(with("group_size", "64").find("\"group_size\" must be an integer"), std::string::npos);
    EXPECT_NE(with("scale_dtype", "i8").find("scale_dtype"), std::string::npos);
    json no_block = g;
    no_block.erase("quantization_config");
    EXPECT_NE(parse_error(no_block).find("quantization_config"), std::string::npos);
    json mismatch = g;
    mismatch["quantization_config"]["group_size"] = 32;
    EXPECT_NE(parse_error(mismatch).find("disagrees"), std::string::npos);
    json ct = preset_json("int8");
    ct["weight_type"] = "uint";
    EXPECT_NE(parse_error(ct).find("weight_type"), std::string::npos);
    ct = preset_json("int8");
    ct["strategy"] = "tensor";
    EXPECT_NE(parse_error(ct).find("channel strategy only"), std::string::npos);
    ct = preset_json("fp8");
    ct["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 4;
    EXPECT_NE(parse_error(ct).find("num_bits 8"), std::string::npos);
}

TEST(QuantApply, PackedWeightsAndScaleTensors) {
    auto b = bind_real("llama.scr", "llama/tiny-llama.json", "mlx-int4-g32");
    const auto& t = b.graph.tensors;
    auto find = [&](const std::string& name) {
        for (size_t i = 0; i < t.size(); ++i)
            if (t[i].name == name) return int(i);
        return -1;
    };
    const int q = find("model.layers.1.self_attn.q_proj.weight");
    ASSERT_GE(q, 0);
    EXPECT_EQ(t[q].dtype, DType::u32);
    EXPECT_EQ(t[q].shape, (std::vector<int64_t>{96, 12}));
    EXPECT_EQ(t[q].logical, (std::vector<int64_t>{96, 96}));
    EXPECT_EQ(t[q].scales, q + 1);
    EXPECT_EQ(t[q + 1].name, "model.layers.1.self_attn.q_proj.scales");
    EXPECT_EQ(t[q + 1].shape, (std::vector<int64_t>{96, 3}));
    EXPECT_EQ(t[q + 2].name, "model.layers.1.self_attn.q_proj.biases");
    const int norm = find("model.layers.1.input_layernorm.weight");
    EXPECT_FALSE(t[norm].quantized());
    EXPECT_TRUE(t[find("model.embed_tokens.weight")].quantized());  // MLX quantizes embeddings
    // Every op still points at the right tensors after the table grew.
    for (auto& op : b.graph.ops)
        for (int w : op.weights)
            if (w >= 0) EXPECT_EQ(t[w].name.find(".scales"), std::string::npos);
    // compressed-tensors: linears only, [out, 1] scales; the embedding stays dense.
    auto c = bind_real("llama.scr", "llama/tiny-llama.json", "int8");
    for (auto& tensor : c.graph.tensors) {
        if (tensor.name == "model.embed_tokens.weight") EXPECT_FALSE(tensor.quantized());
        if (tensor.name == "model.layers.0.mlp.down_proj.weight") {
            EXPECT_EQ(tensor.dtype, DType::i8);
            EXPECT_EQ(c.graph.tensors[tensor.scales].shape, (std::vector<int64_t>{96, 1}));
        }
    }
    // g64 on 96-wide inputs: only the 192-wide down_proj divides by the group.
    auto g = bind_real("llama.scr", "llama/tiny-llama.json", "mlx-int4-g64");
    for (auto& tensor : g.graph.tensors)
        if (tensor.logical.size() || tensor.name.find("proj.weight") != std::string::npos)
            EXPECT_EQ(tensor.quantized(), tensor.name.find("down_proj") != std::string::npos) << tensor.name;
}

// MoE experts are quantized, each projection followed by its scales (and biases): the CPU kernel
// (kernels/cpu/moe.hpp: moe_quant) reads expert e's projection j at the op's first expert weight +
// (3 e + j) x the tensors per projection, so the table's layout is checked here. The router stays dense.
TEST(QuantApply, MoeExpertsQuantizedInTableOrder) {
    for (const char* q : {"mlx-int4-g32", "int8", "fp8-tensor"}) {
        auto b = bind_real("qwen3_moe.scr", "qwen3_moe/tiny-qwen3-moe.json", q);
        const auto& t = b.graph.tensors;
        const int per = std::string(q).rfind("mlx", 0) == 0 ? 3 : 2;
        int moes = 0;
        for (auto& op : b.graph.ops) {
            if (op.kind != ir::OpKind::moe) continue;
            ++moes;
            EXPECT_FALSE(t[op.weights[0]].quantized()) << q << ": router " << t[op.weights[0]].name;
            const int experts = int(op.attr.at("experts")), first = op.weights[1];
            ASSERT_EQ(experts, 4);
            for (int e = 0; e < experts; ++e)
                for (int j = 0; j < 3; ++j) {
                    const int w = op.weights[size_t(1 + 3 * e + j)];
                    EXPECT_EQ(w, first + (3 * e + j) * per) << q << ": " << t[w].name;
                    EXPECT_TRUE(t[w].quantized()) << q << ": " << t[w].name;
                    EXPECT_EQ(t[w].scales, w + 1) << t[w].name;
                    EXPECT_EQ(t[w].logical[1], j == 2 ? 64 : 96) << t[w].name;  // down: K = moe_intermediate_size
                }
        }
        EXPECT_EQ(moes, 3) << q;
    }
}

TEST(QuantApply, MoeRefusalsNameTheCause) {
    // g64 does not divide the 96-wide hidden size: the gate / up experts would stay dense.
    std::string e = error_of([] { bind_real("qwen3_moe.scr", "qwen3_moe/tiny-qwen3-moe.json", "mlx-int4-g64"); });
    EXPECT_NE(e.find("expert weight model.layers.0.mlp.experts.0.gate_proj.weight"), std::string::npos) << e;
    EXPECT_NE(e.find("not a multiple of group 64"), std::string::npos) << e;
    // GPT-OSS's stacked experts and MLA are not read quantized.
    e = error_of([] { bind_real("gpt_oss.scr", "gpt_oss/tiny-gpt-oss-h64.json", "mlx-int4-g32"); });
    EXPECT_NE(e.find("the moe op"), std::string::npos) << e;
    EXPECT_NE(e.find("stacked experts"), std::string::npos) << e;
    e = error_of([] { bind_real("deepseek_v3.scr", "deepseek_v3/tiny-deepseek-v3-h64.json", "int8"); });
    EXPECT_NE(e.find("the mla op"), std::string::npos) << e;
    EXPECT_NE(e.find("int8"), std::string::npos) << e;
}
