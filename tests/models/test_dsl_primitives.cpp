// The DSL primitives added for architecture breadth, at the compiler level: what they record in the
// graph (windows, compressed MLA KV, rope attributes) and that misuse is an scr::Error naming the
// problem rather than a wrong model. Numerics are covered end to end by the transformers fixtures.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "compiler/bind/binder.hpp"
#include "compiler/dsl/parser.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/targets/emit.hpp"
#include "runtime/core/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace scr;

namespace {

const fs::path kRoot = SCR_SOURCE_DIR;

quant::Preset preset(const char* name) {
    return quant::load_preset((kRoot / "models/quant" / (std::string(name) + ".json")).string());
}

bind::Bound bind_src(const std::string& src, const json& cfg, const char* q = "f32") {
    auto prog = dsl::parse("test.scr", src);
    return bind::bind(prog, cfg, "config.json", "test", preset(q), bind::BuildParams{});
}

bind::Bound bind_real(const char* arch, const char* config, const char* q = "bf16") {
    auto prog = dsl::parse_file((kRoot / "models/arch" / arch).string());
    std::ifstream in(kRoot / "models/configs" / config);
    return bind::bind(prog, json::parse(in), config, "test", preset(q), bind::BuildParams{});
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

json config() {
    return json{{"architectures", {"TForCausalLM"}}, {"hidden_size", 32}, {"vocab_size", 50}, {"num_attention_heads", 4},
                {"num_hidden_layers", 2}, {"max_position_embeddings", 64}, {"types", {"sliding", "full"}}};
}

// A two-layer model whose middle line is the statement under test.
std::string program(const std::string& body, const std::string& consts = "") {
    return "arch t for TForCausalLM\nconst hidden = hidden_size\nconst vocab = vocab_size\nconst layers = num_hidden_layers\n" +
           consts + "x = embed(tokens, model.embed_tokens)\nfor l in layers at model.layers.{l}:\n" + body +
           "logits = linear(x, lm_head) : [vocab]\n";
}

const std::string kAttention =
    "  q = linear(x, self_attn.q_proj) : [4, 8]\n  k = linear(x, self_attn.k_proj) : [2, 8]\n"
    "  v = linear(x, self_attn.v_proj) : [2, 8]\n";

TEST(Window, PerLayerWindowsAndTheFreeableWindow) {
    auto b = bind_src(program(kAttention + "  x = x + linear(attention(q, k, v, window=types[l] == \"sliding\" ? 16 : 0), o) : [hidden]\n",
                              "const types = types\n"),
                      config());
    ASSERT_EQ(b.graph.kv.size(), 2u);
    EXPECT_EQ(b.graph.kv[0].window, 16);
    EXPECT_EQ(b.graph.kv[1].window, 0);
    EXPECT_EQ(emit::freeable_window(b.graph), 0) << "a full layer keeps every block";
    auto all = bind_src(program(kAttention + "  x = x + linear(attention(q, k, v, window=8 * (l + 1)), o) : [hidden]\n"), config());
    EXPECT_EQ(emit::freeable_window(all.graph), 16) << "the largest window when every layer has one";
}

TEST(Window, NegativeWindowIsAnError) {
    auto e = error_of([] { bind_src(program(kAttention + "  x = x + linear(attention(q, k, v, window=-1), o) : [hidden]\n"), config()); });
    EXPECT_NE(e.find("window -1 must be >= 0"), std::string::npos) << e;
}

TEST(Lists, IndexOutsideTheListNamesIt) {
    auto e = error_of([] {
        bind_src(program(kAttention + "  x = x + linear(attention(q, k, v, window=types[l + 1] == \"full\" ? 4 : 0), o) : [hidden]\n",
                         "const types = types\n"),
                 config());
    });
    EXPECT_NE(e.find("index 2 is outside the list of 2 items"), std::string::npos) << e;
    EXPECT_NE(e.find("test.scr:"), std::string::npos) << "errors carry the DSL location: " << e;
}

TEST(Split, SizesMustCoverTheDim) {
    auto ok = bind_src(program("  a, b = split(linear(x, p) : [3, 8], [1, 2], dim=0)\n  x = x + linear(b, o) : [hidden]\n"), config());
    int slices = 0;
    for (auto& op : ok.graph.ops)
        if (op.kind == ir::OpKind::slice) {
            ++slices;
            EXPECT_EQ(op.attr.at("outer"), 1);
            EXPECT_EQ(op.attr.at("stride"), 24);
        }
    EXPECT_EQ(slices, 4);  // two pieces, two layers
    auto e = error_of([] {
        bind_src(program("  a, b = split(linear(x, p) : [hidden], [10, 20])\n  x = x + linear(b, o) : [hidden]\n"), config());
    });
    EXPECT_NE(e.find("sizes add up to 30 but the dim has 32"), std::string::npos) << e;
}

TEST(Rmsnorm, OffsetIsZeroOrOne) {
    auto e = error_of([] { bind_src(program("  x = rmsnorm(x, n, 1e-6, offset=2)\n"), config()); });
    EXPECT_NE(e.find("offset must be 0 or 1"), std::string::npos) << e;
}

TEST(Rope, PerLayerTypeParametersNeedALayerType) {
    auto cfg = config();
    cfg["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                              {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
    auto e = error_of([&] { bind_src(program(kAttention + "  q, k = rope(q, k)\n  x = x + linear(attention(q, k, v), o) : [hidden]\n"), cfg); });
    EXPECT_NE(e.find("pass layer_type="), std::string::npos) << e;
    auto b = bind_src(program(kAttention + "  q, k = rope(q, k, layer_type=l == 0 ? \"sliding_attention\" : \"full_attention\")\n"
                                           "  x = x + linear(attention(q, k, v), o) : [hidden]\n"),
                      cfg);
    std::vector<std::vector<float>> tables;
    for (auto& op : b.graph.ops)
        if (op.kind == ir::OpKind::rope) tables.push_back(op.table);
    ASSERT_EQ(tables.size(), 2u);
    EXPECT_FLOAT_EQ(tables[0][1], float(1.0 / std::pow(1e4, 2.0 / 8)));  // base 10^4, dim 8, i = 1
    EXPECT_FLOAT_EQ(tables[1][1], float(1.0 / std::pow(1e6, 2.0 / 8)));
}

TEST(Rope, YarnAndLongropeCarryTheirAttentionFactor) {
    auto cfg = config();
    cfg["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}, {"factor", 32.0}, {"original_max_position_embeddings", 16}};
    auto b = bind_src(program(kAttention + "  q, k = rope(q, k)\n  x = x + linear(attention(q, k, v), o) : [hidden]\n"), cfg);
    for (auto& op : b.graph.ops)
        if (op.kind == ir::OpKind::rope) EXPECT_NEAR(op.attr.at("mscale"), 0.1 * std::log(32.0) + 1.0, 1e-12);
    cfg["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1e4}, {"original_max_position_embeddings", 16},
                              {"short_factor", {1, 1, 1}}, {"long_factor", {2, 2, 2, 2}}};
    auto e = error_of([&] { bind_src(program(kAttention + "  q, k = rope(q, k)\n  x = x + linear(attention(q, k, v), o) : [hidden]\n"), cfg); });
    EXPECT_NE(e.find("\"short_factor\" as a list of 4 numbers"), std::string::npos) << e;
}

TEST(Moe, GroupedTopKMustFitTheKeptGroups) {
    auto e = error_of([] {
        bind_src(program("  x = x + moe(x, gate, experts.{e}, experts=8, top_k=5, ffn=16, scoring=\"sigmoid\", groups=4, topk_groups=2)\n"),
                 config());
    });
    EXPECT_NE(e.find("top_k 5 exceeds the 4 experts of 2 kept groups"), std::string::npos) << e;
    auto e2 = error_of([] { bind_src(program("  x = x + moe(x, gate, experts.{e}, experts=8, top_k=2, ffn=16, scoring=\"max\")\n"), config()); });
    EXPECT_NE(e2.find("scoring \"max\""), std::string::npos) << e2;
}

// DeepSeek-V3's compressed cache: kv_lora_rank + qk_rope_head_dim values per token and layer, no
// separate V — computed here from the published config, not from the compiler.
TEST(Mla, DeepSeekV3CachesTheLatentOnly) {
    auto b = bind_real("deepseek_v3.scr", "deepseek_v3/deepseek-v3.json");
    ASSERT_EQ(b.graph.kv.size(), 61u);
    for (auto& kv : b.graph.kv) {
        EXPECT_TRUE(kv.v_shared);
        EXPECT_EQ(kv.kv_heads, 1);
        EXPECT_EQ(kv.head_dim, 512 + 64);
    }
    auto s = emit::sizes_of(b);
    EXPECT_EQ(s.kv_bytes_per_token, int64_t(61) * (512 + 64) * 2);  // bf16 cache
    // Uncompressed it would be 61 layers x 128 heads x (192 + 128) values: 42x more.
    EXPECT_GT(int64_t(61) * 128 * (192 + 128) * 2 / s.kv_bytes_per_token, 40);
}

// The weight bytes a decode token reads (the bandwidth floor of `scr bench` / `scr cuda-bench`): an
// untied embedding table costs one row, a tied one is read whole by the LM head.
TEST(Sizes, ReadPerTokenCountsOneRowOfAnUntiedEmbedding) {
    const int64_t table = int64_t(128256) * 4096 * 2;  // Llama-3.1-8B embed_tokens, bf16
    auto b8 = bind_real("llama.scr", "llama/llama-3.1-8b.json");
    auto s8 = emit::sizes_of(b8);
    EXPECT_EQ(s8.weight_bytes - s8.active_weight_bytes, table - 4096 * 2);
    auto b1 = bind_real("llama.scr", "llama/llama-3.2-1b.json");  // tie_word_embeddings: true
    auto s1 = emit::sizes_of(b1);
    EXPECT_EQ(s1.active_weight_bytes, s1.weight_bytes);
}

// A MoE token reads top_k of its experts. Quantized, an expert is stored as codes plus scales and
// (MLX) biases, and all three of an inactive expert are not read: Qwen3-30B-A3B at MLX int4 g64 reads
// 9/16 byte per weight (4 bits + a bf16 scale and bias per 64), computed here from the published config.
TEST(Sizes, ReadPerTokenSkipsInactiveExpertsWithTheirScales) {
    const int64_t layers = 48, experts = 128, top_k = 8, hidden = 2048, ffn = 768, vocab = 151936;
    const int64_t expert_weights = 3 * hidden * ffn;  // gate, up, down
    const int64_t unread_experts = layers * (experts - top_k);
    auto bf = emit::sizes_of(bind_real("qwen3_moe.scr", "qwen3_moe/qwen3-30b-a3b.json", "bf16"));
    EXPECT_EQ(bf.weight_bytes - bf.active_weight_bytes, unread_experts * expert_weights * 2 + (vocab - 1) * hidden * 2);
    auto q4 = emit::sizes_of(bind_real("qwen3_moe.scr", "qwen3_moe/qwen3-30b-a3b.json", "mlx-int4-g64"));
    EXPECT_EQ(q4.weight_bytes - q4.active_weight_bytes,
              unread_experts * expert_weights * 9 / 16 + (vocab - 1) * hidden * 9 / 16);
}

TEST(Window, RealConfigsFreeBlocksOnlyWhenEveryLayerIsWindowed) {
    EXPECT_EQ(emit::freeable_window(bind_real("gpt_oss.scr", "gpt_oss/gpt-oss-120b.json").graph), 0);
    EXPECT_EQ(emit::freeable_window(bind_real("gemma2.scr", "gemma2/gemma-2-2b-it.json").graph), 0);
    auto phi = bind_real("phi3.scr", "phi3/phi-3.5-mini-instruct.json");
    EXPECT_EQ(emit::freeable_window(phi.graph), 262144) << "Phi-3.5-mini sets sliding_window on every layer";
}

}  // namespace
