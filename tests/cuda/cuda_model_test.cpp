// The CUDA target against independent references, on a GPU (every test skips without one, so CI,
// which has none, only compiles this):
//  * the transformers fixtures (f32 reference logits and greedy continuations);
//  * a batched decode step (graph of a padded bucket) equals each sequence decoded alone, bit for
//    bit (decode GEMVs and attention never mix rows);
//  * the engine, unchanged, drives the CUDA model: several greedy requests at once give the same
//    tokens as each prompt alone through SequenceRunner;
//  * a bad step is an scr::Error and leaves the model usable.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "kernels/cuda/step.hpp"
#include "runtime/core/error.hpp"
#include "runtime/cuda/cuda_model.hpp"
#include "runtime/cuda/prefill_gemm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/model/sequence_runner.hpp"

namespace fs = std::filesystem;
using namespace scr;

namespace {

const fs::path kFixtures = fs::path(SCR_SOURCE_DIR) / "tests/fixtures";

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Without a GPU (CI, this machine) the device tests skip; on the GPU machine tests/cuda/device_run.sh
// sets SCR_REQUIRE_GPU=1, so a device that cannot be opened fails them instead of skipping.
#define REQUIRE_GPU()                                                                          \
    if (!have_gpu()) {                                                                         \
        if (std::getenv("SCR_REQUIRE_GPU")) FAIL() << "SCR_REQUIRE_GPU is set but no CUDA device"; \
        GTEST_SKIP() << "no CUDA device";                                                     \
    }

double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
}

class Fixture : public ::testing::TestWithParam<std::string> {};

// f32 specializations against transformers' f32 logits: 1e-4 relative (the fixtures' README asks
// ~1e-5 of an f32 engine; GPU summation orders differ from the reference's, and the long inputs
// run 230 tokens through 3 layers), and the same 16 greedy tokens.
TEST_P(Fixture, MatchesTransformers) {
    REQUIRE_GPU();
    const fs::path dir = kFixtures / GetParam();
    auto lm = load_model(dir.string(), LoadOptions{.quant = "f32", .load_text = false});
    ASSERT_EQ(lm.model->info().target, "cuda");
    std::ifstream in(dir / "reference.json");
    const auto ref = nlohmann::json::parse(in);
    for (size_t i = 0; i < ref["inputs"].size(); ++i) {
        auto ids = ref["inputs"][i].get<std::vector<int32_t>>();
        SequenceRunner run(*lm.model, int(ids.size()) + 1);
        auto logits = run.feed(ids);
        EXPECT_LT(rel_err(logits, ref["logits_last"][i].get<std::vector<double>>()), 1e-4) << GetParam() << " input " << i;
    }
    auto ids = ref["inputs"][0].get<std::vector<int32_t>>();
    SequenceRunner run(*lm.model, int(ids.size()) + 17);
    auto logits = run.feed(ids);
    std::vector<int32_t> greedy;
    for (int i = 0; i < 16; ++i) {
        greedy.push_back(argmax(logits));
        logits = run.feed(std::span<const int32_t>(&greedy.back(), 1));
    }
    EXPECT_EQ(greedy, ref["greedy_16"].get<std::vector<int32_t>>()) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Cuda, Fixture,
                         ::testing::Values("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "long/LlamaForCausalLM",
                                           "long/Qwen3ForCausalLM", "long/Qwen3MoeForCausalLM"),
                         [](const auto& info) {
                             std::string s = info.param;
                             for (auto& c : s)
                                 if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                             return s;
                         });

// Sequences with made-up prompts: three fixed ones (4, 19 and 1 tokens), then generated ones of
// 1-19 tokens; `next` is each one's decode token.
struct DecodeSeqs {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int32_t> next;
};
DecodeSeqs make_seqs(int V, int seqs) {
    DecodeSeqs d{{{5, 9, 2, 7}, {11, 3, 3, 3, 3, 3, 8, 1, 4, 4, 4, 4, 4, 4, 4, 4, 9, 1, 2}, {17}}, {6, 12, 30}};
    for (int s = 3; s < seqs; ++s) {
        d.prompts.emplace_back();
        for (int i = 0; i < 1 + (s * 7) % 19; ++i) d.prompts.back().push_back(1 + (s * 13 + i * 5) % (V - 1));
        d.next.push_back(2 + (s * 11) % (V - 2));
    }
    d.prompts.resize(size_t(seqs));
    d.next.resize(size_t(seqs));
    return d;
}

// One sequence's prompt prefilled alone (one step, no logits) into the pool blocks `table` names
// (row stride `stride`).
void prefill_alone(CompiledModel& m, KvPool& pool, const std::vector<int32_t>& prompt, const int32_t* table, int stride) {
    const int bs = m.info().block_size, n = int(prompt.size());
    std::vector<int32_t> pos(n);
    std::vector<int64_t> slots(n);
    for (int i = 0; i < n; ++i) {
        pos[i] = i;
        slots[i] = int64_t(table[i / bs]) * bs + i % bs;
    }
    int32_t qs[2] = {0, n}, len = n;
    StepBatch b;
    b.num_tokens = n;
    b.token_ids = prompt.data();
    b.positions = pos.data();
    b.slot_mapping = slots.data();
    b.num_seqs = 1;
    b.query_start = qs;
    b.seq_lens = &len;
    b.block_tables = table;
    b.block_table_stride = stride;
    m.forward(b, pool, nullptr);
}

// One decode step of the sequences `order` names (each prefilled into row s of `tables`, stride
// `per`), in that order, each with its `next` token: the logits, [place in order][vocab].
std::vector<float> decode_step(CompiledModel& m, KvPool& pool, const DecodeSeqs& d, const std::vector<int>& order,
                               const std::vector<int32_t>& tables, int per) {
    const int V = m.info().vocab_size, bs = m.info().block_size, S = int(order.size());
    std::vector<int32_t> pos(S), qs(S + 1), lens(S), rows(S), next(S);
    std::vector<int64_t> slots(S);
    for (int s = 0; s < S; ++s) {
        const int p = int(d.prompts[size_t(order[s])].size());
        pos[s] = p;
        lens[s] = p + 1;
        slots[s] = int64_t(tables[size_t(s) * per + p / bs]) * bs + p % bs;
        qs[s] = s;
        rows[s] = s;
        next[s] = d.next[size_t(order[s])];
    }
    qs[S] = S;
    StepBatch b;
    b.num_tokens = S;
    b.token_ids = next.data();
    b.positions = pos.data();
    b.slot_mapping = slots.data();
    b.num_seqs = S;
    b.query_start = qs.data();
    b.seq_lens = lens.data();
    b.block_tables = tables.data();
    b.block_table_stride = per;
    b.num_logits = S;
    b.logit_rows = rows.data();
    std::vector<float> logits(size_t(S) * V);
    m.forward(b, pool, logits.data());
    return logits;
}

// The sequences `order` names, each prefilled alone into its own blocks of one pool (blocks in no
// particular order), then decoding together in one step, in that order: the logits of each (by
// its place in `order`). The step runs twice (its graph captured, then replayed), with the same bits.
std::vector<std::vector<float>> decode_together(CompiledModel& m, const DecodeSeqs& d, const std::vector<int>& order) {
    const int V = m.info().vocab_size;
    const int per = 4, S = int(order.size());
    std::vector<std::byte> anchor(16);
    KvPool pool{anchor.data(), S * per};
    std::vector<int32_t> tables(size_t(S) * per);
    std::iota(tables.begin(), tables.end(), 0);
    std::reverse(tables.begin(), tables.end());
    for (int s = 0; s < S; ++s) prefill_alone(m, pool, d.prompts[size_t(order[s])], tables.data() + size_t(s) * per, per);
    const std::vector<float> first = decode_step(m, pool, d, order, tables, per);
    const std::vector<float> again = decode_step(m, pool, d, order, tables, per);
    EXPECT_EQ(std::memcmp(first.data(), again.data(), first.size() * 4), 0) << "a decode step's graph replay differs from its first run";
    std::vector<std::vector<float>> out(static_cast<size_t>(S));
    for (int s = 0; s < S; ++s) out[size_t(s)].assign(first.begin() + ptrdiff_t(s) * V, first.begin() + ptrdiff_t(s + 1) * V);
    return out;
}

// `seqs` sequences of different lengths decoding in one step (a padded graph bucket) give, bit for
// bit, what batch invariance promises (kernels/cuda/step.hpp: kGemvRegimeRows):
//  * in the GEMV's regime (f32 weights at any decode row count; bf16 buckets of one row): the
//    logits each sequence gets decoded alone;
//  * bf16 buckets of 2-32 rows (the MMA linears): the logits each gets in another batch of that
//    regime, twice the rows (a larger bucket) with the sequences in reverse order among others.
// Returns the step's logits, [seq][vocab].
std::vector<float> batched_keeps_the_bits(const std::string& fixture, const std::string& quant, int seqs = 3) {
    auto lm = load_model((kFixtures / fixture).string(), LoadOptions{.quant = quant, .load_text = false});
    CompiledModel& m = *lm.model;
    const int V = m.info().vocab_size;
    int bucket = 1;
    while (bucket < seqs) bucket *= 2;
    // Twice the rows must stay inside the MMA linears' regime (cuBLASLt from 33 rows).
    if (2 * seqs > 32) ADD_FAILURE() << "batched_keeps_the_bits takes at most 16 sequences, not " << seqs;
    const bool gemv_regime = quant != "bf16" || bucket <= kernels::cuda::kGemvRegimeRows;
    const DecodeSeqs d = make_seqs(V, gemv_regime ? seqs : 2 * seqs);
    std::vector<int> order(static_cast<size_t>(seqs));
    std::iota(order.begin(), order.end(), 0);
    const std::vector<std::vector<float>> batched = decode_together(m, d, order);
    std::vector<std::vector<float>> ref(static_cast<size_t>(seqs));
    if (gemv_regime) {
        for (int s = 0; s < seqs; ++s) {
            SequenceRunner r(m, 64);
            r.feed(d.prompts[size_t(s)]);
            ref[size_t(s)] = r.feed(std::span<const int32_t>(&d.next[size_t(s)], 1));
        }
    } else {
        std::vector<int> other(size_t(2 * seqs));
        std::iota(other.rbegin(), other.rend(), 0);  // 2 seqs - 1, ..., 0: sequence s at row 2 seqs - 1 - s
        const std::vector<std::vector<float>> o = decode_together(m, d, other);
        for (int s = 0; s < seqs; ++s) ref[size_t(s)] = o[size_t(2 * seqs - 1 - s)];
    }
    std::vector<float> logits;
    for (int s = 0; s < seqs; ++s) {
        size_t differ = 0;
        for (int v = 0; v < V; ++v) differ += std::memcmp(&batched[size_t(s)][size_t(v)], &ref[size_t(s)][size_t(v)], 4) != 0;
        EXPECT_EQ(differ, 0u) << fixture << "/" << quant << " seq " << s << " of " << seqs << ": " << differ << " logits differ from "
                              << (gemv_regime ? "the sequence decoded alone" : "the same sequence in a batch of twice the rows");
        logits.insert(logits.end(), batched[size_t(s)].begin(), batched[size_t(s)].end());
    }
    return logits;
}

TEST(CudaBatch, DecodeStepEqualsAloneF32) {
    REQUIRE_GPU();
    batched_keeps_the_bits("LlamaForCausalLM", "f32");
    batched_keeps_the_bits("Qwen3MoeForCausalLM", "f32");
}

// bf16: both regimes of the linears (one sequence: the GEMV, against itself through SequenceRunner;
// 2, 3 and 6 sequences, buckets 2, 4 and 8: the MMA linear, against batches of twice the rows,
// buckets 4, 8 and 16).
TEST(CudaBatch, DecodeStepKeepsTheBitsBf16) {
    REQUIRE_GPU();
    for (const char* fixture : {"LlamaForCausalLM", "Qwen3ForCausalLM"})
        for (int seqs : {1, 2, 3, 6}) batched_keeps_the_bits(fixture, "bf16", seqs);
}

// MoE routing with one warp per row and with the serial one-thread-per-row kernel: the same logits,
// bit for bit (ids, weights and the softmax's sum order are the same).
TEST(CudaBatch, MoeWarpRoutingKeepsTheBits) {
    REQUIRE_GPU();
    kernels::cuda::moe_route_override() = 1;  // serial
    const std::vector<float> serial = batched_keeps_the_bits("Qwen3MoeForCausalLM", "f32", 6);
    kernels::cuda::moe_route_override() = 0;  // a warp per row
    const std::vector<float> warp = batched_keeps_the_bits("Qwen3MoeForCausalLM", "f32", 6);
    kernels::cuda::moe_route_override() = -1;
    ASSERT_EQ(serial.size(), warp.size());
    size_t differ = 0;
    for (size_t i = 0; i < serial.size(); ++i) differ += std::memcmp(&serial[i], &warp[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << differ << " of " << serial.size() << " logits differ";
}

// The fused decode attention with each query group in one block and with the group's heads split
// over blocks (rope_attention_kernel's GS): the same logits, bit for bit, for every sequence of a
// decode step (and each against its regime's reference, inside batched_keeps_the_bits).
TEST(CudaBatch, AttentionHeadSplitKeepsTheBits) {
    REQUIRE_GPU();
    for (const auto& [fixture, quant] : {std::pair{"LlamaForCausalLM", "bf16"}, std::pair{"Qwen3ForCausalLM", "f32"}}) {
        kernels::cuda::attention_split_override() = 0;  // never split
        const std::vector<float> whole = batched_keeps_the_bits(fixture, quant, 6);
        kernels::cuda::attention_split_override() = 1 << 20;  // always split
        const std::vector<float> split = batched_keeps_the_bits(fixture, quant, 6);
        kernels::cuda::attention_split_override() = -1;
        ASSERT_EQ(whole.size(), split.size());
        size_t differ = 0;
        for (size_t i = 0; i < whole.size(); ++i) differ += std::memcmp(&whole[i], &split[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << fixture << "/" << quant << ": " << differ << " of " << whole.size() << " logits differ";
    }
}

// The decode attention's context split (kernels/cuda/attention.cuh) through the model's steps:
// every token forced into 3 parts (the fixtures' contexts, at most 16 KV blocks, are too short to
// take more than one). Only part 0 then holds KV blocks, so the split must give exactly the
// single-block merge's bits (its one live partial rescaled by expf(0) = 1, the empty ones adding 0;
// the fixtures have no sinks): this checks the tickets, the blocks along z, the parts taken in
// turn and the head split in real batch-1 decode steps (the split's rows: launches of more keep
// one part), each against itself through SequenceRunner. The split's arithmetic over live parts is
// scr_cuda_attention's run_parts_case.
TEST(CudaBatch, AttentionPartsKeepTheBits) {
    REQUIRE_GPU();
    namespace kc = kernels::cuda;
    for (const auto& [fixture, quant] : {std::pair{"LlamaForCausalLM", "bf16"}, std::pair{"Qwen3ForCausalLM", "f32"}}) {
        const std::vector<float> one = batched_keeps_the_bits(fixture, quant, 1);
        kc::attention_parts_every_token_override() = 3;
        const std::vector<float> spread = batched_keeps_the_bits(fixture, quant, 1);
        kc::attention_part_blocks_override() = 1;
        const std::vector<float> in_turn = batched_keeps_the_bits(fixture, quant, 1);
        kc::attention_part_blocks_override() = -1;
        kc::attention_split_override() = 0;
        const std::vector<float> whole_group = batched_keeps_the_bits(fixture, quant, 1);
        kc::attention_split_override() = -1;
        kc::attention_parts_every_token_override() = -1;
        ASSERT_EQ(one.size(), spread.size());
        size_t differ = 0;
        for (size_t i = 0; i < spread.size(); ++i) {
            differ += std::memcmp(&spread[i], &one[i], sizeof(float)) != 0;
            differ += std::memcmp(&spread[i], &in_turn[i], sizeof(float)) != 0;
            differ += std::memcmp(&spread[i], &whole_group[i], sizeof(float)) != 0;
        }
        EXPECT_EQ(differ, 0u) << fixture << "/" << quant << ": " << differ << " logits differ (split with empty parts, on a block each, in "
                              << "turn, without the head split, against the single-block merge)";
    }
}

// A decode graph captured before cuBLASLt's scratch grew holds the freed buffer's address; the model
// drops its graphs and captures again when the scratch's epoch moves (runtime/cuda/cuda_model.cpp,
// graphs_scratch_epoch). With the scratch released first, 40 bf16 sequences decode together (the
// bucket of 64 rows, on cuBLASLt) until the graph is replayed, then one long prompt is prefilled
// (more rows than the scratch held), then the same decode step runs again: its graph is captured
// anew and its logits keep their bits. Under compute-sanitizer's memcheck (tests/cuda/qpass_rule_ab.sh,
// PHASE=graphs) a stale graph would also show as accesses to freed memory.
TEST(CudaGraphs, DecodeGraphsCapturedAgainAfterTheScratchGrows) {
    REQUIRE_GPU();
    auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "bf16", .load_text = false});
    auto* m = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
    ASSERT_NE(m, nullptr);
    const int V = m->info().vocab_size, bs = m->info().block_size;
    const int S = 40, per = 4, long_len = std::min({240, m->info().max_position_embeddings - 1, m->info().max_batch_tokens});
    const int long_blocks = (long_len + bs - 1) / bs;
    ASSERT_GE(S, cuda_rt::cublas_min_rows()) << "the decode step must run on cuBLASLt";
    cuda_rt::cublas_release_scratch();  // so that the steps below grow it, whatever ran before
    std::vector<std::byte> anchor(16);
    KvPool pool{anchor.data(), S * per + long_blocks};
    std::vector<int32_t> tables(size_t(pool.num_blocks));
    std::iota(tables.begin(), tables.end(), 0);
    const DecodeSeqs d = make_seqs(V, S);
    for (int s = 0; s < S; ++s) prefill_alone(*m, pool, d.prompts[size_t(s)], tables.data() + size_t(s) * per, per);
    std::vector<int> order(S);
    std::iota(order.begin(), order.end(), 0);
    const auto decode = [&] { return decode_step(*m, pool, d, order, tables, per); };
    // The first decode step's eager run allocates the scratch, after the step checked the epoch, so
    // the second step captures again; from the third the graph is replayed.
    const std::vector<float> first = decode();
    decode();
    const int captured = m->stats().graphs_captured;
    const std::vector<float> replayed = decode();
    ASSERT_EQ(m->stats().graphs_captured, captured) << "the third decode step did not replay its graph";
    const unsigned long long epoch = cuda_rt::cublas_scratch_epoch();
    std::vector<int32_t> long_prompt(static_cast<size_t>(long_len));
    for (int i = 0; i < long_len; ++i) long_prompt[size_t(i)] = 1 + (i * 37 + 11) % (V - 1);
    // Its block table: the pool's last long_blocks blocks, one row.
    const std::vector<int32_t> long_table(tables.end() - long_blocks, tables.end());
    prefill_alone(*m, pool, long_prompt, long_table.data(), long_blocks);
    ASSERT_GT(cuda_rt::cublas_scratch_epoch(), epoch) << "the long prefill did not grow cuBLASLt's scratch: nothing is checked";
    const std::vector<float> again = decode();
    EXPECT_EQ(m->stats().graphs_captured, captured + 1) << "the decode graph was not captured again after the scratch grew";
    for (const auto* later : {&replayed, &again}) {
        size_t differ = 0;
        for (size_t i = 0; i < first.size(); ++i) differ += std::memcmp(&first[i], &(*later)[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << differ << " of " << first.size() << " logits differ "
                              << (later == &again ? "after the scratch grew" : "in the graph's replay");
    }
}

// The persistent batch-1 decode kernel (kernels/cuda/decode1.cuh) against the launch-per-op step:
// the same logits, bit for bit, for a 1-token prompt and 24 greedy decode steps of a longer one
// (graphs captured for each), on the bf16 Llama fixture (the kernel's sums are the GEMV's and its
// attention rope_attention_kernel's). Each run loads the model afresh, so each captures its own graph.
// Every form of the kernel's waits: the grid barriers (count, publish) and the dataflow counters.
TEST(CudaDecode1, KeepsTheBits) {
    REQUIRE_GPU();
    auto run = [](int mode) {
        kernels::cuda::decode1_override() = mode;
        auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "bf16", .load_text = false});
        std::vector<float> all;
        {
            SequenceRunner one(*lm.model, 4);
            const int32_t tok = 17;
            auto l = one.feed(std::span<const int32_t>(&tok, 1));
            all.insert(all.end(), l.begin(), l.end());
        }
        const std::vector<int32_t> prompt = {5, 9, 2, 7, 100, 33, 21, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
        SequenceRunner r(*lm.model, int(prompt.size()) + 26);
        auto logits = r.feed(prompt);
        for (int i = 0; i < 24; ++i) {
            const int32_t next = argmax(logits);
            logits = r.feed(std::span<const int32_t>(&next, 1));
            all.insert(all.end(), logits.begin(), logits.end());
        }
        kernels::cuda::decode1_override() = -1;
        return all;
    };
    const std::vector<float> launches = run(0);
    using kernels::cuda::Decode1Sync;
    for (const auto& [sync, name] : {std::pair{Decode1Sync::count, "count"}, {Decode1Sync::publish, "publish"}, {Decode1Sync::flow, "flow"}}) {
        kernels::cuda::decode1_sync_override() = int(sync);
        const std::vector<float> persistent = run(1);
        kernels::cuda::decode1_sync_override() = -1;
        ASSERT_EQ(launches.size(), persistent.size()) << name;
        size_t differ = 0;
        for (size_t i = 0; i < launches.size(); ++i) differ += std::memcmp(&launches[i], &persistent[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << differ << " of " << launches.size() << " logits differ (" << name << ")";
    }
}

// The engine (chunked prefill mixing with decodes, eager; then decode-only steps, graphs) against
// each prompt alone: the same greedy tokens.
TEST(CudaEngine, GreedyRequestsMatchAlone) {
    REQUIRE_GPU();
    auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "f32", .load_text = false});
    // Prompts of at most 8 tokens and a step budget of 8: every forward takes the decode GEMV path,
    // whose per-row arithmetic does not depend on the other rows, so equality is exact.
    const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7}, {100, 200, 300, 400, 500, 600, 7}, {42}};
    const int kNew = 12;
    std::vector<std::vector<int32_t>> want;
    for (auto& p : prompts) {
        SequenceRunner r(*lm.model, int(p.size()) + kNew + 1);
        auto logits = r.feed(p);
        std::vector<int32_t> out;
        for (int i = 0; i < kNew; ++i) {
            out.push_back(argmax(logits));
            logits = r.feed(std::span<const int32_t>(&out.back(), 1));
        }
        want.push_back(out);
    }
    EngineConfig cfg;
    cfg.max_num_batched_tokens = 8;  // forces chunked prefill mixed with decodes
    cfg.kv_cache_bytes = 64 * lm.model->info().kv_bytes_per_block;
    Engine engine(*lm.model, nullptr, cfg);
    std::map<std::string, std::vector<int32_t>> got;
    for (size_t i = 0; i < prompts.size(); ++i) {
        Request r;
        r.id = "r" + std::to_string(i);
        r.prompt_ids = prompts[i];
        r.params.temperature = 0;
        r.params.max_tokens = kNew;
        r.params.ignore_eos = true;
        engine.add_request(r, [&](const RequestOutput& o) {
            auto& v = got[o.request_id];
            v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
        });
    }
    while (engine.has_unfinished()) engine.step();
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got["r" + std::to_string(i)], want[i]) << "request " << i;
}

// Sampling on the GPU through the engine (CompiledModel::forward_sample): the same requests with device
// sampling on and off (off: logits to the host, the engine's CPU Sampler). Greedy must give the same
// tokens. Seeded temperature / top-k / top-p / min-p requests must too: the device draws with the same
// per-sequence uniform the CPU sampler would and inverts the CDF of the same kept set in the same id
// order, so only a uniform within float rounding (~1e-6 relative) of a CDF boundary could differ.
// Requests with a penalty or logprobs make their steps fall back to the CPU sampler.
struct EngineRun {
    std::map<std::string, std::vector<int32_t>> tokens;
    std::map<std::string, size_t> logprobs;  // logprob entries received
    int64_t sampled = 0, device_rows = 0;
    int64_t ahead_adopted = 0, ahead_dropped = 0;
};

// late > 0: the last request arrives after `late` steps instead of with the others.
EngineRun run_engine(CudaGeneratedModel& m, bool device, const std::vector<Request>& requests, bool run_ahead = false,
                     int late = 0) {
    m.set_device_sampling(device);
    m.set_run_ahead(run_ahead);
    const int64_t before = m.stats().device_sampled_rows;
    EngineConfig cfg;
    cfg.max_num_batched_tokens = 8;  // chunked prefill mixed with decodes, then decode graphs
    cfg.kv_cache_bytes = 64 * m.info().kv_bytes_per_block;
    Engine engine(m, nullptr, cfg);
    EngineRun run;
    auto add = [&](const Request& r) {
        engine.add_request(r, [&](const RequestOutput& o) {
            const std::string key = o.request_id + "#" + std::to_string(o.index);  // n > 1: one entry per sample
            auto& v = run.tokens[key];
            v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
            run.logprobs[key] += o.logprobs.size();
            run.sampled += int64_t(o.new_token_ids.size());
        });
    };
    const size_t now = late > 0 && !requests.empty() ? requests.size() - 1 : requests.size();
    for (size_t i = 0; i < now; ++i) add(requests[i]);
    bool pending = now < requests.size();
    for (int steps = 0; engine.has_unfinished() || pending; ++steps) {
        if (pending && (steps >= late || !engine.has_unfinished())) {
            add(requests.back());
            pending = false;
        }
        engine.step();
    }
    run.device_rows = m.stats().device_sampled_rows - before;
    run.ahead_adopted = engine.stats().run_ahead_adopted;
    run.ahead_dropped = engine.stats().run_ahead_dropped;
    m.set_run_ahead(false);
    return run;
}

std::vector<Request> sampling_requests() {
    const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3, 4, 5}, {9, 8, 7}, {100, 200, 300, 400, 500, 600, 7}, {42}};
    std::vector<Request> out;
    auto add = [&](const std::string& id, size_t prompt, auto&& set) {
        Request r;
        r.id = id;
        r.prompt_ids = prompts[prompt % prompts.size()];
        r.params.max_tokens = 12;
        r.params.ignore_eos = true;
        set(r.params);
        out.push_back(r);
    };
    for (size_t i = 0; i < prompts.size(); ++i) add("greedy" + std::to_string(i), i, [](SamplingParams& p) { p.temperature = 0; });
    add("t0.8", 0, [](SamplingParams& p) { p.temperature = 0.8f; p.seed = 11; });
    add("t1-k5", 1, [](SamplingParams& p) { p.temperature = 1.0f; p.top_k = 5; p.seed = 12; });
    add("t1.2-p0.9", 2, [](SamplingParams& p) { p.temperature = 1.2f; p.top_p = 0.9f; p.seed = 13; });
    add("t0.7-all", 3, [](SamplingParams& p) {
        p.temperature = 0.7f; p.top_k = 20; p.top_p = 0.95f; p.min_p = 0.1f; p.seed = 14;
    });
    add("t1.5-n2", 0, [](SamplingParams& p) { p.temperature = 1.5f; p.n = 2; p.seed = 15; });
    return out;
}

TEST(CudaSampling, EngineOnTheGpuMatchesTheCpuSampler) {
    REQUIRE_GPU();
    for (const char* quant : {"f32", "bf16"}) {
        auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = quant, .load_text = false});
        auto* m = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
        ASSERT_NE(m, nullptr);
        ASSERT_TRUE(m->can_sample_on_device() || std::getenv("SCR_CUDA_DEVICE_SAMPLING"));
        const auto requests = sampling_requests();
        const EngineRun gpu = run_engine(*m, true, requests);
        const EngineRun cpu = run_engine(*m, false, requests);
        EXPECT_EQ(cpu.device_rows, 0);
        EXPECT_EQ(gpu.device_rows, gpu.sampled) << quant << ": every token should have been sampled on the GPU";
        EXPECT_GT(gpu.sampled, 0);
        for (const auto& [id, want] : cpu.tokens) {
            EXPECT_EQ(want.size(), 12u) << quant << " " << id;
            EXPECT_EQ(gpu.tokens.at(id), want) << quant << " " << id;
        }
        // The seeded requests sampled something other than the greedy path at least once, or the
        // comparison above says little about the draw.
        size_t differ = 0;
        const auto greedy_run = cpu.tokens.at("greedy0#0"), sampled_run = cpu.tokens.at("t0.8#0");
        for (size_t i = 0; i < greedy_run.size(); ++i) differ += greedy_run[i] != sampled_run[i];
        EXPECT_GT(differ, 0u) << "temperature 0.8 reproduced greedy exactly: the fixture is too peaked for this test";
    }
}

TEST(CudaSampling, UnsupportedParametersFallBackToTheCpuSampler) {
    REQUIRE_GPU();
    auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "f32", .load_text = false});
    auto* m = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
    ASSERT_NE(m, nullptr);
    auto requests = sampling_requests();
    Request penalized = requests[4];
    penalized.id = "penalized";
    penalized.params.repetition_penalty = 1.3f;
    penalized.params.max_tokens = 30;  // outlives the others: its steps fall back, the rest run on the GPU
    Request with_logprobs = requests[0];
    with_logprobs.id = "logprobs";
    with_logprobs.params.logprobs = 2;
    const EngineRun cpu = run_engine(*m, false, {penalized, with_logprobs});
    const EngineRun mixed = run_engine(*m, true, {penalized, with_logprobs});
    EXPECT_EQ(mixed.tokens, cpu.tokens);
    EXPECT_EQ(mixed.device_rows, 0) << "a step with a penalized or logprobs row must not sample on the GPU";
    EXPECT_EQ(mixed.logprobs.at("logprobs#0"), 12u);
    // min_tokens bans stop tokens until that many outputs exist: those steps fall back, later ones
    // (the request runs alone, one row per step) sample on the GPU.
    Request late_min_tokens = requests[5];
    late_min_tokens.id = "min_tokens";
    late_min_tokens.params.min_tokens = 4;
    const EngineRun a = run_engine(*m, true, {late_min_tokens});
    const EngineRun b = run_engine(*m, false, {late_min_tokens});
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.device_rows, a.sampled - 4);
}

// Run-ahead (the engine enqueues step n + 1 before step n's tokens are back; its token ids are step
// n's draws, copied on the device): the same tokens as without it, for greedy and seeded requests,
// with steps really adopted (and dropped where requests end or arrive).
TEST(CudaRunAhead, EngineGivesTheSameTokensAsWithout) {
    REQUIRE_GPU();
    for (const char* quant : {"f32", "bf16"}) {
        auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = quant, .load_text = false});
        auto* m = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
        ASSERT_NE(m, nullptr);
        auto requests = sampling_requests();
        for (size_t i = 0; i < requests.size(); ++i) requests[i].params.max_tokens = 9 + int(i) * 3;  // staggered ends
        // Ends by length are foreseen (no step is launched ahead past them); a request arriving is
        // not: a step launched ahead is then dropped. The last request arrives after `late` steps,
        // the first `late` from 12 at which a step launched ahead is pending (the schedule, hence
        // which steps run ahead, does not depend on run-ahead itself).
        EngineRun ahead;
        int late = 12;
        for (; late < 60; ++late) {
            ahead = run_engine(*m, true, requests, /*run_ahead=*/true, late);
            if (ahead.ahead_dropped > 0) break;
        }
        const EngineRun sync = run_engine(*m, true, requests, /*run_ahead=*/false, late);
        EXPECT_EQ(sync.ahead_adopted, 0);
        EXPECT_GT(ahead.ahead_adopted, 10) << quant;
        EXPECT_GT(ahead.ahead_dropped, 0) << quant;
        EXPECT_EQ(sync.device_rows, sync.sampled) << quant;
        EXPECT_GT(ahead.device_rows, ahead.sampled) << quant;  // a dropped step's rows were sampled too
        EXPECT_EQ(ahead.tokens, sync.tokens) << quant;
    }
}

// The model's launch_sample chain on its own: 24 greedy steps of one sequence, each fed the
// previous step's draw on the device, against forward_sample fed from the host.
TEST(CudaRunAhead, FedStepsEqualHostFedSteps) {
    REQUIRE_GPU();
    auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "bf16", .load_text = false});
    auto* m = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
    ASSERT_NE(m, nullptr);
    m->set_run_ahead(true);
    ASSERT_TRUE(m->can_run_ahead() || std::getenv("SCR_CUDA_DEVICE_SAMPLING"));
    const ModelInfo& info = m->info();
    const int steps = 24, prompt = 5, bs = info.block_size;
    const int blocks = (prompt + steps + bs) / bs + 1;
    auto run = [&](bool fed) {
        std::vector<std::byte> anchor(64);
        KvPool pool{anchor.data(), blocks + 1};
        std::vector<int32_t> table(static_cast<size_t>(blocks));
        for (int i = 0; i < blocks; ++i) table[size_t(i)] = i + 1;
        const std::vector<DeviceSamplingRow> greedy(1);
        std::vector<int32_t> out;
        auto step = [&](const std::vector<int32_t>& ids, int start, bool feed) {
            const int n = int(ids.size());
            std::vector<int32_t> pos(static_cast<size_t>(n));
            std::vector<int64_t> slots(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) {
                pos[size_t(i)] = start + i;
                slots[size_t(i)] = int64_t(table[size_t((start + i) / bs)]) * bs + (start + i) % bs;
            }
            int32_t qs[2] = {0, n}, len = start + n, row = n - 1;
            StepBatch b;
            b.num_tokens = n;
            b.token_ids = ids.data();
            b.positions = pos.data();
            b.slot_mapping = slots.data();
            b.num_seqs = 1;
            b.query_start = qs;
            b.seq_lens = &len;
            b.block_tables = table.data();
            b.block_table_stride = blocks;
            b.num_logits = 1;
            b.logit_rows = &row;
            int32_t tok = -1;
            if (!fed) {
                m->forward_sample(b, pool, greedy, &tok);
                out.push_back(tok);
            } else {
                m->launch_sample(b, pool, greedy, feed);
            }
        };
        step({11, 22, 33, 44, 55}, 0, false);
        if (!fed) {
            for (int i = 0; i < steps; ++i) step({out.back()}, prompt + i, false);
        } else {
            // Launch i + 1 (fed on the device; the host's id 0 is not used) before waiting for i.
            for (int i = 0; i < steps; ++i) {
                step({0}, prompt + i, true);
                int32_t tok = -1;
                m->wait_sample(&tok);
                out.push_back(tok);
            }
            int32_t tok = -1;
            m->wait_sample(&tok);
            out.push_back(tok);
        }
        return out;
    };
    const auto host_fed = run(false);
    const auto device_fed = run(true);
    ASSERT_EQ(host_fed.size(), size_t(steps + 1));
    EXPECT_EQ(device_fed, host_fed);
    // Misuse is an error naming the problem, and the model still works afterwards.
    EXPECT_THROW(
        {
            int32_t tok;
            m->wait_sample(&tok);
        },
        std::logic_error);
    EXPECT_EQ(run(false), host_fed);
}

// A prefill beside decodes (6 tokens of 5 sequences, an eager step), then a step fed its ids on the
// device whose graph bucket (8) pads beyond the rows the first step packed: padding rows 6 and 7
// read token ids no step wrote, which must still be valid ids. Session 25's review found them
// holding weight bytes (the step buffer was the upload's staging buffer): an out-of-bounds read
// of the embedding table that changes no real row, so this test asserts the tokens here and
// tests/cuda/device_run.sh runs it under memcheck. A fresh model per run: the first launches of a
// freshly loaded model are the case.
TEST(CudaRunAhead, PaddingRowsOfAFedStepReadValidIds) {
    REQUIRE_GPU();
    auto run = [&](bool fed) {
        auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "bf16", .load_text = false});
        auto* m = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
        EXPECT_NE(m, nullptr);
        if (!m) return std::vector<int32_t>{};
        m->set_run_ahead(true);
        const int bs = m->info().block_size, S = 5, per = 2;
        std::vector<std::byte> anchor(64);
        KvPool pool{anchor.data(), S * per + 1};
        std::vector<int32_t> table(static_cast<size_t>(S * per));
        for (int i = 0; i < S * per; ++i) table[size_t(i)] = i + 1;
        auto slot = [&](int s, int pos) { return int64_t(table[size_t(s * per + pos / bs)]) * bs + pos % bs; };
        const std::vector<DeviceSamplingRow> greedy(static_cast<size_t>(S));
        // Step A: sequences 0-3 one prompt token each, sequence 4 two.
        std::vector<int32_t> ids_a = {11, 22, 33, 44, 55, 66}, pos_a = {0, 0, 0, 0, 0, 1}, qs_a = {0, 1, 2, 3, 4, 6},
                             lens_a = {1, 1, 1, 1, 2}, rows_a = {0, 1, 2, 3, 5};
        std::vector<int64_t> slots_a = {slot(0, 0), slot(1, 0), slot(2, 0), slot(3, 0), slot(4, 0), slot(4, 1)};
        StepBatch a;
        a.num_tokens = 6;
        a.token_ids = ids_a.data();
        a.positions = pos_a.data();
        a.slot_mapping = slots_a.data();
        a.num_seqs = S;
        a.query_start = qs_a.data();
        a.seq_lens = lens_a.data();
        a.block_tables = table.data();
        a.block_table_stride = per;
        a.num_logits = S;
        a.logit_rows = rows_a.data();
        // Step B: one token per sequence, its ids A's draws.
        std::vector<int32_t> ids_b(static_cast<size_t>(S)), pos_b = {1, 1, 1, 1, 2}, qs_b = {0, 1, 2, 3, 4, 5},
                             lens_b = {2, 2, 2, 2, 3}, rows_b = {0, 1, 2, 3, 4};
        std::vector<int64_t> slots_b = {slot(0, 1), slot(1, 1), slot(2, 1), slot(3, 1), slot(4, 2)};
        StepBatch b = a;
        b.num_tokens = S;
        b.token_ids = ids_b.data();
        b.positions = pos_b.data();
        b.slot_mapping = slots_b.data();
        b.query_start = qs_b.data();
        b.seq_lens = lens_b.data();
        b.logit_rows = rows_b.data();
        std::vector<int32_t> out_a(static_cast<size_t>(S), -1), out_b(static_cast<size_t>(S), -1);
        if (fed) {
            m->launch_sample(a, pool, greedy, /*feed_previous=*/false);
            m->launch_sample(b, pool, greedy, /*feed_previous=*/true);
            m->wait_sample(out_a.data());
            m->wait_sample(out_b.data());
        } else {
            m->forward_sample(a, pool, greedy, out_a.data());
            ids_b = out_a;
            m->forward_sample(b, pool, greedy, out_b.data());
        }
        out_a.insert(out_a.end(), out_b.begin(), out_b.end());
        return out_a;
    };
    const auto host_fed = run(false);
    ASSERT_EQ(host_fed.size(), size_t(10));
    for (int32_t t : host_fed) EXPECT_GE(t, 0);
    EXPECT_EQ(run(true), host_fed);
}

TEST(CudaErrors, BadStepIsAnErrorAndTheModelStillWorks) {
    REQUIRE_GPU();
    auto lm = load_model((kFixtures / "LlamaForCausalLM").string(), LoadOptions{.quant = "f32", .load_text = false});
    CompiledModel& m = *lm.model;
    std::vector<std::byte> anchor(16);
    KvPool pool{anchor.data(), 4};
    int32_t id = 3, pos = 0, qs[2] = {0, 1}, len = 1, table[4] = {9, 0, 0, 0}, row = 0;  // block 9 is outside the pool
    int64_t slot = 0;
    StepBatch b;
    b.num_tokens = 1;
    b.token_ids = &id;
    b.positions = &pos;
    b.slot_mapping = &slot;
    b.num_seqs = 1;
    b.query_start = qs;
    b.seq_lens = &len;
    b.block_tables = table;
    b.block_table_stride = 4;
    b.num_logits = 1;
    b.logit_rows = &row;
    std::vector<float> logits(size_t(m.info().vocab_size));
    EXPECT_THROW(m.forward(b, pool, logits.data()), Error);
    table[0] = 0;
    m.forward(b, pool, logits.data());
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
}

}  // namespace
