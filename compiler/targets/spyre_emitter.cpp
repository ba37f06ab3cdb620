// The Spyre emitter: the plan (tiles per op, device memory map) as constexpr constants checked by
// static_assert, and a forward() that is the list of tiled kernel calls on the emulator. Layers
// whose calls are identical up to their weight base and KV slot fold into one loop.
#include "compiler/targets/spyre_emitter.hpp"

#include <fmt/format.h>

#include <map>

#include "compiler/targets/emit.hpp"
#include "compiler/targets/spyre_plan.hpp"
#include "runtime/core/error.hpp"

namespace scr::emit {
namespace {

namespace sp = scr::kernels::spyre;
using spyre::AnyPlan;

std::string row_lit(const sp::RowShape& r) { return fmt::format("{{.groups = {}, .group = {}}}", r.groups, r.group); }

// The plan as a C++ aggregate (designated initializers in declaration order).
std::string plan_literal(const AnyPlan& any) {
    struct V {
        std::string operator()(const sp::EmbedPlan& p) const {
            return fmt::format("sp::EmbedPlan{{.rows_max = {}, .row = {}, .cores = {}, .tile_rows = {}}}", p.rows_max, row_lit(p.row),
                               p.cores, p.tile_rows);
        }
        std::string operator()(const sp::NormPlan& p) const {
            return fmt::format("sp::NormPlan{{.rows_max = {}, .row = {}, .cores = {}, .tile_rows = {}, .offset = {}}}", p.rows_max,
                               row_lit(p.row), p.cores, p.tile_rows, float_literal(p.offset));
        }
        std::string operator()(const sp::RopePlan& p) const {
            return fmt::format("sp::RopePlan{{.rows_max = {}, .q_heads = {}, .k_heads = {}, .head_dim = {}, .rot = {}, .cores = {}, "
                               ".tile_rows = {}, .mscale = {}}}",
                               p.rows_max, p.q_heads, p.k_heads, p.head_dim, p.rot, p.cores, p.tile_rows, float_literal(p.mscale));
        }
        std::string operator()(const sp::EltwisePlan& p) const {
            const char* op = p.op == sp::Eltwise::add ? "add" : p.op == sp::Eltwise::mul ? "mul" : p.op == sp::Eltwise::silu ? "silu" : "scale";
            return fmt::format("sp::EltwisePlan{{.rows_max = {}, .row = {}, .op = sp::Eltwise::{}, .cores = {}, .tile_rows = {}, "
                               ".factor = {}, .out_f32 = {}}}",
                               p.rows_max, row_lit(p.row), op, p.cores, p.tile_rows, float_literal(p.factor),
                               p.out_f32 ? "true" : "false");
        }
        std::string operator()(const sp::GatherPlan& p) const {
            return fmt::format("sp::GatherPlan{{.rows_max = {}, .row = {}, .cores = {}, .tile_rows = {}}}", p.rows_max,
                               row_lit(p.row), p.cores, p.tile_rows);
        }
        std::string operator()(const sp::KvAppendPlan& p) const {
            return fmt::format("sp::KvAppendPlan{{.rows_max = {}, .kv_heads = {}, .head_dim = {}, .block_size = {}, .cores = {}, "
                               ".tile_rows = {}}}",
                               p.rows_max, p.kv_heads, p.head_dim, p.block_size, p.cores, p.tile_rows);
        }
        std::string operator()(const sp::LinearPlan& p) const {
            auto b = [](bool v) { return v ? "true" : "false"; };
            return fmt::format("sp::LinearPlan{{.rows_max = {}, .k_sticks = {}, .out = {}, .cores = {}, .sticks_per_core = {}, "
                               ".tile_rows = {}, .tile_n = {}, .tile_k = {}, .swiglu = {}, .bias = {}, .residual = {}, "
                               ".out_f32 = {}, .gather = {}, .scatter = {}, .index_div = {}}}",
                               p.rows_max, p.k_sticks, row_lit(p.out), p.cores, p.sticks_per_core, p.tile_rows, p.tile_n, p.tile_k,
                               b(p.swiglu), b(p.bias), b(p.residual), b(p.out_f32), b(p.gather), b(p.scatter), p.index_div);
        }
        std::string operator()(const sp::AttentionPlan& p) const {
            return fmt::format("sp::AttentionPlan{{.rows_max = {}, .q_heads = {}, .kv_heads = {}, .head_dim = {}, .block_size = {}, "
                               ".max_blocks = {}, .cores = {}, .tile_q = {}, .window = {}, .softcap = {}}}",
                               p.rows_max, p.q_heads, p.kv_heads, p.head_dim, p.block_size, p.max_blocks, p.cores, p.tile_q,
                               p.window, float_literal(p.softcap));
        }
        std::string operator()(const sp::MoeRoutePlan& p) const {
            return fmt::format("sp::MoeRoutePlan{{.rows_max = {}, .experts = {}, .top_k = {}, .normalize = {}, .tile_rows = {}}}",
                               p.rows_max, p.experts, p.top_k, p.normalize ? "true" : "false", p.tile_rows);
        }
        std::string operator()(const sp::MoeCombinePlan& p) const {
            return fmt::format("sp::MoeCombinePlan{{.rows_max = {}, .row = {}, .top_k = {}, .residual = {}, .cores = {}, "
                               ".tile_rows = {}}}",
                               p.rows_max, row_lit(p.row), p.top_k, p.residual ? "true" : "false", p.cores, p.tile_rows);
        }
    };
    return std::visit(V{}, any);
}

class SpyreEmitter {
public:
    SpyreEmitter(const bind::Bound& b, int64_t lx) : b_(b), g_(b.graph), plan_(spyre::plan_spyre(b, lx)) {}

    std::string run() {
        const std::string sym = symbol_for(b_, "spyre");
        const auto& d = plan_.dev;
        std::string o;
        o += fmt::format("// Generated by scrc from {} + {} + quant preset \"{}\" for the Spyre target (run on the host emulator).\n",
                         b_.arch + ".scr", b_.config_path, b_.preset.name);
        o += fmt::format("// Do not edit: every tile below was planned by scrc for a {}-byte scratchpad per core and is re-checked\n"
                         "// by static_assert; change the DSL, the config, the preset or SCR_SPYRE_SCRATCHPAD_BYTES instead.\n",
                         plan_.lx_bytes);
        o += "#include \"kernels/spyre/ops.hpp\"\n#include \"runtime/model/generated_support.hpp\"\n\n";
        o += fmt::format("namespace scr::gen::{} {{\n\nnamespace sp = scr::kernels::spyre;\n\n", sym);
        o += info();
        o += "\n// ---- The machine this plan was made for ------------------------------------------------------\n";
        o += fmt::format("constexpr int64_t kLxBytes = {};  // SCR_SPYRE_SCRATCHPAD_BYTES: usable LX per core\n", plan_.lx_bytes);
        o += "static_assert(kLxBytes >= 1 && kLxBytes <= sp::kLxPhysicalBytes, \"the usable scratchpad cannot exceed the physical 2 MiB LX\");\n\n";
        o += "// ---- Tile plans: split over the 32 cores and the per-core tile of every kernel ---------------\n";
        std::string calls = body();  // names the tiles as it goes
        o += tiles_;
        o += device_map();
        o += "\nclass Model final : public GeneratedModel {\npublic:\n";
        o += "    Model(const WeightSet& w, ThreadPool& pool) : GeneratedModel(kInfo, w, pool, 0), dev_(kDeviceBytes, kLxBytes, pool) {\n";
        o += "        // Startup: every weight crosses to device memory once, as stickified fp16.\n";
        o += "        for (const sp::Upload& u : kUploads) {\n";
        o += "            const void* src = this->w<void>(u.tensor);\n";
        o += "            if (!src) fail(\"spyre upload: tensor {} is missing from the weight set\", kTensors[u.tensor].name);\n";
        o += "            sp::upload(dev_, u, src, kTensors[u.tensor].dtype);\n        }\n";
        for (auto& [table, off] : d.rope_tables)
            o += fmt::format("        sp::upload_f32(dev_, {}, {}, {});\n", off, rope_name_.at(table), table.size());
        o += fmt::format("        s_.items.reserve({});\n        s_.expert_counts.reserve({});\n", max_items_, max_experts_);
        o += "    }\n\n";
        o += "    void forward(const StepBatch& b, KvPool& kv, float* logits) override {\n";
        o += "        begin_step(b, kv);\n";
        o += "        sp::write_step(dev_, kStep,\n"
             "                       {.num_tokens = b.num_tokens, .token_ids = b.token_ids, .positions = b.positions,\n"
             "                        .slot_mapping = b.slot_mapping, .num_seqs = b.num_seqs, .query_start = b.query_start,\n"
             "                        .seq_lens = b.seq_lens, .block_tables = b.block_tables, .block_table_stride = b.block_table_stride,\n"
             "                        .num_logits = b.num_logits, .logit_rows = b.logit_rows, .kv = kv.data, .kv_blocks = kv.num_blocks},\n"
             "                       s_);\n";
        o += "        const int T = b.num_tokens, R = b.num_logits;\n        (void)T; (void)R;\n";
        o += calls;
        o += fmt::format("        if (R > 0 && logits) sp::read_logits(dev_, kLogits, R, {}, kLogitsRowFloats, logits);\n", b_.vocab);
        o += "    }\n\nprivate:\n    sp::Device dev_;\n    sp::Step s_;\n};\n\n";
        o += "}  // namespace scr::gen::" + sym + "\n\n";
        o += fmt::format("namespace scr::gen {{\nextern const ModelEntry {}_entry;\nconst ModelEntry {}_entry{{&{}::kInfo, &make_generated<{}::Model>}};\n}}  // namespace scr::gen\n",
                         sym, sym, sym, sym);
        return o;
    }

private:
    // ModelInfo and friends, with the Spyre device's sizes: fp16 KV in stickified rows, fp16
    // weights as uploaded, activations as planned; the plan text is the common one plus the tiles.
    std::string info() {
        bind::Bound bb = b_;
        bb.preset.kv_cache = DType::f16;
        Sizes s = sizes_of(bb);
        const auto& d = plan_.dev;
        s.weight_bytes = d.weight_bytes;
        s.active_weight_bytes = d.active_weight_bytes;
        s.kv_bytes_per_token = d.kv_bytes_per_token;
        s.kv_block_bytes = d.kv_block_bytes;
        s.k_offsets = d.k_offsets;
        s.v_offsets = d.v_offsets;
        s.scratch_bytes = d.activation_bytes;
        std::string tables = info_tables(bb, s, "spyre");
        // The plan text scr info prints: the common plan, then the Spyre tiles.
        const std::string marker = ")PLAN\";";
        auto at = tables.find(marker);
        if (at == std::string::npos) fail("spyre emitter: info tables have no plan text");
        tables.insert(at, spyre::plan_spyre_text(b_, plan_));
        return tables;
    }

    std::string device_map() {
        const auto& d = plan_.dev;
        std::string o = "\n// ---- Device memory (bytes), laid out by scrc -----------------------------------------------\n";
        o += fmt::format("constexpr int64_t kDeviceBytes = {};\n", d.total);
        o += "// Weights: rows of fp16, each row stickified (groups padded to 64-element sticks).\n";
        o += "constexpr sp::Upload kUploads[] = {\n";
        for (auto& w : d.weights)
            o += fmt::format("    {{{}, {}, {}, {}}},  // {}\n", w.tensor, w.rows, row_lit(w.row), w.offset, g_.tensors[w.tensor].name);
        o += "};\n";
        for (auto& [table, off] : d.rope_tables) {
            std::string name = fmt::format("kRopeInvFreq{}", rope_name_.size());
            rope_name_[table] = name;
            o += "// RoPE inverse frequencies, computed by scrc from the config's rope parameters.\n";
            o += fmt::format("constexpr float {}[] = {{", name);
            for (size_t i = 0; i < table.size(); ++i) o += (i % 6 == 0 ? "\n    " : " ") + float_literal(table[i]) + ",";
            o += "\n};\n";
        }
        o += fmt::format("constexpr sp::StepMap kStep{{.ids = {}, .positions = {}, .slots = {}, .logit_rows = {}, .tables = {},\n"
                         "                            .rows_max = {}, .logit_rows_max = {}, .max_blocks = {}, .table_row_bytes = {},\n"
                         "                            .block_size = {}, .kv_block_bytes = {}}};\n",
                         d.ids, d.positions, d.slots, d.logit_rows, d.tables, b_.params.max_batch_tokens, b_.params.max_logit_rows,
                         d.max_blocks, d.table_row_bytes, b_.params.block_size, d.kv_block_bytes);
        if (d.moe_logits >= 0)
            o += fmt::format("constexpr int64_t kMoeLogits = {}, kMoeTop = {}, kMoeLists = {}, kMoeCounts = {}, kMoeAct = {}, kMoeY = {},\n"
                             "                  kMoeListStride = {};\n",
                             d.moe_logits, d.moe_top, d.moe_lists, d.moe_counts, d.moe_act, d.moe_y, d.moe_list_stride);
        o += fmt::format("constexpr int64_t kLogits = {}, kLogitsRowFloats = {};  // f32 logits, [max rows][pad(vocab)]\n", d.logits,
                         d.logits_row_floats);
        o += fmt::format("// KV block: {} tokens of every layer, K then V per layer, each [kv_heads][block][pad(head_dim)] fp16.\n",
                         b_.params.block_size);
        o += fmt::format("constexpr int64_t kKvBlockBytes = {};\n", d.kv_block_bytes);
        o += fmt::format("constexpr int64_t kKvK[] = {{{}}};\n", fmt::join(d.k_offsets, ", "));
        o += fmt::format("constexpr int64_t kKvV[] = {{{}}};\n", fmt::join(d.v_offsets, ", "));
        o += fmt::format("static_assert(kKvBlockBytes == {}, \"the KV layout must match ModelInfo::kv_bytes_per_block\");\n",
                         d.kv_block_bytes);
        return o;
    }

    // The constant holding plan p (identical plans share one), with its checks.
    std::string tile_name(const spyre::Kernel& k, int layer) {
        const std::string lit = plan_literal(k.plan);
        auto it = tile_names_.find(lit);
        if (it != tile_names_.end()) return it->second;
        const std::string name = fmt::format("kTile{}", tile_names_.size());
        tile_names_[lit] = name;
        const std::string where = layer < 0 ? k.what : fmt::format("{} (layer {})", k.what, layer);
        tiles_ += fmt::format("// {}: {} core{}, tile {}; {} of {} bytes resident, headroom {}\n", where, k.cores_used,
                              k.cores_used == 1 ? "" : "s", k.tile, spyre::with_commas(k.resident),
                              spyre::with_commas(plan_.lx_bytes), spyre::with_commas(plan_.lx_bytes - k.resident));
        tiles_ += fmt::format("constexpr auto {} = {};\n", name, lit);
        tiles_ += fmt::format("static_assert(sp::resident_bytes({}) <= kLxBytes, \"{}: tile [{}] must fit the scratchpad "
                              "(SCR_SPYRE_SCRATCHPAD_BYTES per core)\");\n",
                              name, where, k.tile);
        tiles_ += fmt::format("static_assert({}.valid(), \"{}: the cores and tiles must cover the op with non-empty tiles\");\n",
                              name, where);
        tiles_ += fmt::format("static_assert(sp::buffers_stick_aligned({}), \"{}: every LX buffer must be whole 128-byte sticks\");\n",
                              name, where);
        return name;
    }

    std::string A(int v) const {
        if (v == g_.output) return "kLogits";
        const int64_t off = plan_.dev.value_offset[size_t(v)];
        if (off < 0) fail("spyre emitter: value {} has no device region", v);
        return std::to_string(off);
    }
    std::string rows(int v) const { return g_.values[size_t(v)].rows == ir::Rows::tokens ? "T" : "R"; }
    std::string W(int64_t off, int64_t wbase, bool in_layer) const {
        if (off < 0) return "-1";
        return in_layer ? fmt::format("wl + {}", off - wbase) : std::to_string(off);
    }

    std::string call(const spyre::OpPlan& p, int64_t wbase, int kbase, bool in_layer, const std::string& ind) {
        const ir::Op& op = g_.ops[size_t(p.op)];
        auto K = [&](size_t i) { return tile_name(p.kernels.at(i), p.layer); };
        auto Wt = [&](size_t i) { return W(p.weights.at(i), wbase, in_layer); };
        const int o0 = op.out.empty() ? -1 : op.out[0];
        std::string o;
        switch (op.kind) {
            case ir::OpKind::embed:
                return ind + fmt::format("sp::embed<{}>(dev_, s_, {}, {}, {});\n", K(0), b_.vocab, Wt(0), A(o0));
            case ir::OpKind::rmsnorm:
                return ind + fmt::format("sp::rmsnorm<{}>(dev_, {}, {}, {}, {}, {});\n", K(0), rows(op.in[0]), A(op.in[0]), Wt(0),
                                         float_literal(op.attr.at("eps")), A(o0));
            case ir::OpKind::linear:
                return ind + fmt::format("sp::linear<{}>(dev_, {}, {{.x = {}, .w = {}, .bias = {}, .res = {}, .y = {}}});\n", K(0),
                                         rows(op.in[0]), A(op.in[0]), Wt(0), Wt(1), op.residual >= 0 ? A(op.residual) : "-1",
                                         A(o0));
            case ir::OpKind::linear_swiglu:
                return ind + fmt::format("sp::linear<{}>(dev_, {}, {{.x = {}, .w = {}, .w2 = {}, .y = {}}});\n", K(0), rows(op.in[0]),
                                         A(op.in[0]), Wt(0), Wt(1), A(o0));
            case ir::OpKind::rope:
                return ind + fmt::format("sp::rope<{}>(dev_, s_, {}, {}, {}, {}, {});\n", K(0), A(op.in[0]), A(op.in[1]), A(op.out[0]),
                                         A(op.out[1]), p.table);
            case ir::OpKind::attention: {
                const std::string kv = in_layer ? fmt::format("kl + {}", op.kv_index - kbase) : std::to_string(op.kv_index);
                o += ind + fmt::format("sp::kv_append<{}>(dev_, s_, {}, {}, kKvK[{}], kKvV[{}]);\n", K(0), A(op.in[1]), A(op.in[2]),
                                       kv, kv);
                o += ind + fmt::format("sp::attention<{}>(dev_, s_, {}, kKvK[{}], kKvV[{}], {}, {});\n", K(1), A(op.in[0]), kv, kv,
                                       float_literal(op.attr.at("scale")), A(o0));
                max_items_ = std::max<int64_t>(max_items_, b_.params.max_batch_tokens * int64_t(op.attr.at("kv_heads")));
                return o;
            }
            case ir::OpKind::moe: {
                const int64_t E = int64_t(op.attr.at("experts"));
                max_experts_ = std::max(max_experts_, E);
                const int64_t e0 = p.weights.at(1), stride = E > 1 ? p.weights.at(4) - e0 : 0;
                for (int64_t e = 0; e < E; ++e)
                    for (int j = 0; j < 3; ++j)
                        if (p.weights.at(size_t(1 + 3 * e + j)) - e0 != e * stride + (p.weights.at(size_t(1 + j)) - e0))
                            fail("spyre emitter: MoE expert weights are not evenly strided in device memory");
                o += ind + fmt::format("sp::linear<{}>(dev_, T, {{.x = {}, .w = {}, .y = kMoeLogits}});\n", K(0), A(op.in[0]), Wt(0));
                o += ind + fmt::format("sp::moe_route<{}>(dev_, s_, T, kMoeLogits, kMoeTop, kMoeLists, kMoeCounts);\n", K(1));
                o += ind + fmt::format("for (int e = 0; e < {}; ++e) {{  // each expert on the rows routed to it\n", E);
                o += ind + "    const int n = s_.expert_counts[size_t(e)];\n";
                o += ind + "    if (n == 0) continue;\n";
                o += ind + fmt::format("    const int64_t we = {} + e * int64_t({}), list = kMoeLists + e * kMoeListStride;\n",
                                       W(e0, wbase, in_layer), stride);
                o += ind + fmt::format("    sp::linear<{}>(dev_, n, {{.x = {}, .w = we, .w2 = we + {}, .y = kMoeAct, .index = list}});\n",
                                       K(2), A(op.in[0]), p.weights.at(2) - e0);
                o += ind + fmt::format("    sp::linear<{}>(dev_, n, {{.x = kMoeAct, .w = we + {}, .y = kMoeY, .index = list}});\n", K(3),
                                       p.weights.at(3) - e0);
                o += ind + "}\n";
                o += ind + fmt::format("sp::moe_combine<{}>(dev_, T, kMoeTop, kMoeY, {}, {});\n", K(4),
                                       op.residual >= 0 ? A(op.residual) : "-1", A(o0));
                return o;
            }
            case ir::OpKind::add:
            case ir::OpKind::mul:
                return ind + fmt::format("sp::eltwise<{}>(dev_, {}, {}, {}, {});\n", K(0), rows(o0), A(op.in[0]), A(op.in[1]), A(o0));
            case ir::OpKind::silu:
            case ir::OpKind::scale:
                return ind + fmt::format("sp::eltwise<{}>(dev_, {}, {}, -1, {});\n", K(0), rows(o0), A(op.in[0]), A(o0));
            case ir::OpKind::gather_rows:
                return ind + fmt::format("sp::gather_rows<{}>(dev_, s_, {}, {}, {});\n", K(0), b_.params.max_batch_tokens, A(op.in[0]),
                                         A(o0));
            default: break;
        }
        fail("spyre emitter: unhandled op {}", ir::op_name(op.kind));
    }

    std::string lines(const std::vector<const spyre::OpPlan*>& ops, int64_t wbase, int kbase, bool in_layer, const std::string& ind) {
        std::string o, last_src;
        for (auto* p : ops) {
            const auto& src = g_.ops[size_t(p->op)].src;
            if (!src.empty() && src != last_src) {
                o += ind + "// " + src + "\n";
                last_src = src;
            }
            o += call(*p, wbase, kbase, in_layer, ind);
        }
        return o;
    }

    std::string body() {
        std::map<int, std::vector<const spyre::OpPlan*>> layers;
        std::vector<const spyre::OpPlan*> pre, post;
        for (auto& p : plan_.ops) {
            if (p.layer >= 0) layers[p.layer].push_back(&p);
            else if (layers.empty()) pre.push_back(&p);
            else post.push_back(&p);
        }
        const std::string ind = "        ";
        std::string o = lines(pre, 0, 0, false, ind);
        std::vector<std::string> texts;
        std::vector<int64_t> wbases;
        std::vector<int> kbases;
        for (auto& [l, ops] : layers) {
            int64_t wb = -1;
            int kb = 0;
            bool have_kv = false;
            for (auto* p : ops) {
                for (int64_t w : p->weights)
                    if (w >= 0 && (wb < 0 || w < wb)) wb = w;
                const auto& op = g_.ops[size_t(p->op)];
                if (op.kv_index >= 0 && !have_kv) kb = op.kv_index, have_kv = true;
            }
            wbases.push_back(std::max<int64_t>(wb, 0));
            kbases.push_back(kb);
            texts.push_back(lines(ops, wbases.back(), kb, true, ind + "    "));
        }
        bool uniform = !texts.empty();
        const int64_t wstride = texts.size() > 1 ? wbases[1] - wbases[0] : 0;
        const int kstride = texts.size() > 1 ? kbases[1] - kbases[0] : 0;
        for (size_t l = 1; l < texts.size() && uniform; ++l)
            uniform = texts[l] == texts[0] && wbases[l] - wbases[l - 1] == wstride && kbases[l] - kbases[l - 1] == kstride;
        if (uniform) {
            o += fmt::format("        for (int l = 0; l < {}; ++l) {{\n", texts.size());
            o += fmt::format("            const int64_t wl = {} + int64_t({}) * l;\n            const int kl = {} + {} * l;\n", wbases[0],
                             wstride, kbases[0], kstride);
            o += "            (void)wl; (void)kl;\n";
            o += texts[0];
            o += "        }\n";
        } else {
            size_t i = 0;
            for (auto& [l, ops] : layers) {
                o += fmt::format("        {{  // layer {}\n            const int64_t wl = {};\n            const int kl = {};\n"
                                 "            (void)wl; (void)kl;\n",
                                 l, wbases[i], kbases[i]);
                o += texts[i];
                o += "        }\n";
                ++i;
            }
        }
        o += lines(post, 0, 0, false, ind);
        return o;
    }

    const bind::Bound& b_;
    const ir::Graph& g_;
    spyre::Plan plan_;
    std::map<std::string, std::string> tile_names_;
    std::map<std::vector<float>, std::string> rope_name_;
    std::string tiles_;
    int64_t max_items_ = 1, max_experts_ = 1;
};

}  // namespace

std::string emit_spyre(const bind::Bound& b, int64_t scratchpad_bytes) { return SpyreEmitter(b, scratchpad_bytes).run(); }

std::string spyre_plan_report(const bind::Bound& b, int64_t scratchpad_bytes) {
    const spyre::Plan p = spyre::plan_spyre(b, scratchpad_bytes);
    return spyre::plan_spyre_text(b, p);
}

}  // namespace scr::emit
