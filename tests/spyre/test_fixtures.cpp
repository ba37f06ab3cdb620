// The Spyre specializations compiled into this build, run on the emulator, against the
// transformers fp32 fixtures (tests/fixtures): last-position logits within the stated fp16
// tolerance, the 16-token greedy continuation decoded one token per step over the paged KV cache,
// and the batch invariance the engine relies on (chunked, batched with another sequence on
// shuffled blocks, or alone: the same bits).
//
// Tolerance: the device holds fp16 (unit roundoff u = 2^-11 = 4.9e-4) and rounds once per stored
// element, about 10 times per layer; products and sums are f32. Those roundings are independent,
// so a layer's relative error is about sqrt(10) u ~ 1.5e-3 and L layers compound to about
// sqrt(L) of that: 2.7e-3 for the 3-layer fixtures. kRelTol = 1e-2 leaves 3-4x for the
// amplification through attention softmax and the final norm; the measured worst is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "runtime/core/error.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/model/sequence_runner.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace scr;

namespace {

constexpr double kRelTol = 1e-2;
const fs::path kFixtures = fs::path(SCR_SOURCE_DIR) / "tests/fixtures";

struct Reference {
    std::vector<std::vector<int32_t>> inputs;
    std::vector<std::vector<float>> logits_last;
    std::vector<int32_t> greedy;
};

Reference read_reference(const fs::path& dir) {
    std::ifstream in(dir / "reference.json");
    const json j = json::parse(in);
    Reference r;
    r.inputs = j.at("inputs").get<std::vector<std::vector<int32_t>>>();
    r.logits_last = j.at("logits_last").get<std::vector<std::vector<float>>>();
    r.greedy = j.at("greedy_16").get<std::vector<int32_t>>();
    return r;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        den += double(want[i]) * want[i];
    }
    return std::sqrt(num / den);
}

class SpyreFixture : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        dir_ = kFixtures / GetParam();
        LoadOptions opt;
        opt.load_text = false;
        lm_ = load_model(dir_.string(), opt);
        ASSERT_EQ(lm_.entry->info->target, "spyre") << "this test runs the spyre specializations";
        ref_ = read_reference(dir_);
    }
    fs::path dir_;
    LoadedModel lm_;
    Reference ref_;
};

TEST_P(SpyreFixture, LastLogitsWithinFp16Tolerance) {
    double worst = 0;
    for (size_t i = 0; i < ref_.inputs.size(); ++i) {
        SequenceRunner run(*lm_.model, int(ref_.inputs[i].size()));
        const auto got = run.feed(ref_.inputs[i]);
        ASSERT_EQ(got.size(), ref_.logits_last[i].size());
        const double e = rel_err(got, ref_.logits_last[i]);
        worst = std::max(worst, e);
        EXPECT_LE(e, kRelTol) << "input " << i << " (" << ref_.inputs[i].size() << " tokens)";
    }
    std::printf("[ spyre    ] %s: worst relative logit error %.2e over %zu inputs (tolerance %.0e)\n", GetParam().c_str(), worst,
                ref_.inputs.size(), kRelTol);
}

// The reference continuation, decoded one token per step over the paged cache. A dense model must
// reproduce it exactly (the smallest top-1/top-2 gap on these paths is 0.025, ten times our logit
// noise). An MoE model's continuation also depends on its router's top-k choices, and fp16 can flip
// a choice whose margin is within its noise: measured, the shared Qwen3-MoE fixture routes token 19
// in layer 1 with a 2.96e-4 margin between its 2nd and 3rd expert (probabilities 0.1908 / 0.1905),
// which fp16 flips. So MoE steps are checked teacher-forced (each step from the reference prefix,
// so one flip does not derail the rest) and may disagree at one step of the 16.
TEST_P(SpyreFixture, GreedyDecodeOverPagedKvMatches) {
    const bool moe = GetParam().find("Moe") != std::string::npos;
    const auto& prompt = ref_.inputs[0];
    SequenceRunner run(*lm_.model, int(prompt.size()) + 16);
    auto logits = run.feed(prompt);
    std::vector<int32_t> got;
    int disagree = 0;
    for (int i = 0; i < 16; ++i) {
        const int32_t mine = argmax(logits);
        got.push_back(mine);
        disagree += mine != ref_.greedy[size_t(i)];
        const int32_t next = moe ? ref_.greedy[size_t(i)] : mine;
        if (i + 1 < 16) logits = run.feed(std::span<const int32_t>(&next, 1));  // one decode step
    }
    if (moe) EXPECT_LE(disagree, 1) << ::testing::PrintToString(got);
    else EXPECT_EQ(got, ref_.greedy);
}

// The longest input (230 tokens for long/: 15 KV blocks) fed one token per step: every step is a
// paged decode, and the last one must match the reference and the one-step prefill bit for bit.
TEST_P(SpyreFixture, TokenByTokenDecodeMatchesReferenceAndPrefill) {
    size_t longest = 0;
    for (size_t i = 1; i < ref_.inputs.size(); ++i)
        if (ref_.inputs[i].size() > ref_.inputs[longest].size()) longest = i;
    const auto& seq = ref_.inputs[longest];
    SequenceRunner prefill(*lm_.model, int(seq.size())), decode(*lm_.model, int(seq.size()));
    const auto whole = prefill.feed(seq);
    const auto steps = decode.feed(seq, false, 1);
    EXPECT_EQ(whole, steps);
    EXPECT_LE(rel_err(steps, ref_.logits_last[longest]), kRelTol) << seq.size() << " tokens";
}

// Prefill in chunks of 7 (many steps, blocks filled across steps) gives the bits of one step.
TEST_P(SpyreFixture, ChunkedPrefillIsBitIdentical) {
    const auto& longest = *std::max_element(ref_.inputs.begin(), ref_.inputs.end(),
                                            [](auto& a, auto& b) { return a.size() < b.size(); });
    SequenceRunner whole(*lm_.model, int(longest.size())), chunked(*lm_.model, int(longest.size()));
    const auto a = whole.feed(longest);
    const auto b = chunked.feed(longest, false, 7);
    EXPECT_EQ(a, b);
}

// Two sequences in one step, on shuffled KV blocks, each get the logits they get alone.
TEST_P(SpyreFixture, BatchedWithAnotherSequenceIsBitIdentical) {
    const ModelInfo& info = lm_.model->info();
    const auto& s0 = ref_.inputs[0];
    const auto& s1 = ref_.inputs[1];
    std::vector<std::vector<float>> alone;
    for (auto* s : {&s0, &s1}) {
        SequenceRunner r(*lm_.model, int(s->size()));
        alone.push_back(r.feed(*s));
    }
    const int bs = info.block_size;
    const int b0 = int((s0.size() + bs - 1) / bs), b1 = int((s1.size() + bs - 1) / bs), blocks = b0 + b1 + 3;
    std::vector<int32_t> perm(static_cast<size_t>(blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    const int stride = std::max(b0, b1);
    std::vector<int32_t> tables(size_t(2 * stride), 0);
    for (int j = 0; j < b0; ++j) tables[size_t(j)] = perm[size_t(j)];
    for (int j = 0; j < b1; ++j) tables[size_t(stride + j)] = perm[size_t(b0 + j)];
    std::vector<int32_t> ids, pos, rows;
    std::vector<int64_t> slots;
    for (int s = 0; s < 2; ++s) {
        const auto& seq = s ? s1 : s0;
        for (size_t i = 0; i < seq.size(); ++i) {
            ids.push_back(seq[i]);
            pos.push_back(int32_t(i));
            slots.push_back(int64_t(tables[size_t(s * stride) + i / size_t(bs)]) * bs + int64_t(i % size_t(bs)));
        }
    }
    const int n0 = int(s0.size()), n = int(ids.size());
    int32_t qs[3] = {0, n0, n}, lens[2] = {n0, n - n0}, want_rows[2] = {n0 - 1, n - 1};
    std::vector<std::byte> kv(size_t(blocks) * size_t(info.kv_bytes_per_block));
    KvPool pool{kv.data(), blocks};
    StepBatch b;
    b.num_tokens = n;
    b.token_ids = ids.data();
    b.positions = pos.data();
    b.slot_mapping = slots.data();
    b.num_seqs = 2;
    b.query_start = qs;
    b.seq_lens = lens;
    b.block_tables = tables.data();
    b.block_table_stride = stride;
    b.num_logits = 2;
    b.logit_rows = want_rows;
    std::vector<float> logits(size_t(2 * info.vocab_size));
    lm_.model->forward(b, pool, logits.data());
    EXPECT_TRUE(std::equal(alone[0].begin(), alone[0].end(), logits.begin()));
    EXPECT_TRUE(std::equal(alone[1].begin(), alone[1].end(), logits.begin() + info.vocab_size));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SpyreFixture,
                         ::testing::Values("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "long/LlamaForCausalLM",
                                           "long/Qwen3ForCausalLM", "long/Qwen3MoeForCausalLM", "seed5/GraniteForCausalLM"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (auto& c : s)
                                 if (c == '/') c = '_';
                             return s;
                         });

TEST(SpyreModel, ABadBatchIsAnErrorNotAnOverrun) {
    LoadOptions opt;
    opt.load_text = false;
    auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), opt);
    const ModelInfo& info = lm.model->info();
    std::vector<std::byte> kv(size_t(info.kv_bytes_per_block));
    KvPool pool{kv.data(), 1};
    int32_t id = 5, pos = 0, qs[2] = {0, 1}, len = 1, table = 0, row = 0;
    int64_t slot = 99;  // outside the one-block pool
    StepBatch b;
    b.num_tokens = 1;
    b.token_ids = &id;
    b.positions = &pos;
    b.slot_mapping = &slot;
    b.num_seqs = 1;
    b.query_start = qs;
    b.seq_lens = &len;
    b.block_tables = &table;
    b.block_table_stride = 1;
    b.num_logits = 1;
    b.logit_rows = &row;
    std::vector<float> logits(size_t(info.vocab_size));
    EXPECT_THROW(lm.model->forward(b, pool, logits.data()), Error);
    slot = 0;
    EXPECT_NO_THROW(lm.model->forward(b, pool, logits.data()));
}

}  // namespace
