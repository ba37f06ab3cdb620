// The Spyre planner: every tile it emits fits the budget it was given (checked with the same
// arithmetic the emulator allocates by), covers its op, and an op that cannot fit is an error
// naming the op, the layer, the tile, the bytes and what to change.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "compiler/bind/binder.hpp"
#include "compiler/dsl/parser.hpp"
#include "compiler/passes/passes.hpp"
#include "compiler/targets/spyre_emitter.hpp"
#include "compiler/targets/spyre_plan.hpp"
#include "runtime/core/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace scr;
namespace sp = scr::kernels::spyre;

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

bind::Bound bound(const std::string& arch, const fs::path& config, bind::BuildParams params = {}) {
    auto prog = dsl::parse_file((kRoot / "models/arch" / (arch + ".scr")).string());
    auto preset = quant::load_preset((kRoot / "models/quant/f32.json").string());
    auto b = bind::bind(prog, read_json(config), config.string(), config.stem().string(), preset, params);
    passes::fuse(b.graph);
    passes::plan_memory(b.graph, params.max_batch_tokens, params.max_logit_rows);
    return b;
}

const fs::path kTinyLlama = kRoot / "models/configs/llama/tiny-llama.json";
const fs::path kTinyMoe = kRoot / "models/configs/qwen3_moe/tiny-qwen3-moe.json";
const fs::path kLlama8B = kRoot / "tests/spyre/configs/llama-3.1-8b.json";
const fs::path kGranite8B = kRoot / "tests/spyre/configs/granite-3.x-8b.json";

bool valid(const spyre::AnyPlan& p) {
    return std::visit([](const auto& x) { return x.valid() && sp::buffers_stick_aligned(x); }, p);
}

// Every kernel of a plan fits, is valid, and the plan covers every op of the graph.
void expect_sound(const bind::Bound& b, const spyre::Plan& p) {
    ASSERT_EQ(p.ops.size(), b.graph.ops.size());
    for (auto& op : p.ops) {
        ASSERT_FALSE(op.kernels.empty()) << op.label;
        for (auto& k : op.kernels) {
            EXPECT_EQ(k.resident, spyre::resident_of(k.plan)) << op.label;
            EXPECT_LE(k.resident, p.lx_bytes) << op.label << " layer " << op.layer << " " << k.what;
            EXPECT_TRUE(valid(k.plan)) << op.label << " " << k.what;
            EXPECT_GE(k.cores_used, 1);
            EXPECT_LE(k.cores_used, sp::kCores);
        }
    }
    // Device regions of live values never overlap the weights or each other's neighbours' sizes.
    EXPECT_GE(p.dev.activations_begin, p.dev.weight_bytes + p.dev.constants_bytes + p.dev.step_bytes);
    EXPECT_GT(p.dev.total, p.dev.activations_begin);
}

TEST(SpyrePlanner, TinyModelsFitAtEveryBudgetOrFailLoudly) {
    for (const fs::path& cfg : {kTinyLlama, kTinyMoe}) {
        const auto b = bound(cfg == kTinyMoe ? "qwen3_moe" : "llama", cfg);
        int fits = 0;
        for (int64_t budget : {100000, 200000, 400000, 1000000, 1677721}) {
            spyre::Plan p;
            const std::string e = error_of([&] { p = spyre::plan_spyre(b, budget); });
            if (!e.empty()) {
                EXPECT_NE(e.find("does not fit the scratchpad"), std::string::npos) << e;
                continue;
            }
            ++fits;
            expect_sound(b, p);
        }
        EXPECT_GE(fits, 3) << cfg;
    }
}

TEST(SpyrePlanner, TilesGrowWithTheBudget) {
    const auto b = bound("llama", kTinyLlama);
    const auto small = spyre::plan_spyre(b, 120000), big = spyre::plan_spyre(b, 1677721);
    int64_t small_max = 0, big_max = 0;
    for (size_t i = 0; i < small.ops.size(); ++i)
        for (size_t k = 0; k < small.ops[i].kernels.size(); ++k) {
            small_max = std::max(small_max, small.ops[i].kernels[k].resident);
            big_max = std::max(big_max, big.ops[i].kernels[k].resident);
        }
    EXPECT_LE(small_max, 120000);
    EXPECT_GT(big_max, small_max);
}

TEST(SpyrePlanner, Llama31_8BFitsTheDefaultScratchpad) {
    const auto b = bound("llama", kLlama8B);
    const auto p = spyre::plan_spyre(b, sp::kLxUsableBytes);
    expect_sound(b, p);
    // 4096 hidden = 64 sticks: q_proj's 64 output sticks go 2 per core over all 32 cores.
    const spyre::OpPlan* q = nullptr;
    for (auto& op : p.ops)
        if (op.layer == 0 && op.label == "linear self_attn.q_proj") q = &op;
    ASSERT_NE(q, nullptr);
    const auto& lin = std::get<sp::LinearPlan>(q->kernels[0].plan);
    EXPECT_EQ(lin.cores, 32);
    EXPECT_EQ(lin.sticks_per_core, 2);
    EXPECT_EQ(lin.k_sticks, 64);
    // The weights as uploaded: 8.03 B parameters in fp16, every dim already a multiple of 64.
    EXPECT_EQ(p.dev.weight_bytes, int64_t(2) * (128256LL * 4096 * 2 + 32LL * (4096LL * 4096 * 2 + 1024LL * 4096 * 2 +
                                                                               3LL * 4096 * 14336 + 2 * 4096) + 4096));
    EXPECT_EQ(p.dev.kv_bytes_per_token, 32LL * 2 * 8 * 128 * 2);  // 128 KiB per token in fp16
    const std::string text = spyre::plan_spyre_text(b, p);
    EXPECT_NE(text.find("tightest tiles:"), std::string::npos);
    EXPECT_NE(text.find("(layers 1..31: same tiles as layer 0)"), std::string::npos) << text;
}

TEST(SpyrePlanner, Granite8BFitsTheDefaultScratchpad) {
    const auto b = bound("granite", kGranite8B);
    const auto p = spyre::plan_spyre(b, sp::kLxUsableBytes);
    expect_sound(b, p);
    // 12800 = 200 sticks of ffn: 7 per core over 29 cores for gate/up.
    for (auto& op : p.ops)
        if (op.layer == 0 && op.label == "linear_swiglu mlp.gate_proj") {
            const auto& lin = std::get<sp::LinearPlan>(op.kernels[0].plan);
            EXPECT_EQ(lin.sticks_per_core, 7);
            EXPECT_EQ(lin.cores, 29);
        }
    // Granite's logits are the tied head's output divided by logits_scaling: the scale op writes f32.
    const auto& last = p.ops.back();
    EXPECT_EQ(last.label, "scale -> logits");
    EXPECT_TRUE(std::get<sp::EltwisePlan>(last.kernels[0].plan).out_f32);
    EXPECT_FLOAT_EQ(std::get<sp::EltwisePlan>(last.kernels[0].plan).factor, 1.0f / 16);
}

TEST(SpyrePlanner, LessThanOneStickNamesTheScratchpadTheOpAndTheBudget) {
    const auto b = bound("llama", kTinyLlama);
    const std::string e = error_of([&] { spyre::plan_spyre(b, 120); });
    EXPECT_NE(e.find("SCR_SPYRE_SCRATCHPAD_BYTES = 120 bytes"), std::string::npos) << e;
    EXPECT_NE(e.find("smaller than one 128-byte stick"), std::string::npos) << e;
    EXPECT_NE(e.find("op embed embed_tokens"), std::string::npos) << e;
    EXPECT_NE(e.find("scratchpad"), std::string::npos) << e;
}

TEST(SpyrePlanner, AnOversizedOpNamesLayerTileBytesAndTheFix) {
    // 16,000 bytes hold every row op of tiny-llama but not the smallest linear tile. For o_proj
    // (input 6 heads x 16 = 6 sticks, output 96 = 2 sticks, fused residual) that tile is 1 row x 1
    // output stick x 1 K stick: x 2 x 128 + w 2 x (64 x 128) + acc 64 x 4 + residual 2 x 128 +
    // y 2 x 128 = 17,408 bytes.
    const auto b = bound("llama", kTinyLlama);
    const std::string e = error_of([&] { spyre::plan_spyre(b, 16000); });
    EXPECT_NE(e.find("layers 0,1,2, op linear self_attn.o_proj: its smallest tile [1 row x 1 out stick x 1 K stick of 6] "
                     "needs 17,408 bytes of scratchpad per core, but the budget is 16,000 bytes"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("1,408 bytes short"), std::string::npos) << e;
    EXPECT_NE(e.find("raise SCR_SPYRE_SCRATCHPAD_BYTES to at least 17408"), std::string::npos) << e;
    EXPECT_NE(e.find("op linear_swiglu mlp.gate_proj"), std::string::npos) << e;
    EXPECT_EQ(e.find("rmsnorm"), std::string::npos) << "row ops fit 16,000 bytes: " << e;
    EXPECT_EQ(e.find("op attention"), std::string::npos) << "attention fits 16,000 bytes: " << e;
}

TEST(SpyrePlanner, MoeRoutingAdvisesFewerBatchTokens) {
    bind::BuildParams params;
    params.max_batch_tokens = 65536;
    params.max_logit_rows = 256;
    const auto b = bound("qwen3_moe", kTinyMoe, params);
    const std::string e = error_of([&] { spyre::plan_spyre(b, 1000000); });
    EXPECT_NE(e.find("op moe route"), std::string::npos) << e;
    EXPECT_NE(e.find("lower SCR_MAX_BATCH_TOKENS (now 65536) to at most"), std::string::npos) << e;
}

TEST(SpyrePlanner, AttentionBlockTableOfAHugeContextIsNamed) {
    auto cfg = read_json(kTinyLlama);
    cfg["max_position_embeddings"] = 1 << 26;  // a 64M-token context: a 16 MiB block table
    const fs::path tmp = fs::temp_directory_path() / "spyre_huge_context.json";
    std::ofstream(tmp) << cfg.dump();
    const auto b = bound("llama", tmp);
    const std::string e = error_of([&] { spyre::plan_spyre(b, sp::kLxUsableBytes); });
    fs::remove(tmp);
    EXPECT_NE(e.find("op attention"), std::string::npos) << e;
    EXPECT_NE(e.find("block table"), std::string::npos) << e;
    EXPECT_NE(e.find("physical 2 MiB"), std::string::npos) << e;
}

TEST(SpyrePlanner, BudgetBeyondThePhysicalScratchpadIsRefused) {
    const auto b = bound("llama", kTinyLlama);
    EXPECT_NE(error_of([&] { spyre::plan_spyre(b, 2097153); }).find("physical"), std::string::npos);
}

TEST(SpyrePlanner, EmittedSourceCarriesThePlanAndItsChecks) {
    const auto b = bound("llama", kTinyLlama);
    const std::string src = emit::emit_spyre(b, sp::kLxUsableBytes);
    EXPECT_NE(src.find("constexpr int64_t kLxBytes = 1677721;"), std::string::npos);
    EXPECT_NE(src.find("static_assert(sp::resident_bytes(kTile0) <= kLxBytes"), std::string::npos);
    EXPECT_NE(src.find(".target = \"spyre\""), std::string::npos);
    EXPECT_NE(src.find("tightest tiles:"), std::string::npos);  // ModelInfo::plan_text, what scr info prints
    EXPECT_NE(src.find("for (int l = 0; l < 3; ++l)"), std::string::npos);  // identical layers fold
}

}  // namespace
