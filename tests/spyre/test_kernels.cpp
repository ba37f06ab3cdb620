// The Spyre kernels against naive double-precision references, each run with a scratchpad of
// exactly its plan's resident bytes (so a kernel that needed one byte more than planned would fail
// its bounds checks), on partial tiles, split K, padded head groups, gathers and scatters, and a
// paged KV cache with shuffled blocks and mixed prefill / decode sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/spyre/ops.hpp"

namespace sp = scr::kernels::spyre;
using sp::RowShape;

namespace {

scr::ThreadPool& pool() {
    static scr::ThreadPool p(2);
    return p;
}

float half(float v) { return scr::f16_to_f32(scr::f32_to_f16(v)); }

// Random logical values, rounded to fp16 (what the device holds), [rows][groups * group].
std::vector<float> random_rows(int64_t rows, const RowShape& r, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> nd(0.0f, scale);
    std::vector<float> v(size_t(rows * r.logical()));
    for (auto& x : v) x = half(nd(rng));
    return v;
}

void put_rows(sp::Device& dev, int64_t off, const std::vector<float>& v, int64_t rows, const RowShape& r) {
    auto* d = reinterpret_cast<uint16_t*>(dev.host_view(off));
    const int64_t gp = sp::pad_halves(r.group);
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t g = 0; g < r.groups; ++g)
            for (int64_t e = 0; e < gp; ++e)
                d[(i * r.groups + g) * gp + e] =
                    e < r.group ? scr::f32_to_f16(v[size_t((i * r.groups + g) * r.group + e)]) : uint16_t(0);
}

// Reads logical values back; every padding element must be zero.
std::vector<float> get_rows(sp::Device& dev, int64_t off, int64_t rows, const RowShape& r) {
    const auto* d = reinterpret_cast<const uint16_t*>(dev.host_view(off));
    const int64_t gp = sp::pad_halves(r.group);
    std::vector<float> v(size_t(rows * r.logical()));
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t g = 0; g < r.groups; ++g)
            for (int64_t e = 0; e < gp; ++e) {
                const uint16_t h = d[(i * r.groups + g) * gp + e];
                if (e < r.group) v[size_t((i * r.groups + g) * r.group + e)] = scr::f16_to_f32(h);
                else EXPECT_EQ(h, 0) << "padding of row " << i << " group " << g << " element " << e;
            }
    return v;
}

// |got - want| within fp16's rounding of the result (2^-11 relative) plus f32 accumulation slack.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, const char* what) {
    ASSERT_EQ(got.size(), want.size());
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (std::abs(double(got[i]) - want[i]) > rel * std::max(1.0, std::abs(want[i])) && ++bad <= 5)
            ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", reference " << want[i];
    EXPECT_EQ(bad, 0) << what;
}

template <class P>
int64_t lx_of(const P& p) {
    return sp::resident_bytes(p);
}

// ---- linear ---------------------------------------------------------------------------------------

struct LinearCase {
    RowShape in;
    int64_t rows;
};

template <sp::LinearPlan P>
void check_linear(const LinearCase& c, uint32_t seed) {
    static_assert(P.valid());
    ASSERT_EQ(c.in.sticks(), P.k_sticks);
    std::mt19937 rng(seed);
    const int64_t N = P.out.logical(), K = c.in.logical(), index_rows = P.scatter ? P.rows_max * P.index_div : P.rows_max;
    const RowShape wrow = c.in;
    auto x = random_rows(P.rows_max, c.in, rng);
    auto w = random_rows(N, wrow, rng, 1.0f / std::sqrt(float(K)));
    auto w2 = random_rows(N, wrow, rng, 1.0f / std::sqrt(float(K)));
    auto bias = random_rows(1, P.out, rng);
    auto res = random_rows(P.rows_max, P.out, rng);
    // Row list for gather/scatter: distinct slots, input row = slot / index_div.
    std::vector<int32_t> list(size_t(P.rows_max * P.index_div));
    std::iota(list.begin(), list.end(), 0);
    std::shuffle(list.begin(), list.end(), rng);
    list.resize(size_t(P.rows_max));

    const int64_t xo = 0, wo = xo + P.rows_max * c.in.bytes(), w2o = wo + N * wrow.bytes(), bo = w2o + N * wrow.bytes(),
                  ro = bo + sp::stick_round(P.out.bytes()), yo = ro + P.rows_max * P.out.bytes(),
                  io = yo + index_rows * P.out.padded() * P.out_elem_bytes(), total = io + sp::stick_round(P.rows_max * 4);
    sp::Device dev(total, lx_of(P), pool());
    put_rows(dev, xo, x, P.rows_max, c.in);
    put_rows(dev, wo, w, N, wrow);
    put_rows(dev, w2o, w2, N, wrow);
    put_rows(dev, bo, bias, 1, P.out);
    put_rows(dev, ro, res, P.rows_max, P.out);
    std::memcpy(dev.host_view(io), list.data(), list.size() * 4);
    sp::LinearArgs a{.x = xo, .w = wo, .w2 = w2o, .bias = bo, .res = ro, .y = yo, .index = io};
    sp::linear<P>(dev, c.rows, a);

    std::vector<double> want;
    std::vector<float> got;
    for (int64_t t = 0; t < c.rows; ++t) {
        const int64_t src = P.gather ? list[size_t(t)] / P.index_div : t;
        const int64_t dst = P.scatter ? list[size_t(t)] : t;
        for (int64_t n = 0; n < N; ++n) {
            double g = 0, u = 0;
            for (int64_t k = 0; k < K; ++k) {
                g += double(x[size_t(src * K + k)]) * w[size_t(n * K + k)];
                u += double(x[size_t(src * K + k)]) * w2[size_t(n * K + k)];
            }
            double v = P.swiglu ? g / (1 + std::exp(-g)) * u : g;
            if (P.bias) v += bias[size_t(n)];
            if (P.residual) v += res[size_t(dst * N + n)];
            want.push_back(v);
            if constexpr (P.out_f32) {
                const int64_t spg = sp::pad_halves(P.out.group);
                const auto* y = reinterpret_cast<const float*>(dev.host_view(yo));
                got.push_back(y[dst * P.out.padded() + (n / P.out.group) * spg + n % P.out.group]);
            }
        }
        if constexpr (!P.out_f32) {
            const RowShape o = P.out;
            auto row = get_rows(dev, yo + dst * o.bytes(), 1, o);
            got.insert(got.end(), row.begin(), row.end());
        }
    }
    expect_close(got, want, P.out_f32 ? 2e-5 : 1.2e-3, "linear");
}

// K split in tiles of 2 sticks (last one partial), 3 cores x 2 output sticks, row tiles of 7 with a
// partial last one, bias and residual.
constexpr sp::LinearPlan kSplitK{.rows_max = 40, .k_sticks = 3, .out = {.groups = 1, .group = 200}, .cores = 2,
                                 .sticks_per_core = 2, .tile_rows = 7, .tile_n = 1, .tile_k = 2, .bias = true,
                                 .residual = true};
TEST(SpyreLinear, SplitKPartialTilesBiasResidual) { check_linear<kSplitK>({{1, 150}, 33}, 1); }

// Output of 5 heads x 16 (each head its own padded stick), input of 3 heads x 40, weights stationary.
constexpr sp::LinearPlan kHeads{.rows_max = 19, .k_sticks = 3, .out = {.groups = 5, .group = 16}, .cores = 3,
                                .sticks_per_core = 2, .tile_rows = 19, .tile_n = 2, .tile_k = 3};
TEST(SpyreLinear, PaddedHeadGroupsInAndOut) { check_linear<kHeads>({{3, 40}, 19}, 2); }

constexpr sp::LinearPlan kSwiglu{.rows_max = 16, .k_sticks = 2, .out = {.groups = 1, .group = 96}, .cores = 2,
                                 .sticks_per_core = 1, .tile_rows = 5, .tile_n = 1, .tile_k = 1, .swiglu = true};
TEST(SpyreLinear, SwiGLU) { check_linear<kSwiglu>({{1, 96}, 16}, 3); }

constexpr sp::LinearPlan kExpert{.rows_max = 12, .k_sticks = 1, .out = {.groups = 1, .group = 64}, .cores = 1,
                                 .sticks_per_core = 1, .tile_rows = 4, .tile_n = 1, .tile_k = 1, .swiglu = true,
                                 .gather = true, .index_div = 2};
TEST(SpyreLinear, GatheredRows) { check_linear<kExpert>({{1, 64}, 9}, 4); }

constexpr sp::LinearPlan kScatter{.rows_max = 12, .k_sticks = 1, .out = {.groups = 1, .group = 70}, .cores = 2,
                                  .sticks_per_core = 1, .tile_rows = 5, .tile_n = 1, .tile_k = 1, .scatter = true,
                                  .index_div = 3};
TEST(SpyreLinear, ScatteredRows) { check_linear<kScatter>({{1, 50}, 11}, 5); }

constexpr sp::LinearPlan kLogits{.rows_max = 6, .k_sticks = 2, .out = {.groups = 1, .group = 300}, .cores = 3,
                                 .sticks_per_core = 2, .tile_rows = 6, .tile_n = 2, .tile_k = 2, .out_f32 = true};
TEST(SpyreLinear, F32Logits) { check_linear<kLogits>({{1, 100}, 4}, 6); }

TEST(SpyreLinear, ZeroRowsDoNothing) {
    sp::Device dev(1 << 20, lx_of(kLogits), pool());
    EXPECT_NO_THROW(sp::linear<kLogits>(dev, 0, {.x = 0, .w = 0, .y = 0}));
    EXPECT_EQ(dev.bytes_moved(), 0);
}

// ---- row kernels ------------------------------------------------------------------------------------

constexpr sp::NormPlan kQNorm{.rows_max = 20, .row = {.groups = 3, .group = 40}, .cores = 4, .tile_rows = 2};
TEST(SpyreRows, RmsNormPerHead) {
    std::mt19937 rng(7);
    constexpr auto P = kQNorm;
    auto x = random_rows(P.rows_max, P.row, rng, 3.0f);
    auto w = random_rows(1, {1, P.row.group}, rng);
    const int64_t xo = 0, wo = P.rows_max * P.row.bytes(), yo = wo + 128, total = yo + P.rows_max * P.row.bytes();
    sp::Device dev(total, lx_of(P), pool());
    put_rows(dev, xo, x, P.rows_max, P.row);
    put_rows(dev, wo, w, 1, {1, P.row.group});
    const int rows = 17;
    sp::rmsnorm<P>(dev, rows, xo, wo, 1e-6f, yo);
    std::vector<double> want;
    for (int t = 0; t < rows * P.row.groups; ++t) {
        double ss = 0;
        for (int e = 0; e < P.row.group; ++e) ss += double(x[size_t(t * P.row.group + e)]) * x[size_t(t * P.row.group + e)];
        const double inv = 1 / std::sqrt(ss / P.row.group + 1e-6);
        for (int e = 0; e < P.row.group; ++e) want.push_back(w[size_t(e)] * x[size_t(t * P.row.group + e)] * inv);
    }
    expect_close(get_rows(dev, yo, rows, P.row), want, 1.2e-3, "rmsnorm");
}

constexpr sp::RopePlan kRope{.rows_max = 9, .q_heads = 4, .k_heads = 2, .head_dim = 24, .rot = 16, .cores = 3, .tile_rows = 2};
TEST(SpyreRows, RopePartialRotary) {
    std::mt19937 rng(8);
    constexpr auto P = kRope;
    const RowShape qr{P.q_heads, P.head_dim}, kr{P.k_heads, P.head_dim};
    auto q = random_rows(P.rows_max, qr, rng), k = random_rows(P.rows_max, kr, rng);
    std::vector<float> inv(size_t(P.rot / 2));
    for (size_t i = 0; i < inv.size(); ++i) inv[i] = float(std::pow(10000.0, -2.0 * double(i) / double(P.rot)));
    std::vector<int32_t> pos = {0, 5, 17, 3, 100, 101, 7, 250, 31};
    const int64_t qo = 0, ko = qo + P.rows_max * qr.bytes(), fo = ko + P.rows_max * kr.bytes(), po = fo + 128,
                  total = po + 128;
    sp::Device dev(total, lx_of(P), pool());
    put_rows(dev, qo, q, P.rows_max, qr);
    put_rows(dev, ko, k, P.rows_max, kr);
    sp::upload_f32(dev, fo, inv.data(), int64_t(inv.size()));
    sp::Step s;
    s.tokens = 9;
    s.positions = dev.region(po, 128, "positions");
    std::memcpy(s.positions.base, pos.data(), pos.size() * 4);
    sp::rope<P>(dev, s, qo, ko, qo, ko, fo);  // in place, as the compiler plans it
    auto rotate = [&](const std::vector<float>& v, int64_t heads) {
        std::vector<double> out;
        for (int t = 0; t < 9; ++t)
            for (int64_t h = 0; h < heads; ++h)
                for (int64_t e = 0; e < P.head_dim; ++e) {
                    const float* x = &v[size_t((t * heads + h) * P.head_dim)];
                    const int64_t half = P.rot / 2;
                    if (e >= P.rot) { out.push_back(x[e]); continue; }
                    const int64_t i = e % half;
                    const double a = double(float(pos[size_t(t)]) * inv[size_t(i)]);
                    out.push_back(e < half ? x[i] * std::cos(a) - x[i + half] * std::sin(a)
                                           : x[i + half] * std::cos(a) + x[i] * std::sin(a));
                }
        return out;
    };
    expect_close(get_rows(dev, qo, 9, qr), rotate(q, P.q_heads), 1.5e-3, "rope q");
    expect_close(get_rows(dev, ko, 9, kr), rotate(k, P.k_heads), 1.5e-3, "rope k");
}

constexpr sp::EmbedPlan kEmbed{.rows_max = 30, .row = {.groups = 1, .group = 72}, .cores = 5, .tile_rows = 4};
constexpr sp::GatherPlan kGather{.rows_max = 7, .row = {.groups = 1, .group = 72}, .cores = 3, .tile_rows = 2};
TEST(SpyreRows, EmbedAndGatherAreExactCopies) {
    std::mt19937 rng(9);
    const RowShape r = kEmbed.row;
    auto table = random_rows(50, r, rng);
    std::vector<int32_t> ids(30), which = {29, 0, 13, 13, 5, 28, 1};
    for (auto& i : ids) i = int32_t(rng() % 50);
    const int64_t to = 0, io = 50 * r.bytes(), oo = io + 128, lo = oo + 30 * r.bytes(), go = lo + 128, total = go + 7 * r.bytes();
    sp::Device dev(total, std::max(lx_of(kEmbed), lx_of(kGather)), pool());
    put_rows(dev, to, table, 50, r);
    sp::Step s;
    s.tokens = 30;
    s.logits = 7;
    s.ids = dev.region(io, 128, "ids");
    s.logit_rows = dev.region(lo, 128, "logit rows");
    std::memcpy(s.ids.base, ids.data(), 120);
    std::memcpy(s.logit_rows.base, which.data(), 28);
    sp::embed<kEmbed>(dev, s, 50, to, oo);
    sp::gather_rows<kGather>(dev, s, 30, oo, go);
    auto emb = get_rows(dev, oo, 30, r), gat = get_rows(dev, go, 7, r);
    for (int t = 0; t < 30; ++t)
        for (int e = 0; e < 72; ++e) ASSERT_EQ(emb[size_t(t * 72 + e)], table[size_t(ids[size_t(t)] * 72 + e)]);
    for (int t = 0; t < 7; ++t)
        for (int e = 0; e < 72; ++e) ASSERT_EQ(gat[size_t(t * 72 + e)], emb[size_t(which[size_t(t)] * 72 + e)]);
}

constexpr sp::EltwisePlan kMul{.rows_max = 11, .row = {.groups = 2, .group = 30}, .op = sp::Eltwise::mul, .cores = 4, .tile_rows = 2};
constexpr sp::EltwisePlan kSilu{.rows_max = 11, .row = {.groups = 2, .group = 30}, .op = sp::Eltwise::silu, .cores = 2, .tile_rows = 3};
constexpr sp::EltwisePlan kScaleF32{.rows_max = 11, .row = {.groups = 2, .group = 30}, .op = sp::Eltwise::scale, .cores = 3,
                                    .tile_rows = 2, .factor = 0.0625f, .out_f32 = true};
TEST(SpyreRows, ScaleIntoF32Logits) {
    std::mt19937 rng(14);
    const RowShape r = kScaleF32.row;
    auto a = random_rows(11, r, rng, 8.0f);
    const int64_t ao = 0, yo = 11 * r.bytes();
    sp::Device dev(yo + 11 * r.padded() * 4, lx_of(kScaleF32), pool());
    put_rows(dev, ao, a, 11, r);
    sp::eltwise<kScaleF32>(dev, 11, ao, -1, yo);
    const auto* y = reinterpret_cast<const float*>(dev.host_view(yo));
    for (int t = 0; t < 11; ++t)
        for (int g = 0; g < 2; ++g)
            for (int e = 0; e < 64; ++e) {
                const float want = e < 30 ? a[size_t((t * 2 + g) * 30 + e)] * 0.0625f : 0.0f;
                ASSERT_EQ(y[(t * 2 + g) * 64 + e], want) << t << " " << g << " " << e;  // exact: a power of two, no fp16 rounding
            }
}

TEST(SpyreRows, ElementwiseMulAndSilu) {
    std::mt19937 rng(10);
    const RowShape r = kMul.row;
    auto a = random_rows(11, r, rng, 2.0f), b = random_rows(11, r, rng, 2.0f);
    const int64_t ao = 0, bo = 11 * r.bytes(), mo = 2 * bo, so = 3 * bo;
    sp::Device dev(4 * bo, std::max(lx_of(kMul), lx_of(kSilu)), pool());
    put_rows(dev, ao, a, 11, r);
    put_rows(dev, bo, b, 11, r);
    sp::eltwise<kMul>(dev, 10, ao, bo, mo);
    sp::eltwise<kSilu>(dev, 10, ao, -1, so);
    std::vector<double> wm, ws;
    for (size_t i = 0; i < size_t(10 * r.logical()); ++i) {
        wm.push_back(double(a[i]) * b[i]);
        ws.push_back(a[i] / (1 + std::exp(-double(a[i]))));
    }
    expect_close(get_rows(dev, mo, 10, r), wm, 1e-3, "mul");
    expect_close(get_rows(dev, so, 10, r), ws, 1e-3, "silu");
}

// ---- attention over a paged cache ------------------------------------------------------------------

constexpr int64_t kBS = 4;
constexpr sp::KvAppendPlan kAppend{.rows_max = 24, .kv_heads = 2, .head_dim = 20, .block_size = kBS, .cores = 5, .tile_rows = 2};
constexpr sp::AttentionPlan kAttn{.rows_max = 24, .q_heads = 6, .kv_heads = 2, .head_dim = 20, .block_size = kBS,
                                  .max_blocks = 8, .cores = 4, .tile_q = 3};
// A 5-token sliding window (blocks before it are skipped) and Gemma-2-style soft-capping.
constexpr sp::AttentionPlan kWindowed{.rows_max = 24, .q_heads = 6, .kv_heads = 2, .head_dim = 20, .block_size = kBS,
                                      .max_blocks = 8, .cores = 3, .tile_q = 2, .window = 5, .softcap = 2.5f};

template <sp::AttentionPlan P>
void check_attention(uint32_t seed) {
    std::mt19937 rng(seed);
    const int64_t D = P.head_dim, dp = P.dp(), HQ = P.q_heads, HK = P.kv_heads, G = P.group();
    // Three sequences: 9 cached + 5 new (a prefill chunk), 12 cached + 1 new (decode), 0 + 4 new.
    const std::vector<int> cached = {9, 12, 0}, fresh = {5, 1, 4};
    const int num_blocks = 20, layers = 2, layer = 1;
    const int64_t one = HK * kBS * dp * 2, block_bytes = layers * 2 * one, lk = layer * 2 * one, lv = lk + one;
    std::vector<std::byte> kv(size_t(num_blocks * block_bytes));
    std::vector<int32_t> blocks(static_cast<size_t>(num_blocks));
    std::iota(blocks.begin(), blocks.end(), 0);
    std::shuffle(blocks.begin(), blocks.end(), rng);
    std::vector<std::vector<int32_t>> tables(3);
    for (int s = 0, next = 0; s < 3; ++s)
        for (int j = 0; j < sp::ceil_div(cached[size_t(s)] + fresh[size_t(s)], kBS); ++j) tables[size_t(s)].push_back(blocks[size_t(next++)]);
    // Keys/values of every position of every sequence, fp16-rounded: [seq][pos][head][D].
    std::vector<std::vector<float>> K(3), V(3);
    auto slot_ptr = [&](int s, int pos, int h, int64_t part) {
        const int64_t blk = tables[size_t(s)][size_t(pos / kBS)];
        return reinterpret_cast<uint16_t*>(kv.data() + blk * block_bytes + part + (h * kBS + pos % kBS) * dp * 2);
    };
    for (int s = 0; s < 3; ++s) {
        const int n = cached[size_t(s)] + fresh[size_t(s)];
        K[size_t(s)] = random_rows(n, {HK, D}, rng);
        V[size_t(s)] = random_rows(n, {HK, D}, rng);
        for (int p = 0; p < cached[size_t(s)]; ++p)
            for (int h = 0; h < HK; ++h)
                for (int e = 0; e < D; ++e) {
                    slot_ptr(s, p, h, lk)[e] = scr::f32_to_f16(K[size_t(s)][size_t((p * HK + h) * D + e)]);
                    slot_ptr(s, p, h, lv)[e] = scr::f32_to_f16(V[size_t(s)][size_t((p * HK + h) * D + e)]);
                }
    }
    // The step's tokens: new k/v rows, q rows, positions, slots.
    std::vector<int32_t> qs = {0}, positions, seq_lens;
    std::vector<int64_t> slots;
    std::vector<float> krows, vrows;
    for (int s = 0; s < 3; ++s) {
        for (int i = 0; i < fresh[size_t(s)]; ++i) {
            const int p = cached[size_t(s)] + i;
            positions.push_back(p);
            slots.push_back(int64_t(tables[size_t(s)][size_t(p / kBS)]) * kBS + p % kBS);
            for (int64_t e = 0; e < HK * D; ++e) {
                krows.push_back(K[size_t(s)][size_t(p * HK * D + e)]);
                vrows.push_back(V[size_t(s)][size_t(p * HK * D + e)]);
            }
        }
        qs.push_back(qs.back() + fresh[size_t(s)]);
        seq_lens.push_back(cached[size_t(s)] + fresh[size_t(s)]);
    }
    const int T = qs.back();
    auto q = random_rows(T, {HQ, D}, rng);
    const RowShape qr{HQ, D}, kr{HK, D};
    const int64_t qo = 0, ko = qo + P.rows_max * qr.bytes(), vo = ko + P.rows_max * kr.bytes(), oo = vo + P.rows_max * kr.bytes(),
                  so = oo + P.rows_max * qr.bytes(), po = so + sp::stick_round(P.rows_max * 8), to = po + sp::stick_round(P.rows_max * 4),
                  trow = sp::stick_round(P.max_blocks * 4), total = to + P.rows_max * trow;
    sp::Device dev(total, std::max(lx_of(kAppend), lx_of(P)), pool());
    put_rows(dev, qo, q, T, qr);
    put_rows(dev, ko, krows, T, kr);
    put_rows(dev, vo, vrows, T, kr);
    sp::StepMap map{.ids = so, .positions = po, .slots = so, .logit_rows = so, .tables = to, .rows_max = P.rows_max,
                    .logit_rows_max = 1, .max_blocks = P.max_blocks, .table_row_bytes = trow, .block_size = kBS,
                    .kv_block_bytes = block_bytes};
    std::vector<int32_t> flat_tables(3 * 8, 0), ids(size_t(T), 0);
    for (int s = 0; s < 3; ++s) std::copy(tables[size_t(s)].begin(), tables[size_t(s)].end(), flat_tables.begin() + s * 8);
    sp::Step step;
    step.items.reserve(64);
    // ids are unused here; write_step writes them first and the slots over them.
    sp::write_step(dev, map,
                   {.num_tokens = T, .token_ids = ids.data(), .positions = positions.data(), .slot_mapping = slots.data(),
                    .num_seqs = 3, .query_start = qs.data(), .seq_lens = seq_lens.data(), .block_tables = flat_tables.data(),
                    .block_table_stride = 8, .num_logits = 0, .logit_rows = nullptr, .kv = kv.data(), .kv_blocks = num_blocks},
                   step);
    sp::kv_append<kAppend>(dev, step, ko, vo, lk, lv);
    // The new rows landed in their slots.
    for (int t = 0, s = 0; t < T; ++t) {
        while (t >= qs[size_t(s + 1)]) ++s;
        for (int h = 0; h < HK; ++h)
            for (int e = 0; e < D; ++e)
                ASSERT_EQ(scr::f16_to_f32(slot_ptr(s, positions[size_t(t)], h, lk)[e]), krows[size_t((t * HK + h) * D + e)]);
    }
    const float scale = 1.0f / std::sqrt(float(D));
    sp::attention<P>(dev, step, qo, lk, lv, scale, oo);
    std::vector<double> want;
    for (int t = 0, s = 0; t < T; ++t) {
        while (t >= qs[size_t(s + 1)]) ++s;
        for (int h = 0; h < HQ; ++h) {
            const int kvh = h / int(G), ctx = positions[size_t(t)] + 1;
            const int lo = P.window > 0 ? std::max(0, ctx - int(P.window)) : 0;
            std::vector<double> sc(size_t(ctx), 0.0);
            double mx = -1e300, z = 0;
            for (int p = lo; p < ctx; ++p) {
                double d = 0;
                for (int e = 0; e < D; ++e)
                    d += double(q[size_t((t * HQ + h) * D + e)]) * K[size_t(s)][size_t((p * HK + kvh) * D + e)];
                sc[size_t(p)] = P.softcap > 0 ? P.softcap * std::tanh(d * scale / P.softcap) : d * scale;
                mx = std::max(mx, sc[size_t(p)]);
            }
            for (int p = lo; p < ctx; ++p) z += (sc[size_t(p)] = std::exp(sc[size_t(p)] - mx));
            for (int e = 0; e < D; ++e) {
                double o = 0;
                for (int p = lo; p < ctx; ++p) o += sc[size_t(p)] * V[size_t(s)][size_t((p * HK + kvh) * D + e)];
                want.push_back(o / z);
            }
        }
    }
    expect_close(get_rows(dev, oo, T, qr), want, 1.2e-3, "attention");
}

TEST(SpyreAttention, PagedMixedPrefillAndDecodeMatchesReference) { check_attention<kAttn>(11); }
TEST(SpyreAttention, SlidingWindowAndSoftcapMatchReference) { check_attention<kWindowed>(13); }

// ---- MoE: route + experts + combine against a double reference -------------------------------------

constexpr int64_t kE = 4, kTopK = 2, kH = 64, kF = 80, kRows = 10;
constexpr sp::LinearPlan kRouter{.rows_max = kRows, .k_sticks = 1, .out = {.groups = 1, .group = kE}, .cores = 1,
                                 .sticks_per_core = 1, .tile_rows = 3, .tile_n = 1, .tile_k = 1, .out_f32 = true};
constexpr sp::MoeRoutePlan kRoute{.rows_max = kRows, .experts = kE, .top_k = kTopK, .normalize = true, .tile_rows = 4};
constexpr sp::LinearPlan kUp{.rows_max = kRows, .k_sticks = 1, .out = {.groups = 1, .group = kF}, .cores = 2,
                             .sticks_per_core = 1, .tile_rows = 4, .tile_n = 1, .tile_k = 1, .swiglu = true, .gather = true,
                             .index_div = kTopK};
constexpr sp::LinearPlan kDown{.rows_max = kRows, .k_sticks = 2, .out = {.groups = 1, .group = kH}, .cores = 1,
                               .sticks_per_core = 1, .tile_rows = 4, .tile_n = 1, .tile_k = 2, .scatter = true,
                               .index_div = kTopK};
constexpr sp::MoeCombinePlan kCombine{.rows_max = kRows, .row = {.groups = 1, .group = kH}, .top_k = kTopK, .residual = true,
                                      .cores = 3, .tile_rows = 2};

TEST(SpyreMoe, RouteExpertsCombineMatchReference) {
    std::mt19937 rng(12);
    const RowShape hr{1, kH}, fr{1, kF};
    auto x = random_rows(kRows, hr, rng), res = random_rows(kRows, hr, rng);
    auto router = random_rows(kE, hr, rng, 0.125f);  // logits of order 1: no saturated softmax
    std::vector<std::vector<float>> gate, up, down;
    for (int e = 0; e < kE; ++e) {
        gate.push_back(random_rows(kF, hr, rng, 0.125f));
        up.push_back(random_rows(kF, hr, rng, 0.125f));
        down.push_back(random_rows(kH, fr, rng, 0.11f));
    }
    const int64_t xo = 0, reso = xo + kRows * hr.bytes(), rwo = reso + kRows * hr.bytes(), expert = 2 * kF * hr.bytes() + kH * fr.bytes(),
                  ewo = rwo + kE * hr.bytes(), lo = ewo + kE * expert, topo = lo + kRows * 256, listo = topo + kRows * 128,
                  cnto = listo + kE * 128, acto = cnto + 128, yo = acto + kRows * fr.bytes(), oo = yo + kRows * kTopK * hr.bytes(),
                  total = oo + kRows * hr.bytes();
    sp::Device dev(total, std::max({lx_of(kRouter), lx_of(kRoute), lx_of(kUp), lx_of(kDown), lx_of(kCombine)}), pool());
    put_rows(dev, xo, x, kRows, hr);
    put_rows(dev, reso, res, kRows, hr);
    put_rows(dev, rwo, router, kE, hr);
    for (int e = 0; e < kE; ++e) {
        put_rows(dev, ewo + e * expert, gate[size_t(e)], kF, hr);
        put_rows(dev, ewo + e * expert + kF * hr.bytes(), up[size_t(e)], kF, hr);
        put_rows(dev, ewo + e * expert + 2 * kF * hr.bytes(), down[size_t(e)], kH, fr);
    }
    sp::Step s;
    sp::linear<kRouter>(dev, kRows, {.x = xo, .w = rwo, .y = lo});
    sp::moe_route<kRoute>(dev, s, kRows, lo, topo, listo, cnto);
    ASSERT_EQ(std::accumulate(s.expert_counts.begin(), s.expert_counts.end(), 0), kRows * kTopK);
    for (int e = 0; e < kE; ++e) {
        const int n = s.expert_counts[size_t(e)];
        if (n == 0) continue;
        const int64_t we = ewo + e * expert, list = listo + e * 128;
        sp::linear<kUp>(dev, n, {.x = xo, .w = we, .w2 = we + kF * hr.bytes(), .y = acto, .index = list});
        sp::linear<kDown>(dev, n, {.x = acto, .w = we + 2 * kF * hr.bytes(), .y = yo, .index = list});
    }
    sp::moe_combine<kCombine>(dev, kRows, topo, yo, reso, oo);

    std::vector<double> want;
    for (int t = 0; t < kRows; ++t) {
        std::vector<double> p(kE);
        double mx = -1e300, z = 0;
        for (int e = 0; e < kE; ++e) {
            for (int k = 0; k < kH; ++k) p[size_t(e)] += double(x[size_t(t * kH + k)]) * router[size_t(e * kH + k)];
            mx = std::max(mx, p[size_t(e)]);
        }
        for (auto& v : p) z += (v = std::exp(v - mx));
        std::vector<int> order(kE);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[size_t(a)] > p[size_t(b)]; });
        ASSERT_GT(p[size_t(order[1])] - p[size_t(order[2])], 1e-3 * z) << "row " << t << ": a near tie makes the test ambiguous";
        const double wsum = p[size_t(order[0])] + p[size_t(order[1])];
        std::vector<double> out(kH, 0.0);
        for (int j = 0; j < kTopK; ++j) {
            const int e = order[size_t(j)];
            std::vector<double> act(kF);
            for (int f = 0; f < kF; ++f) {
                double g = 0, u = 0;
                for (int k = 0; k < kH; ++k) {
                    g += double(x[size_t(t * kH + k)]) * gate[size_t(e)][size_t(f * kH + k)];
                    u += double(x[size_t(t * kH + k)]) * up[size_t(e)][size_t(f * kH + k)];
                }
                act[size_t(f)] = g / (1 + std::exp(-g)) * u;
            }
            for (int h = 0; h < kH; ++h) {
                double y = 0;
                for (int f = 0; f < kF; ++f) y += act[size_t(f)] * down[size_t(e)][size_t(h * kF + f)];
                out[size_t(h)] += p[size_t(e)] / wsum * y;
            }
        }
        for (int h = 0; h < kH; ++h) want.push_back(res[size_t(t * kH + h)] + out[size_t(h)]);
    }
    // Three fp16 roundings on the way (activation, expert output, sum) over values of order 1.
    expect_close(get_rows(dev, oo, kRows, hr), want, 3e-3, "moe");
}

}  // namespace
