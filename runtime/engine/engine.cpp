// Engine: requests in, scheduled steps through the compiled forward, sampled tokens and text out.
// The loop is vLLM v1's EngineCore.step (schedule -> execute_model -> update_from_output) with the
// output processor (detokenize, stop strings) folded in, single-threaded.
#include "runtime/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include "runtime/core/error.hpp"
#include "runtime/engine/kv_cache_manager.hpp"
#include "runtime/engine/kv_pool.hpp"
#include "runtime/engine/model_runner.hpp"
#include "runtime/engine/sampler.hpp"
#include "runtime/engine/scheduler.hpp"
#include "runtime/engine/text_stream.hpp"
#include "runtime/model/compiled_model.hpp"
#include "runtime/text/tokenizer.hpp"

namespace scr {

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::none: return "none";
        case FinishReason::stop: return "stop";
        case FinishReason::length: return "length";
        case FinishReason::abort: return "abort";
        case FinishReason::error: return "error";
    }
    return "?";
}

namespace {

using namespace scr::engine;

double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct RequestGroup;

// A sequence plus what the engine keeps for its output stream.
struct EngineSeq : Sequence {
    RequestGroup* group = nullptr;
    Rng rng;
    std::unique_ptr<text::IncrementalDecoder> detok;
    TextStream text;
    RequestOutput out;      // reused for every output of this sample
    TokenLogprob logprob;   // filled by the sampler, swapped into out.logprobs
    bool done = false;      // its final output has been delivered
};

// One request: n samples sharing parameters and a callback.
struct RequestGroup {
    std::string id;
    SamplingParams params;
    OutputCallback on_output;
    std::vector<std::unique_ptr<EngineSeq>> samples;
    int num_done = 0;
    bool all_done() const { return num_done == int(samples.size()); }
};

}  // namespace

struct Engine::Impl {
    CompiledModel& model;
    const ModelInfo& info;
    const text::Tokenizer* tokenizer;
    EngineConfig config;
    int context_len = 0;          // the model's, before clamping to the KV pool
    std::vector<int32_t> eos_ids;

    std::unique_ptr<KvPoolMemory> kv_memory;
    std::unique_ptr<KvCacheManager> kv;
    std::unique_ptr<Scheduler> scheduler;
    std::unique_ptr<ModelRunner> runner;
    std::unique_ptr<Sampler> sampler;

    std::unordered_map<std::string, std::unique_ptr<RequestGroup>> groups;
    std::vector<std::unique_ptr<RequestGroup>> graveyard;  // freed at the end of a step
    bool in_step = false;
    std::vector<int32_t> sampled;
    EngineStats stats;
    uint64_t arrival_counter = 0;
    std::mt19937_64 seed_source{std::random_device{}()};

    Impl(CompiledModel& m, const text::Tokenizer* tok, EngineConfig cfg);
    ~Impl() {
        if (runner) runner->recover();  // the model outlives the engine: leave nothing pending on it
    }
    void validate(const Request& r) const;
    void add_request(Request r, OutputCallback cb);
    bool abort(const std::string& id);
    bool step();
    void emit_token(EngineSeq& s, int32_t token);
    void emit_final(EngineSeq& s, FinishReason reason, const std::string& error);
    void retire_if_done(RequestGroup* g, bool aborted = false);
    void drop_ahead() {
        if (!runner->has_ahead()) return;
        runner->drop_ahead();
        ++stats.run_ahead_dropped;
    }
    static Rng& rng_of(Sequence& s) { return static_cast<EngineSeq&>(s).rng; }
};

Engine::Impl::Impl(CompiledModel& m, const text::Tokenizer* tok, EngineConfig cfg)
    : model(m), info(m.info()), tokenizer(tok), config(cfg) {
    if (config.max_num_seqs < 1) fail("engine: max_num_seqs must be >= 1 (got {})", config.max_num_seqs);
    if (config.max_num_batched_tokens < 0)
        fail("engine: max_num_batched_tokens must be >= 1, or 0 for the compiled step size (got {})", config.max_num_batched_tokens);
    if (info.block_size < 1 || info.kv_bytes_per_block < 1)
        fail("engine: model {} reports block_size {} and {} KV bytes per block", info.stem, info.block_size,
             info.kv_bytes_per_block);
    // The compiled scratch bounds one forward: tokens and logit rows (one per sequence).
    // The step budget defaults to the compiled step size (512 tokens on the CPU, 2,048 on CUDA:
    // CMakeLists.txt), as vLLM picks its default max_num_batched_tokens per device (8,192 for its API
    // server on GPUs of 70+ GB; vLLM: vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults).
    if (config.max_num_batched_tokens == 0) config.max_num_batched_tokens = info.max_batch_tokens;
    config.max_num_batched_tokens = std::min(config.max_num_batched_tokens, info.max_batch_tokens);
    config.max_num_seqs = std::min(config.max_num_seqs, info.max_logit_rows);
    context_len = info.max_position_embeddings;
    if (config.max_model_len > context_len)
        fail("engine: max_model_len {} is longer than the context of model {} ({} tokens)",
             config.max_model_len, info.stem, context_len);
    int max_model_len = config.max_model_len > 0 ? config.max_model_len : context_len;
    const int bs = info.block_size;

    // The KV pool from the byte budget (vLLM: vllm/v1/core/kv_cache_utils.py:L839, get_num_blocks).
    int64_t budget = config.kv_cache_bytes;
    if (budget <= 0) {
        // No budget given: a fraction of available memory, but no more than max_num_seqs
        // sequences of max_model_len can use (the mapping is lazy; unused blocks cost nothing).
        const int64_t useful = (int64_t(config.max_num_seqs) * ((max_model_len + bs - 1) / bs) + 1) *
                               info.kv_bytes_per_block;
        const int64_t avail = KvPoolMemory::available_memory_bytes();
        budget = avail > 0 ? std::min<int64_t>(useful, int64_t(double(avail) * config.kv_cache_fraction))
                           : std::min<int64_t>(useful, int64_t(1) << 30);
    }
    const int64_t num_blocks64 = budget / info.kv_bytes_per_block;
    if (num_blocks64 < 2)
        fail("engine: a KV cache of {} bytes holds {} blocks of {} bytes ({} tokens each); need at least 2",
             budget, num_blocks64, info.kv_bytes_per_block, bs);
    const int32_t num_blocks = int32_t(std::min<int64_t>(num_blocks64, INT32_MAX / 2));
    // A sequence must fit in the pool on its own, or it could only ever preempt itself. With a
    // sliding window it holds at most the window plus one step's tokens, whatever its length.
    const int64_t window_need = info.sliding_window > 0
        ? (int64_t(info.sliding_window) - 1 + config.max_num_batched_tokens + bs - 1) / bs + 1
        : INT64_MAX;
    if (window_need > num_blocks - 1)
        max_model_len = std::min<int64_t>(max_model_len, int64_t(num_blocks - 1) * bs);
    config.max_model_len = max_model_len;
    config.kv_cache_bytes = int64_t(num_blocks) * info.kv_bytes_per_block;

    if (tokenizer) eos_ids = tokenizer->eos_ids();
    if (info.eos_token_id >= 0 && info.eos_token_id < info.vocab_size &&
        std::find(eos_ids.begin(), eos_ids.end(), int32_t(info.eos_token_id)) == eos_ids.end())
        eos_ids.push_back(int32_t(info.eos_token_id));

    kv_memory = std::make_unique<KvPoolMemory>(num_blocks, info.kv_bytes_per_block);
    kv = std::make_unique<KvCacheManager>(num_blocks, bs, max_model_len, config.enable_prefix_caching,
                                          info.sliding_window);
    SchedulerConfig sc;
    sc.max_num_seqs = config.max_num_seqs;
    sc.max_num_batched_tokens = config.max_num_batched_tokens;
    sc.max_model_len = max_model_len;
    sc.enable_chunked_prefill = config.enable_chunked_prefill;
    sc.policy = config.policy;
    sc.eos_ids = eos_ids;
    scheduler = std::make_unique<Scheduler>(sc, *kv);
    runner = std::make_unique<ModelRunner>(model, config.max_num_seqs, max_model_len);
    sampler = std::make_unique<Sampler>(info.vocab_size);
    sampled.reserve(size_t(config.max_num_seqs));
}

void Engine::Impl::validate(const Request& r) const {
    const SamplingParams& p = r.params;
    const int V = info.vocab_size;
    if (r.id.empty()) fail("request: empty request id");
    const std::string& id = r.id;
    if (r.prompt_ids.empty()) fail("request {}: the prompt is empty", id);
    for (size_t i = 0; i < r.prompt_ids.size(); ++i)
        if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= V)
            fail("request {}: prompt token {} at position {} is outside the vocabulary [0, {})", id,
                 r.prompt_ids[i], i, V);
    if (int64_t(r.prompt_ids.size()) > config.max_model_len) {
        if (config.max_model_len < context_len && config.max_model_len < int(r.prompt_ids.size()))
            fail("request {}: the prompt has {} tokens, more than max_model_len {} (the model's context is "
                 "{} tokens; the KV cache of {} bytes or the configured max_model_len limits it)",
                 id, r.prompt_ids.size(), config.max_model_len, context_len, config.kv_cache_bytes);
        fail("request {}: the prompt has {} tokens, more than the model's context of {} tokens", id,
             r.prompt_ids.size(), config.max_model_len);
    }
    if (!config.enable_chunked_prefill && int(r.prompt_ids.size()) > config.max_num_batched_tokens)
        fail("request {}: the prompt has {} tokens but chunked prefill is off and a step takes at most {}",
             id, r.prompt_ids.size(), config.max_num_batched_tokens);
    if (p.n < 1 || p.n > 1024) fail("request {}: n must be in [1, 1024] (got {})", id, p.n);
    if (!std::isfinite(p.temperature) || p.temperature < 0)
        fail("request {}: temperature must be >= 0 (got {})", id, p.temperature);
    if (!(p.top_p > 0 && p.top_p <= 1)) fail("request {}: top_p must be in (0, 1] (got {})", id, p.top_p);
    if (p.top_k < -1) fail("request {}: top_k must be -1, 0 (off) or positive (got {})", id, p.top_k);
    if (!(p.min_p >= 0 && p.min_p <= 1)) fail("request {}: min_p must be in [0, 1] (got {})", id, p.min_p);
    if (!(p.repetition_penalty > 0) || !std::isfinite(p.repetition_penalty))
        fail("request {}: repetition_penalty must be > 0 (got {})", id, p.repetition_penalty);
    if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2))
        fail("request {}: presence_penalty must be in [-2, 2] (got {})", id, p.presence_penalty);
    if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2))
        fail("request {}: frequency_penalty must be in [-2, 2] (got {})", id, p.frequency_penalty);
    if (p.max_tokens < 1) fail("request {}: max_tokens must be >= 1 (got {})", id, p.max_tokens);
    if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
        fail("request {}: min_tokens must be in [0, max_tokens={}] (got {})", id, p.max_tokens, p.min_tokens);
    if (p.logprobs < -1 || p.logprobs > V)
        fail("request {}: logprobs must be in [-1, {}] (got {})", id, V, p.logprobs);
    for (auto [tok, bias] : p.logit_bias) {
        if (tok < 0 || tok >= V) fail("request {}: logit_bias token {} is outside the vocabulary [0, {})", id, tok, V);
        if (!std::isfinite(bias)) fail("request {}: logit_bias for token {} is not finite", id, tok);
    }
    for (int32_t tok : p.stop_token_ids)
        if (tok < 0 || tok >= V) fail("request {}: stop token {} is outside the vocabulary [0, {})", id, tok, V);
    for (const std::string& s : p.stop)
        if (s.empty()) fail("request {}: empty stop string", id);
    if (!p.stop.empty() && !tokenizer)
        fail("request {}: stop strings need a tokenizer and this engine has none", id);
}

void Engine::Impl::add_request(Request r, OutputCallback cb) {
    validate(r);
    if (groups.count(r.id)) fail("request {}: a request with this id is already running", r.id);
    auto g = std::make_unique<RequestGroup>();
    g->id = r.id;
    g->params = std::move(r.params);
    g->on_output = std::move(cb);
    const double arrival = r.arrival_time > 0 ? r.arrival_time : now_seconds();
    const uint64_t salt_key = hash_extra_key(r.cache_salt);
    const int bs = info.block_size;
    const size_t max_tokens = size_t(std::min<int64_t>(int64_t(r.prompt_ids.size()) + g->params.max_tokens,
                                                       config.max_model_len)) + 1;
    for (int i = 0; i < g->params.n; ++i) {
        auto s = std::make_unique<EngineSeq>();
        s->group = g.get();
        s->request_id = g->id;
        s->sample_index = i;
        s->params = &g->params;
        s->priority = r.priority;
        s->arrival_time = arrival;
        s->arrival_order = arrival_counter++;
        // Reserve for the whole generation so appending tokens and blocks never reallocates.
        s->tokens.reserve(max_tokens);
        s->tokens.assign(r.prompt_ids.begin(), r.prompt_ids.end());
        s->num_prompt_tokens = int(r.prompt_ids.size());
        s->blocks.reserve(max_tokens / size_t(bs) + 1);
        s->block_hashes.reserve(max_tokens / size_t(bs) + 1);
        s->extra_key = salt_key;
        // vLLM gives the i-th child of a seeded request seed + i (vllm/v1/engine/parallel_sampling.py).
        s->rng.reseed(g->params.seed ? *g->params.seed + uint64_t(i) : seed_source());
        if (tokenizer)
            s->detok = std::make_unique<text::IncrementalDecoder>(*tokenizer, g->params.skip_special_tokens,
                                                                  r.prompt_ids);
        s->text = TextStream(&g->params.stop, g->params.include_stop_str_in_output);
        s->out.request_id = g->id;
        s->out.index = i;
        s->out.num_prompt_tokens = s->num_prompt_tokens;
        s->out.new_token_ids.reserve(1);
        if (i > 0) s->wait_for = g->samples[0].get();
        g->samples.push_back(std::move(s));
    }
    for (auto& s : g->samples) scheduler->add_request(s.get());
    stats.prompt_tokens += int64_t(r.prompt_ids.size());
    groups.emplace(g->id, std::move(g));
}

void Engine::Impl::emit_final(EngineSeq& s, FinishReason reason, const std::string& error) {
    RequestOutput& o = s.out;
    o.new_token_ids.clear();
    o.logprobs.clear();
    o.new_text.clear();
    o.finish_reason = reason;
    o.error = error;
    o.num_output_tokens = s.num_output_tokens();
    o.num_cached_tokens = std::max(0, s.num_cached_tokens);
    s.done = true;
    ++s.group->num_done;
    s.group->on_output(o);
}

void Engine::Impl::emit_token(EngineSeq& s, int32_t token) {
    const SamplingParams& p = *s.params;
    RequestOutput& o = s.out;
    o.new_token_ids.clear();
    o.new_token_ids.push_back(token);
    if (p.logprobs >= 0) {
        o.logprobs.resize(1);
        std::swap(o.logprobs[0], s.logprob);  // keeps both vectors' capacity
    }
    bool finished = is_finished(s.status);
    if (s.detok) {
        // vLLM: vllm/v1/engine/detokenizer.py:L93: a stop token's own text is left out unless
        // stop strings are to be included.
        const bool stopped_by_token = s.status == SeqStatus::finished_stopped;
        int matched = -1;
        if (!(stopped_by_token && !p.include_stop_str_in_output)) {
            std::string piece = s.detok->push(token);
            const bool check = !finished && s.num_output_tokens() >= p.min_tokens;
            matched = s.text.append(piece, check);
        }
        if (matched >= 0) {
            s.stop_reason = p.stop[size_t(matched)];
            scheduler->finish_request(&s, SeqStatus::finished_stopped);
            finished = true;
        } else if (finished) {
            s.text.append_unchecked(s.detok->flush());
        }
        o.new_text.assign(s.text.next_chunk(finished));
    }
    o.finish_reason = !finished ? FinishReason::none
                      : s.status == SeqStatus::finished_length ? FinishReason::length
                                                               : FinishReason::stop;
    o.stop_reason = s.stop_reason;
    o.num_output_tokens = s.num_output_tokens();
    o.num_cached_tokens = std::max(0, s.num_cached_tokens);
    ++stats.generation_tokens;
    if (finished) {
        s.done = true;
        ++s.group->num_done;
    }
    s.group->on_output(o);
}

void Engine::Impl::retire_if_done(RequestGroup* g, bool aborted) {
    if (!g->all_done()) return;
    auto it = groups.find(g->id);
    if (it == groups.end() || it->second.get() != g) return;
    ++(aborted ? stats.requests_aborted : stats.requests_finished);
    if (in_step) graveyard.push_back(std::move(it->second));
    groups.erase(it);
}

bool Engine::Impl::abort(const std::string& id) {
    auto it = groups.find(id);
    if (it == groups.end()) return false;
    // Outside a step the aborted sequences are freed at once; the step launched ahead may carry them.
    if (!in_step) drop_ahead();
    RequestGroup* g = it->second.get();
    for (auto& s : g->samples) {
        if (s->done) continue;
        scheduler->finish_request(s.get(), SeqStatus::finished_aborted);
        emit_final(*s, FinishReason::abort, "");
    }
    retire_if_done(g, /*aborted=*/true);
    return true;
}

// vLLM: vllm/v1/engine/core.py (EngineCore.step): schedule, execute, update_from_output.
bool Engine::Impl::step() {
    if (in_step) throw std::logic_error("Engine::step called from inside a step (an output callback)");
    in_step = true;
    struct Guard { Impl* e; ~Guard() { e->in_step = false; e->graveyard.clear(); } } guard{this};

    const double t0 = now_seconds();
    const SchedulerOutput& out = scheduler->schedule();
    const double t1 = now_seconds();
    stats.time_schedule_s += t1 - t0;
    if (out.empty()) {
        drop_ahead();
        return false;
    }
    ++stats.steps;

    runner->prepare(out);
    // The step launched ahead by the previous one, if this schedule is that step; else it is dropped.
    const bool adopt = runner->has_ahead() && runner->ahead_matches(out);
    if (!adopt) drop_ahead();
    // Sampling on the model's device when it can and every row allows it (only token ids come back).
    const bool device_sampled = adopt || runner->plan_device_sampling(out, rng_of);
    const double t2 = now_seconds();
    try {
        if (adopt) {
            runner->adopt_ahead();
            ++stats.run_ahead_adopted;
        } else {
            runner->launch(kv_memory->pool());
        }
        // While this step runs on the device, enqueue the next one as it will most likely be.
        if (config.run_ahead &&
            runner->launch_ahead(out, kv_memory->pool(), config.max_model_len, scheduler->num_waiting() > 0, rng_of))
            ++stats.run_ahead_launched;
        runner->finish();
    } catch (const std::exception& e) {
        runner->recover();  // nothing of this step, or of the one launched ahead, stays pending
        // The forward failed: fail what it carried, keep serving the rest.
        const std::string msg = std::string("forward failed: ") + e.what();
        for (const ScheduledSeq& sch : out.seqs) {
            auto& s = static_cast<EngineSeq&>(*sch.seq);
            if (s.done) continue;
            scheduler->finish_request(&s, SeqStatus::finished_error);
            emit_final(s, FinishReason::error, msg);
        }
        for (const ScheduledSeq& sch : out.seqs) retire_if_done(static_cast<EngineSeq&>(*sch.seq).group);
        return true;
    }
    const double t3 = now_seconds();

    sampled.assign(out.seqs.size(), -1);
    for (size_t i = 0; i < out.seqs.size(); ++i) {
        const ScheduledSeq& sch = out.seqs[i];
        stats.forward_tokens += sch.num_tokens;
        stats.prompt_tokens_computed +=
            std::max(0, std::min(sch.start + sch.num_tokens, sch.seq->num_prompt_tokens) - sch.start);
        if (!sch.needs_sample) continue;
        auto& s = static_cast<EngineSeq&>(*sch.seq);
        sampled[i] = device_sampled ? runner->device_token_of(i)
                                    : sampler->sample(runner->logits_of(i), *s.params, s.tokens, s.num_output_tokens(),
                                                      eos_ids, s.rng, s.params->logprobs >= 0 ? &s.logprob : nullptr);
    }
    const double t4 = now_seconds();

    scheduler->update_from_output(sampled);
    for (size_t i = 0; i < out.seqs.size(); ++i) {
        auto& s = static_cast<EngineSeq&>(*out.seqs[i].seq);
        if (sampled[i] >= 0 && !s.done) emit_token(s, sampled[i]);
    }
    // A sequence that ended (EOS, a stop string, an abort from a callback) is freed at the end of
    // this step: the step launched ahead carries it, so it goes now, while its sequences exist.
    if (runner->has_ahead())
        for (const ScheduledSeq& sch : out.seqs)
            if (is_finished(sch.seq->status)) {
                drop_ahead();
                break;
            }
    for (const ScheduledSeq& sch : out.seqs) retire_if_done(static_cast<EngineSeq&>(*sch.seq).group);
    const double t5 = now_seconds();

    stats.time_prepare_s += t2 - t1;
    stats.time_forward_s += t3 - t2;
    stats.time_sample_s += t4 - t3;
    stats.time_output_s += t5 - t4;
    return true;
}

// ---- Engine ----------------------------------------------------------------------------------------

Engine::Engine(CompiledModel& model, const text::Tokenizer* tokenizer, EngineConfig config)
    : impl_(std::make_unique<Impl>(model, tokenizer, config)) {}
Engine::~Engine() = default;

void Engine::add_request(Request request, OutputCallback on_output) {
    impl_->add_request(std::move(request), std::move(on_output));
}
void Engine::validate(const Request& request) const { impl_->validate(request); }
bool Engine::abort(const std::string& request_id) { return impl_->abort(request_id); }
int Engine::abort_all() {
    std::vector<std::string> ids;
    for (auto& [id, g] : impl_->groups) ids.push_back(id);
    int n = 0;
    for (auto& id : ids) n += impl_->abort(id);
    return n;
}
bool Engine::step() { return impl_->step(); }
bool Engine::has_unfinished() const { return impl_->scheduler->has_unfinished(); }
const EngineConfig& Engine::config() const { return impl_->config; }

EngineStats Engine::stats() const {
    EngineStats s = impl_->stats;
    s.num_running = impl_->scheduler->num_running();
    s.num_waiting = impl_->scheduler->num_waiting();
    s.kv_blocks_total = impl_->kv->pool().num_blocks() - 1;  // the null block is not usable
    s.kv_blocks_free = impl_->kv->pool().num_free_blocks();
    s.prefix_cache_queries = impl_->kv->prefix_cache_queries;
    s.prefix_cache_hits = impl_->kv->prefix_cache_hits;
    s.num_preemptions = impl_->scheduler->num_preemptions();
    return s;
}

}  // namespace scr
