// The engine's device-sampling path (ModelRunner::plan_device_sampling -> CompiledModel::forward_sample)
// on the CPU, no GPU: a FakeModel (tests/engine/fake_model.hpp) that "samples on its device" with the
// CPU sampler's own arithmetic (Sampler::apply_min_p_top_k_top_p, then Sampler::draw's inverse CDF)
// at the uniform the engine hands it. Same logits, same kept set, same uniform: the tokens must equal
// the CPU path's exactly, which checks what the engine owns — one uniform per non-greedy token drawn
// from the right sequence's generator, rows mapped back to the right sequences (chunked prefill,
// preemption, n > 1), and the fallback to logits + CPU sampler for anything else the sampler does.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "runtime/engine/sampler.hpp"
#include "tests/engine/fake_model.hpp"

using namespace scr;

namespace {

class SamplingFakeModel : public test::FakeModel {
public:
    explicit SamplingFakeModel(test::FakeModelShape shape, bool device) : FakeModel(shape), device_(device) {}

    bool can_sample_on_device() const override { return device_; }

    void forward_sample(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> rows, int32_t* tokens) override {
        const int V = info().vocab_size;
        if (rows.size() < size_t(b.num_logits)) throw std::logic_error("fewer sampling rows than logit rows");
        logits_.resize(size_t(b.num_logits) * size_t(V));
        forward(b, kv, logits_.data());
        for (int r = 0; r < b.num_logits; ++r) tokens[r] = draw(logits_.data() + size_t(r) * V, rows[size_t(r)]);
        device_rows += b.num_logits;
    }

    int64_t device_rows = 0;

private:
    // Sampler::sample's greedy and temperature paths, with the uniform given instead of drawn.
    int32_t draw(float* x, const DeviceSamplingRow& row) {
        const int V = info().vocab_size;
        engine::Sampler sampler(V);
        if (row.temperature < engine::Sampler::kSamplingEps) return sampler.argmax(x);
        const float inv_t = 1.0f / row.temperature;
        for (int i = 0; i < V; ++i) x[i] *= inv_t;
        SamplingParams p;
        p.top_k = row.top_k;
        p.top_p = row.top_p;
        p.min_p = row.min_p;
        sampler.apply_min_p_top_k_top_p(x, p);
        return sampler.draw(x, row.uniform);
    }

    bool device_;
    std::vector<float> logits_;
};

struct Outcome {
    std::map<std::string, std::vector<int32_t>> tokens;  // "id#sample"
    int64_t sampled = 0;
    int64_t preemptions = 0;
};

Outcome run(SamplingFakeModel& model, const std::vector<Request>& requests, int kv_blocks) {
    EngineConfig cfg;
    cfg.max_num_seqs = 8;
    cfg.max_num_batched_tokens = 12;  // chunked prefill mixed with decodes
    cfg.kv_cache_bytes = int64_t(kv_blocks) * model.info().kv_bytes_per_block;
    Engine engine(model, nullptr, cfg);
    Outcome o;
    for (const Request& r : requests)
        engine.add_request(r, [&](const RequestOutput& out) {
            auto& v = o.tokens[out.request_id + "#" + std::to_string(out.index)];
            v.insert(v.end(), out.new_token_ids.begin(), out.new_token_ids.end());
            o.sampled += int64_t(out.new_token_ids.size());
        });
    while (engine.has_unfinished()) engine.step();
    o.preemptions = engine.stats().num_preemptions;
    return o;
}

Request request(const std::string& id, int prompt_len, int seed_offset, int max_tokens) {
    Request r;
    r.id = id;
    for (int i = 0; i < prompt_len; ++i) r.prompt_ids.push_back((i * 7 + seed_offset * 13) % 90 + 1);
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    return r;
}

std::vector<Request> supported_requests() {
    std::vector<Request> rs;
    auto add = [&](Request r, auto&& set) { set(r.params); rs.push_back(r); };
    add(request("greedy", 9, 1, 20), [](SamplingParams& p) { p.temperature = 0; });
    add(request("t1", 17, 2, 20), [](SamplingParams& p) { p.temperature = 1.0f; p.seed = 5; });
    add(request("t1-greedy-twin", 17, 2, 20), [](SamplingParams& p) { p.temperature = 0; });
    add(request("k3", 5, 3, 20), [](SamplingParams& p) { p.temperature = 0.8f; p.top_k = 3; p.seed = 6; });
    add(request("p0.7", 23, 4, 20), [](SamplingParams& p) { p.temperature = 1.3f; p.top_p = 0.7f; p.seed = 7; });
    add(request("minp", 3, 5, 20), [](SamplingParams& p) { p.temperature = 1.0f; p.min_p = 0.2f; p.seed = 8; });
    add(request("all", 11, 6, 20), [](SamplingParams& p) {
        p.temperature = 0.9f; p.top_k = 10; p.top_p = 0.9f; p.min_p = 0.05f; p.seed = 9;
    });
    add(request("n3", 6, 7, 20), [](SamplingParams& p) { p.temperature = 1.1f; p.n = 3; p.seed = 10; });
    return rs;
}

TEST(DeviceSamplingEngine, SameTokensAsTheCpuSamplerEveryRowOnTheDevice) {
    for (int kv_blocks : {200, 24}) {  // plenty; then few enough to preempt
        SamplingFakeModel gpu(test::FakeModelShape{}, true), cpu(test::FakeModelShape{}, false);
        const auto requests = supported_requests();
        const Outcome a = run(gpu, requests, kv_blocks), b = run(cpu, requests, kv_blocks);
        EXPECT_EQ(a.tokens, b.tokens) << "kv blocks " << kv_blocks;
        EXPECT_EQ(a.tokens.size(), 10u);
        EXPECT_EQ(gpu.device_rows, a.sampled) << "every token should have been drawn on the device";
        EXPECT_EQ(cpu.device_rows, 0);
        if (kv_blocks == 24) EXPECT_GT(a.preemptions, 0) << "the small pool was meant to preempt";
        // The sampled requests really sampled (not greedy in disguise).
        EXPECT_NE(a.tokens.at("t1#0"), a.tokens.at("t1-greedy-twin#0"));
    }
}

TEST(DeviceSamplingEngine, UnsupportedParametersFallBackStepByStep) {
    struct Case {
        const char* name;
        void (*set)(SamplingParams&);
        int64_t device_rows;  // of its 20 tokens, alone in the engine
    };
    const Case cases[] = {
        {"logprobs", [](SamplingParams& p) { p.logprobs = 1; }, 0},
        {"logit_bias", [](SamplingParams& p) { p.logit_bias = {{3, 2.0f}}; }, 0},
        {"repetition", [](SamplingParams& p) { p.repetition_penalty = 1.2f; }, 0},
        {"frequency", [](SamplingParams& p) { p.frequency_penalty = 0.5f; }, 0},
        {"presence", [](SamplingParams& p) { p.presence_penalty = 0.5f; }, 0},
        {"min_tokens", [](SamplingParams& p) { p.min_tokens = 6; }, 14},  // its first 6 tokens fall back
    };
    for (const Case& c : cases) {
        Request r = request(c.name, 7, 3, 20);
        r.params.temperature = 0.9f;
        r.params.seed = 21;
        c.set(r.params);
        SamplingFakeModel gpu(test::FakeModelShape{}, true), cpu(test::FakeModelShape{}, false);
        const Outcome a = run(gpu, {r}, 200), b = run(cpu, {r}, 200);
        EXPECT_EQ(a.tokens, b.tokens) << c.name;
        EXPECT_EQ(gpu.device_rows, c.device_rows) << c.name;
        // Beside a supported request (which finishes first), an unsupported row takes the whole step
        // back to the CPU.
        SamplingFakeModel mixed(test::FakeModelShape{}, true);
        Request plain = request("plain", 7, 4, 10);
        plain.params.temperature = 0.7f;
        plain.params.seed = 22;
        const Outcome m = run(mixed, {r, plain}, 200), want = run(cpu, {r, plain}, 200);
        EXPECT_EQ(m.tokens, want.tokens) << c.name << " mixed";
        if (c.device_rows == 0) {
            EXPECT_EQ(mixed.device_rows, 0) << c.name << " mixed";
        } else {
            EXPECT_GT(mixed.device_rows, 0) << c.name << " mixed";
        }
    }
}

}  // namespace
