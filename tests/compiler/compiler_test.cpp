// The compiler's front half: DSL errors carry file:line:col, binding errors name the config key,
// every real architecture binds against its configs, and the memory plan never lets two live
// values overlap.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "compiler/bind/binder.hpp"
#include "compiler/dsl/parser.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/targets/emit.hpp"
#include "kernels/cpu/moe.hpp"
#include "runtime/core/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace scr;

namespace {

const fs::path kRoot = SCR_SOURCE_DIR;

json read_json(const fs::path& p) {
    std::ifstream in(p);
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

quant::Preset preset(const char* name) { return quant::load_preset((kRoot / "models/quant" / (std::string(name) + ".json")).string()); }

bind::Bound bind_file(const fs::path& arch, const json& cfg, const char* q = "f32") {
    auto prog = dsl::parse_file(arch.string());
    return bind::bind(prog, cfg, "config.json", "test", preset(q), bind::BuildParams{});
}

const char* kTiny = R"(arch t for TForCausalLM
const hidden = hidden_size
const vocab = vocab_size
const layers = num_hidden_layers
x = embed(tokens, model.embed_tokens)
for l in layers at model.layers.{l}:
  x = x + linear(x, mlp.proj) : [hidden]
logits = linear(x, lm_head) : [vocab]
)";

json tiny_config() {
    return json{{"architectures", {"TForCausalLM"}}, {"hidden_size", 32}, {"vocab_size", 50},
                {"num_hidden_layers", 2}, {"max_position_embeddings", 64}};
}

}  // namespace

TEST(Parser, SyntaxErrorsCarryFileLineColumn) {
    std::string msg = error_of([] { dsl::parse("a.scr", "arch t for X\nx = embed(tokens,\n"); });
    EXPECT_NE(msg.find("a.scr:2:"), std::string::npos) << msg;
    msg = error_of([] { dsl::parse("b.scr", "arch t for X\n  x = 1\n"); });
    EXPECT_NE(msg.find("b.scr:2:"), std::string::npos) << msg;
    msg = error_of([] { dsl::parse("c.scr", "arch t for X\nx = 1 $ 2\n"); });
    EXPECT_NE(msg.find("c.scr:2:7: unexpected character '$'"), std::string::npos) << msg;
    msg = error_of([] { dsl::parse("d.scr", "x = 1\n"); });
    EXPECT_NE(msg.find("d.scr:1:1: expected 'arch'"), std::string::npos) << msg;
}

TEST(Parser, ParsesShapesTernariesFallbacksAndBlocks) {
    auto p = dsl::parse("t.scr", kTiny);
    EXPECT_EQ(p.arch, "t");
    ASSERT_EQ(p.hf_architectures.size(), 1u);
    ASSERT_EQ(p.stmts.size(), 6u);
    EXPECT_EQ(p.stmts[4]->kind, dsl::StmtKind::for_layers);
    EXPECT_EQ(p.stmts[4]->prefix, "model.layers.{l}");
    EXPECT_EQ(p.stmts[5]->value->kind, dsl::ExprKind::shaped);
}

TEST(Binder, MissingConfigKeyIsNamed) {
    auto cfg = tiny_config();
    cfg.erase("vocab_size");
    auto prog = dsl::parse("t.scr", kTiny);
    std::string msg = error_of([&] { bind::bind(prog, cfg, "cfg.json", "t", preset("f32"), {}); });
    EXPECT_NE(msg.find("vocab_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("t.scr:3:"), std::string::npos) << msg;
}

TEST(Binder, WrongArchitectureIsRefused) {
    auto cfg = tiny_config();
    cfg["architectures"] = {"OtherForCausalLM"};
    auto prog = dsl::parse("t.scr", kTiny);
    std::string msg = error_of([&] { bind::bind(prog, cfg, "cfg.json", "t", preset("f32"), {}); });
    EXPECT_NE(msg.find("OtherForCausalLM is not served by t.scr"), std::string::npos) << msg;
}

TEST(Binder, ShapeErrorsNameTheOp) {
    const char* bad = R"(arch t for TForCausalLM
const hidden = hidden_size
const vocab = vocab_size
const layers = num_hidden_layers
x = embed(tokens, model.embed_tokens)
y = linear(x, a) : [7]
x = x + y
logits = linear(x, lm_head) : [vocab]
)";
    auto prog = dsl::parse("s.scr", bad);
    std::string msg = error_of([&] { bind::bind(prog, tiny_config(), "cfg.json", "t", preset("f32"), {}); });
    EXPECT_NE(msg.find("s.scr:7:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("widths 32 and 7"), std::string::npos) << msg;
    const char* noshape = "arch t for TForCausalLM\nconst hidden = hidden_size\nconst vocab = vocab_size\nx = embed(tokens, e)\nlogits = linear(x, h)\n";
    msg = error_of([&] { bind::bind(dsl::parse("n.scr", noshape), tiny_config(), "cfg.json", "t", preset("f32"), {}); });
    EXPECT_NE(msg.find("n.scr:5:10: linear() needs its output shape"), std::string::npos) << msg;
}

TEST(Binder, RecordsEveryConfigValueItRead) {
    auto b = bind::bind(dsl::parse("t.scr", kTiny), tiny_config(), "cfg.json", "t", preset("f32"), {});
    std::map<std::string, std::string> keys;
    for (auto& k : b.keys) keys[k.pointer] = k.value_json;
    EXPECT_EQ(keys["/hidden_size"], "32");
    EXPECT_EQ(keys["/vocab_size"], "50");
    EXPECT_EQ(keys["/architectures/0"], "\"TForCausalLM\"");
    // Two layers unrolled, tensors named by the loop prefix.
    ASSERT_EQ(b.graph.tensors.size(), 4u);
    EXPECT_EQ(b.graph.tensors[2].name, "model.layers.1.mlp.proj.weight");
}

TEST(Binder, FallbackUsesTheDefaultWhenTheKeyIsNullOrAbsent) {
    auto cfg = read_json(kRoot / "tests/fixtures/Qwen3MoeForCausalLM/config.json");
    ASSERT_FALSE(cfg.contains("head_dim"));
    auto b = bind_file(kRoot / "models/arch/qwen3_moe.scr", cfg);
    std::map<std::string, std::string> consts(b.consts.begin(), b.consts.end());
    EXPECT_EQ(consts["head_dim"], "16");        // hidden / heads
    EXPECT_EQ(consts["experts"], "4");          // num_local_experts, since num_experts is absent
    cfg["head_dim"] = nullptr;
    b = bind_file(kRoot / "models/arch/qwen3_moe.scr", cfg);
    consts = {b.consts.begin(), b.consts.end()};
    EXPECT_EQ(consts["head_dim"], "16");
}

TEST(Binder, Llama3RopeScalingMatchesTheFormula) {
    auto cfg = read_json(kRoot / "models/configs/llama/llama-3.2-1b.json");
    auto b = bind_file(kRoot / "models/arch/llama.scr", cfg, "bf16");
    const ir::Op* rope = nullptr;
    for (auto& op : b.graph.ops)
        if (op.kind == ir::OpKind::rope) { rope = &op; break; }
    ASSERT_NE(rope, nullptr);
    ASSERT_EQ(rope->table.size(), 32u);
    // Independent float64 evaluation of the llama3 rule (factor 32, low 1, high 4, old ctx 8192).
    for (int i = 0; i < 32; ++i) {
        double inv = 1.0 / std::pow(500000.0, double(float(2 * i) / 64.0f));
        double wl = 2 * M_PI / inv, want;
        if (wl < 8192.0 / 4) want = inv;
        else if (wl > 8192.0 / 1) want = inv / 32;
        else {
            double s = (8192.0 / wl - 1) / (4 - 1);
            want = (1 - s) * inv / 32 + s * inv;
        }
        EXPECT_NEAR(rope->table[size_t(i)], want, std::abs(want) * 1e-6) << i;
    }
}

// Binds every checked-in config (models/configs/<arch>/*.json) against its architecture with the
// bf16 preset and hands the result to fn, under a trace naming the config.
template <class Fn>
void for_each_checked_in_config(Fn&& fn) {
    for (auto& dir : fs::directory_iterator(kRoot / "models/configs")) {
        if (!dir.is_directory()) continue;
        fs::path arch = kRoot / "models/arch" / (dir.path().filename().string() + ".scr");
        if (!fs::exists(arch)) continue;
        for (auto& f : fs::directory_iterator(dir.path())) {
            if (f.path().extension() != ".json") continue;
            SCOPED_TRACE(f.path().string());
            auto b = bind_file(arch, read_json(f.path()), "bf16");
            fn(b);
        }
    }
}

// The scratch the binder reserves for a MoE op holds the CPU kernels' workspace layout
// (kernels/cpu/moe.hpp: moe_workspace_floats) at the most rows of a step, for every checked-in MoE
// config: top-k 2 (Mixtral, Qwen3-MoE toys), 4 (GPT-OSS) and 8 (Qwen3-30B-A3B, DeepSeek-V3). The
// generated code asserts the same at compile time; this test names the config.
TEST(Binder, MoeWorkspaceHoldsTheCpuKernelsLayout) {
    int checked = 0;
    std::set<int64_t> top_ks;
    for_each_checked_in_config([&](bind::Bound& b) {
        for (auto& op : b.graph.ops) {
            if (op.kind != ir::OpKind::moe) continue;
            auto a = [&](const char* k) { return int64_t(op.attr.at(k)); };
            const int64_t need = scr::kernels::cpu::moe_workspace_floats(bind::BuildParams{}.max_batch_tokens, a("hidden"), a("experts"),
                                                                         a("top_k"), (a("layout") ? 3 : 2) * a("ffn"));
            EXPECT_GE(op.workspace, need) << "layer " << op.layer << ", top-k " << a("top_k");
            top_ks.insert(a("top_k"));
            ++checked;
        }
    });
    EXPECT_GT(checked, 0);
    EXPECT_TRUE(top_ks.count(8) && top_ks.count(4) && top_ks.count(2)) << "the configs should cover top-k 2, 4 and 8";
}

// Every real architecture binds against every config of its folder, and after fusion and
// planning no two values that are live at the same time share scratch bytes.
TEST(Plan, LiveValuesNeverOverlapForEveryCheckedInConfig) {
    int checked = 0;
    for_each_checked_in_config([&](bind::Bound& b) {
        passes::fuse(b.graph);
        passes::plan_memory(b.graph, 64, 16);
        const auto& g = b.graph;
        // Live interval of each storage region: [def, last use].
        std::vector<int> def(g.values.size(), -1), last(g.values.size(), -1);
        for (size_t i = 0; i < g.ops.size(); ++i) {
            for (int v : g.ops[i].out) def[v] = int(i);
            for (int v : g.ops[i].in) last[v] = int(i);
            if (g.ops[i].residual >= 0) last[g.ops[i].residual] = int(i);
        }
        last[g.output] = int(g.ops.size());
        auto rows = [&](const ir::Value& v) { return v.rows == ir::Rows::tokens ? 64 : 16; };
        for (size_t a = 0; a < g.values.size(); ++a)
            for (size_t c = a + 1; c < g.values.size(); ++c) {
                const auto &va = g.values[a], &vc = g.values[c];
                if (def[a] < 0 || def[c] < 0 || int(a) == g.output || int(c) == g.output) continue;
                if (va.alias_of == int(c) || vc.alias_of == int(a)) continue;
                // Overlapping lifetimes (a value is written at def, read until last).
                bool live_together = def[a] < std::max(last[c], def[c]) && def[c] < std::max(last[a], def[a]);
                if (!live_together) continue;
                int64_t a0 = va.offset, a1 = a0 + rows(va) * va.width();
                int64_t c0 = vc.offset, c1 = c0 + rows(vc) * vc.width();
                bool chain = false;  // in-place chains share storage by design
                for (int x = int(c); x >= 0 && !chain; x = g.values[x].alias_of) chain = x == int(a);
                for (int x = int(a); x >= 0 && !chain; x = g.values[x].alias_of) chain = x == int(c);
                if (chain) continue;
                EXPECT_TRUE(a1 <= c0 || c1 <= a0) << "values " << a << " and " << c << " overlap";
            }
        EXPECT_GT(g.scratch_floats, 0);
        ++checked;
    });
    EXPECT_GE(checked, 4);
}

TEST(Plan, FusionFoldsSwigluAndResiduals) {
    auto b = bind_file(kRoot / "models/arch/llama.scr", read_json(kRoot / "tests/fixtures/LlamaForCausalLM/config.json"));
    auto s = passes::fuse(b.graph);
    EXPECT_EQ(s.swiglu, 3);       // one per layer
    EXPECT_EQ(s.residual, 6);     // attention out + MLP down, per layer
    for (auto& op : b.graph.ops) {
        EXPECT_NE(op.kind, ir::OpKind::add);
        EXPECT_NE(op.kind, ir::OpKind::silu);
    }
}

TEST(Quant, PresetErrorsNameTheField) {
    std::string msg = error_of([] { quant::parse_preset(json{{"name", "x"}, {"linear", "int3"}}, "p.json"); });
    EXPECT_NE(msg.find("p.json: field \"linear\": unknown dtype \"int3\""), std::string::npos) << msg;
    msg = error_of([] { quant::parse_preset(json{{"linear", "bf16"}}, "p.json"); });
    EXPECT_NE(msg.find("missing string field \"name\""), std::string::npos) << msg;
    msg = error_of([] { quant::parse_preset(json{{"name", "x"}, {"kv_cache", "f16"}}, "p.json"); });
    EXPECT_NE(msg.find("not supported for this role"), std::string::npos) << msg;
}

TEST(Emit, GeneratedCodeHasLiteralShapes) {
    auto b = bind_file(kRoot / "models/arch/llama.scr", read_json(kRoot / "tests/fixtures/LlamaForCausalLM/config.json"));
    passes::fuse(b.graph);
    passes::plan_memory(b.graph, 512, 256);
    std::string code = emit::emit_cpu(b);
    EXPECT_NE(code.find("k::linear_swiglu<192, 96, float>"), std::string::npos);
    EXPECT_NE(code.find("k::attention<6, 2, 16, 16, float>"), std::string::npos);
    EXPECT_NE(code.find("for (int l = 1; l < 3; ++l)"), std::string::npos) << code;  // identical layers fold
}

// The CUDA target's MoE: quantized experts run as k::moe_quant over the preset's format (the experts'
// table at the first expert weight, as the CPU target reads it), dense ones as k::moe; routings the
// CUDA kernels do not implement are refused by name, never emitted as softmax top-k.
TEST(Emit, CudaMoeOverQuantizedExpertsAndRefusedRoutings) {
    const fs::path arch = kRoot / "models/arch/qwen3_moe.scr";
    const json cfg = read_json(kRoot / "tests/fixtures/Qwen3MoeForCausalLM/config.json");
    auto emit_with = [&](const char* q) {
        auto b = bind_file(arch, cfg, q);
        passes::fuse(b.graph);
        passes::plan_memory(b.graph, 512, 256);
        return emit::emit_cuda(b);
    };
    const std::string int8 = emit_with("int8");
    EXPECT_NE(int8.find("k::moe_quant<96, 64, 4, 2, true, k::qdetail::Int8Channel<bf16_t>, float>("), std::string::npos) << int8;
    EXPECT_EQ(int8.find("k::moe<"), std::string::npos);
    const std::string int4 = emit_with("mlx-int4-g32");
    EXPECT_NE(int4.find("k::moe_quant<96, 64, 4, 2, true, k::qdetail::MlxInt4<32, bf16_t>, float>("), std::string::npos) << int4;
    const std::string dense = emit_with("bf16");
    EXPECT_NE(dense.find("k::moe<96, 64, 4, 2, true, bf16_t,"), std::string::npos) << dense;
    EXPECT_EQ(dense.find("k::moe_quant<"), std::string::npos);

    // The same architecture with DeepSeek's sigmoid scoring: the CPU target runs it, CUDA refuses it.
    std::ifstream in(arch);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string plain = "normalize=norm_topk)";
    ASSERT_NE(text.find(plain), std::string::npos);
    text.replace(text.find(plain), plain.size(), "normalize=norm_topk, scoring=\"sigmoid\")");
    auto b = bind::bind(dsl::parse("sigmoid.scr", text), cfg, "config.json", "test", preset("bf16"), bind::BuildParams{});
    passes::fuse(b.graph);
    passes::plan_memory(b.graph, 512, 256);
    EXPECT_NE(emit::emit_cpu(b).find("k::Scoring::sigmoid"), std::string::npos);
    const std::string msg = error_of([&] { emit::emit_cuda(b); });
    EXPECT_NE(msg.find("the CUDA target implements MoE with softmax top-k routing over per-expert weights only (layer 0"),
              std::string::npos)
        << msg;
}
