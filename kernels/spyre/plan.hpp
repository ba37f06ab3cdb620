// The Spyre machine model and the tile plans of every op, as constexpr data.
//
// One header is the single source of truth for "how many scratchpad bytes does this tile hold":
// scrc's planner (compiler/targets/spyre_plan.cpp) sizes tiles with these functions, the
// generated code re-checks the emitted plans with static_assert on the same functions (so a hand
// edit that breaks a plan does not compile), and the emulator (emulator.hpp, ops.hpp) carves its
// per-core scratchpad into exactly these buffers at exactly these offsets.
//
// Machine model (docs/SPYRE.md has the sources): 32 cores, SPMD; each core has a 2 MiB LX
// scratchpad of which 1,677,721 bytes are usable by a program; data moves between device memory
// (LPDDR5) and LX in 128-byte sticks (64 fp16 elements). Every activation row is "stickified":
// its innermost dimension is padded to whole sticks.
//
// Each plan is a structural aggregate (usable as a template argument). Its hand-editable fields
// are the split over cores and the tile shape; `buffer(i)` derives the scratchpad layout from
// them. A buffer with copies = 2 is double-buffered: the next tile loads while this one computes.
#pragma once

#include <cstdint>

namespace scr::kernels::spyre {

constexpr int kCores = 32;
constexpr int64_t kStickBytes = 128;
constexpr int64_t kStickHalves = 64;                  // fp16 elements per stick
constexpr int64_t kLxPhysicalBytes = 2 * 1024 * 1024; // per core
constexpr int64_t kLxUsableBytes = 1677721;           // 80 % of 2 MiB: the rest is the runtime's

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
constexpr int64_t stick_round(int64_t bytes) { return round_up(bytes, kStickBytes); }
constexpr int64_t pad_halves(int64_t n) { return round_up(n, kStickHalves); }
// Bytes of an index list of n elements loaded from any element offset: the covering sticks.
constexpr int64_t index_tile_bytes(int64_t n, int64_t elem_bytes) { return stick_round(n * elem_bytes) + kStickBytes; }

// One activation row: `groups` groups of `group` elements, each group padded to whole sticks
// (a [heads, head_dim] row is heads x pad(head_dim); a [hidden] row is pad(hidden)).
struct RowShape {
    int64_t groups = 1, group = 1;
    constexpr int64_t logical() const { return groups * group; }
    constexpr int64_t padded() const { return groups * pad_halves(group); }
    constexpr int64_t sticks() const { return padded() / kStickHalves; }
    constexpr int64_t bytes() const { return padded() * 2; }  // fp16
};

struct LxBuffer {
    const char* name = "";
    int64_t bytes = 0;  // one copy, whole sticks
    int copies = 1;
};

// ---- generic layout arithmetic over any plan with kBuffers / buffer(i) ----------------------------
template <class P>
constexpr int64_t lx_offset(const P& p, int index, int copy = 0) {
    int64_t off = 0;
    for (int i = 0; i < index; ++i) off += p.buffer(i).bytes * p.buffer(i).copies;
    return off + copy * p.buffer(index).bytes;
}
template <class P>
constexpr int64_t resident_bytes(const P& p) {
    return lx_offset(p, P::kBuffers - 1) + p.buffer(P::kBuffers - 1).bytes * p.buffer(P::kBuffers - 1).copies;
}
template <class P>
constexpr bool buffers_stick_aligned(const P& p) {
    for (int i = 0; i < P::kBuffers; ++i)
        if (p.buffer(i).bytes % kStickBytes != 0 || p.buffer(i).copies < 1) return false;
    return true;
}
// Rows split over cores: every row is owned by exactly one core, tiles are non-empty.
constexpr bool row_split_ok(int64_t rows_max, int cores, int64_t tile_rows) {
    return cores >= 1 && cores <= kCores && tile_rows >= 1 && cores <= rows_max &&
           tile_rows <= ceil_div(rows_max, cores);
}

// ---- row-parallel ops: rows split over cores, tiles of tile_rows whole rows ---------------------

// out[t] = table[ids[t]]: rows of the table are loaded straight into the output tile.
struct EmbedPlan {
    int64_t rows_max = 0;
    RowShape row;
    int cores = 1;
    int64_t tile_rows = 1;
    static constexpr int kBuffers = 2;
    enum { ids, out };
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case ids: return {"ids", index_tile_bytes(tile_rows, 4), 2};
            default: return {"out", tile_rows * row.bytes(), 2};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows); }
};

// RMSNorm over each group of a row (a [hidden] row is one group; q/k norms one per head); the
// weight is applied as (offset + w) (Gemma's 1 + w).
struct NormPlan {
    int64_t rows_max = 0;
    RowShape row;
    int cores = 1;
    int64_t tile_rows = 1;
    float offset = 0;
    static constexpr int kBuffers = 3;
    enum { weight, in, out };
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case weight: return {"weight", pad_halves(row.group) * 2, 1};
            case in: return {"in", tile_rows * row.bytes(), 2};
            default: return {"out", tile_rows * row.bytes(), 2};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows); }
};

// Rotates the first `rot` dims of every q and k head (neox layout), cos/sin (times mscale) per
// row on the SFU.
struct RopePlan {
    int64_t rows_max = 0;
    int64_t q_heads = 1, k_heads = 1, head_dim = 1, rot = 2;
    int cores = 1;
    int64_t tile_rows = 1;
    float mscale = 1;
    static constexpr int kBuffers = 5;
    enum { pos, q, k, freq, cs };
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case pos: return {"positions", index_tile_bytes(tile_rows, 4), 2};
            case q: return {"q", tile_rows * q_heads * pad_halves(head_dim) * 2, 2};
            case k: return {"k", tile_rows * k_heads * pad_halves(head_dim) * 2, 2};
            case freq: return {"inv_freq", stick_round(rot / 2 * 4), 1};
            default: return {"cos_sin", stick_round(rot * 4), 1};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows) && rot % 2 == 0 && rot <= head_dim; }
};

enum class Eltwise : int { add, mul, silu, scale };

struct EltwisePlan {
    int64_t rows_max = 0;
    RowShape row;
    Eltwise op = Eltwise::add;
    int cores = 1;
    int64_t tile_rows = 1;
    float factor = 1;      // scale: y = x * factor
    bool out_f32 = false;  // the model's output (logits) is stored as f32
    static constexpr int kBuffers = 3;
    enum { a, b, out };
    constexpr int inputs() const { return op == Eltwise::silu || op == Eltwise::scale ? 1 : 2; }
    constexpr int64_t out_row_bytes() const { return row.padded() * (out_f32 ? 4 : 2); }
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case a: return {"a", tile_rows * row.bytes(), 2};
            case b: return {"b", inputs() == 2 ? tile_rows * row.bytes() : 0, 2};
            default: return {"out", tile_rows * out_row_bytes(), 2};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows); }
};

// out[r] = in[which[r]] (token rows -> logit rows).
struct GatherPlan {
    int64_t rows_max = 0;
    RowShape row;
    int cores = 1;
    int64_t tile_rows = 1;
    static constexpr int kBuffers = 2;
    enum { idx, rows };
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case idx: return {"row_ids", index_tile_bytes(tile_rows, 4), 2};
            default: return {"rows", tile_rows * row.bytes(), 2};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows); }
};

// Writes this step's K and V rows into their paged-cache slots (one stick-aligned head row each).
struct KvAppendPlan {
    int64_t rows_max = 0;
    int64_t kv_heads = 1, head_dim = 1, block_size = 16;
    int cores = 1;
    int64_t tile_rows = 1;
    static constexpr int kBuffers = 3;
    enum { slots, k, v };
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case slots: return {"slots", index_tile_bytes(tile_rows, 8), 2};
            case k: return {"k", tile_rows * kv_heads * pad_halves(head_dim) * 2, 2};
            default: return {"v", tile_rows * kv_heads * pad_halves(head_dim) * 2, 2};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows) && block_size >= 1; }
};

// ---- linear: output columns (sticks) split over cores; tiles rows x out sticks x K sticks -------
//
// y[t, n] = sum_k x[t, k] W[n, k] (+ bias[n]) (+ residual[t, n]); with swiglu two weights give
// silu(x Wg^T) * (x Wu^T). Accumulation is f32 in LX; output fp16 (or f32 for logits).
// MoE experts run on listed rows: with `gather` input row i is list[i] / index_div, with
// `scatter` output row i goes to list[i].
struct LinearPlan {
    int64_t rows_max = 0;
    int64_t k_sticks = 1;  // input row, padded
    RowShape out;          // output row layout; N = out.logical()
    int cores = 1;
    int64_t sticks_per_core = 1;  // output sticks per core
    int64_t tile_rows = 1, tile_n = 1, tile_k = 1;
    bool swiglu = false, bias = false, residual = false, out_f32 = false;
    bool gather = false, scatter = false;
    int64_t index_div = 1;

    static constexpr int kBuffers = 9;
    enum { idx, x, w, w2, acc, acc2, bias_t, res, y };
    constexpr int64_t out_elem_bytes() const { return out_f32 ? 4 : 2; }
    constexpr LxBuffer buffer(int i) const {
        const int64_t cols = tile_n * kStickHalves;
        switch (i) {
            case idx: return {"row_ids", gather || scatter ? index_tile_bytes(tile_rows, 4) : 0, 2};
            case x: return {"x", tile_rows * tile_k * kStickBytes, 2};
            case w: return {"w", cols * tile_k * kStickBytes, 2};
            case w2: return {"w_up", swiglu ? cols * tile_k * kStickBytes : 0, 2};
            case acc: return {"acc", stick_round(tile_rows * cols * 4), 1};
            case acc2: return {"acc_up", swiglu ? stick_round(tile_rows * cols * 4) : 0, 1};
            case bias_t: return {"bias", bias ? tile_n * kStickBytes : 0, 2};
            case res: return {"residual", residual ? tile_rows * tile_n * kStickBytes : 0, 2};
            default: return {"y", tile_rows * cols * out_elem_bytes(), 2};
        }
    }
    constexpr int64_t n_sticks() const { return out.sticks(); }
    constexpr bool valid() const {
        return cores >= 1 && cores <= kCores && sticks_per_core >= 1 && cores * sticks_per_core >= n_sticks() &&
               (cores - 1) * sticks_per_core < n_sticks() && tile_rows >= 1 && tile_rows <= rows_max && tile_n >= 1 &&
               tile_n <= sticks_per_core && tile_k >= 1 && tile_k <= k_sticks && index_div >= 1;
    }
};

// ---- attention: work items (a query tile of one sequence x one kv head's query group) -----------
//
// Flash-attention style: K and V blocks of the paged cache stream through LX one block at a
// time; an online softmax keeps running max / sum per (token, head) so no score row is stored.
struct AttentionPlan {
    int64_t rows_max = 0;
    int64_t q_heads = 1, kv_heads = 1, head_dim = 1, block_size = 16, max_blocks = 1;
    int cores = 1;
    int64_t tile_q = 1;  // query tokens per work item
    int64_t window = 0;  // a token sees the last `window` positions (0: all)
    float softcap = 0;   // scores become softcap * tanh(score / softcap) (0: none)
    static constexpr int kBuffers = 9;
    enum { table, pos, q, k, v, scores, acc, ml, out };
    constexpr int64_t group() const { return q_heads / kv_heads; }
    constexpr int64_t dp() const { return pad_halves(head_dim); }
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case table: return {"block_table", stick_round(max_blocks * 4), 1};
            case pos: return {"positions", index_tile_bytes(tile_q, 4), 2};
            case q: return {"q", tile_q * group() * dp() * 2, 2};
            case k: return {"k_block", block_size * dp() * 2, 2};
            case v: return {"v_block", block_size * dp() * 2, 2};
            case scores: return {"scores", stick_round(tile_q * group() * block_size * 4), 1};
            case acc: return {"acc", stick_round(tile_q * group() * dp() * 4), 1};
            case ml: return {"max_sum", stick_round(tile_q * group() * 8), 1};
            default: return {"out", tile_q * group() * dp() * 2, 2};
        }
    }
    constexpr bool valid() const {
        return cores >= 1 && cores <= kCores && tile_q >= 1 && tile_q <= rows_max && kv_heads >= 1 &&
               q_heads % kv_heads == 0 && (block_size * dp() * 2) % kStickBytes == 0 && window >= 0 && softcap >= 0;
    }
};

// ---- MoE: router linear (f32 logits) -> route (one core) -> per expert gathered SwiGLU and
// scattered down projection -> combine (rows over cores) ----------------------------------------

// Softmax, top-k (optionally renormalized) per row; builds each expert's row list in LX.
struct MoeRoutePlan {
    int64_t rows_max = 0;
    int64_t experts = 1, top_k = 1;
    bool normalize = false;
    int64_t tile_rows = 1;
    static constexpr int kBuffers = 4;
    enum { logits, top, lists, counts };
    constexpr int64_t top_row_bytes() const { return stick_round(top_k * 8); }  // ids then weights
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case logits: return {"router_logits", tile_rows * pad_halves(experts) * 4, 2};  // f32 linear rows
            case top: return {"top_k", tile_rows * top_row_bytes(), 2};
            case lists: return {"expert_rows", experts * stick_round(rows_max * 4), 1};
            default: return {"counts", stick_round(experts * 4), 1};
        }
    }
    constexpr bool valid() const { return tile_rows >= 1 && tile_rows <= rows_max && top_k >= 1 && top_k <= experts; }
};

// out[t] = residual[t] + sum over t's experts (in expert order) of weight * expert_out[t, j].
struct MoeCombinePlan {
    int64_t rows_max = 0;
    RowShape row;
    int64_t top_k = 1;
    bool residual = false;
    int cores = 1;
    int64_t tile_rows = 1;
    static constexpr int kBuffers = 4;
    enum { top, y, res, out };
    constexpr LxBuffer buffer(int i) const {
        switch (i) {
            case top: return {"top_k", tile_rows * stick_round(top_k * 8), 2};
            case y: return {"expert_out", tile_rows * top_k * row.bytes(), 2};
            case res: return {"residual", residual ? tile_rows * row.bytes() : 0, 2};
            default: return {"out", tile_rows * row.bytes(), 2};
        }
    }
    constexpr bool valid() const { return row_split_ok(rows_max, cores, tile_rows); }
};

}  // namespace scr::kernels::spyre
