// The Spyre planner: every op of the bound, fused graph becomes one or more tiled kernels whose
// split over the 32 cores and per-core tile are fixed here, sized so that a tile's resident bytes
// (inputs, weights, outputs, accumulators, double buffers) fit the usable scratchpad. It also lays
// out device memory (weights stickified to fp16, activations by liveness, step inputs, KV layout).
// A plan that cannot fit is an scr::Error naming the op, the layer, the tile, the bytes and the fix.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "compiler/bind/binder.hpp"
#include "kernels/spyre/plan.hpp"

namespace scr::spyre {

namespace sp = scr::kernels::spyre;

using AnyPlan = std::variant<sp::EmbedPlan, sp::NormPlan, sp::RopePlan, sp::EltwisePlan, sp::GatherPlan, sp::KvAppendPlan,
                             sp::LinearPlan, sp::AttentionPlan, sp::MoeRoutePlan, sp::MoeCombinePlan>;

// One tiled kernel call.
struct Kernel {
    AnyPlan plan;
    std::string what;      // "linear self_attn.q_proj", "attention kv-append", "moe route"
    std::string tile;      // the tile shape in words
    int cores_used = 1;    // at the planned maximum rows
    int64_t resident = 0;  // LX bytes per core
};

struct OpPlan {
    int op = -1;     // index into graph.ops
    int layer = -1;  // -1 outside the layer loop
    std::string label;
    std::vector<Kernel> kernels;
    std::vector<int64_t> weights;  // device offsets of the op's weights, in op.weights order (-1: absent)
    int64_t table = -1;            // rope: device offset of its inverse-frequency table
};

// A tensor as it lives in device memory: rows of fp16, each row stickified in `row`'s layout.
struct WeightSlot {
    int tensor = -1;
    int64_t rows = 1;
    sp::RowShape row;
    int64_t offset = 0;
};

struct DeviceMap {
    std::vector<WeightSlot> weights;
    int64_t weight_bytes = 0, active_weight_bytes = 0;
    std::map<std::vector<float>, int64_t> rope_tables;  // table -> offset
    int64_t constants_bytes = 0;
    // Per-step inputs (host -> device each forward).
    int64_t ids = 0, positions = 0, slots = 0, logit_rows = 0, tables = 0, table_row_bytes = 0, max_blocks = 0;
    int64_t step_bytes = 0;
    // Activations: one fp16 region per value (shared by in-place aliases), placed by liveness.
    std::vector<int64_t> value_offset;
    int64_t activations_begin = 0, activation_bytes = 0;
    // MoE workspace, shared by every MoE op (they run one after another).
    int64_t moe_logits = -1, moe_top = -1, moe_lists = -1, moe_counts = -1, moe_act = -1, moe_y = -1, moe_list_stride = 0;
    int64_t moe_bytes = 0;
    int64_t logits = 0, logits_row_floats = 0;
    int64_t total = 0;
    // KV cache (the runtime's pool): per block, per layer K then V, [kv_heads][block][pad(head_dim)] fp16.
    int64_t kv_block_bytes = 0, kv_bytes_per_token = 0;
    std::vector<int64_t> k_offsets, v_offsets;
};

struct Plan {
    int64_t lx_bytes = sp::kLxUsableBytes;
    DeviceMap dev;
    std::vector<OpPlan> ops;
};

// Plans the whole graph for a scratchpad budget of lx_bytes per core. Throws scr::Error listing
// every op whose smallest tile does not fit.
Plan plan_spyre(const bind::Bound& b, int64_t lx_bytes);

// The plan as `scr info` and `scrc plan --target spyre` print it.
std::string plan_spyre_text(const bind::Bound& b, const Plan& p);

// Shape of a value's row in device memory.
sp::RowShape row_shape(const ir::Value& v);

// Tile shape and LX breakdown of any plan, in words (for plan text and error messages).
std::string describe_tile(const AnyPlan& p);
std::string describe_buffers(const AnyPlan& p, int largest);
int64_t resident_of(const AnyPlan& p);
std::string with_commas(int64_t v);

}  // namespace scr::spyre
