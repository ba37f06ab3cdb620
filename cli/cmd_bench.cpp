// `scr bench [MODEL] --mode throughput|latency|forward`: the engine's offline throughput (N
// requests at once, prefix caching on/off, optionally against one-at-a-time), latency at a
// concurrency (TTFT, TPOT, ITL percentiles), and the bare compiled forward (prefill and decode
// tokens/s) beside the memory-bandwidth floor measured in the same run.
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/kv_pool.hpp"
#include "runtime/model/loader.hpp"

namespace scr::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct BenchArgs {
    std::string model, quant, mode = "throughput", prefix_caching = "both";
    int threads = 0;
    int num_prompts = 64, input_len = 128, output_len = 64, shared_prefix = 0;
    int max_num_seqs = 64, max_batched_tokens = 0, concurrency = 4;  // 0 tokens: the compiled step size
    int batch = 1, context = 128, iters = 5;
    int64_t kv_cache_mb = 0;
    float temperature = 0, top_p = 1.0f;
    int top_k = 0;
    uint64_t seed = 1;
    bool one_at_a_time = false;
    bool huge_pages = LoadOptions::huge_pages_from_env();
};

// ---- progress bar (stderr, only on a terminal) ---------------------------------------------------

class Progress {
public:
    Progress(std::string what, int total) : what_(std::move(what)), total_(total), tty_(isatty(STDERR_FILENO)) {}
    void update(int done) {
        if (!tty_ || (done < total_ && seconds_since(last_) < 0.1)) return;
        last_ = Clock::now();
        const int width = 30, filled = total_ ? width * done / total_ : width;
        const double el = seconds_since(start_);
        const double eta = done ? el * (total_ - done) / done : 0;
        fmt::print(stderr, "\r{} [{}{}] {}/{} {:.1f}s eta {:.1f}s ", what_, std::string(size_t(filled), '#'),
                   std::string(size_t(width - filled), '.'), done, total_, el, eta);
        if (done >= total_) fmt::print(stderr, "\n");
    }
private:
    std::string what_;
    int total_;
    bool tty_;
    Clock::time_point start_ = Clock::now(), last_ = Clock::now() - std::chrono::seconds(1);
};

// ---- memory bandwidth probe ---------------------------------------------------------------------

// Streaming read of a large anonymous buffer on huge pages with 2 threads; best of 3 passes, GB/s.
double measure_read_bandwidth(size_t bytes = size_t(1) << 30) {
    const size_t huge = size_t(2) << 20;
    void* map = mmap(nullptr, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) fail("bandwidth probe: cannot map {} bytes", bytes);
    auto* base = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(map) + huge - 1) & ~uintptr_t(huge - 1));
    madvise(base, bytes, MADV_HUGEPAGE);
    const size_t n = bytes / sizeof(uint64_t);
    for (size_t i = 0; i < n; ++i) base[i] = i;  // fault every page in
    double best = 0;
    for (int pass = 0; pass < 3; ++pass) {
        uint64_t sums[2] = {0, 0};
        auto t0 = Clock::now();
        std::thread other([&] {
            uint64_t s = 0;
            for (size_t i = n / 2; i < n; ++i) s += base[i];
            sums[1] = s;
        });
        uint64_t s = 0;
        for (size_t i = 0; i < n / 2; ++i) s += base[i];
        sums[0] = s;
        other.join();
        const double t = seconds_since(t0);
        if (sums[0] + sums[1] == 42) fmt::print(" ");  // keep the sums alive
        best = std::max(best, double(bytes) / t / 1e9);
    }
    munmap(map, bytes + huge);
    return best;
}

// Streaming read of the model's own weight bytes, where the model reads them (file mapping or
// huge-page copy), 2 threads, best of 3 passes, GB/s: the floor for these very pages.
double measure_weight_read_bandwidth(const WeightSet& weights, const ModelInfo& info) {
    struct Span { const std::byte* p; size_t bytes; };
    std::vector<Span> spans;
    size_t total = 0;
    for (size_t i = 0; i < info.tensors.size() && i < weights.size(); ++i) {
        const TensorSpec& t = info.tensors[i];
        if (!weights.data(i)) continue;
        size_t elems = 1;
        for (int d = 0; d < t.rank; ++d) elems *= size_t(t.shape[d]);
        spans.push_back({static_cast<const std::byte*>(weights.data(i)), elems * size_t(dtype_bytes(t.dtype))});
        total += spans.back().bytes;
    }
    auto read_half = [&](int half) {
        uint64_t acc[8] = {};
        for (const Span& s : spans) {
            const size_t words = s.bytes / 64 * 8, mid = words / 2;
            const auto* w = reinterpret_cast<const uint64_t*>(s.p);
            for (size_t i = half ? mid : 0, e = half ? words : mid; i < e; i += 8)
                for (int j = 0; j < 8; ++j) acc[j] ^= w[i + size_t(j)];
        }
        uint64_t x = 0;
        for (uint64_t a : acc) x ^= a;
        return x;
    };
    double best = 0;
    for (int pass = 0; pass < 3; ++pass) {
        uint64_t other_sum = 0;
        auto t0 = Clock::now();
        std::thread other([&] { other_sum = read_half(1); });
        const uint64_t mine = read_half(0);
        other.join();
        const double t = seconds_since(t0);
        if ((mine ^ other_sum) == 42) fmt::print(" ");  // keep the reads alive
        best = std::max(best, double(total) / t / 1e9);
    }
    return best;
}

// ---- request generation ------------------------------------------------------------------------

std::vector<std::vector<int32_t>> make_prompts(const BenchArgs& a, int vocab) {
    std::mt19937_64 g(a.seed);
    std::vector<int32_t> prefix;
    for (int i = 0; i < std::min(a.shared_prefix, a.input_len); ++i) prefix.push_back(int32_t(g() % uint64_t(vocab)));
    std::vector<std::vector<int32_t>> out;
    for (int r = 0; r < a.num_prompts; ++r) {
        std::vector<int32_t> p = prefix;
        while (int(p.size()) < a.input_len) p.push_back(int32_t(g() % uint64_t(vocab)));
        out.push_back(std::move(p));
    }
    return out;
}

Request bench_request(const BenchArgs& a, int i, const std::vector<int32_t>& prompt) {
    Request r;
    r.id = fmt::format("b{}", i);
    r.prompt_ids = prompt;
    r.params.max_tokens = a.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = a.temperature;
    r.params.top_k = a.top_k;
    r.params.top_p = a.top_p;
    r.params.seed = a.seed + uint64_t(i);
    return r;
}

EngineConfig engine_config(const BenchArgs& a, bool prefix_caching) {
    EngineConfig c;
    c.max_num_seqs = a.max_num_seqs;
    c.max_num_batched_tokens = a.max_batched_tokens;
    c.enable_prefix_caching = prefix_caching;
    c.kv_cache_bytes = a.kv_cache_mb << 20;
    return c;
}

std::vector<bool> caching_modes(const std::string& s) {
    if (s == "on") return {true};
    if (s == "off") return {false};
    if (s == "both") return {false, true};
    fail("--prefix-caching must be on, off or both (got \"{}\")", s);
}

void print_engine_overhead(const EngineStats& s, double wall) {
    const double overhead = s.time_schedule_s + s.time_prepare_s + s.time_sample_s + s.time_output_s;
    const double steps = double(std::max<int64_t>(s.steps, 1));
    fmt::print("  steps {} (mean {:.1f} tokens/step), preemptions {}, prefix-cache hits {}/{} prompt tokens\n", s.steps,
               double(s.forward_tokens) / steps, s.num_preemptions, s.prefix_cache_hits, s.prefix_cache_queries);
    fmt::print("  per step: forward {:.3f} ms; engine overhead {:.1f} us = {:.2f}% of the step "
               "(schedule {:.1f}, batch {:.1f}, sample {:.1f}, output {:.1f} us)\n",
               1e3 * s.time_forward_s / steps, 1e6 * overhead / steps,
               100.0 * overhead / std::max(1e-12, overhead + s.time_forward_s), 1e6 * s.time_schedule_s / steps,
               1e6 * s.time_prepare_s / steps, 1e6 * s.time_sample_s / steps, 1e6 * s.time_output_s / steps);
    if (s.run_ahead_launched > 0)
        fmt::print("  run-ahead: {} steps launched before the previous step's tokens were back, {} adopted, {} dropped\n",
                   s.run_ahead_launched, s.run_ahead_adopted, s.run_ahead_dropped);
    (void)wall;
}

// ---- throughput ---------------------------------------------------------------------------------

void run_throughput(const BenchArgs& a, LoadedModel& lm) {
    const ModelInfo& info = lm.model->info();
    const auto prompts = make_prompts(a, info.vocab_size);
    const double bw = measure_read_bandwidth();
    const double floor_step_s = double(info.active_weight_bytes) / (bw * 1e9);
    fmt::print("throughput: {} requests, {} prompt + {} output tokens each, shared prefix {}, max_num_seqs {}, "
               "max_num_batched_tokens {}, temperature {}; model {} ({}), {} thread(s)\n",
               a.num_prompts, a.input_len, a.output_len, a.shared_prefix, a.max_num_seqs,
               a.max_batched_tokens > 0 ? std::min(a.max_batched_tokens, info.max_batch_tokens) : info.max_batch_tokens,
               a.temperature, info.stem, info.quant, a.threads ? a.threads : int(std::thread::hardware_concurrency()));
    fmt::print("memory read bandwidth (2 threads, huge pages): {:.1f} GB/s -> weight-read floor {:.3f} ms per step "
               "({} bytes of weights per decode step)\n", bw, floor_step_s * 1e3, info.active_weight_bytes);
    for (bool caching : caching_modes(a.prefix_caching)) {
        for (bool sequential : a.one_at_a_time ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
            Engine engine(*lm.model, nullptr, engine_config(a, caching));
            int finished = 0;
            Progress bar(sequential ? "one at a time" : "batched", a.num_prompts);
            auto cb = [&](const RequestOutput& o) { if (o.finished()) bar.update(++finished); };
            const auto t0 = Clock::now();
            if (sequential) {
                for (int i = 0; i < a.num_prompts; ++i) {
                    engine.add_request(bench_request(a, i, prompts[size_t(i)]), cb);
                    while (engine.has_unfinished()) engine.step();
                }
            } else {
                for (int i = 0; i < a.num_prompts; ++i) engine.add_request(bench_request(a, i, prompts[size_t(i)]), cb);
                while (engine.has_unfinished()) engine.step();
            }
            const double wall = seconds_since(t0);
            const EngineStats s = engine.stats();
            const double out_tokens = double(a.num_prompts) * a.output_len;
            const double mean_step = s.time_forward_s / double(std::max<int64_t>(s.steps, 1));
            fmt::print("prefix caching {}, {}: {:.2f} s, {:.2f} requests/s, {:.1f} output tokens/s, {:.1f} total "
                       "tokens/s (prompt tokens computed {})\n",
                       caching ? "on" : "off", sequential ? "one at a time" : "continuous batching", wall,
                       a.num_prompts / wall, out_tokens / wall,
                       (out_tokens + double(a.num_prompts) * a.input_len) / wall, s.prompt_tokens_computed);
            fmt::print("  mean forward {:.3f} ms vs weight-read floor {:.3f} ms: {:.0f}% of the bandwidth bound\n",
                       mean_step * 1e3, floor_step_s * 1e3, 100.0 * floor_step_s / std::max(1e-12, mean_step));
            print_engine_overhead(s, wall);
        }
    }
}

// ---- latency ------------------------------------------------------------------------------------

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const double idx = p / 100.0 * double(v.size() - 1);
    const size_t lo = size_t(std::floor(idx)), hi = size_t(std::ceil(idx));
    return v[lo] + (v[hi] - v[lo]) * (idx - double(lo));
}

void run_latency(const BenchArgs& a, LoadedModel& lm) {
    const ModelInfo& info = lm.model->info();
    const auto prompts = make_prompts(a, info.vocab_size);
    fmt::print("latency: {} requests at concurrency {}, {} prompt + {} output tokens, shared prefix {}, temperature {} "
               "top_k {} top_p {}; model {} ({})\n",
               a.num_prompts, a.concurrency, a.input_len, a.output_len, a.shared_prefix, a.temperature, a.top_k, a.top_p,
               info.stem, info.quant);
    for (bool caching : caching_modes(a.prefix_caching)) {
        Engine engine(*lm.model, nullptr, engine_config(a, caching));
        struct Timing { Clock::time_point submit, last; double ttft = -1; std::vector<double> itl; int tokens = 0; int cached = 0; };
        std::vector<Timing> t(size_t(a.num_prompts));
        int next = 0, finished = 0;
        Progress bar(caching ? "latency (prefix cache on)" : "latency (prefix cache off)", a.num_prompts);
        auto submit = [&] {
            const int i = next++;
            t[size_t(i)].submit = Clock::now();
            engine.add_request(bench_request(a, i, prompts[size_t(i)]), [&, i](const RequestOutput& o) {
                Timing& x = t[size_t(i)];
                const auto now = Clock::now();
                if (!o.new_token_ids.empty()) {
                    if (x.ttft < 0) x.ttft = std::chrono::duration<double>(now - x.submit).count();
                    else x.itl.push_back(std::chrono::duration<double>(now - x.last).count());
                    x.last = now;
                    x.tokens += int(o.new_token_ids.size());
                }
                x.cached = o.num_cached_tokens;
                if (o.finished()) bar.update(++finished);
            });
        };
        const auto t0 = Clock::now();
        while (next < std::min(a.concurrency, a.num_prompts)) submit();
        while (engine.has_unfinished()) {
            engine.step();
            // Keep `concurrency` requests in flight.
            while (next < a.num_prompts && next - finished < a.concurrency) submit();
        }
        const double wall = seconds_since(t0);
        std::vector<double> ttft, tpot, itl;
        int64_t cached = 0;
        for (const Timing& x : t) {
            ttft.push_back(x.ttft * 1e3);
            if (x.tokens > 1) {
                double sum = std::accumulate(x.itl.begin(), x.itl.end(), 0.0);
                tpot.push_back(sum / double(x.tokens - 1) * 1e3);
            }
            for (double d : x.itl) itl.push_back(d * 1e3);
            cached += x.cached;
        }
        fmt::print("prefix caching {}: {:.2f} s, {:.1f} output tokens/s; mean cached prompt tokens per request {:.1f}\n",
                   caching ? "on" : "off", wall, double(a.num_prompts) * a.output_len / wall,
                   double(cached) / a.num_prompts);
        for (auto [name, v] : {std::pair<const char*, std::vector<double>*>{"TTFT", &ttft}, {"TPOT", &tpot}, {"ITL", &itl}})
            fmt::print("  {:<4} ms: mean {:8.3f}  p50 {:8.3f}  p90 {:8.3f}  p99 {:8.3f}\n", name,
                       v->empty() ? 0.0 : std::accumulate(v->begin(), v->end(), 0.0) / double(v->size()),
                       percentile(*v, 50), percentile(*v, 90), percentile(*v, 99));
        print_engine_overhead(engine.stats(), wall);
    }
}

// ---- forward ------------------------------------------------------------------------------------

void run_forward(const BenchArgs& a, LoadedModel& lm) {
    CompiledModel& model = *lm.model;
    const ModelInfo& info = model.info();
    const int bs = info.block_size;
    const int L = std::min(a.input_len, info.max_position_embeddings);
    const int B = std::min(a.batch, info.max_logit_rows);
    const int C = std::min(a.context, info.max_position_embeddings - 1);
    const int blocks_prefill = (L + bs - 1) / bs, blocks_decode = (C + 1 + bs - 1) / bs;
    const int stride = std::max(blocks_prefill, blocks_decode);
    engine::KvPoolMemory kv(std::max(blocks_prefill, B * blocks_decode) + 1, info.kv_bytes_per_block);
    std::vector<float> logits(size_t(std::max(B, 1)) * size_t(info.vocab_size));
    std::mt19937 g(uint32_t(a.seed));
    const double bw = measure_read_bandwidth();
    const double floor_s = double(info.active_weight_bytes) / (bw * 1e9);
    fmt::print("forward: model {} ({}, {} layers, hidden {}), {} thread(s); weights read per forward {} bytes\n",
               info.stem, info.quant, info.num_layers, info.hidden_size,
               a.threads ? a.threads : int(std::thread::hardware_concurrency()), info.active_weight_bytes);
    fmt::print("memory read bandwidth (2 threads, huge pages, this run): {:.1f} GB/s -> {:.3f} ms to read the weights once\n",
               bw, floor_s * 1e3);
    const double wbw = measure_weight_read_bandwidth(*lm.weights, info);
    fmt::print("weight read bandwidth (2 threads, the model's own weight pages, {}): {:.1f} GB/s -> weight-read floor "
               "{:.1f} tokens/s\n", lm.weights->huge_page_bytes() ? "huge-page copy" : "file mapping", wbw,
               wbw * 1e9 / double(info.active_weight_bytes));

    // Prefill: one sequence of L tokens in chunks of the compiled step size (or --max-batched-tokens, at most that).
    const int step = a.max_batched_tokens > 0 ? std::min(a.max_batched_tokens, info.max_batch_tokens) : info.max_batch_tokens;
    std::vector<int32_t> ids(size_t(info.max_batch_tokens)), pos(ids.size()), table(static_cast<size_t>(stride));
    std::vector<int64_t> slots(ids.size());
    std::iota(table.begin(), table.end(), 1);
    int32_t qs[2], seq_len, row;
    auto prefill = [&] {
        for (int done = 0; done < L;) {
            const int n = std::min(step, L - done);
            for (int i = 0; i < n; ++i) {
                ids[size_t(i)] = int32_t(g() % uint32_t(info.vocab_size));
                pos[size_t(i)] = done + i;
                slots[size_t(i)] = int64_t(table[size_t((done + i) / bs)]) * bs + (done + i) % bs;
            }
            qs[0] = 0; qs[1] = n; seq_len = done + n; row = n - 1;
            StepBatch b;
            b.num_tokens = n; b.token_ids = ids.data(); b.positions = pos.data(); b.slot_mapping = slots.data();
            b.num_seqs = 1; b.query_start = qs; b.seq_lens = &seq_len; b.block_tables = table.data();
            b.block_table_stride = stride;
            const bool last = done + n == L;
            b.num_logits = last ? 1 : 0; b.logit_rows = &row;
            model.forward(b, kv.pool(), last ? logits.data() : nullptr);
            done += n;
        }
    };
    prefill();  // warm-up
    double best = 1e30;
    for (int it = 0; it < a.iters; ++it) {
        auto t0 = Clock::now();
        prefill();
        best = std::min(best, seconds_since(t0));
    }
    const int chunks = (L + step - 1) / step;
    fmt::print("prefill {} tokens ({} forward(s)): {:.1f} tokens/s (best of {}: {:.3f} s); weight-read floor "
               "{:.1f} tokens/s; ratio {:.2f}\n", L, chunks, L / best, a.iters, best,
               L / (chunks * floor_s), (chunks * floor_s) / best);

    // Decode: B sequences at context C, one token each per forward.
    const size_t nb = static_cast<size_t>(B);
    std::vector<int32_t> dtable(nb * static_cast<size_t>(stride)), dqs(nb + 1), dlens(nb), drows(nb);
    std::vector<int32_t> dids(nb), dpos(nb);
    std::vector<int64_t> dslots(nb);
    for (int s = 0; s < B; ++s) {
        for (int j = 0; j < blocks_decode; ++j) dtable[size_t(s * stride + j)] = 1 + s * blocks_decode + j;
        dqs[size_t(s)] = s;
        dlens[size_t(s)] = C + 1;
        drows[size_t(s)] = s;
        dpos[size_t(s)] = C;
        dslots[size_t(s)] = int64_t(dtable[size_t(s * stride + C / bs)]) * bs + C % bs;
    }
    dqs[size_t(B)] = B;
    StepBatch d;
    d.num_tokens = B; d.token_ids = dids.data(); d.positions = dpos.data(); d.slot_mapping = dslots.data();
    d.num_seqs = B; d.query_start = dqs.data(); d.seq_lens = dlens.data(); d.block_tables = dtable.data();
    d.block_table_stride = stride; d.num_logits = B; d.logit_rows = drows.data();
    // A model that samples on its device (CUDA) draws greedily there, as the engine does when every
    // request allows it: only B token ids come back, not B x vocab logits (33 MB per step at B = 64
    // for a 128k vocabulary, which would otherwise dominate a batched step).
    const bool on_device = model.can_sample_on_device();
    const std::vector<DeviceSamplingRow> greedy(nb);
    std::vector<int32_t> sampled(nb);
    auto decode_step = [&] {
        for (auto& x : dids) x = int32_t(g() % uint32_t(info.vocab_size));
        if (on_device) model.forward_sample(d, kv.pool(), greedy, sampled.data());
        else model.forward(d, kv.pool(), logits.data());
    };
    decode_step();
    const int steps = std::max(3, a.iters * 4);
    auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) decode_step();
    const double step_s = seconds_since(t0) / steps;
    fmt::print("decode batch {} at context {}{}: {:.1f} tokens/s ({:.3f} ms/step, mean of {}); weight-read floor "
               "{:.1f} tokens/s; ratio {:.2f}\n", B, C, on_device ? ", sampled on the device" : "", B / step_s, step_s * 1e3,
               steps, B / floor_s, floor_s / step_s);
}

void setup(CLI::App& app) {
    auto* c = app.add_subcommand("bench", "benchmark the engine (throughput, latency) or the bare forward");
    auto a = std::make_shared<BenchArgs>();
    c->add_option("model", a->model, "model folder or Hugging Face id (default: the embedded model)");
    c->add_option("--mode", a->mode, "throughput | latency | forward")->check(CLI::IsMember({"throughput", "latency", "forward"}));
    c->add_option("--quant", a->quant, "quant preset of the specialization to use");
    c->add_option("--threads", a->threads, "CPU threads (default: all cores)");
    c->add_option("--num-prompts", a->num_prompts, "requests (throughput, latency)")->check(CLI::Range(1, 1 << 20));
    c->add_option("--input-len", a->input_len, "prompt tokens per request; prefill length (forward)")->check(CLI::Range(1, 1 << 24));
    c->add_option("--output-len", a->output_len, "generated tokens per request")->check(CLI::Range(1, 1 << 24));
    c->add_option("--shared-prefix", a->shared_prefix, "leading prompt tokens shared by all requests")->check(CLI::Range(0, 1 << 24));
    c->add_option("--prefix-caching", a->prefix_caching, "on | off | both");
    c->add_option("--max-num-seqs", a->max_num_seqs, "most sequences per step")->check(CLI::Range(1, 1 << 20));
    c->add_option("--max-batched-tokens", a->max_batched_tokens,
                  "token budget per step; forward: the prefill chunk (default: the compiled step size)")
        ->check(CLI::Range(1, 1 << 24));
    c->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache size in MiB (default: from free memory)")->check(CLI::Range(0, 1 << 24));
    c->add_option("--concurrency", a->concurrency, "requests in flight (latency)")->check(CLI::Range(1, 1 << 20));
    c->add_option("--batch", a->batch, "decode batch (forward)")->check(CLI::Range(1, 1 << 20));
    c->add_option("--context", a->context, "context length of each decoding sequence (forward)")->check(CLI::Range(0, 1 << 24));
    c->add_option("--iters", a->iters, "repetitions (forward)")->check(CLI::Range(1, 1 << 20));
    c->add_option("--temperature", a->temperature, "sampling temperature (0: greedy)")->check(CLI::Range(0.0, 100.0));
    c->add_option("--top-k", a->top_k, "sampling: keep the k most likely tokens (0: off)")->check(CLI::Range(0, 1 << 24));
    c->add_option("--top-p", a->top_p, "sampling: keep the smallest set holding this much probability (1: off)")
        ->check(CLI::Range(0.0, 1.0));
    c->add_option("--seed", a->seed, "seed of the random prompts and sampling");
    c->add_flag("--one-at-a-time", a->one_at_a_time, "throughput: also run the requests one after another");
    c->add_flag("--huge-pages,!--no-huge-pages", a->huge_pages,
                "copy the weights into 2 MiB pages at load, or not (default: SCR_HUGE_PAGES, else on)");
    c->callback([a] {
        LoadOptions o;
        o.quant = a->quant;
        o.threads = a->threads;
        o.load_text = false;
        o.huge_pages = a->huge_pages;
        LoadedModel lm = load_model(a->model, o);
        if (a->mode == "forward") run_forward(*a, lm);
        else if (a->mode == "latency") run_latency(*a, lm);
        else run_throughput(*a, lm);
    });
}

CommandRegistrar reg(&setup);

}  // namespace
}  // namespace scr::cli
