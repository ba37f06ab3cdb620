#include "compiler/targets/spyre_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>

#include "runtime/core/error.hpp"

namespace scr::spyre {

std::string with_commas(int64_t v) {
    std::string digits = std::to_string(v < 0 ? -v : v), out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return (v < 0 ? "-" : "") + out;
}

sp::RowShape row_shape(const ir::Value& v) {
    sp::RowShape r;
    r.group = v.dims.empty() ? 1 : v.dims.back();
    r.groups = 1;
    for (size_t i = 0; i + 1 < v.dims.size(); ++i) r.groups *= v.dims[i];
    return r;
}

int64_t resident_of(const AnyPlan& p) {
    return std::visit([](const auto& x) { return sp::resident_bytes(x); }, p);
}

namespace {

std::string row_words(const sp::RowShape& r) {
    std::string shape = r.groups == 1 ? std::to_string(r.group) : fmt::format("{}x{}", r.groups, r.group);
    return fmt::format("{} ({} stick{})", shape, r.sticks(), r.sticks() == 1 ? "" : "s");
}

std::string plural(int64_t n, const char* one, const char* many) { return fmt::format("{} {}", n, n == 1 ? one : many); }

}  // namespace

std::string describe_tile(const AnyPlan& any) {
    struct V {
        std::string operator()(const sp::EmbedPlan& p) const { return plural(p.tile_rows, "row", "rows") + " x " + row_words(p.row); }
        std::string operator()(const sp::NormPlan& p) const { return plural(p.tile_rows, "row", "rows") + " x " + row_words(p.row); }
        std::string operator()(const sp::RopePlan& p) const {
            return fmt::format("{} x (q {}x{} + k {}x{})", plural(p.tile_rows, "row", "rows"), p.q_heads, p.head_dim, p.k_heads,
                               p.head_dim);
        }
        std::string operator()(const sp::EltwisePlan& p) const { return plural(p.tile_rows, "row", "rows") + " x " + row_words(p.row); }
        std::string operator()(const sp::GatherPlan& p) const { return plural(p.tile_rows, "row", "rows") + " x " + row_words(p.row); }
        std::string operator()(const sp::KvAppendPlan& p) const {
            return fmt::format("{} x (k + v {}x{})", plural(p.tile_rows, "row", "rows"), p.kv_heads, p.head_dim);
        }
        std::string operator()(const sp::LinearPlan& p) const {
            return fmt::format("{} x {} x {} of {}{}", plural(p.tile_rows, "row", "rows"),
                               plural(p.tile_n, "out stick", "out sticks"), plural(p.tile_k, "K stick", "K sticks"), p.k_sticks,
                               p.swiglu ? " (gate + up)" : "");
        }
        std::string operator()(const sp::AttentionPlan& p) const {
            return fmt::format("{} x {} x {}, K/V blocks of {} x {}{}", plural(p.tile_q, "query", "queries"),
                               plural(p.group(), "head", "heads"), p.head_dim, p.block_size, p.head_dim,
                               p.window > 0 ? fmt::format(", window {}", p.window) : "");
        }
        std::string operator()(const sp::MoeRoutePlan& p) const {
            return fmt::format("{} x {} experts (top {}), row lists {} x {}", plural(p.tile_rows, "row", "rows"), p.experts,
                               p.top_k, p.experts, p.rows_max);
        }
        std::string operator()(const sp::MoeCombinePlan& p) const {
            return fmt::format("{} x {} x {}", plural(p.tile_rows, "row", "rows"), plural(p.top_k, "expert", "experts"),
                               row_words(p.row));
        }
    };
    return std::visit(V{}, any);
}

std::string describe_buffers(const AnyPlan& any, int largest) {
    return std::visit(
        [&](const auto& p) {
            using P = std::decay_t<decltype(p)>;
            std::vector<sp::LxBuffer> bufs;
            for (int i = 0; i < P::kBuffers; ++i)
                if (p.buffer(i).bytes > 0) bufs.push_back(p.buffer(i));
            std::stable_sort(bufs.begin(), bufs.end(),
                             [](const sp::LxBuffer& a, const sp::LxBuffer& b) { return a.bytes * a.copies > b.bytes * b.copies; });
            std::string o;
            for (int i = 0; i < int(bufs.size()) && i < largest; ++i) {
                if (i) o += ", ";
                o += bufs[i].copies > 1 ? fmt::format("{} {} x {}", bufs[i].name, bufs[i].copies, with_commas(bufs[i].bytes))
                                        : fmt::format("{} {}", bufs[i].name, with_commas(bufs[i].bytes));
            }
            return o;
        },
        any);
}

namespace {

std::string short_name(const std::string& tensor) {
    std::string s = tensor;
    if (s.rfind("model.layers.", 0) == 0) {
        auto dot = s.find('.', 13);
        if (dot != std::string::npos) s = s.substr(dot + 1);
    } else if (s.rfind("model.", 0) == 0) {
        s = s.substr(6);
    }
    if (s.size() > 7 && s.substr(s.size() - 7) == ".weight") s.resize(s.size() - 7);
    return s;
}

// The largest t in [1, tmax] whose plan fits, or 0. Resident bytes grow with t.
template <class Make>
int64_t largest_fit(int64_t tmax, int64_t budget, Make make) {
    if (tmax < 1 || sp::resident_bytes(make(1)) > budget) return 0;
    int64_t lo = 1, hi = tmax;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (sp::resident_bytes(make(mid)) <= budget) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

struct Failure {
    std::string what;
    int layer;
    std::string text;
};

template <class Map>
std::string known_ops(const Map& known) {
    std::string o;
    for (auto& [k, v] : known) o += std::string(o.empty() ? "" : ", ") + ir::op_name(k);
    return o;
}

class Planner {
public:
    Planner(const bind::Bound& b, int64_t budget) : b_(b), g_(b.graph), budget_(budget) {
        plan_.lx_bytes = budget;
        tmax_ = b.params.max_batch_tokens;
        rmax_ = b.params.max_logit_rows;
    }

    Plan run() {
        check_supported();
        layout_weights();
        layout_step_and_kv();
        layout_activations();
        for (size_t i = 0; i < g_.ops.size(); ++i) plan_op(int(i));
        if (!failures_.empty()) throw Error(failure_message());
        return std::move(plan_);
    }

private:
    // ---- what the target implements -----------------------------------------------------------------
    void check_supported() {
        // Per op: the attributes the kernels implement (any value), and those implemented only at
        // their neutral value (anything else is refused by name, never silently ignored).
        struct Attrs {
            std::set<std::string> any;
            std::map<std::string, double> neutral;
        };
        static const std::map<ir::OpKind, Attrs> known = {
            {ir::OpKind::embed, {}},
            {ir::OpKind::rmsnorm, {{"eps", "dim", "offset"}, {}}},
            {ir::OpKind::linear, {{"n", "k"}, {}}},
            {ir::OpKind::linear_swiglu, {{"n", "k"}, {}}},
            {ir::OpKind::rope, {{"rotary_dim", "q_heads", "k_heads", "head_dim", "mscale"}, {{"interleaved", 0}, {"long_after", 0}}}},
            {ir::OpKind::attention,
             {{"q_heads", "kv_heads", "head_dim", "v_head_dim", "scale", "window", "softcap"}, {{"sinks", 0}}}},
            // alpha / limit only shape GPT-OSS's stacked experts (layout 1), which is refused.
            {ir::OpKind::moe,
             {{"experts", "top_k", "ffn", "hidden", "normalize", "alpha", "limit"},
              {{"layout", 0}, {"scoring", 0}, {"groups", 1}, {"topk_groups", 1}, {"scale", 1}, {"router_bias_index", -1},
               {"choice_bias_index", -1}}}},
            {ir::OpKind::add, {}},
            {ir::OpKind::mul, {}},
            {ir::OpKind::silu, {}},
            {ir::OpKind::scale, {{"factor"}, {}}},
            {ir::OpKind::gather_rows, {}},
        };
        for (auto& op : g_.ops) {
            auto it = known.find(op.kind);
            if (it == known.end())
                fail("{}:{}: the spyre target has no tiled kernel for op `{}` yet (layer {}); it plans {}", op.loc.file,
                     op.loc.line, ir::op_name(op.kind), op.layer, known_ops(known));
            for (auto& [k, v] : op.attr) {
                if (it->second.any.count(k)) continue;
                auto n = it->second.neutral.find(k);
                if (n == it->second.neutral.end())
                    fail("{}:{}: the spyre target does not implement `{}` with attribute `{}` yet (layer {})", op.loc.file,
                         op.loc.line, ir::op_name(op.kind), k, op.layer);
                if (v != n->second)
                    fail("{}:{}: the spyre target implements `{}` only with {} = {}, not {} (layer {})", op.loc.file, op.loc.line,
                         ir::op_name(op.kind), k, n->second, v, op.layer);
            }
            if (op.kind == ir::OpKind::attention && op.attr.at("v_head_dim") != op.attr.at("head_dim"))
                fail("{}:{}: the spyre target plans attention with equal q/k and v head dims only", op.loc.file, op.loc.line);
            if (op.kind == ir::OpKind::moe && op.attr.at("top_k") > 64)
                fail("{}:{}: the spyre MoE combine orders at most 64 experts per row (top_k {})", op.loc.file, op.loc.line,
                     op.attr.at("top_k"));
        }
        // The logits are stored as f32, which the linear and elementwise kernels can write.
        for (auto& op : g_.ops)
            if (std::find(op.out.begin(), op.out.end(), g_.output) != op.out.end() && op.kind != ir::OpKind::linear &&
                op.kind != ir::OpKind::add && op.kind != ir::OpKind::mul && op.kind != ir::OpKind::silu &&
                op.kind != ir::OpKind::scale)
                fail("{}:{}: the spyre target writes the logits from a linear or an elementwise op, not from `{}`", op.loc.file,
                     op.loc.line, ir::op_name(op.kind));
        for (auto& t : g_.tensors)
            if (t.dtype != DType::f32 && t.dtype != DType::bf16 && t.dtype != DType::f16)
                fail("tensor {}: the spyre target uploads f32/bf16/f16 checkpoints to fp16; preset dtype {} is not supported",
                     t.name, dtype_name(t.dtype));
    }

    // ---- device memory ------------------------------------------------------------------------------
    int64_t weight_slot(int tensor, int64_t rows, sp::RowShape row) {
        for (auto& w : plan_.dev.weights)
            if (w.tensor == tensor && w.row.groups == row.groups && w.row.group == row.group) return w.offset;
        WeightSlot s{tensor, rows, row, cursor_};
        cursor_ += sp::stick_round(rows * row.bytes());
        plan_.dev.weights.push_back(s);
        return s.offset;
    }

    void layout_weights() {
        auto& d = plan_.dev;
        cursor_ = 0;
        op_weights_.assign(g_.ops.size(), {});
        int64_t inactive = 0;
        for (size_t i = 0; i < g_.ops.size(); ++i) {
            const auto& op = g_.ops[i];
            auto& ow = op_weights_[i];
            auto in_row = [&]() { return row_shape(g_.values[op.in[0]]); };
            switch (op.kind) {
                case ir::OpKind::embed:
                    ow.push_back(weight_slot(op.weights[0], g_.tensors[op.weights[0]].shape[0], row_shape(g_.values[op.out[0]])));
                    break;
                case ir::OpKind::rmsnorm:
                    ow.push_back(weight_slot(op.weights[0], 1, {1, int64_t(op.attr.at("dim"))}));
                    break;
                case ir::OpKind::linear:
                case ir::OpKind::linear_swiglu: {
                    const int64_t n = int64_t(op.attr.at("n"));
                    ow.push_back(weight_slot(op.weights[0], n, in_row()));
                    if (op.kind == ir::OpKind::linear_swiglu) ow.push_back(weight_slot(op.weights[1], n, in_row()));
                    else ow.push_back(op.weights[1] >= 0 ? weight_slot(op.weights[1], 1, row_shape(g_.values[op.out[0]])) : -1);
                    break;
                }
                case ir::OpKind::moe: {
                    const int64_t E = int64_t(op.attr.at("experts")), F = int64_t(op.attr.at("ffn")),
                                  H = int64_t(op.attr.at("hidden")), K = int64_t(op.attr.at("top_k"));
                    ow.push_back(weight_slot(op.weights[0], E, in_row()));
                    const int64_t first = cursor_;
                    for (int64_t e = 0; e < E; ++e) {
                        ow.push_back(weight_slot(op.weights[1 + 3 * e], F, in_row()));
                        ow.push_back(weight_slot(op.weights[2 + 3 * e], F, in_row()));
                        ow.push_back(weight_slot(op.weights[3 + 3 * e], H, {1, F}));
                    }
                    inactive += (cursor_ - first) * (E - K) / E;
                    break;
                }
                default:
                    break;
            }
        }
        d.weight_bytes = cursor_;
        d.active_weight_bytes = cursor_ - inactive;
        for (auto& op : g_.ops)
            if (op.kind == ir::OpKind::rope && !d.rope_tables.count(op.table)) {
                d.rope_tables[op.table] = cursor_;
                cursor_ += sp::stick_round(int64_t(op.table.size()) * 4);
            }
        d.constants_bytes = cursor_ - d.weight_bytes;
    }

    void layout_step_and_kv() {
        auto& d = plan_.dev;
        const int64_t start = cursor_;
        d.max_blocks = sp::ceil_div(b_.max_position, b_.params.block_size);
        d.table_row_bytes = sp::stick_round(d.max_blocks * 4);
        d.ids = cursor_, cursor_ += sp::stick_round(tmax_ * 4);
        d.positions = cursor_, cursor_ += sp::stick_round(tmax_ * 4);
        d.slots = cursor_, cursor_ += sp::stick_round(tmax_ * 8);
        d.logit_rows = cursor_, cursor_ += sp::stick_round(rmax_ * 4);
        d.tables = cursor_, cursor_ += tmax_ * d.table_row_bytes;
        d.step_bytes = cursor_ - start;
        int64_t off = 0;
        for (auto& kv : g_.kv) {
            const int64_t one = int64_t(kv.kv_heads) * b_.params.block_size * sp::pad_halves(kv.head_dim) * 2;
            d.k_offsets.push_back(off);
            d.v_offsets.push_back(off + one);
            off += 2 * one;
            d.kv_bytes_per_token += 2 * int64_t(kv.kv_heads) * sp::pad_halves(kv.head_dim) * 2;
        }
        d.kv_block_bytes = off;
    }

    int64_t value_bytes(int v) const {
        const auto& val = g_.values[v];
        return (val.rows == ir::Rows::tokens ? tmax_ : rmax_) * row_shape(val).bytes();
    }

    // Every value gets an fp16 region of (max rows x stickified row) placed by a first-fit scan over
    // liveness; an in-place output (the fused residual, rmsnorm, rope) shares its input's region.
    void layout_activations() {
        auto& d = plan_.dev;
        const size_t nv = g_.values.size();
        std::vector<int> def(nv, -1), last(nv, -1), owner(nv);
        for (size_t i = 0; i < g_.ops.size(); ++i) {
            for (int v : g_.ops[i].in) last[v] = int(i);
            if (g_.ops[i].residual >= 0) last[g_.ops[i].residual] = int(i);
            for (int v : g_.ops[i].out) def[v] = int(i);
        }
        for (size_t v = 0; v < nv; ++v) owner[v] = int(v);
        for (size_t i = 0; i < g_.ops.size(); ++i) {
            const auto& op = g_.ops[i];
            for (int v : op.out) {
                const int src = g_.values[v].alias_of;
                if (src < 0 || v == g_.output) continue;
                const bool same_layout = row_shape(g_.values[src]).padded() == row_shape(g_.values[v]).padded() &&
                                         row_shape(g_.values[src]).group == row_shape(g_.values[v]).group &&
                                         g_.values[src].rows == g_.values[v].rows;
                // A column-split linear reads all of its input while writing; never alias the input.
                const bool reads_src_as_input = std::find(op.in.begin(), op.in.end(), src) != op.in.end() &&
                                                (op.kind == ir::OpKind::linear || op.kind == ir::OpKind::moe);
                if (same_layout && !reads_src_as_input) owner[v] = owner[src];
            }
        }
        std::vector<int> owner_last(nv, -1);
        for (size_t v = 0; v < nv; ++v) owner_last[owner[v]] = std::max({owner_last[owner[v]], last[v], def[v]});

        std::map<int64_t, int64_t> free_list;  // offset -> size
        int64_t arena = 0;
        auto allocate = [&](int64_t size) {
            for (auto it = free_list.begin(); it != free_list.end(); ++it)
                if (it->second >= size) {
                    const int64_t off = it->first, len = it->second;
                    free_list.erase(it);
                    if (len > size) free_list[off + size] = len - size;
                    return off;
                }
            const int64_t off = arena;
            arena += size;
            return off;
        };
        auto release = [&](int64_t off, int64_t size) {
            auto it = free_list.emplace(off, size).first;
            if (auto next = std::next(it); next != free_list.end() && it->first + it->second == next->first) {
                it->second += next->second;
                free_list.erase(next);
            }
            if (it != free_list.begin())
                if (auto prev = std::prev(it); prev->first + prev->second == it->first) {
                    prev->second += it->second;
                    free_list.erase(it);
                }
        };
        std::vector<int64_t> rel(nv, -1);
        for (size_t i = 0; i < g_.ops.size(); ++i) {
            for (int v : g_.ops[i].out)
                if (v != g_.output && owner[v] == v) rel[v] = allocate(sp::stick_round(value_bytes(v)));
            for (size_t v = 0; v < nv; ++v)
                if (owner[v] == int(v) && rel[v] >= 0 && owner_last[v] == int(i) && v != size_t(g_.output)) {
                    release(rel[v], sp::stick_round(value_bytes(int(v))));
                    owner_last[v] = -2;
                }
        }
        d.activations_begin = cursor_;
        d.activation_bytes = arena;
        d.value_offset.assign(nv, -1);
        for (size_t v = 0; v < nv; ++v)
            if (rel[owner[v]] >= 0) d.value_offset[v] = cursor_ + rel[owner[v]];
        cursor_ += arena;

        // The MoE workspace, sized for the largest MoE op.
        int64_t logits = 0, top = 0, lists = 0, counts = 0, act = 0, y = 0;
        for (auto& op : g_.ops) {
            if (op.kind != ir::OpKind::moe) continue;
            const int64_t E = int64_t(op.attr.at("experts")), K = int64_t(op.attr.at("top_k")), F = int64_t(op.attr.at("ffn"));
            const sp::RowShape out = row_shape(g_.values[op.out[0]]);
            logits = std::max(logits, tmax_ * sp::pad_halves(E) * 4);
            top = std::max(top, tmax_ * sp::stick_round(K * 8));
            lists = std::max(lists, E * sp::stick_round(tmax_ * 4));
            counts = std::max(counts, sp::stick_round(E * 4));
            act = std::max(act, tmax_ * sp::RowShape{1, F}.bytes());
            y = std::max(y, tmax_ * K * out.bytes());
        }
        if (logits > 0) {
            const int64_t start = cursor_;
            d.moe_logits = cursor_, cursor_ += logits;
            d.moe_top = cursor_, cursor_ += top;
            d.moe_lists = cursor_, cursor_ += lists;
            d.moe_counts = cursor_, cursor_ += counts;
            d.moe_act = cursor_, cursor_ += act;
            d.moe_y = cursor_, cursor_ += y;
            d.moe_list_stride = sp::stick_round(tmax_ * 4);
            d.moe_bytes = cursor_ - start;
        }
        const auto& outv = g_.values[g_.output];
        d.logits_row_floats = sp::pad_halves(row_shape(outv).logical());
        d.logits = cursor_;
        cursor_ += (outv.rows == ir::Rows::tokens ? tmax_ : rmax_) * d.logits_row_floats * 4;
        d.total = cursor_;
    }

    // ---- tiles -------------------------------------------------------------------------------------
    std::string label_of(const ir::Op& op) const {
        std::string s = ir::op_name(op.kind);
        if (!op.weights.empty() && op.weights[0] >= 0) return s + " " + short_name(g_.tensors[op.weights[0]].name);
        if (!op.out.empty() && !g_.values[op.out[0]].name.empty()) return s + " -> " + g_.values[op.out[0]].name;
        return s;
    }

    int64_t rows_max(int v) const { return g_.values[v].rows == ir::Rows::tokens ? tmax_ : rmax_; }

    template <class P>
    Kernel kernel(const P& p, std::string what, int cores_used) {
        return Kernel{p, std::move(what), describe_tile(p), cores_used, sp::resident_bytes(p)};
    }

    void record_failure(const OpPlan& op, const std::string& what, const AnyPlan& smallest, const std::string& advice) {
        const int64_t need = resident_of(smallest);
        std::string text = fmt::format(
            "{}: its smallest tile [{}] needs {} bytes of scratchpad per core, but the budget is {} bytes "
            "(SCR_SPYRE_SCRATCHPAD_BYTES; {} bytes short). Largest buffers: {}. To fix: {}",
            what, describe_tile(smallest), with_commas(need), with_commas(budget_), with_commas(need - budget_),
            describe_buffers(smallest, 3), advice);
        failures_.push_back({what, op.layer, text});
    }

    std::string raise_to(int64_t need) const {
        return need > sp::kLxPhysicalBytes
                   ? fmt::format("this op needs {} bytes, more than the physical 2 MiB LX: the model's shapes cannot be planned",
                                 with_commas(need))
                   : fmt::format("raise SCR_SPYRE_SCRATCHPAD_BYTES to at least {} (the default is {})", need, sp::kLxUsableBytes);
    }

    // A row-parallel op: rows split over the cores; the largest tile of whole rows that fits.
    template <class P, class Make>
    void plan_rows(OpPlan& op, const std::string& what, int64_t rows, Make make) {
        const int cores = int(std::min<int64_t>(sp::kCores, rows));
        const int64_t per = sp::ceil_div(rows, cores);
        const int64_t t = largest_fit(per, budget_, [&](int64_t tr) { return make(cores, tr); });
        if (t == 0) {
            const P smallest = make(cores, 1);
            record_failure(op, what, smallest,
                           fmt::format("one row cannot be split across tiles (the op needs whole rows, so "
                                       "SCR_MAX_BATCH_TOKENS does not change this tile); {}",
                                       raise_to(sp::resident_bytes(smallest))));
            op.kernels.push_back(kernel(smallest, what, cores));
            return;
        }
        op.kernels.push_back(kernel(make(cores, t), what, cores));
    }

    // Linear: output sticks split over the cores; per core the tile (rows x out sticks x K sticks)
    // that moves the fewest bytes at the planned maximum rows, with the weight tile kept stationary
    // across row tiles when the whole K fits.
    sp::LinearPlan plan_linear(OpPlan& op, const std::string& what, sp::LinearPlan base, int64_t rows) {
        const int64_t nst = base.out.sticks();
        base.sticks_per_core = sp::ceil_div(nst, sp::kCores);
        base.cores = int(sp::ceil_div(nst, base.sticks_per_core));
        base.rows_max = rows;
        std::optional<sp::LinearPlan> best;
        double best_cost = 0;
        for (int64_t tk = base.k_sticks; tk >= 1; --tk) {
            for (int64_t tn = base.sticks_per_core; tn >= 1; --tn) {
                sp::LinearPlan p = base;
                p.tile_k = tk;
                p.tile_n = tn;
                const int64_t tm = largest_fit(rows, budget_, [&](int64_t t) {
                    sp::LinearPlan q = p;
                    q.tile_rows = t;
                    return q;
                });
                if (tm == 0) continue;
                p.tile_rows = tm;
                const double w_bytes = double(base.sticks_per_core) * 64 * base.k_sticks * 128 * (p.swiglu ? 2 : 1);
                const double x_bytes = double(rows) * base.k_sticks * 128;
                const double w_moves = tk == base.k_sticks ? 1 : double(sp::ceil_div(rows, tm));
                const double cost = w_bytes * w_moves + x_bytes * double(sp::ceil_div(base.sticks_per_core, tn));
                if (!best || cost < best_cost) {
                    best = p;
                    best_cost = cost;
                }
            }
            // Splitting K only pays when even one output stick of the whole K does not fit.
            if (best && best->tile_k == base.k_sticks) break;
        }
        if (best) return *best;
        sp::LinearPlan smallest = base;
        smallest.tile_rows = smallest.tile_n = smallest.tile_k = 1;
        record_failure(op, what, smallest,
                       fmt::format("a linear tile cannot be smaller than 1 row x 1 output stick (64 columns) x 1 K stick, "
                                   "double-buffered; {}",
                                   raise_to(sp::resident_bytes(smallest))));
        return smallest;
    }

    void plan_op(int index) {
        const ir::Op& op = g_.ops[size_t(index)];
        OpPlan o;
        o.op = index;
        o.layer = op.layer;
        o.label = label_of(op);
        o.weights = op_weights_[size_t(index)];
        const std::string& what = o.label;
        auto in = [&](int i) { return op.in[size_t(i)]; };
        switch (op.kind) {
            case ir::OpKind::embed: {
                const sp::RowShape row = row_shape(g_.values[op.out[0]]);
                plan_rows<sp::EmbedPlan>(o, what, tmax_, [&](int c, int64_t t) { return sp::EmbedPlan{tmax_, row, c, t}; });
                break;
            }
            case ir::OpKind::rmsnorm: {
                sp::RowShape row = row_shape(g_.values[in(0)]);
                const int64_t dim = int64_t(op.attr.at("dim"));
                if (dim != row.group) fail("spyre: rmsnorm over {} of a row shaped {}x{} is not planned", dim, row.groups, row.group);
                const int64_t rows = rows_max(in(0));
                const float offset = op.attr.count("offset") ? float(op.attr.at("offset")) : 0.0f;
                plan_rows<sp::NormPlan>(o, what, rows, [&](int c, int64_t t) { return sp::NormPlan{rows, row, c, t, offset}; });
                break;
            }
            case ir::OpKind::rope: {
                const int64_t hq = int64_t(op.attr.at("q_heads")), hk = int64_t(op.attr.at("k_heads")),
                              d = int64_t(op.attr.at("head_dim")), rot = int64_t(op.attr.at("rotary_dim"));
                o.table = plan_.dev.rope_tables.at(op.table);
                const float mscale = op.attr.count("mscale") ? float(op.attr.at("mscale")) : 1.0f;
                plan_rows<sp::RopePlan>(o, what, tmax_,
                                        [&](int c, int64_t t) { return sp::RopePlan{tmax_, hq, hk, d, rot, c, t, mscale}; });
                break;
            }
            case ir::OpKind::add:
            case ir::OpKind::mul:
            case ir::OpKind::silu:
            case ir::OpKind::scale: {
                const sp::RowShape row = row_shape(g_.values[op.out[0]]);
                const sp::Eltwise e = op.kind == ir::OpKind::add   ? sp::Eltwise::add
                                      : op.kind == ir::OpKind::mul ? sp::Eltwise::mul
                                      : op.kind == ir::OpKind::silu ? sp::Eltwise::silu
                                                                    : sp::Eltwise::scale;
                const float factor = op.attr.count("factor") ? float(op.attr.at("factor")) : 1.0f;
                for (int v : op.in)
                    if (row_shape(g_.values[v]).padded() != row.padded() || row_shape(g_.values[v]).group != row.group)
                        fail("spyre: {} of differently shaped rows is not planned", ir::op_name(op.kind));
                const int64_t rows = rows_max(op.out[0]);
                const bool out_f32 = op.out[0] == g_.output;
                plan_rows<sp::EltwisePlan>(o, what, rows,
                                           [&](int c, int64_t t) { return sp::EltwisePlan{rows, row, e, c, t, factor, out_f32}; });
                break;
            }
            case ir::OpKind::gather_rows: {
                const sp::RowShape row = row_shape(g_.values[op.out[0]]);
                plan_rows<sp::GatherPlan>(o, what, rmax_, [&](int c, int64_t t) { return sp::GatherPlan{rmax_, row, c, t}; });
                break;
            }
            case ir::OpKind::linear:
            case ir::OpKind::linear_swiglu: {
                sp::LinearPlan base;
                base.k_sticks = row_shape(g_.values[in(0)]).sticks();
                base.out = row_shape(g_.values[op.out[0]]);
                base.swiglu = op.kind == ir::OpKind::linear_swiglu;
                base.bias = op.kind == ir::OpKind::linear && op.weights[1] >= 0;
                base.residual = op.residual >= 0;
                base.out_f32 = op.out[0] == g_.output;
                const auto p = plan_linear(o, what, base, rows_max(in(0)));
                o.kernels.push_back(kernel(p, what, p.cores));
                break;
            }
            case ir::OpKind::attention: plan_attention(o, op); break;
            case ir::OpKind::moe: plan_moe(o, op); break;
            default: fail("spyre: op {} is not planned", ir::op_name(op.kind));
        }
        plan_.ops.push_back(std::move(o));
    }

    void plan_attention(OpPlan& o, const ir::Op& op) {
        const int64_t hq = int64_t(op.attr.at("q_heads")), hk = int64_t(op.attr.at("kv_heads")), d = int64_t(op.attr.at("head_dim"));
        const int64_t bs = b_.params.block_size;
        plan_rows<sp::KvAppendPlan>(o, "attention kv-append", tmax_,
                                    [&](int c, int64_t t) { return sp::KvAppendPlan{tmax_, hk, d, bs, c, t}; });
        const int64_t window = op.attr.count("window") ? int64_t(op.attr.at("window")) : 0;
        const float softcap = op.attr.count("softcap") ? float(op.attr.at("softcap")) : 0.0f;
        auto make = [&](int64_t t) {
            return sp::AttentionPlan{tmax_, hq, hk, d, bs, plan_.dev.max_blocks, sp::kCores, t, window, softcap};
        };
        const std::string what = "attention";
        const int64_t fit = largest_fit(tmax_, budget_, make);
        if (fit == 0) {
            const auto smallest = make(1);
            const int64_t table = smallest.buffer(sp::AttentionPlan::table).bytes;
            const int64_t blocks = 2 * (smallest.buffer(sp::AttentionPlan::k).bytes * 2);
            std::string advice =
                table >= blocks
                    ? fmt::format("the block table of a {}-token context is {} bytes: lower max_position_embeddings or raise "
                                  "SCR_BLOCK_SIZE (now {}); or {}",
                                  b_.max_position, with_commas(table), bs, raise_to(resident_of(smallest)))
                    : fmt::format("the double-buffered K and V blocks take {} bytes: lower SCR_BLOCK_SIZE (now {}); or {}",
                                  with_commas(blocks), bs, raise_to(resident_of(smallest)));
            record_failure(o, what, smallest, advice);
            o.kernels.push_back(kernel(smallest, what, 1));
            return;
        }
        // Enough query tiles to give every core work at the planned maximum (one sequence of
        // max tokens), but no larger than fits.
        const int64_t for_cores = std::max<int64_t>(1, tmax_ * hk / sp::kCores);
        const auto p = make(std::min(fit, for_cores));
        const int64_t items = sp::ceil_div(tmax_, p.tile_q) * hk;
        o.kernels.push_back(kernel(p, what, int(std::min<int64_t>(sp::kCores, items))));
    }

    void plan_moe(OpPlan& o, const ir::Op& op) {
        const int64_t E = int64_t(op.attr.at("experts")), K = int64_t(op.attr.at("top_k")), F = int64_t(op.attr.at("ffn"));
        const bool normalize = op.attr.at("normalize") != 0;
        const sp::RowShape xrow = row_shape(g_.values[op.in[0]]), out = row_shape(g_.values[op.out[0]]);
        // 1. Router logits, f32.
        sp::LinearPlan router;
        router.k_sticks = xrow.sticks();
        router.out = {1, E};
        router.out_f32 = true;
        const auto rp = plan_linear(o, "moe router", router, tmax_);
        o.kernels.push_back(kernel(rp, "moe router", rp.cores));
        // 2. Routing on one core.
        auto make_route = [&](int64_t rows, int64_t t) { return sp::MoeRoutePlan{rows, E, K, normalize, t}; };
        const int64_t t = largest_fit(tmax_, budget_, [&](int64_t tr) { return make_route(tmax_, tr); });
        if (t == 0) {
            const auto smallest = make_route(tmax_, 1);
            const int64_t rows_ok = largest_fit(tmax_, budget_, [&](int64_t r) { return make_route(r, 1); });
            std::string advice =
                rows_ok > 0 ? fmt::format("the per-expert row lists grow with the step: lower SCR_MAX_BATCH_TOKENS (now {}) to at "
                                          "most {}, or {}",
                                          tmax_, rows_ok, raise_to(sp::resident_bytes(smallest)))
                            : raise_to(sp::resident_bytes(smallest));
            record_failure(o, "moe route", smallest, advice);
            o.kernels.push_back(kernel(smallest, "moe route", 1));
        } else {
            o.kernels.push_back(kernel(make_route(tmax_, t), "moe route", 1));
        }
        // 3. Experts: SwiGLU on the gathered rows, down projection scattered to (row, k) slots.
        sp::LinearPlan up;
        up.k_sticks = xrow.sticks();
        up.out = {1, F};
        up.swiglu = true;
        up.gather = true;
        up.index_div = K;
        const auto upp = plan_linear(o, "moe expert gate/up", up, tmax_);
        o.kernels.push_back(kernel(upp, "moe expert gate/up", upp.cores));
        sp::LinearPlan down;
        down.k_sticks = sp::RowShape{1, F}.sticks();
        down.out = out;
        down.scatter = true;
        down.index_div = K;
        const auto dp = plan_linear(o, "moe expert down", down, tmax_);
        o.kernels.push_back(kernel(dp, "moe expert down", dp.cores));
        // 4. Weighted sum (+ residual), rows over cores.
        const bool residual = op.residual >= 0;
        plan_rows<sp::MoeCombinePlan>(o, "moe combine", tmax_,
                                      [&](int c, int64_t tr) { return sp::MoeCombinePlan{tmax_, out, K, residual, c, tr}; });
    }

    std::string failure_message() const {
        std::string o = fmt::format(
            "the Spyre plan for {} does not fit the scratchpad: SCR_SPYRE_SCRATCHPAD_BYTES = {} bytes of LX per core "
            "(physical LX {} bytes; default budget {}).\n",
            b_.stem, with_commas(budget_), with_commas(sp::kLxPhysicalBytes), with_commas(sp::kLxUsableBytes));
        if (budget_ < sp::kStickBytes)
            o += fmt::format("The budget of {} bytes is smaller than one 128-byte stick, the unit of every load and store: no op "
                             "can hold a tile.\n",
                             budget_);
        // One line per distinct failure, with the layers it occurs in.
        std::vector<std::pair<std::string, std::vector<int>>> groups;
        for (auto& f : failures_) {
            auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == f.text; });
            if (it == groups.end()) groups.push_back({f.text, {f.layer}});
            else it->second.push_back(f.layer);
        }
        for (auto& [text, layers] : groups) {
            std::string where;
            if (layers.size() == 1) where = layers[0] < 0 ? "outside the layers" : fmt::format("layer {}", layers[0]);
            else where = fmt::format("layers {}", fmt::join(layers, ","));
            o += fmt::format("  - {}, op {}\n", where, text);
        }
        return o;
    }

    const bind::Bound& b_;
    const ir::Graph& g_;
    int64_t budget_;
    int64_t tmax_ = 0, rmax_ = 0;
    int64_t cursor_ = 0;
    Plan plan_;
    std::vector<std::vector<int64_t>> op_weights_;
    std::vector<Failure> failures_;
};

}  // namespace

Plan plan_spyre(const bind::Bound& b, int64_t lx_bytes) {
    if (lx_bytes < 1 || lx_bytes > sp::kLxPhysicalBytes)
        fail("SCR_SPYRE_SCRATCHPAD_BYTES = {}: the usable scratchpad must be 1..{} bytes (the physical 2 MiB LX per core)", lx_bytes,
             sp::kLxPhysicalBytes);
    return Planner(b, lx_bytes).run();
}

std::string plan_spyre_text(const bind::Bound& b, const Plan& p) {
    const auto& d = p.dev;
    std::string o;
    o += fmt::format("spyre plan: {} cores x {} bytes of usable LX scratchpad (of {}), 128-byte sticks, fp16 on the device\n",
                     sp::kCores, with_commas(p.lx_bytes), with_commas(sp::kLxPhysicalBytes));
    o += fmt::format("device memory: {} bytes = weights {} (fp16, stickified) + constants {} + step inputs {} + activations {}{} + "
                     "logits {}\n",
                     with_commas(d.total), with_commas(d.weight_bytes), with_commas(d.constants_bytes), with_commas(d.step_bytes),
                     with_commas(d.activation_bytes), d.moe_bytes ? " + moe workspace " + with_commas(d.moe_bytes) : "",
                     with_commas(d.total - d.logits));
    const double pcie = 63.0e9;  // PCIe Gen5 x16, one direction
    const double upload_s = double(d.weight_bytes + d.constants_bytes) / pcie;
    o += fmt::format("startup: uploads {} bytes of weights and tables once ({} at the 63 GB/s of PCIe Gen5 x16); "
                     "decode reads {} bytes of weights per step\n",
                     with_commas(d.weight_bytes + d.constants_bytes),
                     upload_s < 0.1 ? fmt::format("{:.3f} ms", upload_s * 1e3) : fmt::format("{:.2f} s", upload_s),
                     with_commas(d.active_weight_bytes));
    o += fmt::format("kv cache: fp16, per layer K then V [kv_heads][{}][pad(head_dim)]: {} bytes per token, {} per block\n",
                     b.params.block_size, with_commas(d.kv_bytes_per_token), with_commas(d.kv_block_bytes));
    o += "tiles (resident = LX bytes per core, double buffers included; headroom = budget - resident):\n";
    o += fmt::format("  {:<5} {:<34} {:>5}  {:<58} {:>11} {:>11}\n", "layer", "op", "cores", "tile", "resident", "headroom");
    std::vector<std::string> layer_text;
    std::map<int, std::string> per_layer;
    std::string pre, post;
    for (auto& op : p.ops) {
        std::string lines;
        for (auto& k : op.kernels)
            lines += fmt::format("  {:<5} {:<34} {:>5}  {:<58} {:>11} {:>11}\n", op.layer < 0 ? "-" : std::to_string(op.layer),
                                 k.what, k.cores_used, k.tile, with_commas(k.resident), with_commas(p.lx_bytes - k.resident));
        if (op.layer < 0) (per_layer.empty() ? pre : post) += lines;
        else per_layer[op.layer] += lines;
    }
    o += pre;
    // A layer whose tiles equal the previous printed layer's (up to the layer number) prints as a count.
    std::string shown;
    int repeat_from = -1, last = -1;
    auto flush = [&]() {
        if (repeat_from >= 0) o += fmt::format("  (layers {}..{}: same tiles as layer {})\n", repeat_from, last, repeat_from - 1);
        repeat_from = -1;
    };
    for (auto& [l, text] : per_layer) {
        std::string norm;
        for (size_t i = 0; i < text.size();) {
            size_t e = text.find('\n', i);
            norm += text.substr(i + 7, e - i - 7) + "\n";
            i = e + 1;
        }
        if (norm == shown) {
            if (repeat_from < 0) repeat_from = l;
            last = l;
            continue;
        }
        flush();
        o += text;
        shown = norm;
    }
    flush();
    o += post;
    // The tightest tiles, each distinct (op, tile) once.
    struct Tight {
        int64_t resident;
        std::string text;
    };
    std::vector<Tight> tight;
    std::set<std::string> seen;
    for (auto& op : p.ops)
        for (auto& k : op.kernels) {
            std::string key = k.what + "|" + k.tile;
            if (!seen.insert(key).second) continue;
            tight.push_back({k.resident, fmt::format("{} [{}]: {} of {} bytes ({:.1f} %), headroom {}; {}", k.what, k.tile,
                                                     with_commas(k.resident), with_commas(p.lx_bytes),
                                                     100.0 * double(k.resident) / double(p.lx_bytes),
                                                     with_commas(p.lx_bytes - k.resident), describe_buffers(k.plan, 3))});
        }
    std::stable_sort(tight.begin(), tight.end(), [](const Tight& a, const Tight& b) { return a.resident > b.resident; });
    o += "tightest tiles:\n";
    for (size_t i = 0; i < tight.size() && i < 5; ++i) o += fmt::format("  {}. {}\n", i + 1, tight[i].text);
    return o;
}

}  // namespace scr::spyre
