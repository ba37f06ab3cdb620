// The Spyre kernels, run tile by tile on the emulator. Each is a template over its compile-time
// plan (plan.hpp): the split over cores, the tile shape and therefore every LX buffer are
// constants; the only run-time numbers are the step's row count and its data.
//
// Numerics: device memory and LX hold fp16; products and sums are f32 (dot_f16), one rounding
// to fp16 per stored element. Logits and router logits are stored as f32.
//
// Loop shape of every kernel: a core walks its tiles; per tile it loads (DMA) the inputs into
// one of the two copies of each double-buffered LX buffer, computes into LX, stores the result.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/spyre/emulator.hpp"

namespace scr::kernels::spyre {

// ---- the step: host-side inputs, written into device memory at the start of each forward ----------

// Where the per-step inputs live in device memory (constants of a build).
struct StepMap {
    int64_t ids, positions, slots, logit_rows, tables;
    int64_t rows_max, logit_rows_max, max_blocks, table_row_bytes;
    int64_t block_size, kv_block_bytes;
};

// The step as the host hands it over (plain pointers; the generated code maps a StepBatch here).
struct StepInputs {
    int num_tokens = 0;
    const int32_t* token_ids = nullptr;
    const int32_t* positions = nullptr;
    const int64_t* slot_mapping = nullptr;
    int num_seqs = 0;
    const int32_t* query_start = nullptr;
    const int32_t* seq_lens = nullptr;
    const int32_t* block_tables = nullptr;
    int block_table_stride = 0;
    int num_logits = 0;
    const int32_t* logit_rows = nullptr;
    std::byte* kv = nullptr;
    int64_t kv_blocks = 0;
};

struct AttnItem {
    int32_t seq, t0, n, kv_head;
};

struct Step {
    int tokens = 0, logits = 0, num_seqs = 0;
    const int32_t* query_start = nullptr;
    DevRegion ids, positions, slots, logit_rows, tables, kv;
    int64_t table_row_bytes = 0, kv_block_bytes = 0;
    std::vector<AttnItem> items;  // attention work list, reserved once (no allocation per step)
    std::vector<int32_t> expert_counts;
};

// Host -> device: the step's ids, positions, KV slots, logit rows and block tables.
inline void write_step(Device& dev, const StepMap& m, const StepInputs& in, Step& s) {
    if (in.num_tokens < 1 || in.num_tokens > m.rows_max || in.num_logits < 0 || in.num_logits > m.logit_rows_max ||
        in.num_seqs < 1 || in.num_seqs > m.rows_max)
        fail("spyre step: {} tokens, {} logit rows, {} sequences exceed the planned {} / {} / {}", in.num_tokens,
             in.num_logits, in.num_seqs, m.rows_max, m.logit_rows_max, m.rows_max);
    s.tokens = in.num_tokens;
    s.logits = in.num_logits;
    s.num_seqs = in.num_seqs;
    s.query_start = in.query_start;
    s.ids = dev.region(m.ids, stick_round(m.rows_max * 4), "token ids");
    s.positions = dev.region(m.positions, stick_round(m.rows_max * 4), "positions");
    s.slots = dev.region(m.slots, stick_round(m.rows_max * 8), "kv slots");
    s.logit_rows = dev.region(m.logit_rows, stick_round(m.logit_rows_max * 4), "logit rows");
    s.tables = dev.region(m.tables, m.rows_max * m.table_row_bytes, "block tables");
    s.table_row_bytes = m.table_row_bytes;
    s.kv_block_bytes = m.kv_block_bytes;
    s.kv = {in.kv, in.kv_blocks * m.kv_block_bytes, "kv cache"};
    std::memcpy(s.ids.base, in.token_ids, size_t(in.num_tokens) * 4);
    std::memcpy(s.positions.base, in.positions, size_t(in.num_tokens) * 4);
    std::memcpy(s.slots.base, in.slot_mapping, size_t(in.num_tokens) * 8);
    if (in.num_logits > 0) std::memcpy(s.logit_rows.base, in.logit_rows, size_t(in.num_logits) * 4);
    for (int q = 0; q < in.num_seqs; ++q) {
        const int64_t blocks = ceil_div(in.seq_lens[q], m.block_size);
        if (blocks > m.max_blocks) fail("spyre step: sequence {} needs {} KV blocks, the plan holds {}", q, blocks, m.max_blocks);
        std::memcpy(s.tables.base + q * m.table_row_bytes, in.block_tables + size_t(q) * size_t(in.block_table_stride),
                    size_t(blocks) * 4);
    }
}

// Device -> host: rows x vocab f32 logits out of their stick-padded rows.
inline void read_logits(Device& dev, int64_t off, int64_t rows, int64_t vocab, int64_t row_floats, float* out) {
    const DevRegion r = dev.region(off, rows * row_floats * 4, "logits");
    for (int64_t i = 0; i < rows; ++i) std::memcpy(out + i * vocab, r.base + i * row_floats * 4, size_t(vocab) * 4);
}

// ---- weight upload (startup): host checkpoint rows -> stickified fp16 rows in device memory ------

struct Upload {
    int tensor;          // index into the model's tensor table
    int64_t rows;        // rows of the tensor (1 for vectors)
    RowShape row;        // each row's logical groups, padded to sticks in device memory
    int64_t offset;      // device byte offset
};

inline void upload(Device& dev, const Upload& u, const void* src, DType dtype) {
    const DevRegion r = dev.region(u.offset, u.rows * u.row.bytes(), "weights");
    auto* dst = reinterpret_cast<uint16_t*>(r.base);
    const int64_t gp = pad_halves(u.row.group);
    for (int64_t i = 0; i < u.rows; ++i)
        for (int64_t g = 0; g < u.row.groups; ++g)
            for (int64_t e = 0; e < u.row.group; ++e) {
                const int64_t s = (i * u.row.groups + g) * u.row.group + e;
                float v;
                switch (dtype) {
                    case DType::f32: v = static_cast<const float*>(src)[s]; break;
                    case DType::bf16: v = bf16_to_f32(static_cast<const uint16_t*>(src)[s]); break;
                    case DType::f16: v = f16_to_f32(static_cast<const uint16_t*>(src)[s]); break;
                    default: fail("spyre upload: tensor {} has dtype {}, which the device cannot take", u.tensor, dtype_name(dtype));
                }
                dst[(i * u.row.groups + g) * gp + e] = f2h(v);
            }
}

inline void upload_f32(Device& dev, int64_t off, const float* table, int64_t n) {
    const DevRegion r = dev.region(off, stick_round(n * 4), "constants");
    std::memcpy(r.base, table, size_t(n) * 4);
}

// ---- row-parallel kernels -------------------------------------------------------------------------

// A core's share of `rows`, walked tile by tile: fn(first row, rows in the tile, the copy of the
// double-buffered LX buffers this tile uses).
template <class Plan, class Fn>
void each_row_tile(Core& c, int64_t rows, const Plan& p, Fn&& fn) {
    const RowRange r = rows_of_core(rows, p.cores, c.id());
    int copy = 0;
    for (int64_t t0 = r.begin; t0 < r.end; t0 += p.tile_rows, copy ^= 1) fn(t0, std::min(p.tile_rows, r.end - t0), copy);
}

// Rows of `src` picked by an index array in device memory, tile by tile into `out`: the embedding
// lookup (token ids into the table) and the logit rows' gather (step rows into the hidden states)
// are this one program; their plans name the index buffer and the row tile.
template <class Plan>
void gather_by_index(Device& dev, const Plan& p, int index_buf, int tile_buf, int64_t rows, const DevRegion& index,
                     const DevRegion& src, const DevRegion& out) {
    const int64_t rb = p.row.bytes();
    dev.run(cores_for_rows(rows, p.cores), [&](Core& c) {
        each_row_tile(c, rows, p, [&](int64_t t0, int64_t n, int copy) {
            auto idx = c.buf<int32_t>(p, index_buf, copy);
            auto tile = c.buf<uint16_t>(p, tile_buf, copy);
            const int64_t at = c.load_index(idx, index, t0, n);
            for (int64_t i = 0; i < n; ++i) c.load(tile, i * p.row.padded(), src, int64_t(idx.at(at + i)) * rb, rb);
            c.store(out, t0 * rb, tile, 0, n * rb);
        });
    });
}

template <EmbedPlan P>
void embed(Device& dev, const Step& s, int64_t vocab, int64_t table_off, int64_t out_off) {
    constexpr int64_t rb = P.row.bytes();
    const DevRegion table = dev.region(table_off, vocab * rb, "embedding table");
    const DevRegion out = dev.region(out_off, P.rows_max * rb, "embed output");
    gather_by_index(dev, P, EmbedPlan::ids, EmbedPlan::out, s.tokens, s.ids, table, out);
}

template <NormPlan P>
void rmsnorm(Device& dev, int64_t rows, int64_t in_off, int64_t w_off, float eps, int64_t out_off) {
    constexpr int64_t rb = P.row.bytes(), gp = pad_halves(P.row.group);
    const DevRegion in = dev.region(in_off, P.rows_max * rb, "rmsnorm input");
    const DevRegion wr = dev.region(w_off, gp * 2, "rmsnorm weight");
    const DevRegion out = dev.region(out_off, P.rows_max * rb, "rmsnorm output");
    dev.run(cores_for_rows(rows, P.cores), [&](Core& c) {
        auto w = c.buf<uint16_t>(P, NormPlan::weight);
        c.load(w, 0, wr, 0, gp * 2);
        const uint16_t* wv = w.span(0, P.row.group);
        each_row_tile(c, rows, P, [&](int64_t t0, int64_t n, int copy) {
            auto x = c.buf<uint16_t>(P, NormPlan::in, copy);
            auto y = c.buf<uint16_t>(P, NormPlan::out, copy);
            c.load(x, 0, in, t0 * rb, n * rb);
            for (int64_t i = 0; i < n * P.row.groups; ++i) {
                const uint16_t* xs = x.span(i * gp, P.row.group);
                uint16_t* ys = y.span(i * gp, gp);
                float ss = 0;
                for (int64_t e = 0; e < P.row.group; ++e) ss = std::fma(h2f(xs[e]), h2f(xs[e]), ss);
                const float inv = 1.0f / std::sqrt(ss / float(P.row.group) + eps);
                for (int64_t e = 0; e < P.row.group; ++e) ys[e] = f2h((P.offset + h2f(wv[e])) * (h2f(xs[e]) * inv));
                for (int64_t e = P.row.group; e < gp; ++e) ys[e] = 0;
            }
            c.store(out, t0 * rb, y, 0, n * rb);
        });
    });
}

template <RopePlan P>
void rope(Device& dev, const Step& s, int64_t q_in, int64_t k_in, int64_t q_out, int64_t k_out, int64_t freq_off) {
    constexpr int64_t dp = pad_halves(P.head_dim), qb = P.q_heads * dp * 2, kb = P.k_heads * dp * 2, half = P.rot / 2;
    const DevRegion qi = dev.region(q_in, P.rows_max * qb, "rope q"), ki = dev.region(k_in, P.rows_max * kb, "rope k");
    const DevRegion qo = dev.region(q_out, P.rows_max * qb, "rope q out"), ko = dev.region(k_out, P.rows_max * kb, "rope k out");
    const DevRegion fr = dev.region(freq_off, stick_round(half * 4), "rope inverse frequencies");
    const int64_t rows = s.tokens;
    dev.run(cores_for_rows(rows, P.cores), [&](Core& c) {
        auto freq = c.buf<float>(P, RopePlan::freq);
        c.load(freq, 0, fr, 0, stick_round(half * 4));
        const float* inv_freq = freq.span(0, half);
        auto cs = c.buf<float>(P, RopePlan::cs);
        float* cosv = cs.span(0, half);
        float* sinv = cs.span(half, half);
        each_row_tile(c, rows, P, [&](int64_t t0, int64_t n, int copy) {
            auto pos = c.buf<int32_t>(P, RopePlan::pos, copy);
            auto q = c.buf<uint16_t>(P, RopePlan::q, copy);
            auto k = c.buf<uint16_t>(P, RopePlan::k, copy);
            const int64_t at = c.load_index(pos, s.positions, t0, n);
            c.load(q, 0, qi, t0 * qb, n * qb);
            c.load(k, 0, ki, t0 * kb, n * kb);
            for (int64_t i = 0; i < n; ++i) {
                const float p = float(pos.at(at + i));
                for (int64_t j = 0; j < half; ++j) {
                    const float angle = p * inv_freq[j];
                    cosv[j] = std::cos(angle) * P.mscale;
                    sinv[j] = std::sin(angle) * P.mscale;
                }
                auto rotate = [&](const LxView<uint16_t>& v, int64_t heads) {
                    for (int64_t h = 0; h < heads; ++h) {
                        uint16_t* d = v.span((i * heads + h) * dp, P.rot);
                        for (int64_t j = 0; j < half; ++j) {
                            const float a = h2f(d[j]), b = h2f(d[j + half]);
                            d[j] = f2h(a * cosv[j] - b * sinv[j]);
                            d[j + half] = f2h(b * cosv[j] + a * sinv[j]);
                        }
                    }
                };
                rotate(q, P.q_heads);
                rotate(k, P.k_heads);
            }
            c.store(qo, t0 * qb, q, 0, n * qb);
            c.store(ko, t0 * kb, k, 0, n * kb);
        });
    });
}

template <EltwisePlan P>
void eltwise(Device& dev, int64_t rows, int64_t a_off, int64_t b_off, int64_t out_off) {
    constexpr int64_t rb = P.row.bytes(), ob = P.out_row_bytes();
    using Out = std::conditional_t<P.out_f32, float, uint16_t>;
    auto put = [](float v) {
        if constexpr (P.out_f32) return v;
        else return f2h(v);
    };
    const DevRegion ar = dev.region(a_off, P.rows_max * rb, "elementwise a");
    const DevRegion br = P.inputs() == 2 ? dev.region(b_off, P.rows_max * rb, "elementwise b") : DevRegion{};
    const DevRegion out = dev.region(out_off, P.rows_max * ob, "elementwise out");
    dev.run(cores_for_rows(rows, P.cores), [&](Core& c) {
        each_row_tile(c, rows, P, [&](int64_t t0, int64_t n, int copy) {
            auto a = c.buf<uint16_t>(P, EltwisePlan::a, copy);
            auto y = c.buf<Out>(P, EltwisePlan::out, copy);
            c.load(a, 0, ar, t0 * rb, n * rb);
            const int64_t count = n * P.row.padded();
            const uint16_t* av = a.span(0, count);
            Out* yv = y.span(0, count);
            if constexpr (P.op == Eltwise::silu) {
                for (int64_t i = 0; i < count; ++i) {
                    const float x = h2f(av[i]);
                    yv[i] = put(x * (1.0f / (1.0f + std::exp(-x))));
                }
            } else if constexpr (P.op == Eltwise::scale) {
                for (int64_t i = 0; i < count; ++i) yv[i] = put(h2f(av[i]) * P.factor);
            } else {
                auto b = c.buf<uint16_t>(P, EltwisePlan::b, copy);
                c.load(b, 0, br, t0 * rb, n * rb);
                const uint16_t* bv = b.span(0, count);
                for (int64_t i = 0; i < count; ++i)
                    yv[i] = put(P.op == Eltwise::add ? h2f(av[i]) + h2f(bv[i]) : h2f(av[i]) * h2f(bv[i]));
            }
            c.store(out, t0 * ob, y, 0, n * ob);
        });
    });
}

template <GatherPlan P>
void gather_rows(Device& dev, const Step& s, int64_t in_rows_max, int64_t in_off, int64_t out_off) {
    constexpr int64_t rb = P.row.bytes();
    const DevRegion in = dev.region(in_off, in_rows_max * rb, "gather input");
    const DevRegion out = dev.region(out_off, P.rows_max * rb, "gather output");
    gather_by_index(dev, P, GatherPlan::idx, GatherPlan::rows, s.logits, s.logit_rows, in, out);
}

// Paged KV cache, per block and layer: K [kv_heads][block_size][pad(head_dim)] then V, fp16.
template <KvAppendPlan P>
void kv_append(Device& dev, const Step& s, int64_t k_off, int64_t v_off, int64_t layer_k, int64_t layer_v) {
    constexpr int64_t dp = pad_halves(P.head_dim), hb = dp * 2, rb = P.kv_heads * hb;
    const DevRegion kr = dev.region(k_off, P.rows_max * rb, "k"), vr = dev.region(v_off, P.rows_max * rb, "v");
    const int64_t rows = s.tokens;
    dev.run(cores_for_rows(rows, P.cores), [&](Core& c) {
        each_row_tile(c, rows, P, [&](int64_t t0, int64_t n, int copy) {
            auto slots = c.buf<int64_t>(P, KvAppendPlan::slots, copy);
            auto k = c.buf<uint16_t>(P, KvAppendPlan::k, copy);
            auto v = c.buf<uint16_t>(P, KvAppendPlan::v, copy);
            const int64_t at = c.load_index(slots, s.slots, t0, n);
            c.load(k, 0, kr, t0 * rb, n * rb);
            c.load(v, 0, vr, t0 * rb, n * rb);
            for (int64_t i = 0; i < n; ++i) {
                const int64_t slot = slots.at(at + i), block = slot / P.block_size, off = slot % P.block_size;
                for (int64_t h = 0; h < P.kv_heads; ++h) {
                    const int64_t row = (h * P.block_size + off) * hb;
                    c.store(s.kv, block * s.kv_block_bytes + layer_k + row, k, (i * P.kv_heads + h) * dp, hb);
                    c.store(s.kv, block * s.kv_block_bytes + layer_v + row, v, (i * P.kv_heads + h) * dp, hb);
                }
            }
        });
    });
}

// ---- linear -----------------------------------------------------------------------------------------

struct LinearArgs {
    int64_t x = -1, w = -1, w2 = -1, bias = -1, res = -1, y = -1, index = -1;
};

// Weight rows behind output stick `s`: a stick holds 64 padded columns of one output group.
template <LinearPlan P>
constexpr int64_t first_weight_row(int64_t s, int64_t& count) {
    constexpr int64_t spg = pad_halves(P.out.group) / kStickHalves;
    const int64_t c0 = (s % spg) * kStickHalves;
    count = std::min<int64_t>(kStickHalves, P.out.group - c0);
    return (s / spg) * P.out.group + c0;
}

template <LinearPlan P>
void linear(Device& dev, int64_t rows, const LinearArgs& a) {
    if (rows <= 0) return;
    constexpr int64_t xrow = P.k_sticks * kStickBytes, eb = P.out_elem_bytes(), yrow = P.out.padded() * eb;
    constexpr int64_t cols = P.tile_n * kStickHalves, kw = P.tile_k * kStickHalves, nst = P.out.sticks();
    constexpr bool stationary = P.tile_k == P.k_sticks;  // the core's weight tile stays while rows stream
    const DevRegion x = dev.region(a.x, P.rows_max * xrow, "linear input");
    const DevRegion w = dev.region(a.w, P.out.logical() * xrow, "linear weight");
    const DevRegion w2 = P.swiglu ? dev.region(a.w2, P.out.logical() * xrow, "linear up weight") : DevRegion{};
    const DevRegion bias = P.bias ? dev.region(a.bias, P.out.bytes(), "linear bias") : DevRegion{};
    const DevRegion res = P.residual ? dev.region(a.res, P.rows_max * P.out.bytes(), "linear residual") : DevRegion{};
    const DevRegion y = dev.region(a.y, P.rows_max * (P.scatter ? P.index_div : 1) * yrow, "linear output");
    const DevRegion index = P.gather || P.scatter ? dev.region(a.index, stick_round(P.rows_max * 4), "row list") : DevRegion{};
    dev.run(P.cores, [&](Core& c) {
        const int64_t s0 = c.id() * P.sticks_per_core, s1 = std::min(nst, s0 + P.sticks_per_core);
        int wcopy = 0, xcopy = 0, mcopy = 0;
        auto load_w = [&](int copy, int64_t nt, int64_t nn, int64_t kt, int64_t kk) {
            auto wb = c.buf<uint16_t>(P, LinearPlan::w, copy);
            auto wb2 = c.buf<uint16_t>(P, LinearPlan::w2, copy);
            for (int64_t s = nt; s < nt + nn; ++s) {
                int64_t count;
                const int64_t row0 = first_weight_row<P>(s, count);
                for (int64_t r = 0; r < count; ++r) {
                    const int64_t dst = ((s - nt) * kStickHalves + r) * kw;
                    c.load(wb, dst, w, (row0 + r) * xrow + kt * kStickBytes, kk * kStickBytes);
                    if constexpr (P.swiglu) c.load(wb2, dst, w2, (row0 + r) * xrow + kt * kStickBytes, kk * kStickBytes);
                }
            }
        };
        for (int64_t nt = s0; nt < s1; nt += P.tile_n, wcopy ^= 1) {
            const int64_t nn = std::min(P.tile_n, s1 - nt);
            int64_t valid[P.tile_n];  // real (unpadded) columns of each output stick of the tile
            for (int64_t s = 0; s < nn; ++s) first_weight_row<P>(nt + s, valid[s]);
            if constexpr (stationary) load_w(wcopy, nt, nn, 0, P.k_sticks);
            auto bt = c.buf<uint16_t>(P, LinearPlan::bias_t, wcopy);
            if constexpr (P.bias) c.load(bt, 0, bias, nt * kStickBytes, nn * kStickBytes);
            for (int64_t mt = 0; mt < rows; mt += P.tile_rows, mcopy ^= 1) {
                const int64_t mm = std::min(P.tile_rows, rows - mt);
                auto idx = c.buf<int32_t>(P, LinearPlan::idx, mcopy);
                int64_t at = 0;
                if constexpr (P.gather || P.scatter) at = c.load_index(idx, index, mt, mm);
                auto acc = c.buf<float>(P, LinearPlan::acc);
                auto acc2 = c.buf<float>(P, LinearPlan::acc2);
                std::fill_n(acc.span(0, mm * cols), mm * cols, 0.0f);
                if constexpr (P.swiglu) std::fill_n(acc2.span(0, mm * cols), mm * cols, 0.0f);
                for (int64_t kt = 0; kt < P.k_sticks; kt += P.tile_k, xcopy ^= 1) {
                    const int64_t kk = std::min(P.tile_k, P.k_sticks - kt);
                    auto xb = c.buf<uint16_t>(P, LinearPlan::x, xcopy);
                    for (int64_t i = 0; i < mm; ++i) {
                        const int64_t src = P.gather ? int64_t(idx.at(at + i)) / P.index_div : mt + i;
                        c.load(xb, i * kw, x, src * xrow + kt * kStickBytes, kk * kStickBytes);
                    }
                    const int wc = stationary ? wcopy : xcopy;
                    if constexpr (!stationary) load_w(wc, nt, nn, kt, kk);
                    auto wb = c.buf<uint16_t>(P, LinearPlan::w, wc);
                    auto wb2 = c.buf<uint16_t>(P, LinearPlan::w2, wc);
                    for (int64_t i = 0; i < mm; ++i) {
                        const uint16_t* xr = xb.span(i * kw, kk * kStickHalves);
                        float* ar = acc.span(i * cols, nn * kStickHalves);
                        for (int64_t s = 0; s < nn; ++s)
                            for (int64_t r = 0; r < valid[s]; ++r) {
                                const int64_t j = s * kStickHalves + r;
                                ar[j] += dot_f16(xr, wb.span(j * kw, kk * kStickHalves), kk * kStickHalves);
                                if constexpr (P.swiglu)
                                    acc2.at(i * cols + j) += dot_f16(xr, wb2.span(j * kw, kk * kStickHalves), kk * kStickHalves);
                            }
                    }
                }
                // Epilogue: bias, residual or SwiGLU, round, store.
                auto rt = c.buf<uint16_t>(P, LinearPlan::res, mcopy);
                if constexpr (P.residual)
                    for (int64_t i = 0; i < mm; ++i)
                        c.load(rt, i * cols, res, (mt + i) * P.out.bytes() + nt * kStickBytes, nn * kStickBytes);
                using Out = std::conditional_t<P.out_f32, float, uint16_t>;
                auto yt = c.buf<Out>(P, LinearPlan::y, mcopy);
                for (int64_t i = 0; i < mm; ++i) {
                    Out* yr = yt.span(i * cols, nn * kStickHalves);
                    const float* ar = acc.span(i * cols, nn * kStickHalves);
                    for (int64_t s = 0; s < nn; ++s)
                        for (int64_t r = 0; r < kStickHalves; ++r) {
                            const int64_t j = s * kStickHalves + r;
                            float v = 0;
                            if (r < valid[s]) {
                                v = ar[j];
                                if constexpr (P.swiglu) v = v * (1.0f / (1.0f + std::exp(-v))) * acc2.at(i * cols + j);
                                if constexpr (P.bias) v += h2f(bt.at(j));
                                if constexpr (P.residual) v = h2f(rt.at(i * cols + j)) + v;
                            }
                            if constexpr (P.out_f32) yr[j] = v;
                            else yr[j] = f2h(v);
                        }
                }
                for (int64_t i = 0; i < mm; ++i) {
                    const int64_t dst = P.scatter ? int64_t(idx.at(at + i)) : mt + i;
                    c.store(y, dst * yrow + nt * kStickHalves * eb, yt, i * cols, nn * kStickHalves * eb);
                }
            }
        }
    });
}

// ---- attention ----------------------------------------------------------------------------------------

template <AttentionPlan P>
void attention(Device& dev, Step& s, int64_t q_off, int64_t layer_k, int64_t layer_v, float scale, int64_t out_off) {
    constexpr int64_t G = P.group(), dp = P.dp(), D = P.head_dim, BS = P.block_size;
    constexpr int64_t qrow = P.q_heads * dp * 2, grp = G * dp * 2, kvblock = BS * dp * 2;
    const DevRegion q = dev.region(q_off, P.rows_max * qrow, "attention q");
    const DevRegion out = dev.region(out_off, P.rows_max * qrow, "attention output");
    // Work list: each sequence's query tokens in tiles of tile_q, times the kv heads.
    s.items.clear();
    for (int seq = 0; seq < s.num_seqs; ++seq)
        for (int32_t t0 = s.query_start[seq]; t0 < s.query_start[seq + 1]; t0 += int32_t(P.tile_q))
            for (int32_t h = 0; h < P.kv_heads; ++h)
                s.items.push_back({seq, t0, int32_t(std::min<int64_t>(P.tile_q, s.query_start[seq + 1] - t0)), h});
    const int ncores = int(std::min<size_t>(size_t(P.cores), s.items.size()));
    dev.run(ncores, [&](Core& c) {
        int icopy = 0, bcopy = 0;
        auto table = c.buf<int32_t>(P, AttentionPlan::table);
        auto scores = c.buf<float>(P, AttentionPlan::scores);
        auto acc = c.buf<float>(P, AttentionPlan::acc);
        auto ml = c.buf<float>(P, AttentionPlan::ml);
        for (size_t it = size_t(c.id()); it < s.items.size(); it += size_t(ncores), icopy ^= 1) {
            const AttnItem item = s.items[it];
            c.load(table, 0, s.tables, item.seq * s.table_row_bytes, s.table_row_bytes);
            auto pos = c.buf<int32_t>(P, AttentionPlan::pos, icopy);
            auto qt = c.buf<uint16_t>(P, AttentionPlan::q, icopy);
            auto ot = c.buf<uint16_t>(P, AttentionPlan::out, icopy);
            const int64_t at = c.load_index(pos, s.positions, item.t0, item.n);
            for (int64_t i = 0; i < item.n; ++i) c.load(qt, i * G * dp, q, (item.t0 + i) * qrow + item.kv_head * grp, grp);
            const int64_t rows = item.n * G;
            float* m = ml.span(0, rows);
            float* l = ml.span(rows, rows);
            std::fill_n(m, rows, -std::numeric_limits<float>::infinity());
            std::fill_n(l, rows, 0.0f);
            std::fill_n(acc.span(0, rows * dp), rows * dp, 0.0f);
            // Keys [first(p), p] for a token at position p: all of them, or the last `window`.
            auto first = [&](int64_t p) { return P.window > 0 ? std::max<int64_t>(0, p - P.window + 1) : int64_t(0); };
            int64_t ctx_max = 0, first_min = std::numeric_limits<int64_t>::max();
            for (int64_t i = 0; i < item.n; ++i) {
                ctx_max = std::max<int64_t>(ctx_max, pos.at(at + i) + 1);
                first_min = std::min(first_min, first(pos.at(at + i)));
            }
            for (int64_t blk = first_min / BS; blk * BS < ctx_max; ++blk, bcopy ^= 1) {
                const int64_t block = table.at(blk);
                auto kt = c.buf<uint16_t>(P, AttentionPlan::k, bcopy);
                auto vt = c.buf<uint16_t>(P, AttentionPlan::v, bcopy);
                const int64_t head = block * s.kv_block_bytes + item.kv_head * kvblock;
                c.load(kt, 0, s.kv, head + layer_k, kvblock);
                c.load(vt, 0, s.kv, head + layer_v, kvblock);
                for (int64_t i = 0; i < item.n; ++i) {
                    const int64_t p = pos.at(at + i);
                    const int64_t j0 = std::max<int64_t>(0, first(p) - blk * BS), nv = std::min<int64_t>(BS, p + 1 - blk * BS);
                    if (nv <= j0) continue;  // causal (and windowed): none of this block is in the token's context
                    for (int64_t g = 0; g < G; ++g) {
                        const int64_t row = i * G + g;
                        const uint16_t* qh = qt.span(row * dp, D);
                        float* sc = scores.span(row * BS, nv);
                        float bm = -std::numeric_limits<float>::infinity();
                        for (int64_t j = j0; j < nv; ++j) {
                            sc[j] = dot_f16(qh, kt.span(j * dp, D), D) * scale;
                            if constexpr (P.softcap > 0) sc[j] = P.softcap * std::tanh(sc[j] / P.softcap);
                            bm = std::max(bm, sc[j]);
                        }
                        const float m_new = std::max(m[row], bm);
                        const float alpha = std::exp(m[row] - m_new);  // 0 on the first block
                        float* ar = acc.span(row * dp, D);
                        l[row] *= alpha;
                        for (int64_t d = 0; d < D; ++d) ar[d] *= alpha;
                        for (int64_t j = j0; j < nv; ++j) {
                            const float w = std::exp(sc[j] - m_new);
                            l[row] += w;
                            const uint16_t* vr = vt.span(j * dp, D);
                            for (int64_t d = 0; d < D; ++d) ar[d] = std::fma(w, h2f(vr[d]), ar[d]);
                        }
                        m[row] = m_new;
                    }
                }
            }
            for (int64_t row = 0; row < rows; ++row) {
                const float inv = 1.0f / l[row];
                const float* ar = acc.span(row * dp, D);
                uint16_t* o = ot.span(row * dp, dp);
                for (int64_t d = 0; d < D; ++d) o[d] = f2h(ar[d] * inv);
                for (int64_t d = D; d < dp; ++d) o[d] = 0;
            }
            for (int64_t i = 0; i < item.n; ++i) c.store(out, (item.t0 + i) * qrow + item.kv_head * grp, ot, i * G * dp, grp);
        }
    });
}

// ---- MoE ----------------------------------------------------------------------------------------------

// Routing on one core: softmax over the f32 router logits, top-k (ties to the lower expert id, as
// transformers' topk on CPU), optional renormalization; each row's ids/weights go to `top`, and
// (row * top_k + j) is appended to its expert's list, kept in LX and stored at the end.
template <MoeRoutePlan P>
void moe_route(Device& dev, Step& s, int64_t rows, int64_t logits_off, int64_t top_off, int64_t lists_off, int64_t counts_off) {
    constexpr int64_t E = P.experts, K = P.top_k, lrow = pad_halves(E) * 4, trow = P.top_row_bytes();
    constexpr int64_t list_stride = stick_round(P.rows_max * 4);
    const DevRegion lg = dev.region(logits_off, P.rows_max * lrow, "router logits");
    const DevRegion top = dev.region(top_off, P.rows_max * trow, "top-k");
    const DevRegion lists = dev.region(lists_off, E * list_stride, "expert row lists");
    const DevRegion counts = dev.region(counts_off, stick_round(E * 4), "expert counts");
    dev.run(1, [&](Core& c) {
        auto lst = c.buf<int32_t>(P, MoeRoutePlan::lists);
        auto cnt = c.buf<int32_t>(P, MoeRoutePlan::counts);
        std::fill_n(cnt.span(0, E), E, 0);
        int copy = 0;
        for (int64_t t0 = 0; t0 < rows; t0 += P.tile_rows, copy ^= 1) {
            const int64_t n = std::min(P.tile_rows, rows - t0);
            auto lt = c.buf<float>(P, MoeRoutePlan::logits, copy);
            auto tt = c.buf<int32_t>(P, MoeRoutePlan::top, copy);
            c.load(lt, 0, lg, t0 * lrow, n * lrow);
            for (int64_t i = 0; i < n; ++i) {
                float* p = lt.span(i * (lrow / 4), E);
                float mx = -std::numeric_limits<float>::infinity();
                for (int64_t e = 0; e < E; ++e) mx = std::max(mx, p[e]);
                float z = 0;
                for (int64_t e = 0; e < E; ++e) z += (p[e] = std::exp(p[e] - mx));
                for (int64_t e = 0; e < E; ++e) p[e] /= z;
                int32_t* ids = tt.span(i * (trow / 4), K);
                float* wts = reinterpret_cast<float*>(tt.span(i * (trow / 4) + K, K));
                float wsum = 0;
                for (int64_t j = 0; j < K; ++j) {
                    int64_t best = -1;
                    for (int64_t e = 0; e < E; ++e) {
                        bool taken = false;
                        for (int64_t q = 0; q < j; ++q) taken |= ids[q] == e;
                        if (!taken && (best < 0 || p[e] > p[best])) best = e;
                    }
                    ids[j] = int32_t(best);
                    wts[j] = p[best];
                    wsum += p[best];
                    int32_t& count = cnt.at(best);
                    lst.at(best * (list_stride / 4) + count) = int32_t((t0 + i) * K + j);
                    ++count;
                }
                if constexpr (P.normalize)
                    for (int64_t j = 0; j < K; ++j) wts[j] /= wsum;
            }
            c.store(top, t0 * trow, tt, 0, n * trow);
        }
        for (int64_t e = 0; e < E; ++e)
            if (cnt.at(e) > 0) c.store(lists, e * list_stride, lst, e * (list_stride / 4), stick_round(cnt.at(e) * 4));
        c.store(counts, 0, cnt, 0, stick_round(E * 4));
    });
    // The sequencer reads the per-expert row counts back to size the expert GEMMs.
    s.expert_counts.resize(size_t(E));
    std::memcpy(s.expert_counts.data(), counts.base, size_t(E) * 4);
}

template <MoeCombinePlan P>
void moe_combine(Device& dev, int64_t rows, int64_t top_off, int64_t y_off, int64_t res_off, int64_t out_off) {
    constexpr int64_t K = P.top_k, rb = P.row.bytes(), trow = stick_round(K * 8), W = P.row.padded();
    static_assert(K <= 64, "the combine orders at most 64 experts per row");
    const DevRegion top = dev.region(top_off, P.rows_max * trow, "top-k");
    const DevRegion y = dev.region(y_off, P.rows_max * K * rb, "expert outputs");
    const DevRegion res = P.residual ? dev.region(res_off, P.rows_max * rb, "moe residual") : DevRegion{};
    const DevRegion out = dev.region(out_off, P.rows_max * rb, "moe output");
    dev.run(cores_for_rows(rows, P.cores), [&](Core& c) {
        each_row_tile(c, rows, P, [&](int64_t t0, int64_t n, int copy) {
            auto tt = c.buf<int32_t>(P, MoeCombinePlan::top, copy);
            auto yt = c.buf<uint16_t>(P, MoeCombinePlan::y, copy);
            auto rt = c.buf<uint16_t>(P, MoeCombinePlan::res, copy);
            auto ot = c.buf<uint16_t>(P, MoeCombinePlan::out, copy);
            c.load(tt, 0, top, t0 * trow, n * trow);
            c.load(yt, 0, y, t0 * K * rb, n * K * rb);
            if constexpr (P.residual) c.load(rt, 0, res, t0 * rb, n * rb);
            for (int64_t i = 0; i < n; ++i) {
                const int32_t* ids = tt.span(i * (trow / 4), K);
                const float* wts = reinterpret_cast<const float*>(tt.span(i * (trow / 4) + K, K));
                int order[64];
                for (int64_t j = 0; j < K; ++j) order[j] = int(j);
                std::sort(order, order + K, [&](int a, int b) { return ids[a] < ids[b]; });
                uint16_t* o = ot.span(i * W, W);
                for (int64_t e = 0; e < W; ++e) {
                    float sum = 0;
                    for (int64_t q = 0; q < K; ++q) {
                        const int j = order[q];
                        sum = sum + h2f(yt.at((i * K + j) * W + e)) * wts[j];
                    }
                    o[e] = f2h(P.residual ? h2f(rt.at(i * W + e)) + sum : sum);
                }
            }
            c.store(out, t0 * rb, ot, 0, n * rb);
        });
    });
}

}  // namespace scr::kernels::spyre
