// Every transformers fixture model whose config is compiled into this build (f32):
//  * chunked prefill (1, 5, 16 tokens per forward) gives the same last logits, bit for bit, as one
//    forward over the whole prompt: sliding windows, MoE routing and MLA behave the same whatever
//    the step boundaries;
//  * ModelInfo::sliding_window promises that blocks wholly before the window are never read: with
//    those block-table entries pointed at a block full of NaN (what a freed-and-reused block may
//    hold) the logits are unchanged — the contract the engine's KV manager relies on to free them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

#include "runtime/core/error.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/model/sequence_runner.hpp"

using namespace scr;
namespace fs = std::filesystem;

namespace {

// The fixture folders whose config this build compiles in (written by tests/models/CMakeLists.txt).
std::vector<fs::path> fixture_dirs() {
    std::vector<fs::path> out;
    std::ifstream in(SCR_FIXTURE_LIST);
    for (std::string line; std::getline(in, line);)
        if (!line.empty()) out.emplace_back(line);
    return out;
}

// The longest fixture input, at most max_len tokens.
std::vector<int32_t> longest_input(const fs::path& dir, size_t max_len = SIZE_MAX) {
    std::ifstream in(dir / "reference.json");
    auto ref = nlohmann::json::parse(in);
    std::vector<int32_t> best;
    for (auto& seq : ref["inputs"])
        if (seq.size() > best.size() && seq.size() <= max_len) best = seq.get<std::vector<int32_t>>();
    return best;
}

// Longrope switches every position of a step to the long frequencies once the sequence is longer
// than original_max_position_embeddings (transformers' seq_len rule), so a prompt crossing that
// length depends on where the steps split it; chunking is only invariant below it.
size_t chunk_invariant_length(const fs::path& dir) {
    std::ifstream in(dir / "config.json");
    auto c = nlohmann::json::parse(in);
    auto rp = c.value("rope_parameters", nlohmann::json::object());
    if (rp.is_object() && rp.value("rope_type", "") == "longrope")
        return rp.value("original_max_position_embeddings", c.value("original_max_position_embeddings", size_t(0)));
    return SIZE_MAX;
}

LoadedModel load(const fs::path& dir) {
    LoadOptions lo;
    lo.quant = "f32";
    lo.load_text = false;
    lo.threads = 1;  // deterministic either way; one thread avoids barrier stalls on a loaded CI machine
    return load_model(dir.string(), lo);
}

class FixtureModel : public ::testing::TestWithParam<fs::path> {};

TEST_P(FixtureModel, ChunkedPrefillIsBitIdentical) {
    LoadedModel lm = load(GetParam());
    auto prompt = longest_input(GetParam(), chunk_invariant_length(GetParam()));
    ASSERT_GT(prompt.size(), 16u);
    SequenceRunner whole(*lm.model, int(prompt.size()));
    auto want = whole.feed(prompt);
    for (int chunk : {1, 5, 16}) {
        SequenceRunner run(*lm.model, int(prompt.size()));
        auto got = run.feed(prompt, false, chunk);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
            << GetParam() << ": chunks of " << chunk << " differ from one forward";
    }
}

// Feeds the prompt one block at a time with its own block table; before each step, every entry
// wholly before the window of the step's first token points at a block of NaNs.
TEST_P(FixtureModel, BlocksBehindTheWindowAreNeverRead) {
    LoadedModel lm = load(GetParam());
    const ModelInfo& m = lm.model->info();
    if (m.sliding_window == 0) GTEST_SKIP() << m.stem << " keeps every block (no window on every layer)";
    auto prompt = longest_input(GetParam());
    const int n = int(prompt.size()), bs = m.block_size;
    ASSERT_GT(n, m.sliding_window + 2 * bs) << "the fixture's prompt must reach well past the window";
    const int blocks = (n + bs - 1) / bs, poison = blocks;  // one extra block of NaNs
    std::vector<std::byte> pool_bytes(static_cast<size_t>(blocks + 1) * static_cast<size_t>(m.kv_bytes_per_block));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    ASSERT_EQ(m.kv_dtype, DType::f32);
    for (size_t i = 0; i < size_t(m.kv_bytes_per_block) / 4; ++i)
        std::memcpy(pool_bytes.data() + size_t(poison) * size_t(m.kv_bytes_per_block) + 4 * i, &nan, 4);
    KvPool pool{pool_bytes.data(), blocks + 1};
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    std::iota(table.begin(), table.end(), 0);
    std::vector<float> logits(static_cast<size_t>(m.vocab_size));
    int freed = 0;
    for (int start = 0; start < n; start += bs) {
        const int len = std::min(bs, n - start);
        // vLLM SlidingWindowManager.remove_skipped_blocks: first useful token = computed - window + 1.
        const int first_useful_block = std::max(0, start - m.sliding_window + 1) / bs;
        for (int b = 0; b < first_useful_block; ++b)
            if (table[size_t(b)] != poison) { table[size_t(b)] = poison; ++freed; }
        std::vector<int32_t> pos(static_cast<size_t>(len)), qs{0, len};
        std::vector<int64_t> slots(static_cast<size_t>(len));
        for (int i = 0; i < len; ++i) {
            pos[size_t(i)] = start + i;
            slots[size_t(i)] = int64_t(table[size_t((start + i) / bs)]) * bs + (start + i) % bs;
        }
        int32_t seq_len = start + len, row = len - 1;
        StepBatch b;
        b.num_tokens = len;
        b.token_ids = prompt.data() + start;
        b.positions = pos.data();
        b.slot_mapping = slots.data();
        b.num_seqs = 1;
        b.query_start = qs.data();
        b.seq_lens = &seq_len;
        b.block_tables = table.data();
        b.block_table_stride = blocks;
        b.num_logits = 1;
        b.logit_rows = &row;
        lm.model->forward(b, pool, logits.data());
    }
    EXPECT_GT(freed, 0);
    SequenceRunner whole(*lm.model, n);
    auto want = whole.feed(prompt, false, bs);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x)) << "a block behind the window was read";
    EXPECT_EQ(0, std::memcmp(logits.data(), want.data(), want.size() * sizeof(float)));
}

std::string name_of(const ::testing::TestParamInfo<fs::path>& p) {
    std::string s = p.param.parent_path().filename().string() + "_" + p.param.filename().string();
    for (auto& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureModel, ::testing::ValuesIn(fixture_dirs()), name_of);

// Built only when the three window fixtures are compiled in (tests/models/CMakeLists.txt).
#ifdef SCR_HAVE_WINDOW_FIXTURES
TEST(ModelInfo, WindowIsFreeableOnlyWhenEveryLayerHasOne) {
    auto info = [](const char* dir) { return load(dir).model->info().sliding_window; };
    EXPECT_EQ(16, info(SCR_MODEL_FIXTURES_DIR "/MistralForCausalLM-sw16"));
    EXPECT_EQ(0, info(SCR_FIXTURES_DIR "/long/MistralForCausalLM"));     // sliding_window: null
    EXPECT_EQ(0, info(SCR_MODEL_FIXTURES_DIR "/Qwen2ForCausalLM-swlayer1"));  // layer 0 is full
}
#endif

}  // namespace
