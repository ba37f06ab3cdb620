// The one interface between code that scrc generates and the model-agnostic runtime.
//
// A generated specialization (one architecture x config x quant preset x target) provides a
// `ModelInfo` (its constants, expected tensors and the config values it was bound from) and a
// factory for a `CompiledModel`, whose only job is `forward`: run one flattened batch of tokens
// (vLLM-style: any mix of prefill chunks and decode tokens) against the paged KV pool and write
// logits for the requested rows. The engine never sees an architecture; the generated code never
// sees a request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "runtime/core/dtype.hpp"

namespace scr {

class WeightSet;  // runtime/weights/weight_set.hpp
class ThreadPool; // runtime/core/thread_pool.hpp

// One tensor the compiled plan expects in the checkpoint.
struct TensorSpec {
    std::string_view name;     // e.g. "model.layers.3.self_attn.q_proj.weight"
    int rank;
    int64_t shape[4];
    DType dtype;               // dtype the kernels read (the preset's), not the checkpoint's
    bool optional;             // e.g. lm_head when embeddings are tied and the file has none
};

// A config.json value the compiler read while binding. At start the runtime compares every one
// against the model's own config.json: equal everywhere means this specialization serves it.
struct ConfigKey {
    std::string_view path;        // JSON pointer, e.g. "/rope_parameters/rope_theta"
    std::string_view value_json;  // the value seen, as compact JSON; "" when the key was absent
};

struct ModelInfo {
    std::string_view stem;    // config file stem, e.g. "llama-3.2-1b"
    std::string_view arch;    // DSL architecture name, e.g. "llama"
    std::string_view quant;   // preset name, e.g. "bf16"
    std::string_view target;  // "cpu" | "cuda" | "spyre"
    std::string_view hf_architecture;  // e.g. "LlamaForCausalLM"

    int vocab_size;
    int hidden_size;
    int num_layers;
    int num_kv_heads;
    int head_dim;
    int max_position_embeddings;  // the model's context
    int block_size;               // KV block size in tokens (compile-time constant of the build)
    int max_batch_tokens;         // most tokens one forward may carry (scratch is sized for it)
    int max_logit_rows;           // most rows of logits one forward may produce
    int64_t bos_token_id, eos_token_id;  // -1 when the config has none

    DType kv_dtype;
    int64_t kv_bytes_per_token;   // all layers, K and V
    int64_t kv_bytes_per_block;   // kv_bytes_per_token * block_size
    int64_t weight_bytes;         // bytes the kernels read per full forward (all weights once)
    int64_t scratch_bytes;        // activation arena planned by the compiler
    int64_t active_weight_bytes;  // weights read per decode token (MoE: only routed experts)

    std::span<const TensorSpec> tensors;
    std::span<const ConfigKey> config_keys;
    std::string_view plan_text;   // human-readable plan (ops, shapes, scratch offsets) for `scr info`

    // > 0 when EVERY attention layer sees at most this many tokens (itself included): a step whose
    // first new token is at position P never reads blocks wholly before P - sliding_window + 1, so
    // the KV manager may free them (vLLM's SlidingWindowManager.remove_skipped_blocks); their
    // block-table entries must still name a valid block (e.g. a reserved null block).
    // 0: some layer reads the whole sequence (full attention, or a hybrid of both), keep every block.
    int sliding_window = 0;

    // The quant preset's "quantization_config" as compact JSON ("" for dense presets): a quantized
    // checkpoint is served only by a specialization whose block matches its own (runtime/model/quant_match).
    std::string_view quant_config_json = {};
};

// One flattened step, laid out as vLLM's model runner lays it out
// (vLLM: vllm/v1/worker/gpu_model_runner.py:L1040, _prepare_inputs).
// Sequences are contiguous runs of tokens; token i of the batch belongs to the sequence s with
// query_start[s] <= i < query_start[s+1].
struct StepBatch {
    int num_tokens = 0;
    const int32_t* token_ids = nullptr;     // [num_tokens]
    const int32_t* positions = nullptr;     // [num_tokens], absolute position in its sequence
    const int64_t* slot_mapping = nullptr;  // [num_tokens], block_id * block_size + offset (KV write)

    int num_seqs = 0;
    const int32_t* query_start = nullptr;   // [num_seqs + 1]
    const int32_t* seq_lens = nullptr;      // [num_seqs], context length after this step
    const int32_t* block_tables = nullptr;  // [num_seqs * block_table_stride]
    int block_table_stride = 0;

    int num_logits = 0;
    const int32_t* logit_rows = nullptr;    // [num_logits], token rows whose logits are wanted
};

// The KV pool: one allocation, its layout owned by the generated model
// (per layer, K then V, [num_blocks][kv_heads][block_size][head_dim]).
struct KvPool {
    std::byte* data = nullptr;
    int32_t num_blocks = 0;
};

// How one logit row is to be sampled by a model that samples on its own device
// (CompiledModel::forward_sample). It is the part of the engine's sampler a device implements:
// temperature, min_p, top_k, top_p (vLLM's order) and one draw. Penalties, logit bias, min_tokens and
// logprobs need the logits on the host: the engine then calls forward() instead.
struct DeviceSamplingRow {
    float temperature = 0;  // < 1e-5 (the sampler's kSamplingEps): greedy, the lowest id among equal maxima
    int32_t top_k = 0;      // <= 0 or >= vocab_size: off; ties with the k-th value are kept
    float top_p = 1;        // >= 1: off
    float min_p = 0;        // <= 0: off
    double uniform = 0;     // in [0, 1): the draw inverts the CDF of the kept tokens, in id order, at it
};

class CompiledModel {
public:
    virtual ~CompiledModel() = default;
    virtual const ModelInfo& info() const = 0;
    // logits: [batch.num_logits][vocab_size] float32.
    virtual void forward(const StepBatch& batch, KvPool& kv, float* logits) = 0;

    // Optional: models whose logits live on an accelerator may sample there, so that only token ids
    // come back. forward_sample is forward() followed by one token per logit row:
    // sampling[r] says how row r is drawn, token_ids[r] receives it ([batch.num_logits] each).
    virtual bool can_sample_on_device() const { return false; }
    virtual void forward_sample(const StepBatch& batch, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                                int32_t* token_ids) {
        (void)batch, (void)kv, (void)sampling, (void)token_ids;
        throw std::logic_error("forward_sample called on a model that cannot sample on its device");
    }

    // Optional, for models that sample on an asynchronous device: the engine's run-ahead (vLLM's
    // async scheduling) enqueues step n + 1 before step n's tokens are back, so the host's work
    // between steps hides behind the device's. launch_sample enqueues forward_sample's work and
    // returns (the batch and the sampling rows are copied before it returns); wait_sample blocks
    // until the oldest launched step's tokens are in token_ids ([num_logits] of that step; null:
    // discarded). With feed_previous, token row r (r < batch.num_tokens) takes its id from row r of
    // the previous launched step's sampled tokens, on the device, instead of batch.token_ids[r]. At
    // most two steps may be pending (launched, not yet waited for); forward() and forward_sample()
    // need none.
    virtual bool can_run_ahead() const { return false; }
    virtual void launch_sample(const StepBatch& batch, KvPool& kv, std::span<const DeviceSamplingRow> sampling,
                               bool feed_previous) {
        (void)batch, (void)kv, (void)sampling, (void)feed_previous;
        throw std::logic_error("launch_sample called on a model that cannot run ahead");
    }
    virtual void wait_sample(int32_t* token_ids) {
        (void)token_ids;
        throw std::logic_error("wait_sample called on a model that cannot run ahead");
    }
};

using ModelFactory = std::unique_ptr<CompiledModel> (*)(const WeightSet&, ThreadPool&);

struct ModelEntry {
    const ModelInfo* info;
    ModelFactory create;
};

// Every specialization compiled into this binary (generated registry).
std::span<const ModelEntry> compiled_models();

}  // namespace scr
