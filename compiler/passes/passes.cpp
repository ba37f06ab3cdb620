#include "compiler/passes/passes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "runtime/core/error.hpp"

namespace scr::passes {
namespace {

std::vector<int> use_counts(const ir::Graph& g) {
    std::vector<int> uses(g.values.size(), 0);
    for (auto& op : g.ops) {
        for (int v : op.in) ++uses[v];
        if (op.residual >= 0) ++uses[op.residual];
    }
    if (g.output >= 0) ++uses[g.output];
    return uses;
}

std::vector<int> producers(const ir::Graph& g) {
    std::vector<int> prod(g.values.size(), -1);
    for (size_t i = 0; i < g.ops.size(); ++i)
        for (int v : g.ops[i].out) prod[v] = int(i);
    return prod;
}

// Removes the ops a fusion absorbed (dead[i]), keeping the others in order.
void drop_ops(ir::Graph& g, const std::vector<bool>& dead) {
    std::vector<ir::Op> kept;
    for (size_t i = 0; i < g.ops.size(); ++i)
        if (!dead[i]) kept.push_back(std::move(g.ops[i]));
    g.ops = std::move(kept);
}

bool plain_linear(const ir::Op& op) { return op.kind == ir::OpKind::linear && op.weights[1] < 0 && op.residual < 0; }

// silu(linear(x, Wg)) * linear(x, Wu)  ->  linear_swiglu(x, Wg, Wu): the gate and up rows are
// computed together and never stored.
int fuse_swiglu(ir::Graph& g) {
    int fused = 0;
    auto uses = use_counts(g);
    auto prod = producers(g);
    std::vector<bool> dead(g.ops.size(), false);
    for (size_t i = 0; i < g.ops.size(); ++i) {
        auto& mul = g.ops[i];
        if (mul.kind != ir::OpKind::mul) continue;
        for (int side = 0; side < 2; ++side) {
            int s = mul.in[side], u = mul.in[1 - side];
            int ps = prod[s], pu = prod[u];
            if (ps < 0 || pu < 0 || uses[s] != 1 || uses[u] != 1) continue;
            const ir::OpKind act = g.ops[ps].kind;
            if (act != ir::OpKind::silu && act != ir::OpKind::gelu_tanh) continue;
            int gv = g.ops[ps].in[0];
            int pg = prod[gv];
            if (pg < 0 || uses[gv] != 1 || !plain_linear(g.ops[pg]) || !plain_linear(g.ops[pu])) continue;
            if (g.ops[pg].in[0] != g.ops[pu].in[0]) continue;
            ir::Op f = g.ops[pg];
            f.kind = act == ir::OpKind::silu ? ir::OpKind::linear_swiglu : ir::OpKind::linear_geglu;
            f.weights = {g.ops[pg].weights[0], g.ops[pu].weights[0]};
            f.out = mul.out;
            f.src = mul.src;
            f.loc = mul.loc;
            g.ops[i] = f;
            dead[ps] = dead[pg] = dead[pu] = true;
            ++fused;
            break;
        }
    }
    drop_ops(g, dead);
    return fused;
}

// x + op(...) where op is a linear/SwiGLU/MoE whose result is used only there -> the op adds x
// into its output (and may write over x in place).
int fuse_residual(ir::Graph& g) {
    int fused = 0;
    auto uses = use_counts(g);
    auto prod = producers(g);
    std::vector<bool> dead(g.ops.size(), false);
    for (size_t i = 0; i < g.ops.size(); ++i) {
        auto& add = g.ops[i];
        if (add.kind != ir::OpKind::add) continue;
        for (int side = 0; side < 2; ++side) {
            int y = add.in[side], x = add.in[1 - side];
            int py = prod[y];
            if (py < 0 || uses[y] != 1) continue;
            auto& op = g.ops[py];
            if (op.kind != ir::OpKind::linear && op.kind != ir::OpKind::moe) continue;
            if (op.residual >= 0) continue;
            if (prod[x] >= py) continue;  // the residual must exist before the op runs
            op.residual = x;
            op.out = add.out;
            dead[i] = true;
            ++fused;
            break;
        }
    }
    drop_ops(g, dead);
    return fused;
}

// Which input an op's output may overwrite in place (elementwise per row), or -1.
int inplace_input(const ir::Op& op, size_t out_index) {
    switch (op.kind) {
        case ir::OpKind::rmsnorm:
        case ir::OpKind::silu:
        case ir::OpKind::scale:
        case ir::OpKind::gelu_tanh:
        case ir::OpKind::softcap:
        case ir::OpKind::add:
        case ir::OpKind::mul: return out_index == 0 ? op.in[0] : -1;
        case ir::OpKind::rope: return op.in[out_index];
        case ir::OpKind::linear:
        case ir::OpKind::moe: return out_index == 0 ? op.residual : -1;
        default: return -1;
    }
}

}  // namespace

FuseStats fuse(ir::Graph& g) {
    FuseStats s;
    s.swiglu = fuse_swiglu(g);
    s.residual = fuse_residual(g);
    return s;
}

void plan_memory(ir::Graph& g, int64_t max_tokens, int64_t max_logit_rows) {
    const size_t nv = g.values.size();
    std::vector<int> last_use(nv, -1), def(nv, -1);
    for (size_t i = 0; i < g.ops.size(); ++i) {
        for (int v : g.ops[i].in) last_use[v] = int(i);
        if (g.ops[i].residual >= 0) last_use[g.ops[i].residual] = int(i);
        for (int v : g.ops[i].out) def[v] = int(i);
    }
    if (g.output >= 0) last_use[g.output] = int(g.ops.size());

    auto floats_of = [&](const ir::Value& v) {
        int64_t rows = v.rows == ir::Rows::tokens ? max_tokens : max_logit_rows;
        return (rows * v.width() + 15) / 16 * 16;  // 64-byte aligned regions
    };

    // Free intervals of the arena, by offset.
    std::map<int64_t, int64_t> free_list;
    int64_t arena = 0;
    auto allocate = [&](int64_t size) {
        auto best = free_list.end();
        for (auto it = free_list.begin(); it != free_list.end(); ++it)
            if (it->second >= size && (best == free_list.end() || it->second < best->second)) best = it;
        if (best != free_list.end()) {
            int64_t off = best->first, len = best->second;
            free_list.erase(best);
            if (len > size) free_list[off + size] = len - size;
            return off;
        }
        int64_t off = arena;
        arena += size;
        return off;
    };
    auto release = [&](int64_t off, int64_t size) {
        auto it = free_list.emplace(off, size).first;
        auto next = std::next(it);
        if (next != free_list.end() && it->first + it->second == next->first) {
            it->second += next->second;
            free_list.erase(next);
        }
        if (it != free_list.begin()) {
            auto prev = std::prev(it);
            if (prev->first + prev->second == it->first) {
                prev->second += it->second;
                free_list.erase(it);
            }
        }
    };
    // Storage owner of each value (follows aliases) and its size.
    std::vector<int> owner(nv);
    for (size_t v = 0; v < nv; ++v) owner[v] = int(v);
    std::vector<int> owner_last(nv, -1);  // last use over all values sharing the storage

    for (size_t i = 0; i < g.ops.size(); ++i) {
        auto& op = g.ops[i];
        for (size_t o = 0; o < op.out.size(); ++o) {
            auto& v = g.values[op.out[o]];
            if (v.id == g.output) continue;  // written straight into the caller's logits buffer
            int src = inplace_input(op, o);
            if (src >= 0 && last_use[src] == int(i) && g.values[src].width() == v.width() &&
                g.values[src].rows == v.rows && owner_last[owner[src]] <= int(i)) {
                owner[v.id] = owner[src];
                v.alias_of = src;
                v.offset = g.values[src].offset;
                owner_last[owner[v.id]] = std::max(owner_last[owner[v.id]], last_use[v.id]);
                continue;
            }
            v.offset = allocate(floats_of(v));
            owner_last[v.id] = last_use[v.id];
        }
        if (op.workspace > 0) {
            op.workspace_offset = allocate((op.workspace + 15) / 16 * 16);
            release(op.workspace_offset, (op.workspace + 15) / 16 * 16);
        }
        // Free storage whose last reader was this op.
        std::vector<int> ins = op.in;
        if (op.residual >= 0) ins.push_back(op.residual);
        for (int v : ins) {
            int own = owner[v];
            if (owner_last[own] == int(i)) {
                release(g.values[own].offset, floats_of(g.values[own]));
                owner_last[own] = -2;  // released
            }
        }
        // Outputs nobody reads are released at once (their op still writes them).
        for (int v : op.out)
            if (v != g.output && last_use[v] < 0 && owner[v] == v) {
                release(g.values[v].offset, floats_of(g.values[v]));
                owner_last[v] = -2;
            }
    }
    g.scratch_floats = arena;
}

}  // namespace scr::passes
