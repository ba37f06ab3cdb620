#include "runtime/cuda/cuda_model.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>

#include "runtime/core/error.hpp"
#include "runtime/core/thread_pool.hpp"
#include "runtime/cuda/startup.hpp"
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
    void* sync = nullptr;  // dev_sync()
    float* logits_dev = nullptr;
    float* logits_host = nullptr;  // pinned

    // Step arrays: one pinned host buffer and its device twin, fixed layout (block tables last, so
    // a step copies one prefix of it).
    std::byte* meta_host = nullptr;
    std::byte* meta_dev = nullptr;
    size_t off_header = 0, off_ids = 0, off_pos = 0, off_slots = 0, off_seq = 0, off_logit_rows = 0, off_tables = 0;
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
    bool pdl = [] {
        const char* e = std::getenv("SCR_CUDA_PDL");
        return !(e && std::string_view(e) == "0");
    }();
    cudaEvent_t t_begin = nullptr, t_end = nullptr;

    std::vector<int> buckets;  // decode graph batch sizes
    std::map<int, cudaGraphExec_t> graphs;
    Stats stats;

    // Sampling on the GPU (forward_sample): per-row parameters in, token ids out, through pinned
    // buffers allocated at the first use; `sampling_out` is set only while forward_sample runs.
    bool device_sampling = [] {
        const char* e = std::getenv("SCR_CUDA_DEVICE_SAMPLING");
        return !(e && std::string_view(e) == "0");
    }();
    kc::SampleParams* sample_params_host = nullptr;
    kc::SampleParams* sample_params_dev = nullptr;
    int32_t* sampled_host = nullptr;
    int32_t* sampled_dev = nullptr;
    std::span<const DeviceSamplingRow> sampling;
    int32_t* sampling_out = nullptr;

    void drop_graphs() {
        for (auto& [rows, g] : graphs) cudaGraphExecDestroy(g);
        graphs.clear();
    }
};

CudaGeneratedModel::CudaGeneratedModel(const ModelInfo& info, const WeightSet& weights, ThreadPool& pool, int64_t scratch_floats,
                                       int64_t moe_workspace_floats)
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
    cuda_startup::DeviceWeights uploaded = cuda_startup::upload_weights(info, weights, pool, m.stream);
    m.weights = uploaded.base;
    dev_weights_ = std::move(uploaded.tensors);
    SCR_CUDA(cudaMalloc(&m.table, std::max<size_t>(1, dev_weights_.size()) * sizeof(void*)));
    SCR_CUDA(cudaMemcpy(m.table, dev_weights_.data(), dev_weights_.size() * sizeof(void*), cudaMemcpyHostToDevice));
    dev_weight_table_ = static_cast<const void* const*>(m.table);
    m.stats.upload_seconds = uploaded.seconds;
    m.stats.upload_bytes = int64_t(uploaded.bytes);

    // ---- Scratch, MoE workspace, logits.
    SCR_CUDA(cudaMalloc(&m.scratch, std::max<size_t>(size_t(scratch_floats) * 4, kAlign)));
    dev_scratch_ = static_cast<float*>(m.scratch);
    if (moe_workspace_floats > 0) {
        SCR_CUDA(cudaMalloc(&m.moe_ws, size_t(moe_workspace_floats) * 4));
        dev_moe_ws_ = static_cast<float*>(m.moe_ws);
    }
    SCR_CUDA(cudaMalloc(&m.sync, 4096));
    SCR_CUDA(cudaMemset(m.sync, 0, 4096));
    dev_sync_ = static_cast<unsigned*>(m.sync);
    const size_t logit_bytes = size_t(info.max_logit_rows) * size_t(info.vocab_size) * 4;
    SCR_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.logits_dev), logit_bytes));
    SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&m.logits_host), logit_bytes));
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
    m.off_header = section(kc::kHeaderInts * 4);
    m.off_ids = section(size_t(m.rows_cap) * 4);
    m.off_pos = section(size_t(m.rows_cap) * 4);
    m.off_slots = section(size_t(m.rows_cap) * 8);
    m.off_seq = section(size_t(m.rows_cap) * 4);
    m.off_logit_rows = section(size_t(m.rows_cap) * 4);
    m.off_tables = section(size_t(m.table_cap) * 4);
    m.meta_bytes = at;
    SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&m.meta_host), m.meta_bytes));
    SCR_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.meta_dev), m.meta_bytes));
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
}

CudaGeneratedModel::~CudaGeneratedModel() {
    Impl& m = *impl_;
    if (m.stream) cudaStreamSynchronize(m.stream);
    m.drop_graphs();
    if (m.t_begin) cudaEventDestroy(m.t_begin);
    if (m.t_end) cudaEventDestroy(m.t_end);
    cudaFree(m.kv_dev);
    cudaFree(m.meta_dev);
    cudaFreeHost(m.meta_host);
    cudaFree(m.logits_dev);
    cudaFreeHost(m.logits_host);
    cudaFree(m.sample_params_dev);
    cudaFreeHost(m.sample_params_host);
    cudaFree(m.sampled_dev);
    cudaFreeHost(m.sampled_host);
    cudaFree(m.moe_ws);
    cudaFree(m.sync);
    cudaFree(m.scratch);
    cudaFree(m.table);
    cudaFree(m.weights);
    if (m.stream) cudaStreamDestroy(m.stream);
}

const CudaGeneratedModel::Stats& CudaGeneratedModel::stats() const { return impl_->stats; }

void CudaGeneratedModel::set_timing(bool on) {
    Impl& m = *impl_;
    if (on && !m.t_begin) {
        SCR_CUDA(cudaEventCreate(&m.t_begin));
        SCR_CUDA(cudaEventCreate(&m.t_end));
    }
    m.timing = on;
}

void CudaGeneratedModel::forward(const StepBatch& b, KvPool& kv, float* logits) {
    Impl& m = *impl_;
    const ModelInfo& mi = info();
    begin_step(b, kv);  // bounds and consistency, on the host, before anything reaches the GPU

    // The device KV pool for this KvPool (same blocks, same layout).
    if (kv.data != m.kv_key || kv.num_blocks != m.kv_blocks || !m.kv_dev) {
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
    const int T = b.num_tokens, S = b.num_seqs, R = b.num_logits;
    bool decode = T == S && R == T && T <= m.buckets.back();
    for (int r = 0; decode && r < R; ++r) decode = b.logit_rows[r] == r;
    int rows = T, logit_rows = R;
    if (decode) rows = logit_rows = *std::lower_bound(m.buckets.begin(), m.buckets.end(), T);

    // Pack the step into the pinned buffer.
    const kernels::cpu::AttnBatch ab = attn_batch(b);  // seq_of_token, filled by begin_step
    int stride = 1;
    for (int s = 0; s < S; ++s) stride = std::max(stride, (b.seq_lens[s] + mi.block_size - 1) / mi.block_size);
    if (int64_t(S) * stride > m.table_cap) fail("step: block tables of {} x {} exceed the compiled bound", S, stride);
    auto* h = m.meta_host;
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
    const size_t copy = m.off_tables + size_t(S) * stride * 4;
    SCR_CUDA(cudaMemcpyAsync(m.meta_dev, m.meta_host, copy, cudaMemcpyHostToDevice, m.stream));

    kc::Ctx ctx;
    ctx.stream = m.stream;
    ctx.step = m.step;
    ctx.pdl = m.pdl;
    ctx.one_token_per_seq = T == S;
    if (m.timing) SCR_CUDA(cudaEventRecord(m.t_begin, m.stream));
    if (decode) {
        auto it = m.graphs.find(rows);
        if (it == m.graphs.end()) {
            const auto t0 = std::chrono::steady_clock::now();
            // One eager run first, so whatever a launcher sets up lazily (cuBLASLt's algorithm for
            // this bucket, its scratch) exists before capture; a launcher that cannot set up inside a
            // capture takes its fallback, which the graph would then keep for good. The step is
            // idempotent (the same K/V rows to the same slots, logits overwritten by the replay).
            run(ctx, rows, logit_rows, m.kv_dev);
            check(cudaGetLastError(), "a kernel launch");
            cudaGraph_t graph = nullptr;
            SCR_CUDA(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
            run(ctx, rows, logit_rows, m.kv_dev);
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
        run(ctx, rows, logit_rows, m.kv_dev);
        check(cudaGetLastError(), "a kernel launch");
        ++m.stats.eager_steps;
    }
    if (m.sampling_out && R > 0) {
        // forward_sample: rows 0..R-1 of the device logits are the step's real rows (graph padding
        // comes after them); the sampler runs after the step's kernels and only token ids come back.
        for (int r = 0; r < R; ++r) {
            const DeviceSamplingRow& s = m.sampling[size_t(r)];
            m.sample_params_host[r] = kc::SampleParams{s.temperature, s.top_k, s.top_p, s.min_p, s.uniform};
        }
        SCR_CUDA(cudaMemcpyAsync(m.sample_params_dev, m.sample_params_host, size_t(R) * sizeof(kc::SampleParams),
                                 cudaMemcpyHostToDevice, m.stream));
        kc::sample_rows(m.stream, m.logits_dev, mi.vocab_size, R, m.sample_params_dev, m.sampled_dev);
        check(cudaGetLastError(), "the sampling kernel launch");
        SCR_CUDA(cudaMemcpyAsync(m.sampled_host, m.sampled_dev, size_t(R) * 4, cudaMemcpyDeviceToHost, m.stream));
    }
    if (m.timing) SCR_CUDA(cudaEventRecord(m.t_end, m.stream));
    const size_t vocab = size_t(mi.vocab_size);
    if (R > 0 && logits)
        SCR_CUDA(cudaMemcpyAsync(m.logits_host, m.logits_dev, size_t(R) * vocab * 4, cudaMemcpyDeviceToHost, m.stream));
    SCR_CUDA(cudaStreamSynchronize(m.stream));
    if (R > 0 && logits) std::memcpy(logits, m.logits_host, size_t(R) * vocab * 4);
    if (m.sampling_out && R > 0) {
        std::memcpy(m.sampling_out, m.sampled_host, size_t(R) * 4);
        m.stats.device_sampled_rows += R;
    }
    if (m.timing) {
        float ms = 0;
        SCR_CUDA(cudaEventElapsedTime(&ms, m.t_begin, m.t_end));
        m.stats.device_seconds += ms * 1e-3;
        ++m.stats.timed_steps;
    }
}

bool CudaGeneratedModel::can_sample_on_device() const { return impl_->device_sampling; }

void CudaGeneratedModel::set_device_sampling(bool on) { impl_->device_sampling = on; }

void CudaGeneratedModel::forward_sample(const StepBatch& b, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                                        int32_t* token_ids) {
    Impl& m = *impl_;
    const ModelInfo& mi = info();
    if (b.num_logits > 0 && (!token_ids || sampling.size() < size_t(b.num_logits)))
        fail("forward_sample: {} logit rows but {} sampling rows{}", b.num_logits, sampling.size(),
             token_ids ? "" : " and no output");
    if (!m.sample_params_host) {
        const size_t rows = size_t(std::max(1, mi.max_logit_rows));
        SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&m.sample_params_host), rows * sizeof(kc::SampleParams)));
        SCR_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.sample_params_dev), rows * sizeof(kc::SampleParams)));
        SCR_CUDA(cudaMallocHost(reinterpret_cast<void**>(&m.sampled_host), rows * 4));
        SCR_CUDA(cudaMalloc(reinterpret_cast<void**>(&m.sampled_dev), rows * 4));
    }
    m.sampling = sampling;
    m.sampling_out = token_ids;
    struct Reset {
        Impl& m;
        ~Reset() {
            m.sampling = {};
            m.sampling_out = nullptr;
        }
    } reset{m};
    forward(b, kv, nullptr);
}

}  // namespace scr
