// `scr cuda-bench` (CUDA builds only): what the CUDA target does on this GPU, beside the ceilings measured in the same
// run. Loads a model folder through the normal loader (so the specialization, the upload and the
// graphs are the ones `scr` uses) and drives CompiledModel::forward directly:
//   * ceilings: device-to-device copy bandwidth (read + write counted) and pinned host-to-device
//     bandwidth (the upload floor);
//   * start-up: process start -> weights on the GPU -> first token;
//   * batch-1 decode after a prompt, per-token latency of forward() (logits back on the host);
//   * decode throughput at batch B (B sequences, one token each per step);
//   * prefill throughput of one long prompt in compiled-size chunks.
// Prints a table and one JSON line (for docs/CUDA.md).
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <chrono>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/command.hpp"
#include "runtime/core/error.hpp"
#include "runtime/cuda/cuda_model.hpp"
#include "runtime/cuda/startup.hpp"
#include "runtime/model/loader.hpp"
#include "runtime/model/sequence_runner.hpp"

using namespace scr;
using Clock = std::chrono::steady_clock;

namespace {

const auto kProcessStart = Clock::now();

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

void cuda_ok(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail("CUDA: {}: {}", what, cudaGetErrorString(e));
}

// Device copy bandwidth, GB/s with read + write counted (as ../shared/notes/facts.md counts it).
double copy_bandwidth_gbs() {
    const size_t bytes = size_t(2) << 30;
    void *a = nullptr, *b = nullptr;
    cuda_ok(cudaMalloc(&a, bytes), "malloc");
    cuda_ok(cudaMalloc(&b, bytes), "malloc");
    cuda_ok(cudaMemset(a, 1, bytes), "memset");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int i = 0; i < 3; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    std::vector<float> ms;
    for (int i = 0; i < 10; ++i) {
        cudaEventRecord(e0);
        cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
    }
    cuda_ok(cudaGetLastError(), "copy");
    std::sort(ms.begin(), ms.end());
    cudaFree(a);
    cudaFree(b);
    return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

double h2d_bandwidth_gbs() {
    const size_t bytes = size_t(1) << 30;
    void *h = nullptr, *d = nullptr;
    cuda_ok(cudaMallocHost(&h, bytes), "mallochost");
    cuda_ok(cudaMalloc(&d, bytes), "malloc");
    std::memset(h, 1, bytes);
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    std::vector<double> ms;
    for (int i = 0; i < 5; ++i) {
        auto t0 = Clock::now();
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
        ms.push_back(ms_since(t0));
    }
    std::sort(ms.begin(), ms.end());
    cudaFreeHost(h);
    cudaFree(d);
    return double(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

// B sequences decoding together through forward() with the engine's batch layout.
struct BatchRun {
    CompiledModel& model;
    const ModelInfo& info;
    int B, capacity;
    std::vector<int32_t> tables, lens;
    std::vector<std::byte> host_anchor = std::vector<std::byte>(64);  // the KvPool's identity; never read
    KvPool pool;
    std::vector<float> logits;

    BatchRun(CompiledModel& m, int b, int cap) : model(m), info(m.info()), B(b), capacity(cap) {
        const int per = (cap + info.block_size - 1) / info.block_size;
        tables.resize(size_t(B) * per);
        std::iota(tables.begin(), tables.end(), 0);
        lens.assign(size_t(B), 0);
        pool.data = host_anchor.data();
        pool.num_blocks = B * per;
        logits.resize(size_t(std::max(B, 1)) * size_t(info.vocab_size));
    }
    int per() const { return (capacity + info.block_size - 1) / info.block_size; }
    // Every timed phase decodes the same positions: rewind() goes back to where mark() was called
    // (after the prompts), and the next steps overwrite the same KV slots. Before session 25 each
    // phase ran 32+ positions later than the one before, and the later of two modes measured ~2 %
    // slower at short contexts whichever it was (docs/CUDA.md, "Session 25").
    std::vector<int32_t> marked;
    void mark() { marked = lens; }
    void rewind() {
        if (!marked.empty()) lens = marked;
    }
    int64_t slot(int s, int pos) const {
        return int64_t(tables[size_t(s) * per() + pos / info.block_size]) * info.block_size + pos % info.block_size;
    }
    // Prefill sequence s with n tokens (one step, no logits).
    void prefill(int s, const std::vector<int32_t>& ids) {
        const int n = int(ids.size());
        std::vector<int32_t> pos(n);
        std::vector<int64_t> slots(n);
        for (int i = 0; i < n; ++i) {
            pos[i] = lens[s] + i;
            slots[i] = slot(s, lens[s] + i);
        }
        int32_t qs[2] = {0, n};
        int32_t len = lens[s] + n;
        StepBatch b;
        b.num_tokens = n;
        b.token_ids = ids.data();
        b.positions = pos.data();
        b.slot_mapping = slots.data();
        b.num_seqs = 1;
        b.query_start = qs;
        b.seq_lens = &len;
        b.block_tables = tables.data() + size_t(s) * per();
        b.block_table_stride = per();
        model.forward(b, pool, nullptr);
        lens[s] = len;
    }
    // One decode step: every sequence feeds one token and gets its logits (or, with `sampled`, its
    // next token drawn greedily on the GPU, as the engine does when every request allows it).
    void decode(const std::vector<int32_t>& ids, int32_t* sampled = nullptr) {
        const StepBatch& b = decode_batch(ids);
        if (sampled) {
            const std::vector<DeviceSamplingRow> greedy(static_cast<size_t>(B));
            model.forward_sample(b, pool, greedy, sampled);
        } else {
            model.forward(b, pool, logits.data());
        }
        for (int s = 0; s < B; ++s) ++lens[s];
    }
    // `steps` greedy decode steps as the engine's run-ahead runs them (CompiledModel::launch_sample):
    // step i + 1 is launched before step i's tokens are back and takes them as its input on the
    // device; the first step feeds `ids`.
    void decode_ahead(const std::vector<int32_t>& ids, int steps, int32_t* sampled) {
        const std::vector<DeviceSamplingRow> greedy(static_cast<size_t>(B));
        for (int i = 0; i < steps; ++i) {
            model.launch_sample(decode_batch(ids), pool, greedy, /*feed_previous=*/i > 0);
            for (int s = 0; s < B; ++s) ++lens[s];
            if (i > 0) model.wait_sample(sampled);
        }
        model.wait_sample(sampled);
    }
    // A decode step's arrays, reused from step to step (launch_sample copies them before it returns).
    std::vector<int32_t> pos = std::vector<int32_t>(size_t(B)), qs = std::vector<int32_t>(size_t(B) + 1),
                         rows = std::vector<int32_t>(size_t(B)), seq_lens = std::vector<int32_t>(size_t(B));
    std::vector<int64_t> slots = std::vector<int64_t>(size_t(B));
    StepBatch step;
    const StepBatch& decode_batch(const std::vector<int32_t>& ids) {
        for (int s = 0; s < B; ++s) {
            pos[s] = lens[s];
            slots[s] = slot(s, lens[s]);
            qs[s] = s;
            rows[s] = s;
            seq_lens[s] = lens[s] + 1;
        }
        qs[B] = B;
        StepBatch& b = step;
        b.num_tokens = B;
        b.token_ids = ids.data();
        b.positions = pos.data();
        b.slot_mapping = slots.data();
        b.num_seqs = B;
        b.query_start = qs.data();
        b.seq_lens = seq_lens.data();
        b.block_tables = tables.data();
        b.block_table_stride = per();
        b.num_logits = B;
        b.logit_rows = rows.data();
        return b;
    }
};

struct CudaBenchArgs {
    std::string model_dir;
    int prompt = 128, decode_tokens = 128, prefill_len = 2048, batch_steps = 32;
    std::vector<int> batches{16, 64, 256};
};

int run_cuda_bench(const CudaBenchArgs& a) {
    const std::string& model_dir = a.model_dir;
    const int prompt = a.prompt, decode_tokens = a.decode_tokens, prefill_len = a.prefill_len, batch_steps = a.batch_steps;
    const std::vector<int>& batches = a.batches;
    try {
        // ---- Start-up: process start -> weights on the GPU -> first token.
        // As `scr` does it: load_model opens the device in the background while the host maps and
        // checks the weights (runtime/model/device_open.hpp); the model's stats say how long the
        // upload waited for the device and how much it faulted in meanwhile.
        const double main_ms = ms_since(kProcessStart);
        auto lm = load_model(model_dir);
        const double load_ms = ms_since(kProcessStart);
        auto* cm = dynamic_cast<CudaGeneratedModel*>(lm.model.get());
        if (!cm) fail("{} is not served by a CUDA specialization in this binary", model_dir);
        const ModelInfo& info = lm.model->info();
        std::mt19937 rng(7);
        std::uniform_int_distribution<int32_t> tok(3, info.vocab_size - 1);
        std::vector<int32_t> ids(size_t(std::max(prompt, 1)));
        for (auto& t : ids) t = tok(rng);
        {
            SequenceRunner first(*lm.model, 8);
            first.feed(std::span<const int32_t>(ids.data(), 1));
        }
        const double first_token_ms = ms_since(kProcessStart);
        const double upload_s = cm->stats().upload_seconds;

        const double copy_gbs = copy_bandwidth_gbs();
        const double h2d_gbs = h2d_bandwidth_gbs();
        const double floor_ms = double(info.active_weight_bytes) / (copy_gbs * 1e9) * 1e3;
        const double upload_floor_s = double(info.weight_bytes) / (h2d_gbs * 1e9);

        // ---- Batch-1 decode: time forward() alone (argmax on the host is outside the timing).
        SequenceRunner run(*lm.model, prompt + decode_tokens + 3);
        auto logits = run.feed(ids);
        for (int i = 0; i < 2; ++i) {  // capture this pool's bucket-1 graph outside the timing
            int32_t next = argmax(logits);
            logits = run.feed(std::span<const int32_t>(&next, 1));
        }
        cm->set_timing(true);
        const auto device_before = cm->stats();
        std::vector<double> step_ms;
        for (int i = 0; i < decode_tokens; ++i) {
            int32_t next = argmax(logits);
            auto t0 = Clock::now();
            logits = run.feed(std::span<const int32_t>(&next, 1));
            step_ms.push_back(ms_since(t0));
        }
        const double warm = median(step_ms);
        const double device_ms = (cm->stats().device_seconds - device_before.device_seconds) * 1e3 /
                                 double(std::max<int64_t>(1, cm->stats().timed_steps - device_before.timed_steps));
        cm->set_timing(false);

        // ---- Batched decode throughput.
        std::vector<std::pair<int, double>> batch_tps;
        std::vector<double> batch_gpu_tps;  // the same steps counting only the GPU's time (no logits to the host)
        std::vector<double> batch_sampled_tps;  // the same steps sampling greedily on the GPU (0: not supported)
        std::vector<double> batch_ahead_tps;    // and launched ahead, each step fed the previous one's tokens on the device
        std::vector<std::string> step_parts;    // a sampled step's wall time by part
        const bool ahead_first = [] {
            const char* e = std::getenv("SCR_BENCH_AHEAD_FIRST");
            if (!e || !*e || std::string_view(e) == "0") return false;
            if (std::string_view(e) == "1") return true;
            fmt::print(stderr, "scr: SCR_BENCH_AHEAD_FIRST={} is not 0 or 1; timing the gapped steps first\n", e);
            return false;
        }();
        for (int B : batches) {
            if (B > info.max_logit_rows || B > info.max_batch_tokens) continue;
            BatchRun br(*lm.model, B, prompt + 5 * batch_steps + 16);  // five timed runs of batch_steps + warm-ups
            std::vector<int32_t> p(ids.begin(), ids.begin() + std::min<int>(prompt, info.max_batch_tokens));
            for (int s = 0; s < B; ++s) br.prefill(s, p);
            br.mark();
            std::vector<int32_t> next(static_cast<size_t>(B));
            for (auto& t : next) t = tok(rng);
            br.decode(next);  // graph capture for this bucket happens here
            cm->set_timing(true);
            br.rewind();
            const auto before = cm->stats();
            auto t0 = Clock::now();
            for (int i = 0; i < batch_steps; ++i) br.decode(next);
            batch_tps.push_back({B, double(B) * batch_steps / (ms_since(t0) * 1e-3)});
            const double gpu_ms = (cm->stats().device_seconds - before.device_seconds) * 1e3 / batch_steps;
            batch_gpu_tps.push_back(double(B) / (gpu_ms * 1e-3));
            cm->set_timing(false);
            // The same steps with the next tokens sampled on the GPU (what the engine runs), and with
            // run-ahead (the engine's default; SCR_CUDA_RUN_AHEAD=0 turns it off there): the next step
            // enqueued before this one's tokens are back. SCR_BENCH_AHEAD_FIRST=1 measures run-ahead
            // first, so that an order effect (the GPU warming over a run) can be told from the mode.
            double sampled_tps = 0, ahead_tps = 0;
            auto measure_sampled = [&] {
                if (!lm.model->can_sample_on_device()) return;
                std::vector<int32_t> out(static_cast<size_t>(B));
                br.decode(next, out.data());
                br.rewind();
                auto t1 = Clock::now();
                for (int i = 0; i < batch_steps; ++i) br.decode(next, out.data());
                sampled_tps = double(B) * batch_steps / (ms_since(t1) * 1e-3);
            };
            auto measure_ahead = [&] {
                cm->set_run_ahead(true);
                if (!lm.model->can_run_ahead()) return;
                std::vector<int32_t> out(static_cast<size_t>(B));
                br.decode_ahead(next, 2, out.data());
                br.rewind();
                auto t1 = Clock::now();
                br.decode_ahead(next, batch_steps, out.data());
                ahead_tps = double(B) * batch_steps / (ms_since(t1) * 1e-3);
            };
            if (ahead_first) {
                measure_ahead();
                measure_sampled();
            } else {
                measure_sampled();
                measure_ahead();
            }
            batch_sampled_tps.push_back(sampled_tps);
            batch_ahead_tps.push_back(ahead_tps);
            // Where a sampled step's wall time goes (timed separately: the events cost time too).
            if (lm.model->can_sample_on_device()) {
                std::vector<int32_t> out(static_cast<size_t>(B));
                for (bool ahead : {ahead_first, !ahead_first}) {
                    if (ahead && !lm.model->can_run_ahead()) continue;
                    br.rewind();
                    cm->set_timing(true);
                    const auto s0 = cm->stats();
                    auto t1 = Clock::now();
                    if (ahead) {
                        br.decode_ahead(next, batch_steps, out.data());
                    } else {
                        for (int i = 0; i < batch_steps; ++i) br.decode(next, out.data());
                    }
                    const double wall_us = ms_since(t1) * 1e3 / batch_steps;
                    cm->set_timing(false);
                    const auto& s1 = cm->stats();
                    const double copy = (s1.copy_seconds - s0.copy_seconds) * 1e6 / batch_steps;
                    const double dev = (s1.device_seconds - s0.device_seconds) * 1e6 / batch_steps;
                    const double smp = (s1.sample_seconds - s0.sample_seconds) * 1e6 / batch_steps;
                    step_parts.push_back(fmt::format("decode batch {:>3} step parts, sampling on the GPU{}: wall {:.1f} us = copy "
                                                     "{:.1f} + kernels {:.1f} + sampler {:.1f} + the rest {:.1f} (CUDA events)",
                                                     B, ahead ? ", run ahead" : "", wall_us, copy, dev - smp, smp,
                                                     wall_us - copy - dev));
                }
            }
        }

        // ---- Prefill of one long prompt, in compiled-size chunks.
        double prefill_tps = 0;
        if (prefill_len > 0 && prefill_len < info.max_position_embeddings) {
            std::vector<int32_t> long_ids(static_cast<size_t>(prefill_len));
            for (auto& t : long_ids) t = tok(rng);
            {
                SequenceRunner warmup(*lm.model, 600);
                warmup.feed(std::span<const int32_t>(long_ids.data(), 512));
            }
            SequenceRunner pre(*lm.model, prefill_len + 1);
            auto t0 = Clock::now();
            pre.feed(long_ids);
            prefill_tps = prefill_len / (ms_since(t0) * 1e-3);
        }

        const auto& st = cm->stats();
        fmt::print("model {} ({}), weights {:.3f} GB, read per decode token {:.3f} GB\n", info.stem, info.quant, info.weight_bytes / 1e9,
                   info.active_weight_bytes / 1e9);
        fmt::print("ceilings: device copy {:.0f} GB/s (read+write), pinned host->device {:.1f} GB/s\n", copy_gbs, h2d_gbs);
        fmt::print("start-up: weights uploaded in {:.3f} s ({:.2f} GB; floor at pinned bandwidth {:.3f} s); process start -> loaded "
                   "{:.0f} ms -> first token {:.0f} ms\n",
                   upload_s, st.upload_bytes / 1e9, upload_floor_s, load_ms, first_token_ms);
        fmt::print("  start-up parts: to main() {:.0f} ms, host loading + allocations {:.0f} ms (of which {:.2f} GB of weights faulted "
                   "in while the CUDA context opened in the background, then {:.0f} ms waiting for it), upload {:.0f} ms, first "
                   "forward {:.0f} ms\n",
                   main_ms, load_ms - main_ms - upload_s * 1e3, st.prefaulted_bytes / 1e9, st.device_wait_seconds * 1e3, upload_s * 1e3,
                   first_token_ms - load_ms);
        {
            // Where the background opening's time went (runtime/cuda/startup.hpp), from process start.
            const auto ot = cuda_startup::open_times();
            auto at = [](Clock::time_point t) { return std::chrono::duration<double, std::milli>(t - kProcessStart).count(); };
            if (ot.started != Clock::time_point{})
                fmt::print("  device opening: started at {:.0f} ms, context ready at {:.0f} ms, staging buffers pinned at {:.0f} ms; "
                           "the model's allocations after the upload {:.0f} ms\n",
                           at(ot.started), at(ot.context_ready), at(ot.ended), st.after_upload_seconds * 1e3);
        }
        fmt::print("batch-1 decode after {} prompt tokens: {:.3f} ms/token = {:.0f} tok/s; floor {:.3f} ms ({:.0f} tok/s) -> {:.1f} % of "
                   "floor\n",
                   prompt, warm, 1e3 / warm, floor_ms, 1e3 / floor_ms, 100.0 * floor_ms / warm);
        fmt::print("  of which on the GPU (graph replay, CUDA events): {:.3f} ms; the rest is the step's host side (pack, copies, "
                   "logits to the host)\n",
                   device_ms);
        for (size_t i = 0; i < batch_tps.size(); ++i)
            fmt::print("decode batch {:>3}: {:.0f} tok/s sampling on the GPU ({:.0f} run ahead); {:.0f} tok/s with B x vocab logits "
                       "copied to the host ({:.0f} tok/s counting only the GPU's time of those steps)\n",
                       batch_tps[i].first, batch_sampled_tps[i], batch_ahead_tps[i], batch_tps[i].second, batch_gpu_tps[i]);
        for (const std::string& line : step_parts) fmt::print("{}\n", line);
        if (prefill_tps > 0) fmt::print("prefill {} tokens: {:.0f} tok/s\n", prefill_len, prefill_tps);
        fmt::print("graphs captured {} in {:.3f} s total; graph steps {}, eager steps {}\n", st.graphs_captured, st.capture_seconds,
                   st.graph_steps, st.eager_steps);
        std::string bt, ba;
        for (size_t i = 0; i < batch_tps.size(); ++i) {
            bt += fmt::format("{}\"{}\": {:.0f}", bt.empty() ? "" : ", ", batch_tps[i].first,
                              batch_sampled_tps[i] > 0 ? batch_sampled_tps[i] : batch_tps[i].second);
            ba += fmt::format("{}\"{}\": {:.0f}", ba.empty() ? "" : ", ", batch_tps[i].first, batch_ahead_tps[i]);
        }
        fmt::print("JSON {{\"model\": \"{}\", \"copy_gbs\": {:.0f}, \"h2d_gbs\": {:.1f}, \"upload_s\": {:.3f}, \"upload_floor_s\": {:.3f}, "
                   "\"first_token_ms\": {:.0f}, \"decode_ms\": {:.4f}, \"decode_device_ms\": {:.4f}, \"floor_ms\": {:.4f}, \"decode_tps\": {:.0f}, \"batch_tps\": {{{}}}, "
                   "\"batch_ahead_tps\": {{{}}}, \"prefill_tps\": {:.0f}, \"capture_s\": {:.3f}}}\n",
                   info.stem, copy_gbs, h2d_gbs, upload_s, upload_floor_s, first_token_ms, warm, device_ms, floor_ms, 1e3 / warm, bt, ba, prefill_tps,
                   st.capture_seconds);
    } catch (const Error& e) {
        fmt::print(stderr, "scr cuda-bench: {}\n", e.what());
        return 1;
    }
    return 0;
}

void setup(CLI::App& root) {
    auto* c = root.add_subcommand("cuda-bench", "CUDA target benchmarks against the ceilings of this GPU (start-up, batch-1 and "
                                                "batched decode, prefill)");
    auto a = std::make_shared<CudaBenchArgs>();
    c->add_option("model", a->model_dir, "model folder (config.json + safetensors)")->required();
    c->add_option("--prompt", a->prompt, "prompt tokens before decoding");
    c->add_option("--decode", a->decode_tokens, "tokens decoded at batch 1");
    c->add_option("--prefill", a->prefill_len, "prompt length for the prefill measurement (0: skip)");
    c->add_option("--batches", a->batches, "batch sizes for decode throughput")->delimiter(',');
    c->add_option("--batch-steps", a->batch_steps, "decode steps per batch size");
    c->callback([a] { cli::exit_code() = run_cuda_bench(*a); });
}

const cli::CommandRegistrar kRegistrar(setup);

}  // namespace
