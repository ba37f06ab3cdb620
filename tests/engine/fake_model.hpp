// A CompiledModel for engine tests that really goes through the paged KV pool: each token writes
// (token id, position) into its slot, and the logits of a row are a hash-derived function of the
// whole context *read back through the block table*. A wrong slot mapping, block table, position,
// prefix-cache hit or stale block therefore changes the output, and the model throws on any
// inconsistency it can see. `reference_logits` computes the same function from a plain token list,
// independently of the engine.
#pragma once

#include <cstdint>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/model/compiled_model.hpp"

namespace scr::test {

inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

struct FakeModelShape {
    int vocab = 97;
    int block_size = 4;
    int context = 256;
    int max_batch_tokens = 64;
    int max_logit_rows = 16;
    int64_t eos = -1;
    bool letters_only = false;  // favour 'a'..'z' (for tests that detokenize with a byte tokenizer)
    int sliding_window = 0;     // > 0: a token sees only the last `sliding_window` tokens
};

class FakeModel : public CompiledModel {
public:
    explicit FakeModel(FakeModelShape shape = {}) : shape_(shape) {
        scratch_.reserve(size_t(shape.context) + 1);
        info_.stem = "fake";
        info_.arch = "fake";
        info_.quant = "f32";
        info_.target = "cpu";
        info_.hf_architecture = "FakeForCausalLM";
        info_.vocab_size = shape.vocab;
        info_.hidden_size = 8;
        info_.num_layers = 1;
        info_.num_kv_heads = 1;
        info_.head_dim = 2;
        info_.max_position_embeddings = shape.context;
        info_.block_size = shape.block_size;
        info_.max_batch_tokens = shape.max_batch_tokens;
        info_.max_logit_rows = shape.max_logit_rows;
        info_.bos_token_id = -1;
        info_.eos_token_id = shape.eos;
        info_.kv_dtype = DType::i32;
        info_.kv_bytes_per_token = 8;  // (token id, position)
        info_.kv_bytes_per_block = 8 * int64_t(shape.block_size);
        info_.weight_bytes = 0;
        info_.scratch_bytes = 0;
        info_.active_weight_bytes = 0;
        info_.sliding_window = shape.sliding_window;
    }

    const ModelInfo& info() const override { return info_; }

    // The logits for a context (the tokens up to and including the row's token).
    static void reference_logits(const std::vector<int32_t>& context, int vocab, float* out,
                                 bool letters_only = false) {
        uint64_t h = 0x1234567;
        for (int32_t t : context) h = mix64(h ^ uint64_t(uint32_t(t)));
        const int32_t last = context.back();
        for (int v = 0; v < vocab; ++v) {
            uint64_t r = mix64(h + uint64_t(v) * 0x632be59bd9b4e019ULL);
            // Mostly context-hash noise, with a preference for tokens near last+1 so text has runs.
            float x = float(double(r >> 11) * 0x1.0p-53) * 6.0f - 3.0f;
            int d = (v - last - 1 + vocab) % vocab;
            if (d < 3) x += 1.5f - 0.5f * float(d);
            if (letters_only && (v < 'a' || v > 'z')) x -= 20.0f;
            out[v] = x;
        }
    }

    void forward(const StepBatch& b, KvPool& kv, float* logits) override {
        if (!pending_.empty()) fail("forward with a launched step not waited for");
        compute(b, kv, logits);
    }

    // One step: K/V cells written, logits of the logit rows.
    void compute(const StepBatch& b, KvPool& kv, float* logits) {
        ++forwards;
        if (fail_next) { fail_next = false; throw std::runtime_error("injected forward failure"); }
        const int bs = shape_.block_size;
        const int64_t num_slots = int64_t(kv.num_blocks) * bs;
        auto* cells = reinterpret_cast<int32_t*>(kv.data);  // [slot][2]
        if (b.num_tokens > shape_.max_batch_tokens) fail("batch has more tokens than max_batch_tokens");
        if (b.num_logits > shape_.max_logit_rows) fail("batch has more logit rows than max_logit_rows");
        if (b.query_start[0] != 0 || b.query_start[b.num_seqs] != b.num_tokens) fail("bad query_start");
        max_batch_seen = std::max(max_batch_seen, b.num_seqs);
        tokens_computed += b.num_tokens;
        for (int s = 0; s < b.num_seqs; ++s) {
            const int q0 = b.query_start[s], q1 = b.query_start[s + 1];
            if (q1 <= q0) fail("empty sequence in batch");
            const int32_t* table = b.block_tables + int64_t(s) * b.block_table_stride;
            for (int i = q0; i < q1; ++i) {
                const int pos = b.positions[i];
                if (pos != b.seq_lens[s] - (q1 - i)) fail("positions are not the last tokens of the context");
                const int64_t slot = b.slot_mapping[i];
                if (slot < bs || slot >= num_slots) fail("slot outside the pool (or in the null block)");
                if (slot != int64_t(table[pos / bs]) * bs + pos % bs) fail("slot disagrees with the block table");
                cells[2 * slot] = b.token_ids[i];
                cells[2 * slot + 1] = pos;
            }
        }
        std::vector<int32_t>& ctx = scratch_;
        for (int r = 0; r < b.num_logits; ++r) {
            const int row = b.logit_rows[r];
            int s = 0;
            while (b.query_start[s + 1] <= row) ++s;
            const int32_t* table = b.block_tables + int64_t(s) * b.block_table_stride;
            const int pos = b.positions[row];
            ctx.clear();
            const int first = shape_.sliding_window > 0 ? std::max(0, pos - shape_.sliding_window + 1) : 0;
            for (int p = first; p <= pos; ++p) {
                const int64_t slot = int64_t(table[p / bs]) * bs + p % bs;
                if (table[p / bs] <= 0 || table[p / bs] >= kv.num_blocks) fail("block table entry out of range");
                if (cells[2 * slot + 1] != p) fail("KV slot holds another position (stale or shared block)");
                ctx.push_back(cells[2 * slot]);
            }
            reference_logits(ctx, shape_.vocab, logits + int64_t(r) * shape_.vocab, shape_.letters_only);
        }
    }

    // ---- Device sampling and run-ahead, as an asynchronous device does them (the engine's
    // run-ahead tests): a launched step runs and draws at once, a fed step takes its token ids from
    // the previous launch's draws, and wait_sample hands the draws out in launch order. The draw
    // itself is fake_draw's (greedy: the lowest id among the maxima; else the inverse CDF of
    // softmax(logits / T) at the row's uniform); the engine's Sampler is not involved.
    bool device_sampling = false, run_ahead = false;
    int launches_fed = 0;

    bool can_sample_on_device() const override { return device_sampling; }
    bool can_run_ahead() const override { return device_sampling && run_ahead; }

    static int32_t fake_draw(const float* logits, int vocab, const DeviceSamplingRow& row) {
        int32_t best = 0;
        for (int v = 1; v < vocab; ++v) if (logits[v] > logits[best]) best = v;
        if (row.temperature < 1e-5f) return best;
        double z = 0;
        for (int v = 0; v < vocab; ++v) z += std::exp(double(logits[v] - logits[best]) / row.temperature);
        double c = 0;
        for (int v = 0; v < vocab; ++v) {
            c += std::exp(double(logits[v] - logits[best]) / row.temperature) / z;
            if (row.uniform < c) return v;
        }
        return vocab - 1;
    }

    void forward_sample(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                        int32_t* token_ids) override {
        if (!pending_.empty()) fail("forward_sample with a launched step not waited for");
        draw(b, kv, sampling, token_ids);
    }
    void launch_sample(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                       bool feed_previous) override {
        if (!can_run_ahead()) fail("launch_sample on a model that cannot run ahead");
        if (pending_.size() >= 2) fail("a third step launched before the first was waited for");
        StepBatch fed = b;
        std::vector<int32_t> ids(b.token_ids, b.token_ids + b.num_tokens);
        if (feed_previous) {
            if (int(last_draws_.size()) < b.num_tokens) fail("fed step has more rows than the previous step drew");
            std::copy(last_draws_.begin(), last_draws_.begin() + b.num_tokens, ids.begin());
            fed.token_ids = ids.data();
            ++launches_fed;
        }
        std::vector<int32_t> out(size_t(b.num_logits));
        draw(fed, kv, sampling, out.data());
        last_draws_ = out;
        pending_.push_back(std::move(out));
    }
    void wait_sample(int32_t* token_ids) override {
        if (pending_.empty()) fail("wait_sample with nothing launched");
        if (token_ids) std::copy(pending_.front().begin(), pending_.front().end(), token_ids);
        pending_.erase(pending_.begin());
    }
    int pending() const { return int(pending_.size()); }

    int forwards = 0;
    int64_t tokens_computed = 0;
    int max_batch_seen = 0;
    bool fail_next = false;

private:
    void draw(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling, int32_t* token_ids) {
        if (sampling.size() < size_t(b.num_logits)) fail("fewer sampling rows than logit rows");
        std::vector<float> logits(size_t(b.num_logits) * size_t(shape_.vocab));
        compute(b, kv, logits.data());
        for (int r = 0; r < b.num_logits; ++r)
            token_ids[r] = fake_draw(logits.data() + size_t(r) * size_t(shape_.vocab), shape_.vocab, sampling[size_t(r)]);
    }
    std::vector<std::vector<int32_t>> pending_;
    std::vector<int32_t> last_draws_;

    [[noreturn]] static void fail(const std::string& what) { throw std::logic_error("FakeModel: " + what); }
    FakeModelShape shape_;
    ModelInfo info_{};
    std::vector<int32_t> scratch_;
};

// Greedy continuation computed straight from the logits function (no engine, no KV).
inline std::vector<int32_t> reference_greedy(std::vector<int32_t> context, int vocab, int max_tokens,
                                             int64_t eos = -1, bool letters_only = false, int window = 0) {
    std::vector<int32_t> out;
    std::vector<float> logits(size_t(vocab), 0.f);
    for (int i = 0; i < max_tokens; ++i) {
        std::vector<int32_t> seen = context;
        if (window > 0 && int(seen.size()) > window) seen.erase(seen.begin(), seen.end() - window);
        FakeModel::reference_logits(seen, vocab, logits.data(), letters_only);
        int32_t best = 0;
        for (int v = 1; v < vocab; ++v) if (logits[size_t(v)] > logits[size_t(best)]) best = v;
        out.push_back(best);
        context.push_back(best);
        if (best == eos) break;
    }
    return out;
}

}  // namespace scr::test
