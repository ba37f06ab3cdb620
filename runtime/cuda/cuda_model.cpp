#include "runtime/cuda/cuda_model.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>
#include <utility>

#include "kernels/cuda/env_switch.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/cuda/prefill_gemm.hpp"
#include "runtime/cuda/startup.hpp"
#include "runtime/cuda/step_copy.hpp"
#include "runtime/weights/weight_set.hpp"
#include "kernels/cuda/sample.hpp"

namespace scr {

namespace kc = kernels::cuda;

namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) fail("CUDA: {} failed: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define SCR_CUDA(call) check((call), #call)

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// SCR_CUDA_STEP_BUFFER_BYTES=n (tests): the step buffers are taken as n bytes long, so the first
// steps take the growth path (ensure_meta_host) that no real step reaches below 32 MiB of block
// tables. 0 when unset.
size_t step_buffer_test_bytes() {
    static const size_t bytes = [] {
        const char* e = std::getenv("SCR_CUDA_STEP_BUFFER_BYTES");
        if (!e || !*e) return size_t(0);
        char* end = nullptr;
        const unsigned long long n = std::strtoull(e, &end, 10);
        if (*end != '\0' || n == 0) {
            std::fprintf(stderr, "scr: SCR_CUDA_STEP_BUFFER_BYTES=%s is not a positive byte count; ignored\n", e);
            return size_t(0);
        }
        return size_t(n);
    }();
    return bytes;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

struct CudaGeneratedModel::Impl {
    cudaStream_t stream = nullptr;
    void* weights = nullptr;
    void* table = nullptr;
    void* scratch = nullptr;
    void* moe_ws = nullptr;
    void* attn_ws = nullptr;  // the decode attention's split (Ctx::attn_ws)
    void* qwide_ws = nullptr;  // quantized 33-256-row linears' prep and global K split (Ctx::qwide_ws)
    int64_t qwide_ws_bytes = 0;
    void* sync = nullptr;  // dev_sync()
    float* logits_dev = nullptr;
    float* logits_host = nullptr;  // pinned, grown on demand (ensure_logits_host)
    int logits_host_rows = 0;

    // Step arrays: pinned host buffers and their device twin, fixed layout (block tables last, so
    // a step copies one prefix of it). Two host buffers, one per launch slot (below): a step is
    // packed while the previous one's copy may still be queued.
    std::byte* meta_host[2] = {nullptr, nullptr};
    size_t meta_host_bytes[2] = {0, 0};  // each holds at least the sections before the tables; grown on demand
    std::byte* meta_dev = nullptr;
    size_t off_header = 0, off_ids = 0, off_pos = 0, off_slots = 0, off_seq = 0, off_logit_rows = 0, off_params = 0,
           off_tables = 0;
    size_t meta_bytes = 0;
    int rows_cap = 0;           // most rows a step (or a padded graph step) carries
    int64_t table_cap = 0;      // ints of block table
    kc::DevStep step;

    // The device KV pool, keyed by the engine's KvPool.
    std::byte* kv_dev = nullptr;
    const std::byte* kv_key = nullptr;
    int32_t kv_blocks = 0;

    bool timing = false;
    // Kernels launch as programmatic dependents (each may start while its predecessor drains);
    // SCR_CUDA_PDL=0 turns it off, for A/B measurements.
    bool pdl = kernels::cuda::env_flag_switch("SCR_CUDA_PDL", true);
    // How a small decode (graph) step's arrays reach the device (launch()): queued behind a pending
    // step (run-ahead), by one kernel reading the pinned buffer, ~4 us sooner than a copy-engine
    // transfer there; on an idle GPU the kernel did not help (docs/CUDA.md
    // "Session 23"). SCR_CUDA_STEP_COPY=memcpy / kernel forces one way for every graph step, for
    // A/B measurements (eager steps always take the transfer).
    enum class StepCopy { automatic, memcpy, kernel };
    StepCopy step_copy = kernels::cuda::env_choice_switch(
        "SCR_CUDA_STEP_COPY", StepCopy::automatic,
        {{"automatic", StepCopy::automatic}, {"memcpy", StepCopy::memcpy}, {"kernel", StepCopy::kernel}}, "the automatic rule");
    // With timing on, per launch slot: before the step's copy, before its kernels, after them (before
    // the sampler), after the sampler.
    cudaEvent_t t_copy[2] = {nullptr, nullptr}, t_begin[2] = {nullptr, nullptr}, t_graph[2] = {nullptr, nullptr},
                t_end[2] = {nullptr, nullptr};

    // Launched steps, waited for in order (launch_sample / wait_sample; forward and forward_sample
    // launch and wait at once). Step i uses slot i % 2 of every per-launch buffer and event, so at
    // most two may be pending.
    struct Launch {
        int sampled_rows = 0;  // token ids coming back (0: a logits step)
        int logit_rows = 0;    // rows of logits coming back (a logits step)
        bool timed = false;
    };
    Launch launches[2];
    cudaEvent_t ready[2] = {nullptr, nullptr};  // after a launch's last copy back
    int64_t launched = 0, waited = 0;
    bool run_ahead = kernels::cuda::env_flag_switch("SCR_CUDA_RUN_AHEAD", true);
    // A second stream for an op's independent launches (Ctx::side, kernels/cuda/common.cuh:
    // fork_join) and its fork / join events; SCR_CUDA_SIDE_STREAM=0 runs them on `stream` (A/B runs).
    kernels::cuda::OwnedSideStream side;

    std::vector<int> buckets;  // decode graph batch sizes
    std::map<int, cudaGraphExec_t> graphs;
    unsigned long long graphs_scratch_epoch = 0;  // cuda_rt::cublas_scratch_epoch() when `graphs` was last emptied
    Stats stats;

    // Sampling on the GPU (forward_sample, launch_sample): per-row parameters in, token ids out,
    // through pinned buffers (one per launch slot) allocated at the first use.
    bool device_sampling = kernels::cuda::env_flag_switch("SCR_CUDA_DEVICE_SAMPLING", true);
    // The sampler's parameters travel in the step arrays (off_params). It writes its tokens straight
    // into mapped pinned memory (one buffer per launch slot; no copy back) and into the step arrays'
    // token ids on the device, where a fed step (run-ahead) finds them: each copy is one more
    // operation in the stream between two steps, and those gaps were most of what the GPU idled.
    int32_t* sampled_host[2] = {nullptr, nullptr};
    int32_t* sampled_mapped[2] = {nullptr, nullptr};  // their device addresses

    void ensure_sampling_buffers(int rows_cap);
    void ensure_logits_host(const ModelInfo& mi, int rows);
    void ensure_meta_host(int slot, size_t bytes);
    // Packs, copies and launches one step into slot launched % 2; returns nothing until waited.
    void launch(CudaGeneratedModel& model, const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                bool feed_previous, bool want_logits);
    // Waits for the oldest pending launch; its logits (a logits step) or token ids go to the outputs.
    void wait(const ModelInfo& mi, float* logits, int32_t* token_ids);

    void drop_graphs() {
        for (auto& [rows, g] : graphs) cudaGraphExecDestroy(g);
        graphs.clear();
    }
};

CudaGeneratedModel::CudaGeneratedModel(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, int64_t scratch_floats,
                                       int64_t moe_workspace_floats, int64_t attention_workspace_floats, int64_t quant_wide_workspace_bytes)
    : GeneratedModel(info, weights, pool, 0), impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    int devices = 0;

    // ---- Weights (runtime/cuda/startup.cpp): while the device is still opening in the background,
    // fault the mapped weights in; then one allocation, uploaded through pinned staging buffers.
    m.stats.prefaulted_bytes = int64_t(cuda_startup::prefault_while_opening(info, weights, pool));
    const auto t_wait = std::chrono::steady_clock::now();
    cuda_startup::wait_device_open();
    m.stats.device_wait_seconds = seconds_since(t_wait);
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1)
        fail("model {} is compiled for CUDA, but no CUDA device is available", info.stem);
    SCR_CUDA(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
    if (kernels::cuda::env_flag_switch("SCR_CUDA_SIDE_STREAM", true)) SCR_CUDA(m.side.create());
    cuda_startup::DeviceWeights uploaded = cuda_startup::upload_weights(info, weights, pool, m.stream);
    m.weights = uploaded.base;
    dev_weights_ = std::move(uploaded.tensors);
    SCR_CUDA(cudaMalloc(&m.table, std::max<size_t>(1, dev_weights_.size()) * sizeof(void*)));
    SCR_CUDA(cudaMemcpy(m.table, dev_weights_.data(), dev_weights_.size() * sizeof(void*), cudaMemcpyHostToDevice));
    dev_weight_table_ = static_cast<const void* const*>(m.table);
    m.stats.upload_seconds = uploaded.seconds;
    const auto t_uploaded = std::chrono::steady_clock::now();
    // The upload's pinned staging buffers become the two step buffers and the first host logits
    // below: pinning those anew (two 67 MB step buffers sized for every block table the compiled
    // bounds allow, 131 MB of logits) took 50-75 ms before the first token on the H200's host
    // (docs/CUDA.md, "Session 25"). Whatever is not kept is freed.
    struct FreePinned {
        void operator()(std::byte* p) const { cudaFreeHost(p); }
    };
    std::unique_ptr<std::byte, FreePinned> spare[cuda_startup::kStagingBuffers];  // freed unless kept, also on a throw
    for (int k = 0; k < cuda_startup::kStagingBuffers; ++k) spare[k].reset(static_cast<std::byte*>(uploaded.staging[k]));
    auto take_spare = [&](int k) { return spare[k].release(); };
    m.stats.upload_bytes = int64_t(uploaded.bytes);

    // ---- Scratch, MoE workspace, logits.
    SCR_CUDA(cudaMalloc(&m.scratch, std::max<size_t>(size_t(scratch_floats) * 4, kAlign)));
    dev_scratch_ = static_cast<float*>(m.scratch);
    if (moe_workspace_floats > 0) {
        SCR_CUDA(cudaMalloc(&m.moe_ws, size_t(moe_workspace_floats) * 4));
        dev_moe_ws_ = static_cast<float*>(m.moe_ws);
    }
    // The decode attention's context split (kernels/cuda/attention.cuh): its tickets start at zero
    // and every launch leaves them so.
    if (attention_workspace_floats > 0) {
        SCR_CUDA(cudaMalloc(&m.attn_ws, size_t(attention_workspace_floats) * 4));
        SCR_CUDA(cudaMemsetAsync(m.attn_ws, 0, size_t(attention_workspace_floats) * 4, m.stream));  // before every kernel of the model
    }
    // Quantized linears of 33-256 rows (kernels/cuda/quant_wide.cuh): x as the MMA's fragments, and
    // the global K split's partials and arrival counters (which start at zero; every launch leaves
    // each a multiple of its split).
    if (quant_wide_workspace_bytes > 0) {
        SCR_CUDA(cudaMalloc(&m.qwide_ws, size_t(quant_wide_workspace_bytes)));
        SCR_CUDA(cudaMemsetAsync(m.qwide_ws, 0, size_t(quant_wide_workspace_bytes), m.stream));
        m.qwide_ws_bytes = quant_wide_workspace_bytes;
    }
    SCR_CUDA(cudaMalloc(&m.sync, kernels::cuda::kDecode1SyncBytes));
    SCR_CUDA(cudaMemset(m.sync, 0, kernels::cuda::kDecode1SyncBytes));
    dev_sync_ = static_cast<unsigned*>(m.sync);
    const size_t logit_bytes = size_t(info.max_logit_rows) * size_t(info.vocab_size) * 4;
    SCR_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.logits_dev), logit_bytes));
    // Host logits: a staging buffer's rows at first (65 of a 128k vocabulary), grown when a step
    // returns more (ensure_logits_host); the engine's steps mostly draw their tokens on the GPU.
    if (const int rows = int(std::min<size_t>(size_t(std::max(1, info.max_logit_rows)),
                                              cuda_startup::kStagingBytes / (size_t(info.vocab_size) * 4)));
        rows > 0 && spare[2]) {
        m.logits_host = reinterpret_cast<float*>(take_spare(2));
        m.logits_host_rows = rows;
    }
    dev_logits_ = m.logits_dev;

    // ---- Step arrays and graph buckets.
    m.rows_cap = info.max_batch_tokens;
    const int64_t max_blocks = (int64_t(info.max_position_embeddings) + info.block_size - 1) / info.block_size;
    m.table_cap = int64_t(m.rows_cap) * max_blocks;
    size_t at = 0;
    auto section = [&](size_t bytes) {
        size_t o = at;
        at += align_up(bytes);
        return o;
    };
    m.off_ids = section(size_t(m.rows_cap) * 4);  // first: a fed step copies from off_header on
    m.off_header = section(kc::kHeaderInts * 4);
    m.off_pos = section(size_t(m.rows_cap) * 4);
    m.off_slots = section(size_t(m.rows_cap) * 8);
    m.off_seq = section(size_t(m.rows_cap) * 4);
    m.off_logit_rows = section(size_t(m.rows_cap) * 4);
    m.off_params = section(size_t(std::max(1, info.max_logit_rows)) * sizeof(kc::SampleParams));
    m.off_tables = section(size_t(m.table_cap) * 4);
    m.meta_bytes = at;
    for (int i = 0; i < 2; ++i) {
        // A staging buffer holds the tables of ~8M blocks beyond the fixed sections; a step needing
        // more grows its buffer (ensure_meta_host), up to the compiled bound meta_bytes.
        if (spare[i] && m.off_tables <= cuda_startup::kStagingBytes) {
            m.meta_host[i] = take_spare(i);
            m.meta_host_bytes[i] = std::min(m.meta_bytes, cuda_startup::kStagingBytes);
        } else {
            SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&m.meta_host[i]), m.meta_bytes));
            m.meta_host_bytes[i] = m.meta_bytes;
        }
        // Zeros in the sections before the tables: an eager step copies all rows_cap token ids but
        // packs only its own, and a fed graph step's padding rows then read the rest on the device,
        // so they must be valid ids (0). A staging buffer still holds weight bytes.
        std::memset(m.meta_host[i], 0, std::min(m.off_tables, m.meta_host_bytes[i]));
        if (step_buffer_test_bytes() > 0) m.meta_host_bytes[i] = std::min(m.meta_host_bytes[i], step_buffer_test_bytes());
        SCR_CUDA(cudaEventCreateWithFlags(&m.ready[i], cudaEventDisableTiming));
    }
    for (auto& p : spare) p.reset();
    SCR_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.meta_dev), m.meta_bytes));
    // Zeros: token ids a fed step does not copy (graph padding rows) must be valid ids from the start.
    SCR_CUDA(cudaMemset(m.meta_dev, 0, m.meta_bytes));
    auto dev = [&](size_t off) { return m.meta_dev + off; };
    m.step.header = reinterpret_cast<const int32_t*>(dev(m.off_header));
    m.step.token_ids = reinterpret_cast<const int32_t*>(dev(m.off_ids));
    m.step.positions = reinterpret_cast<const int32_t*>(dev(m.off_pos));
    m.step.slot_mapping = reinterpret_cast<const int64_t*>(dev(m.off_slots));
    m.step.seq_of_token = reinterpret_cast<const int32_t*>(dev(m.off_seq));
    m.step.logit_rows = reinterpret_cast<const int32_t*>(dev(m.off_logit_rows));
    m.step.block_tables = reinterpret_cast<const int32_t*>(dev(m.off_tables));
    const int max_decode = std::min(info.max_batch_tokens, info.max_logit_rows);
    for (int b = 1; b < max_decode; b *= 2) m.buckets.push_back(b);
    m.buckets.push_back(max_decode);
    m.stats.after_upload_seconds = seconds_since(t_uploaded);
}

CudaGeneratedModel::~CudaGeneratedModel() {
    Impl& m = *impl_;
    if (m.stream) cudaStreamSynchronize(m.stream);
    m.drop_graphs();
    for (int i = 0; i < 2; ++i) {
        for (cudaEvent_t e : {m.t_copy[i], m.t_begin[i], m.t_graph[i], m.t_end[i]})
            if (e) cudaEventDestroy(e);
        if (m.ready[i]) cudaEventDestroy(m.ready[i]);
        cudaFreeHost(m.meta_host[i]);
        cudaFreeHost(m.sampled_host[i]);
    }
    cudaFree(m.kv_dev);
    cudaFree(m.meta_dev);
    cudaFree(m.logits_dev);
    cudaFreeHost(m.logits_host);
    cudaFree(m.moe_ws);
    cudaFree(m.attn_ws);
    cudaFree(m.qwide_ws);
    cudaFree(m.sync);
    cudaFree(m.scratch);
    cudaFree(m.table);
    cudaFree(m.weights);
    if (m.stream) cudaStreamDestroy(m.stream);
}

const CudaGeneratedModel::Stats& CudaGeneratedModel::stats() const { return impl_->stats; }

void CudaGeneratedModel::set_timing(bool on) {
    Impl& m = *impl_;
    if (on && !m.t_begin[0]) {
        for (int i = 0; i < 2; ++i) {
            for (cudaEvent_t* e : {&m.t_copy[i], &m.t_begin[i], &m.t_graph[i], &m.t_end[i]}) SCR_CUDA(cudaEventCreate(e));
        }
    }
    m.timing = on;
}

void CudaGeneratedModel::Impl::launch(CudaGeneratedModel& model, const StepBatch& b, KvPool& kv,
                                      std::span<const DeviceSamplingRow> sampling, bool feed_previous, bool want_logits) {
    Impl& m = *this;
    const ModelInfo& mi = model.info();
    if (launched - waited >= 2) throw std::logic_error("CUDA model: a third step launched before the first was waited for");
    model.begin_step(b, kv);  // bounds and consistency, on the host, before anything reaches the GPU
    if (want_logits && b.num_logits > 0) m.ensure_logits_host(mi, b.num_logits);  // before anything is queued
    const int T = b.num_tokens, S = b.num_seqs, R = b.num_logits;
    if (feed_previous) {
        // A fed step's ids are the latest launch's draws (the sampler leaves them in the id rows).
        const int drawn = launched == 0 ? 0 : launches[(launched - 1) % 2].sampled_rows;
        if (drawn < T) fail("step: {} token ids to take from the previous step, which sampled {}", T, drawn);
    }
    const int slot = int(launched % 2);

    // The device KV pool for this KvPool (same blocks, same layout).
    if (kv.data != m.kv_key || kv.num_blocks != m.kv_blocks || !m.kv_dev) {
        if (launched != waited) throw std::logic_error("CUDA model: the KV pool changed under a pending step");
        SCR_CUDA(cudaStreamSynchronize(m.stream));
        m.drop_graphs();  // they captured the old pool's address
        cudaFree(m.kv_dev);
        m.kv_dev = nullptr;
        const size_t bytes = size_t(kv.num_blocks) * size_t(mi.kv_bytes_per_block);
        if (cudaMalloc(reinterpret_cast<void**>(&m.kv_dev), bytes) != cudaSuccess) {
            cudaGetLastError();
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            fail("model {}: a KV pool of {} blocks ({:.2f} GiB) does not fit on the GPU ({:.2f} GiB free); give the engine a "
                 "smaller KV cache budget",
                 mi.stem, kv.num_blocks, bytes / 1073741824.0, free_b / 1073741824.0);
        }
        SCR_CUDA(cudaMemsetAsync(m.kv_dev, 0, bytes, m.stream));
        m.kv_key = kv.data;
        m.kv_blocks = kv.num_blocks;
    }

    // Decode-only steps (one token per sequence, each wanting its logits) run as a graph of the
    // smallest bucket that holds them; padding rows write no KV and attend to nothing.
    bool decode = T == S && R == T && T <= m.buckets.back();
    for (int r = 0; decode && r < R; ++r) decode = b.logit_rows[r] == r;
    int rows = T, logit_rows = R;
    if (decode) rows = logit_rows = *std::lower_bound(m.buckets.begin(), m.buckets.end(), T);

    // Pack the step into the pinned buffer.
    const kernels::cpu::AttnBatch ab = model.attn_batch(b);  // seq_of_token, filled by begin_step
    int stride = 1;
    for (int s = 0; s < S; ++s) stride = std::max(stride, (b.seq_lens[s] + mi.block_size - 1) / mi.block_size);
    if (int64_t(S) * stride > m.table_cap) fail("step: block tables of {} x {} exceed the compiled bound", S, stride);
    m.ensure_meta_host(slot, m.off_tables + size_t(S) * size_t(stride) * 4);
    auto* h = m.meta_host[slot];
    auto* header = reinterpret_cast<int32_t*>(h + m.off_header);
    header[kc::kHeaderTokens] = T;
    header[kc::kHeaderTableStride] = stride;
    header[kc::kHeaderSeqs] = S;
    auto* ids = reinterpret_cast<int32_t*>(h + m.off_ids);
    auto* pos = reinterpret_cast<int32_t*>(h + m.off_pos);
    auto* slots = reinterpret_cast<int64_t*>(h + m.off_slots);
    auto* seq = reinterpret_cast<int32_t*>(h + m.off_seq);
    auto* lrows = reinterpret_cast<int32_t*>(h + m.off_logit_rows);
    auto* tables = reinterpret_cast<int32_t*>(h + m.off_tables);
    std::memcpy(ids, b.token_ids, size_t(T) * 4);
    std::memcpy(pos, b.positions, size_t(T) * 4);
    std::memcpy(slots, b.slot_mapping, size_t(T) * 8);
    std::memcpy(seq, ab.seq_of_token, size_t(T) * 4);
    for (int t = T; t < rows; ++t) {
        ids[t] = 0;
        pos[t] = 0;
        slots[t] = -1;
        seq[t] = 0;
    }
    std::memcpy(lrows, b.logit_rows, size_t(R) * 4);
    for (int r = R; r < logit_rows; ++r) lrows[r] = r;
    for (int s = 0; s < S; ++s) {
        const int need = (b.seq_lens[s] + mi.block_size - 1) / mi.block_size;
        const int32_t* src = b.block_tables + size_t(s) * b.block_table_stride;
        int32_t* dst = tables + size_t(s) * stride;
        std::memcpy(dst, src, size_t(need) * 4);
        std::fill(dst + need, dst + stride, 0);
    }
    Launch& l = m.launches[slot];
    l.timed = m.timing;
    l.sampled_rows = sampling.empty() ? 0 : R;
    if (l.sampled_rows > 0) {
        // Rows 0..R-1 of the device logits are the step's real rows (graph padding comes after them).
        auto* params = reinterpret_cast<kc::SampleParams*>(h + m.off_params);
        for (int r = 0; r < R; ++r) {
            const DeviceSamplingRow& s = sampling[size_t(r)];
            params[r] = kc::SampleParams{s.temperature, s.top_k, s.top_p, s.min_p, s.uniform};
        }
    }
    // The step's arrays to the device. Run-ahead: a fed step's token ids are the previous step's
    // draws, which the sampler left in the device's id rows, so they are not copied (ids come first
    // in the layout). A small graph step queued behind another (step_copy above): the ranges its
    // launches read, by one kernel from the mapped pinned buffer (cuda_rt::copy_step_ranges);
    // otherwise one copy-engine transfer of the span.
    static_assert(sizeof(kc::SampleParams) % 4 == 0 && kAlign % 4 == 0, "copy_step_ranges copies whole 32-bit words");
    // Graph replays only: a graph launch starts after all earlier work in the stream, while an eager
    // step's first kernel (also a bucket's first, uncaptured run) is a programmatic dependent that
    // may start before a copy kernel ends.
    const bool replay = decode && m.graphs.count(rows) > 0;
    const bool queued = m.launched > m.waited;  // behind a pending step's kernels
    bool by_kernel = replay && (m.step_copy == Impl::StepCopy::kernel || (m.step_copy == Impl::StepCopy::automatic && queued));
    cuda_rt::StepCopyRanges ranges;
    if (by_kernel) {
        size_t total = 0;
        bool fits = true;  // false: more ranges than the kernel takes (a later edit's), so the transfer
        auto add_range = [&](size_t off, size_t bytes) {
            if (ranges.n == cuda_rt::StepCopyRanges::kMax) {
                fits = false;
                return;
            }
            ranges.offset[ranges.n] = uint32_t(off);
            ranges.bytes[ranges.n++] = uint32_t(bytes);
            total += bytes;
        };
        if (!feed_previous) add_range(m.off_ids, size_t(rows) * 4);
        add_range(m.off_header, kc::kHeaderInts * 4);
        add_range(m.off_pos, size_t(rows) * 4);
        add_range(m.off_slots, size_t(rows) * 8);
        add_range(m.off_seq, size_t(rows) * 4);
        add_range(m.off_logit_rows, size_t(logit_rows) * 4);
        if (l.sampled_rows > 0) add_range(m.off_params, size_t(R) * sizeof(kc::SampleParams));
        add_range(m.off_tables, size_t(S) * stride * 4);
        by_kernel = fits && total <= cuda_rt::kStepCopyKernelMaxBytes;
    }
    if (l.timed) SCR_CUDA(cudaEventRecord(m.t_copy[slot], m.stream));
    if (by_kernel) {
        cuda_rt::copy_step_ranges(m.stream, m.meta_dev, h, ranges);
        check(cudaGetLastError(), "the step copy kernel launch");
    } else {
        const size_t copy_end = m.off_tables + size_t(S) * stride * 4, copy_from = feed_previous ? m.off_header : 0;
        SCR_CUDA(cudaMemcpyAsync(m.meta_dev + copy_from, h + copy_from, copy_end - copy_from, cudaMemcpyHostToDevice, m.stream));
    }

    kc::Ctx ctx;
    ctx.stream = m.stream;
    ctx.step = m.step;
    ctx.pdl = m.pdl;
    ctx.one_token_per_seq = T == S;
    ctx.attn_ws = static_cast<float*>(m.attn_ws);
    ctx.qwide_ws = m.qwide_ws;
    ctx.qwide_ws_bytes = m.qwide_ws_bytes;
    ctx.side = m.side.get();
    if (l.timed) SCR_CUDA(cudaEventRecord(m.t_begin[slot], m.stream));
    if (decode) {
        // A graph captured before cuBLASLt's scratch was reallocated (a longer prefill since) holds
        // the freed buffer's address: drop them all and capture again (after the pending step).
        const unsigned long long epoch = cuda_rt::cublas_scratch_epoch();
        if (epoch != m.graphs_scratch_epoch) {
            if (!m.graphs.empty()) {
                SCR_CUDA(cudaStreamSynchronize(m.stream));
                m.drop_graphs();
            }
            m.graphs_scratch_epoch = epoch;
        }
        auto it = m.graphs.find(rows);
        if (it == m.graphs.end()) {
            const auto t0 = std::chrono::steady_clock::now();
            // One eager run first, so whatever a launcher sets up lazily (cuBLASLt's algorithm for
            // this bucket, its scratch) exists before capture; a launcher that cannot set up inside a
            // capture takes its fallback, which the graph would then keep for good. The step is
            // idempotent (the same K/V rows to the same slots, logits overwritten by the replay).
            model.run(ctx, rows, logit_rows, m.kv_dev);
            check(cudaGetLastError(), "a kernel launch");
            cudaGraph_t graph = nullptr;
            SCR_CUDA(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
            model.run(ctx, rows, logit_rows, m.kv_dev);
            const cudaError_t launch = cudaGetLastError();
            SCR_CUDA(cudaStreamEndCapture(m.stream, &graph));
            check(launch, "a kernel launch during graph capture");
            cudaGraphExec_t exec = nullptr;
            const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
            cudaGraphDestroy(graph);
            check(inst, "cudaGraphInstantiate");
            it = m.graphs.emplace(rows, exec).first;
            ++m.stats.graphs_captured;
            m.stats.capture_seconds += seconds_since(t0);
        }
        SCR_CUDA(cudaGraphLaunch(it->second, m.stream));
        ++m.stats.graph_steps;
    } else {
        model.run(ctx, rows, logit_rows, m.kv_dev);
        check(cudaGetLastError(), "a kernel launch");
        ++m.stats.eager_steps;
    }
    if (l.timed) SCR_CUDA(cudaEventRecord(m.t_graph[slot], m.stream));
    if (l.sampled_rows > 0) {
        // The sampler after the step's kernels: tokens to the mapped host buffer and to the id rows.
        kc::sample_rows(m.stream, m.logits_dev, mi.vocab_size, R, reinterpret_cast<const kc::SampleParams*>(m.meta_dev + m.off_params),
                        m.sampled_mapped[slot], nullptr, reinterpret_cast<int32_t*>(m.meta_dev + m.off_ids));
        check(cudaGetLastError(), "the sampling kernel launch");
    }
    if (l.timed) SCR_CUDA(cudaEventRecord(m.t_end[slot], m.stream));
    // Logits come back through one pinned buffer: forward() waits for its step at once, so no two
    // pending steps share it.
    l.logit_rows = want_logits ? R : 0;
    if (l.logit_rows > 0)
        SCR_CUDA(cudaMemcpyAsync(m.logits_host, m.logits_dev, size_t(R) * size_t(mi.vocab_size) * 4, cudaMemcpyDeviceToHost,
                                 m.stream));
    SCR_CUDA(cudaEventRecord(m.ready[slot], m.stream));
    ++m.launched;
}

void CudaGeneratedModel::Impl::wait(const ModelInfo& mi, float* logits, int32_t* token_ids) {
    Impl& m = *this;
    if (m.waited == m.launched) throw std::logic_error("CUDA model: waited for a step that was not launched");
    const int slot = int(m.waited % 2);
    Launch& l = m.launches[slot];
    SCR_CUDA(cudaEventSynchronize(m.ready[slot]));
    ++m.waited;
    if (l.logit_rows > 0 && logits)
        std::memcpy(logits, m.logits_host, size_t(l.logit_rows) * size_t(mi.vocab_size) * 4);
    if (l.sampled_rows > 0) {
        if (token_ids) std::memcpy(token_ids, m.sampled_host[slot], size_t(l.sampled_rows) * 4);
        m.stats.device_sampled_rows += l.sampled_rows;  // a dropped step's rows (token_ids null) too
    }
    if (l.timed) {
        float copy = 0, all = 0, sample = 0;
        SCR_CUDA(cudaEventElapsedTime(&copy, m.t_copy[slot], m.t_begin[slot]));
        SCR_CUDA(cudaEventElapsedTime(&all, m.t_begin[slot], m.t_end[slot]));
        SCR_CUDA(cudaEventElapsedTime(&sample, m.t_graph[slot], m.t_end[slot]));
        m.stats.copy_seconds += copy * 1e-3;
        m.stats.device_seconds += all * 1e-3;
        m.stats.sample_seconds += sample * 1e-3;
        ++m.stats.timed_steps;
    }
}

void CudaGeneratedModel::Impl::ensure_meta_host(int slot, size_t bytes) {
    if (bytes <= meta_host_bytes[slot]) return;
    // This slot's previous step has been waited for (launch allows one pending step, in the other
    // slot), so its copy has ended and nothing reads this buffer.
    const size_t grown = std::min(meta_bytes, std::max(bytes, 2 * meta_host_bytes[slot]));
    std::byte* p = nullptr;
    SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&p), grown));
    std::memset(p, 0, std::min(off_tables, grown));  // valid token ids in rows no step packs (see the constructor)
    cudaFreeHost(meta_host[slot]);
    meta_host[slot] = p;
    meta_host_bytes[slot] = grown;
}

void CudaGeneratedModel::Impl::ensure_logits_host(const ModelInfo& mi, int rows) {
    if (rows <= logits_host_rows) return;
    // Called before the step queues anything. Only one step with logits is ever pending (forward()
    // waits for it at once), so no queued copy writes this buffer unless that rule was broken.
    for (int64_t i = waited; i < launched; ++i)
        if (launches[i % 2].logit_rows > 0) throw std::logic_error("CUDA model: two pending steps return logits");
    int grown = 1;
    while (grown < rows) grown *= 2;
    grown = std::min(grown, std::max(rows, mi.max_logit_rows));
    cudaFreeHost(logits_host);
    logits_host = nullptr;
    logits_host_rows = 0;
    SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&logits_host), size_t(grown) * size_t(mi.vocab_size) * 4));
    logits_host_rows = grown;
}

void CudaGeneratedModel::Impl::ensure_sampling_buffers(int rows_cap) {
    if (sampled_host[0]) return;
    const size_t rows = size_t(std::max(1, rows_cap));
    for (int i = 0; i < 2; ++i) {
        SCR_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&sampled_host[i]), rows * 4, cudaHostAllocMapped));
        SCR_CUDA(cudaHostGetDevicePointer(reinterpret_cast<void**>(&sampled_mapped[i]), sampled_host[i], 0));
    }
}

void CudaGeneratedModel::forward(const StepBatch& b, KvPool& kv, float* logits) {
    Impl& m = *impl_;
    if (m.launched != m.waited) throw std::logic_error("CudaGeneratedModel::forward with a launched step not waited for");
    m.launch(*this, b, kv, {}, /*feed_previous=*/false, /*want_logits=*/logits != nullptr);
    m.wait(info(), logits, nullptr);
}

bool CudaGeneratedModel::can_sample_on_device() const { return impl_->device_sampling; }

void CudaGeneratedModel::set_device_sampling(bool on) { impl_->device_sampling = on; }

bool CudaGeneratedModel::can_run_ahead() const { return impl_->device_sampling && impl_->run_ahead; }

void CudaGeneratedModel::set_run_ahead(bool on) { impl_->run_ahead = on; }

namespace {
void check_sampling_rows(const StepBatch& b, std::span<const DeviceSamplingRow> sampling, bool have_output) {
    if (b.num_logits > 0 && (!have_output || sampling.size() < size_t(b.num_logits)))
        fail("forward_sample: {} logit rows but {} sampling rows{}", b.num_logits, sampling.size(),
             have_output ? "" : " and no output");
}
}  // namespace

void CudaGeneratedModel::forward_sample(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                                        int32_t* token_ids) {
    Impl& m = *impl_;
    check_sampling_rows(b, sampling, token_ids != nullptr);
    if (m.launched != m.waited) throw std::logic_error("CudaGeneratedModel::forward_sample with a launched step not waited for");
    m.ensure_sampling_buffers(info().max_logit_rows);
    m.launch(*this, b, kv, sampling.first(size_t(b.num_logits)), /*feed_previous=*/false, /*want_logits=*/false);
    m.wait(info(), nullptr, token_ids);
}

void CudaGeneratedModel::launch_sample(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                                       bool feed_previous) {
    Impl& m = *impl_;
    check_sampling_rows(b, sampling, true);
    if (b.num_logits < 1) fail("launch_sample: a step with no logit rows samples nothing");
    m.ensure_sampling_buffers(info().max_logit_rows);
    m.launch(*this, b, kv, sampling.first(size_t(b.num_logits)), feed_previous, /*want_logits=*/false);
}

void CudaGeneratedModel::wait_sample(int32_t* token_ids) { impl_->wait(info(), nullptr, token_ids); }

}  // namespace scr
