// scr_cuda_moe: the MoE expert MLPs of kernels/cuda/moe.cuh (moe_experts: SwiGLU experts of every
// (row, pick) pair, summed per row with the routing weights, plus a residual) on the GPU, given a
// routing, in both implementations: grouped expert GEMMs (moe_gemm.cuh) and per-pair GEMVs.
//   * every checked output against a float64 host reference on random non-zero bf16 weights and
//     float32 activations, with a bound carried through the SwiGLU: each dot product may be off by
//     2e-5 * sum_k |w_k x_k| + 1e-6 (x enters the tensor cores as bf16 hi + lo, ~2^-17 relative;
//     float32 accumulation), the activation error follows from silu's slope, and the down
//     projection adds its own term;
//   * batch invariance of the grouped GEMMs: a row's output in a launch of R rows has exactly the
//     bits of the same row launched alone (narrow steps), or of the same row in the launch of the
//     same rows reversed (wide steps: another kernel, its own regime);
//   * routings: uniform (distinct random experts per row) and skewed (every row picks the same
//     experts: long runs cut into many chunks), for the quantized experts also hot (half of each
//     row's picks among K hot experts); outputs poisoned with NaN first.
// Shapes: a small one, the tiny Qwen3-MoE fixture's (H 96, F 64, 4 experts, top 2) and
// Qwen3-30B-A3B's (H 2048, F 768, 128 experts, top 8). Then the quantized experts (moe_quant.cuh:
// MLX int4 g32 / g64 / g128, int8, fp8 per channel and per tensor) against float64 and alone vs
// in a batch, their tensor-core form (forced at every row count) against float64, alone vs in a
// batch and in chunks of 1, 2 and 4 token tiles or a width per expert, its two chains on one
// stream or two (the same bits), and their wide steps (the experts expanded to bf16 hi + lo)
// against float64 and with the rows reversed. Then (unless --no-bench) the time per call at
// Qwen3-30B-A3B's shape: the quantized experts in each form (per pair, grouped GEMVs, tensor cores
// in chunks of 1 / 2 / 4 tiles / per expert 4 or 1 and 4 or 2 on two streams, expanded, the
// default rule on two streams as in the engine) beside the bf16 ones for 1 to 4,096 rows (uniform
// routing) and 32 to 1,024 (hot), and both bf16 implementations for 1 to 2,048 rows.
// Exit: 0 all checks passed, 1 a check failed, 77 no GPU (ctest skips).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/moe_quant.cuh"
#include "tests/cuda/cuda_check.hpp"

using namespace scr::kernels::cuda;
using scr::bf16_t;

namespace {

// Weights come from a counter-based hash, so the device fills 1.2 GB quickly and the host
// reference recomputes any element it needs.
__host__ __device__ inline uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
__host__ __device__ inline float unit(uint64_t seed, uint64_t i) {  // in [-1, 1), never exactly 0 after scaling below
    return float(int64_t(mix(seed * 0x100000001b3ull + i) >> 40) - (int64_t(1) << 23)) / float(1 << 23) + 1.0f / (1 << 24);
}
uint16_t bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest-even, as __float2bfloat16_rn
}
double bf16_value(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
__global__ void fill_bf16(bf16_t* w, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
        w[i] = bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(unit(seed, i) * scale))};
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// A side stream made as the engine makes its own (Ctx::side): `with(c)` is c with it set. (Not
// named SideStream: that is the handles' struct in step.hpp.)
struct TestSideStream {
    OwnedSideStream owned;
    TestSideStream() { CK(owned.create()); }
    Ctx with(Ctx c) const {
        c.side = owned.get();
        return c;
    }
};

template <int H, int F, int E, int K>
struct Shape {
    static constexpr size_t kGate = size_t(F) * H;  // elements of one matrix
    const char* name;
    bf16_t* w = nullptr;  // [3][E][F*H]: gate, up (F x H), down (H x F)
    void** table = nullptr;
    float scale_h = float(1.0 / std::sqrt(double(H))), scale_f = float(1.0 / std::sqrt(double(F)));

    explicit Shape(const char* n) : name(n) {
        CK(cudaMalloc(&w, 3 * E * kGate * sizeof(bf16_t)));
        fill_bf16<<<1024, 256>>>(w, 2 * E * kGate, 11, scale_h);
        fill_bf16<<<1024, 256>>>(w + 2 * E * kGate, E * kGate, 12, scale_f);
        CK(cudaGetLastError());
        std::vector<void*> t(3 * E);
        for (int e = 0; e < E; ++e)
            for (int m = 0; m < 3; ++m) t[3 * e + m] = w + (size_t(m) * E + e) * kGate;
        CK(cudaMalloc(&table, t.size() * sizeof(void*)));
        CK(cudaMemcpy(table, t.data(), t.size() * sizeof(void*), cudaMemcpyHostToDevice));
    }
    ~Shape() {
        cudaFree(w);
        cudaFree(table);
    }
    double weight(int m, int e, size_t i) const {  // element i of matrix m (0 gate, 1 up, 2 down) of expert e
        const uint64_t seed = m < 2 ? 11 : 12;
        const size_t at = (m < 2 ? size_t(m) * E * kGate : 0) + size_t(e) * kGate + i;
        return bf16_value(bf16_bits(unit(seed, at) * (m < 2 ? scale_h : scale_f)));
    }
    double magnitude(int m, int e, size_t i) const { return std::fabs(weight(m, e, i)); }  // what sets a dot's rounding
};

struct Routing {
    std::vector<int32_t> ids;
    std::vector<float> weights;
};

// uniform: distinct random experts per row; skewed: every row the same K experts; hot: half of
// each row's picks among K hot experts (each holds ~rows / 2 pairs), the rest among the others
// (where E >= 2K; else uniform), the mix of long and short runs a real router gives.
enum class Route { kUniform, kSkewed, kHot };
const char* route_name(Route route) { return route == Route::kUniform ? "uniform" : route == Route::kSkewed ? "skewed" : "hot"; }

template <int E, int K>
Routing make_routing(int rows, Route route, std::mt19937& rng) {
    Routing r;
    std::uniform_real_distribution<float> wd(0.05f, 1.0f);
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    const bool hot = route == Route::kHot && E >= 2 * K;
    for (int i = 0; i < rows; ++i) {
        if (hot) {
            std::shuffle(all.begin(), all.begin() + K, rng);  // the hot experts 0 .. K-1
            std::shuffle(all.begin() + K, all.end(), rng);
        } else if (route != Route::kSkewed) {
            std::shuffle(all.begin(), all.end(), rng);
        }
        for (int j = 0; j < K; ++j) {
            int32_t e = all[j];
            if (route == Route::kSkewed) e = (j * 7 + 3) % E;  // the same K experts for every row
            else if (hot && j >= K / 2) e = all[K + j];  // past the hot picks: the shuffled others
            r.ids.push_back(e);
            r.weights.push_back(wd(rng));
        }
    }
    return r;
}

// Device buffers for one launch of `rows` rows.
template <int H, int F, int E, int K>
struct Launch {
    float *x = nullptr, *res = nullptr, *out = nullptr, *ws = nullptr, *tw = nullptr;
    int32_t* ids = nullptr;
    // ws_floats: the experts' workspace (the bf16 experts' by default)
    explicit Launch(int rows, int64_t ws_floats = 0) {
        CK(cudaMalloc(&x, size_t(rows) * H * 4));
        CK(cudaMalloc(&res, size_t(rows) * H * 4));
        CK(cudaMalloc(&out, size_t(rows) * H * 4));
        CK(cudaMalloc(&ws, size_t(ws_floats > 0 ? ws_floats : moe_experts_floats<H, F, E, K>(rows)) * 4));
        CK(cudaMalloc(&tw, size_t(rows) * K * 4));
        CK(cudaMalloc(&ids, size_t(rows) * K * 4));
    }
    ~Launch() {
        cudaFree(x); cudaFree(res); cudaFree(out); cudaFree(ws); cudaFree(tw); cudaFree(ids);
    }
    // The launch's inputs: rows of x and of the residual, and the routing.
    void upload(const std::vector<float>& xs, const std::vector<float>& rs, const Routing& r) {
        CK(cudaMemcpy(x, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(res, rs.data(), rs.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(ids, r.ids.data(), r.ids.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(tw, r.weights.data(), r.weights.size() * 4, cudaMemcpyHostToDevice));
    }
    void run(const Ctx& c, const Shape<H, F, E, K>& s, int rows) {
        moe_experts<H, F, E, K, bf16_t>(c, rows, x, s.table, ids, tw, res, out, ws);
    }
};

// float64 reference of one row's output with its error bound.
template <int H, int F, int E, int K, class S>
void reference_row(const S& s, const float* x, const float* res, const int32_t* ids, const float* tw, std::vector<double>& ref,
                   std::vector<double>& bound) {
    ref.assign(H, 0.0);
    bound.assign(H, 0.0);
    // the CPU kernel's (and moe_combine_kernel's) order: the row's experts in expert order
    std::vector<int> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
    std::vector<double> act(F), dact(F);
    for (int j : order) {
        const int e = ids[j];
        for (int f = 0; f < F; ++f) {
            double g = 0, u = 0, ag = 0, au = 0;
            for (int h = 0; h < H; ++h) {
                const double wg = s.weight(0, e, size_t(f) * H + h), wu = s.weight(1, e, size_t(f) * H + h);
                g += wg * x[h];
                u += wu * x[h];
                ag += s.magnitude(0, e, size_t(f) * H + h) * std::fabs(x[h]);
                au += s.magnitude(1, e, size_t(f) * H + h) * std::fabs(x[h]);
            }
            const double dg = 2e-5 * ag + 1e-6, du = 2e-5 * au + 1e-6;
            const double sg = 1.0 / (1.0 + std::exp(-g));
            const double slope = std::fabs(sg * (1.0 + g * (1.0 - sg)));
            act[f] = silu(g) * u;
            dact[f] = slope * dg * std::fabs(u) + std::fabs(silu(g)) * du + dg * du + 1e-6 * std::fabs(act[f]);
        }
        for (int h = 0; h < H; ++h) {
            double y = 0, ay = 0, dy = 0;
            for (int f = 0; f < F; ++f) {
                const double wd = s.weight(2, e, size_t(h) * F + f);
                y += wd * act[f];
                ay += s.magnitude(2, e, size_t(h) * F + f) * std::fabs(act[f]);
                dy += std::fabs(wd) * dact[f];
            }
            ref[h] += double(tw[j]) * y;
            bound[h] += double(tw[j]) * (dy + 2e-5 * ay + 1e-6);
        }
    }
    for (int h = 0; h < H; ++h) {
        ref[h] += res[h];
        bound[h] += 1e-6 * (std::fabs(ref[h]) + std::fabs(res[h]));
    }
}

template <int H, int F, int E, int K>
int check_shape(const Shape<H, F, E, K>& s, cudaStream_t st, std::initializer_list<int> row_counts) {
    int failures = 0;
    std::mt19937 rng(1234 + H);
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
    Ctx c;
    c.stream = st;
    for (const bool skewed : {false, true})
        for (const int rows : row_counts) {
            std::vector<float> x(size_t(rows) * H), res(size_t(rows) * H);
            for (auto& v : x) v = xd(rng);
            for (auto& v : res) v = xd(rng);
            const Routing r = make_routing<E, K>(rows, skewed ? Route::kSkewed : Route::kUniform, rng);
            // rows checked against the reference (all of small launches, 8 spread over large ones)
            std::vector<int> check;
            const int stride = rows <= 16 ? 1 : rows / 8;
            for (int i = 0; i < rows; i += stride) check.push_back(i);
            if (check.back() != rows - 1) check.push_back(rows - 1);

            Launch<H, F, E, K> L(rows);
            L.upload(x, res, r);
            std::vector<float> got[2];
            for (int path = 0; path < 2; ++path) {  // 0: grouped GEMMs, 1: per-pair GEMVs
                moe_gemm_override() = path == 0 ? 1 : 0;
                CK(cudaMemset(L.out, 0xff, size_t(rows) * H * 4));  // NaN
                L.run(c, s, rows);
                CK(cudaGetLastError());
                CK(cudaStreamSynchronize(st));
                got[path].resize(size_t(rows) * H);
                CK(cudaMemcpy(got[path].data(), L.out, got[path].size() * 4, cudaMemcpyDeviceToHost));
            }
            moe_gemm_override() = -1;
            double worst[2] = {0, 0};
            int bad[2] = {0, 0};
            std::vector<double> ref, bound;
            for (const int i : check) {
                reference_row<H, F, E, K>(s, &x[size_t(i) * H], &res[size_t(i) * H], &r.ids[size_t(i) * K], &r.weights[size_t(i) * K], ref, bound);
                for (int path = 0; path < 2; ++path)
                    for (int h = 0; h < H; ++h) {
                        const double err = std::fabs(double(got[path][size_t(i) * H + h]) - ref[h]);
                        if (!(err <= bound[h])) {
                            if (bad[path]++ < 3)
                                std::printf("  %s rows %d %s row %d h %d: got %.9g want %.9g (bound %.3g)\n", path ? "gemv" : "grouped", rows,
                                            skewed ? "skewed" : "uniform", i, h, got[path][size_t(i) * H + h], ref[h], bound[h]);
                        } else {
                            worst[path] = std::max(worst[path], err / bound[h]);
                        }
                    }
            }
            // Batch invariance of the grouped path. Narrow steps (most experts under 16 pairs): each
            // checked row alone, bit for bit. Wide steps are a regime of their own (another kernel):
            // the same rows in reverse order, so every pair lands in another chunk and column.
            int differ = 0;
            moe_gemm_override() = 1;
            const bool wide = rows * K >= 16 * E;
            if (wide) {
                std::vector<float> xr(x.size()), rr(res.size());
                Routing rv;
                for (int i = 0; i < rows; ++i) {
                    const int j = rows - 1 - i;
                    std::copy_n(&x[size_t(j) * H], H, &xr[size_t(i) * H]);
                    std::copy_n(&res[size_t(j) * H], H, &rr[size_t(i) * H]);
                    rv.ids.insert(rv.ids.end(), &r.ids[size_t(j) * K], &r.ids[size_t(j) * K] + K);
                    rv.weights.insert(rv.weights.end(), &r.weights[size_t(j) * K], &r.weights[size_t(j) * K] + K);
                }
                L.upload(xr, rr, rv);
                CK(cudaMemset(L.out, 0xff, size_t(rows) * H * 4));
                L.run(c, s, rows);
                CK(cudaStreamSynchronize(st));
                std::vector<float> rev(size_t(rows) * H);
                CK(cudaMemcpy(rev.data(), L.out, rev.size() * 4, cudaMemcpyDeviceToHost));
                for (int i = 0; i < rows; ++i) differ += std::memcmp(&rev[size_t(rows - 1 - i) * H], &got[0][size_t(i) * H], H * 4) != 0;
            }
            Launch<H, F, E, K> one(1);
            std::vector<float> alone(H);
            for (const int i : wide ? std::vector<int>{} : check) {
                CK(cudaMemcpy(one.x, &x[size_t(i) * H], H * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(one.res, &res[size_t(i) * H], H * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(one.ids, &r.ids[size_t(i) * K], K * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(one.tw, &r.weights[size_t(i) * K], K * 4, cudaMemcpyHostToDevice));
                CK(cudaMemset(one.out, 0xff, H * 4));
                one.run(c, s, 1);
                CK(cudaStreamSynchronize(st));
                CK(cudaMemcpy(alone.data(), one.out, H * 4, cudaMemcpyDeviceToHost));
                differ += std::memcmp(alone.data(), &got[0][size_t(i) * H], H * 4) != 0;
            }
            moe_gemm_override() = -1;
            const bool ok = bad[0] == 0 && bad[1] == 0 && differ == 0;
            failures += !ok;
            std::printf("%s %s, %d rows %s (%zu checked): grouped %s (worst err/bound %.2e), gemv %s (%.2e), %s %s\n", ok ? "ok  " : "FAIL",
                        s.name, rows, skewed ? "skewed" : "uniform", check.size(), bad[0] ? "FAIL" : "pass", worst[0], bad[1] ? "FAIL" : "pass",
                        worst[1], wide ? "wide: rows reversed" : "rows alone", differ ? "DIFFER" : "same bits");
        }
    return failures;
}

// ---- Quantized experts (kernels/cuda/moe_quant.cuh: moe_quant_experts) ----
// Random experts in the quantized format Q (qdetail::MlxInt4 / Int8Channel / Fp8E4M3, bf16 scales),
// generated here so the reference reads the very codes and scales the GPU reads: each projection's
// codes, scales (and MLX biases) uploaded as separate tensors and the experts' table in the weight
// table's order (expert e's projection j at (3 e + j) x the tensors per projection).
template <int H, int F, int E, int K, class Q>
struct QShape {
    static constexpr int P = qdetail::kQuantTensors<Q>;
    struct Mat {
        int n, k;
        std::vector<uint8_t> q;
        std::vector<uint16_t> scales, biases;
    };
    const char* name;
    std::vector<Mat> mats;  // 3 e + j
    std::vector<void*> dev;
    void** table = nullptr;

    static size_t code_bytes(int n, int k) { return Q::kAffine ? size_t(n) * k / 2 : size_t(n) * k; }
    static int scale_count(int n, int k) {
        if constexpr (Q::kAffine) return n * (k / Q::kGroup);
        else return Q::kPerTensor ? 1 : n;
    }
    QShape(const char* nm, uint64_t seed) : name(nm) {
        std::vector<void*> t;
        for (int e = 0; e < E; ++e)
            for (int j = 0; j < 3; ++j) {
                Mat m{j < 2 ? F : H, j < 2 ? H : F, {}, {}, {}};
                const uint64_t ms = seed * 1000003 + uint64_t(3 * e + j);
                m.q.resize(code_bytes(m.n, m.k));
                for (size_t i = 0; i < m.q.size(); i += 8) {
                    const uint64_t r = mix(ms * 0x9e3779b97f4a7c15ull + i);
                    std::memcpy(&m.q[i], &r, std::min<size_t>(8, m.q.size() - i));
                }
                if constexpr (!Q::kAffine) {
                    if constexpr (Q::kFp8)
                        for (auto& byte : m.q)
                            if ((byte & 0x7f) == 0x7f) byte -= 1;  // no NaN codes: scr quantize never writes them
                }
                // |w| ~ 1 / sqrt(k): MLX s * (0..15) + b with b ~ -7.5 s; int8 s * (-128..127); fp8 s * e4m3
                const double w = 1.0 / std::sqrt(double(m.k));
                for (int i = 0; i < scale_count(m.n, m.k); ++i) {
                    const double u = 0.5 + 0.5 * (unit(ms + 7, i) + 1.0);  // [0.5, 1.5)
                    if constexpr (Q::kAffine) {
                        const double sc = 2.0 * w / 15.0 * u;
                        m.scales.push_back(bf16_bits(float(sc)));
                        m.biases.push_back(bf16_bits(float(-7.5 * sc * (0.8 + 0.2 * (unit(ms + 9, i) + 1.0)))));
                    } else {
                        m.scales.push_back(bf16_bits(float((Q::kFp8 ? 8.0 * w / 448.0 : w / 127.0) * u)));
                    }
                }
                auto upload = [&](const void* src, size_t bytes) {
                    void* d = nullptr;
                    CK(cudaMalloc(&d, bytes));
                    CK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
                    dev.push_back(d);
                    t.push_back(d);
                };
                upload(m.q.data(), m.q.size());
                upload(m.scales.data(), m.scales.size() * 2);
                if (Q::kAffine) upload(m.biases.data(), m.biases.size() * 2);
                mats.push_back(std::move(m));
            }
        if (t.size() != size_t(3 * E * P)) throw std::runtime_error("QShape: table size");
        CK(cudaMalloc(&table, t.size() * sizeof(void*)));
        CK(cudaMemcpy(table, t.data(), t.size() * sizeof(void*), cudaMemcpyHostToDevice));
    }
    ~QShape() {
        for (void* d : dev) cudaFree(d);
        cudaFree(table);
    }
    // Element i (row i / k, column i % k) of projection m (0 gate, 1 up, 2 down) of expert e, from the
    // layout's definition; with magnitude the |s q| + |b| the kernel's factored sums carry.
    double value(int mi, int e, size_t i, bool magnitude) const {
        const Mat& m = mats[size_t(3 * e + mi)];
        const size_t r = i / size_t(m.k), c = i % size_t(m.k);
        if constexpr (Q::kAffine) {
            const double q = double((m.q[(r * m.k + c) / 2] >> (4 * (c % 2))) & 15u);
            const size_t g = r * (m.k / Q::kGroup) + c / Q::kGroup;
            const double sc = bf16_value(m.scales[g]), b = bf16_value(m.biases[g]);
            return magnitude ? std::fabs(sc * q) + std::fabs(b) : sc * q + b;
        } else {
            const uint8_t byte = m.q[r * m.k + c];
            double q;
            if constexpr (Q::kFp8) {
                const int ex = (byte >> 3) & 15, mt = byte & 7;
                q = ex == 0 ? std::ldexp(double(mt), -9) : std::ldexp(double(8 + mt), ex - 10);
                if (byte & 0x80) q = -q;
            } else {
                q = double(int8_t(byte));
            }
            const double v = bf16_value(m.scales[Q::kPerTensor ? 0 : r]) * q;
            return magnitude ? std::fabs(v) : v;
        }
    }
    double weight(int m, int e, size_t i) const { return value(m, e, i, false); }
    double magnitude(int m, int e, size_t i) const { return value(m, e, i, true); }
};

// moe_quant_experts against the float64 reference (reference_row, the same bound as the bf16
// experts: each dot within 2e-5 of its magnitude sum + 1e-6), grouped by expert and per pair (every
// row the same bits in both forms), and batch invariance (each checked row launched alone, in the
// default form for one row: the same bits). Outputs poisoned with NaN first.
template <int H, int F, int E, int K, class Q>
int check_quant_shape(const QShape<H, F, E, K, Q>& s, cudaStream_t st, std::initializer_list<int> row_counts) {
    int failures = 0;
    std::mt19937 rng(4321 + H);
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
    Ctx c;
    c.stream = st;
    const TestSideStream side;
    for (const Route route : {Route::kUniform, Route::kSkewed, Route::kHot})
        for (const int rows : row_counts) {
            std::vector<float> x(size_t(rows) * H), res(size_t(rows) * H);
            for (auto& v : x) v = xd(rng);
            for (auto& v : res) v = xd(rng);
            const Routing r = make_routing<E, K>(rows, route, rng);
            std::vector<int> check;
            const int stride = rows <= 16 ? 1 : rows / 8;
            for (int i = 0; i < rows; i += stride) check.push_back(i);
            if (check.back() != rows - 1) check.push_back(rows - 1);
            // Wide rows (16+ pairs per expert, the bf16 build's wide steps) also run the expanded form,
            // forced (moe_gemm_override() 4), so their workspace holds the expansion.
            const bool expands = qdetail::kMoeQuantExpandable<H, F> && rows * K >= kMoeWidePairsPerExpert * E;
            const int64_t ws = moe_quant_experts_floats<H, F, E, K, Q>(rows) + (expands ? qdetail::kMoeQuantExpandFloats<H, F, E> : 0);
            Launch<H, F, E, K> L(rows, ws), one(1, moe_quant_experts_floats<H, F, E, K, Q>(1));
            auto launch = [&](Launch<H, F, E, K>& l, int n, const Ctx& on) {
                CK(cudaMemset(l.out, 0xff, size_t(n) * H * 4));  // NaN
                moe_quant_experts<H, F, E, K, Q>(on, n, l.x, s.table, l.ids, l.tw, l.res, l.out, l.ws);
                CK(cudaGetLastError());
                CK(cudaStreamSynchronize(st));
                std::vector<float> got(size_t(n) * H);
                CK(cudaMemcpy(got.data(), l.out, got.size() * 4, cudaMemcpyDeviceToHost));
                return got;
            };
            L.upload(x, res, r);
            moe_gemm_override() = 1;  // grouped by expert
            const std::vector<float> got = launch(L, rows, c);
            moe_gemm_override() = 0;  // per (row, pick) pair: the same bits, every row
            const std::vector<float> per_pair = launch(L, rows, c);
            moe_gemm_override() = -1;
            int forms_differ = 0;
            for (int i = 0; i < rows; ++i) forms_differ += std::memcmp(&got[size_t(i) * H], &per_pair[size_t(i) * H], H * 4) != 0;
            // The checked rows of `out` against the reference: outputs past the bound counted in `bad`
            // (the first 3 printed), the worst err/bound of the others in `worst`.
            auto against_reference = [&](const std::vector<float>& out, const char* form, int& bad, double& worst) {
                std::vector<double> ref, bound;
                for (const int i : check) {
                    reference_row<H, F, E, K>(s, &x[size_t(i) * H], &res[size_t(i) * H], &r.ids[size_t(i) * K], &r.weights[size_t(i) * K],
                                              ref, bound);
                    for (int h = 0; h < H; ++h) {
                        const double err = std::fabs(double(out[size_t(i) * H + h]) - ref[h]);
                        if (!(err <= bound[h])) {
                            if (bad++ < 3)
                                std::printf("  %s rows %d %s%s row %d h %d: got %.9g want %.9g (bound %.3g)\n", s.name, rows,
                                            route_name(route), form, i, h, out[size_t(i) * H + h], ref[h], bound[h]);
                        } else {
                            worst = std::max(worst, err / bound[h]);
                        }
                    }
                }
            };
            double worst = 0.0;
            int bad = 0, differ = 0;
            against_reference(got, "", bad, worst);
            // Checked row i launched alone: rows of `batch` whose bits differ from it.
            auto alone_differ = [&](const std::vector<float>& batch) {
                int n = 0;
                for (const int i : check) {
                    CK(cudaMemcpy(one.x, &x[size_t(i) * H], H * 4, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(one.res, &res[size_t(i) * H], H * 4, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(one.ids, &r.ids[size_t(i) * K], K * 4, cudaMemcpyHostToDevice));
                    CK(cudaMemcpy(one.tw, &r.weights[size_t(i) * K], K * 4, cudaMemcpyHostToDevice));
                    const std::vector<float> alone = launch(one, 1, c);
                    n += std::memcmp(alone.data(), &batch[size_t(i) * H], H * 4) != 0;
                }
                return n;
            };
            differ = alone_differ(got);
            // The tensor-core form (forced, so at every row count): against the reference with the same
            // bound, and each checked row alone in it: the same bits.
            constexpr bool kMmaFits = qdetail::kMoeQuantMmaFits<H, F, Q> && qdetail::kMoeQuantMmaFits<F, H, Q>;
            // Each chunk width (1 or 4 token tiles for every expert, or per expert; forced) gives every
            // row the same bits.
            int bad_mma = 0, mma_differ = 0, tn_differ = 0;
            double worst_mma = 0.0;
            if constexpr (kMmaFits) {
                moe_gemm_override() = 3;
                const std::vector<float> mma = launch(L, rows, c);
                against_reference(mma, " (tensor cores)", bad_mma, worst_mma);
                mma_differ = alone_differ(mma);
                // per expert twice: its two chains one after the other, then on two streams
                struct WidthRun {
                    MoeQmmaWidth width;
                    bool two_streams;
                };
                constexpr WidthRun kRuns[] = {{MoeQmmaWidth::kOne, false},        {MoeQmmaWidth::kTwo, false},
                                              {MoeQmmaWidth::kFour, false},       {MoeQmmaWidth::kPerExpert, false},
                                              {MoeQmmaWidth::kPerExpert, true},   {MoeQmmaWidth::kPerExpertTwo, false},
                                              {MoeQmmaWidth::kPerExpertTwo, true}};
                for (const WidthRun& run : kRuns) {
                    moe_quant_mma_width_override() = run.width;
                    const std::vector<float> at_tn = launch(L, rows, run.two_streams ? side.with(c) : c);
                    for (int i = 0; i < rows; ++i) tn_differ += std::memcmp(&at_tn[size_t(i) * H], &mma[size_t(i) * H], H * 4) != 0;
                }
                moe_quant_mma_width_override() = MoeQmmaWidth::kRule;
                moe_gemm_override() = -1;
            }
            // The experts expanded to bf16 and the grouped GEMM (a regime of its own; by default only
            // from kMoeQuantExpandPairsPerExpert): against the reference with the same bound, and the
            // rows reversed (every pair in another chunk and column) give each row the same bits.
            int bad_wide = 0, wide_differ = 0;
            double worst_wide = 0.0;
            if (expands) {
                moe_gemm_override() = 4;
                const std::vector<float> wide = launch(L, rows, c);
                against_reference(wide, " (expanded)", bad_wide, worst_wide);
                std::vector<float> xr(x.size()), rr(res.size());
                Routing rev = r;
                for (int i = 0; i < rows; ++i) {
                    const int j = rows - 1 - i;
                    std::memcpy(&xr[size_t(i) * H], &x[size_t(j) * H], H * 4);
                    std::memcpy(&rr[size_t(i) * H], &res[size_t(j) * H], H * 4);
                    for (int k = 0; k < K; ++k) {
                        rev.ids[size_t(i) * K + k] = r.ids[size_t(j) * K + k];
                        rev.weights[size_t(i) * K + k] = r.weights[size_t(j) * K + k];
                    }
                }
                L.upload(xr, rr, rev);
                const std::vector<float> reversed = launch(L, rows, c);
                for (int i = 0; i < rows; ++i)
                    wide_differ += std::memcmp(&reversed[size_t(rows - 1 - i) * H], &wide[size_t(i) * H], H * 4) != 0;
                moe_gemm_override() = -1;
            }
            const bool ok = bad == 0 && differ == 0 && forms_differ == 0 && bad_wide == 0 && wide_differ == 0 && bad_mma == 0 &&
                            mma_differ == 0 && tn_differ == 0;
            failures += !ok;
            std::printf("%s %s, %d rows %s (%zu checked): quantized experts %s (worst err/bound %.2e), grouped vs per-pair %s, "
                        "rows alone %s",
                        ok ? "ok  " : "FAIL", s.name, rows, route_name(route), check.size(), bad ? "FAIL" : "pass", worst,
                        forms_differ ? "DIFFER" : "same bits", differ ? "DIFFER" : "same bits");
            if (kMmaFits)
                std::printf("; tensor cores %s (worst err/bound %.2e), rows alone %s, chunks of 1 / 2 / 4 tiles / per expert 4 or 1 and 4 or 2 "
                            "(one and two streams) %s",
                            bad_mma ? "FAIL" : "pass", worst_mma, mma_differ ? "DIFFER" : "same bits", tn_differ ? "DIFFER" : "same bits");
            if (expands)
                std::printf("; expanded %s (worst err/bound %.2e), rows reversed %s", bad_wide ? "FAIL" : "pass", worst_wide,
                            wide_differ ? "DIFFER" : "same bits");
            std::printf("\n");
        }
    return failures;
}

// Time per call of the quantized experts at a shape, beside the bf16 experts' per-pair GEMVs and
// grouped GEMMs of the same shape (one run, the same stream), for a routing and row counts.
template <int H, int F, int E, int K, class Q>
void time_quant_shape(const QShape<H, F, E, K, Q>& q, const Shape<H, F, E, K>& s, const char* fmt, cudaStream_t st, Route route,
                      std::initializer_list<int> row_counts) {
    std::printf("\n%s, %s experts, us per call (events, mean after one warm-up; %s routing):\n", q.name, fmt, route_name(route));
    std::printf("| rows | pairs | %s per-pair GEMVs | %s grouped GEMVs | %s tensor cores, chunks of 1 / 2 / 4 tiles / per expert "
                "4 or 1 / 4 or 2 (two streams) | %s expanded | %s default (two streams) | bf16 per-pair GEMVs | bf16 grouped GEMMs |\n"
                "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
                fmt, fmt, fmt, fmt, fmt);
    std::mt19937 rng(77);
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
    Ctx c;
    c.stream = st;
    const TestSideStream side;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (const int rows : row_counts) {
        const bool expands = rows * K >= kMoeWidePairsPerExpert * E;
        Launch<H, F, E, K> L(rows, moe_quant_experts_floats<H, F, E, K, Q>(rows) + qdetail::kMoeQuantExpandFloats<H, F, E>);
        std::vector<float> x(size_t(rows) * H);
        for (auto& v : x) v = xd(rng);
        const Routing r = make_routing<E, K>(rows, route, rng);
        L.upload(x, x, r);
        // quantized per pair, grouped GEMVs, tensor cores in chunks of 1 / 2 / 4 token tiles / per
        // expert 4 or 1, 4 or 2 (two streams), expanded (wide rows), default (the row rules, two
        // streams as in the engine); bf16 per pair, grouped
        constexpr int kPaths = 11, kQuantPaths = 9, kExpanded = 7;
        using W = MoeQmmaWidth;
        constexpr int kOverride[kPaths] = {0, 1, 3, 3, 3, 3, 3, 4, -1, 0, 1};
        constexpr W kTiles[kPaths] = {W::kRule, W::kRule,         W::kOne,  W::kTwo,  W::kFour, W::kPerExpert,
                                      W::kPerExpertTwo, W::kRule, W::kRule, W::kRule, W::kRule};
        constexpr bool kTwoStreams[kPaths] = {false, false, false, false, false, true, true, false, true, false, false};
        double us[kPaths] = {};
        for (int path = 0; path < kPaths; ++path) {
            if (path == kExpanded && !expands) continue;
            const Ctx on = kTwoStreams[path] ? side.with(c) : c;
            auto one = [&] {
                if (path < kQuantPaths) moe_quant_experts<H, F, E, K, Q>(on, rows, L.x, q.table, L.ids, L.tw, L.res, L.out, L.ws);
                else L.run(c, s, rows);
            };
            moe_gemm_override() = kOverride[path];
            moe_quant_mma_width_override() = kTiles[path];
            const int iters = rows >= 1024 ? 2 : rows >= 256 ? 5 : 20;
            one();
            CK(cudaEventRecord(a, st));
            for (int i = 0; i < iters; ++i) one();
            CK(cudaEventRecord(b, st));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            us[path] = 1000.0 * ms / iters;
        }
        moe_gemm_override() = -1;
        moe_quant_mma_width_override() = W::kRule;
        char expanded[32] = "-";
        if (expands) std::snprintf(expanded, sizeof expanded, "%.1f", us[kExpanded]);
        std::printf("| %d | %d | %.1f | %.1f | %.1f / %.1f / %.1f / %.1f / %.1f | %s | %.1f | %.1f | %.1f |\n", rows, rows * K, us[0],
                    us[1], us[2], us[3], us[4], us[5], us[6], expanded, us[8], us[9], us[10]);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

template <int H, int F, int E, int K>
void time_shape(const Shape<H, F, E, K>& s, cudaStream_t st) {
    std::printf("\n%s, us per call (events, mean of the iterations after one warm-up; uniform routing):\n", s.name);
    std::printf("| rows | pairs | grouped GEMMs | per-pair GEMVs | ratio |\n|---:|---:|---:|---:|---:|\n");
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> xd(-1.0f, 1.0f);
    Ctx c;
    c.stream = st;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (const int rows : {1, 4, 16, 64, 256, 2048}) {
        Launch<H, F, E, K> L(rows);
        std::vector<float> x(size_t(rows) * H);
        for (auto& v : x) v = xd(rng);
        const Routing r = make_routing<E, K>(rows, Route::kUniform, rng);
        L.upload(x, x, r);
        double us[2];
        for (int path = 0; path < 2; ++path) {
            moe_gemm_override() = path == 0 ? 1 : 0;
            const int iters = rows >= 256 && path == 1 ? 3 : 20;
            L.run(c, s, rows);
            CK(cudaEventRecord(a, st));
            for (int i = 0; i < iters; ++i) L.run(c, s, rows);
            CK(cudaEventRecord(b, st));
            CK(cudaEventSynchronize(b));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            us[path] = 1000.0 * ms / iters;
        }
        moe_gemm_override() = -1;
        std::printf("| %d | %d | %.1f | %.1f | %.2fx |\n", rows, rows * K, us[0], us[1], us[1] / us[0]);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
}

}  // namespace

int main(int argc, char** argv) try {
    if (scr::test_cuda::no_gpu()) return scr::test_cuda::kSkipped;
    const bool bench = !(argc > 1 && std::strcmp(argv[1], "--no-bench") == 0);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    int failures = 0;
    {
        const Shape<256, 128, 16, 4> small("H256 F128 E16 top4");
        failures += check_shape(small, st, {1, 3, 8, 40, 300});
    }
    {
        const Shape<96, 64, 4, 2> fixture("H96 F64 E4 top2 (tiny Qwen3-MoE)");
        failures += check_shape(fixture, st, {1, 5, 33, 200});
    }
    const Shape<2048, 768, 128, 8> big("H2048 F768 E128 top8 (Qwen3-30B-A3B)");
    failures += check_shape(big, st, {1, 16, 260});
    // Quantized experts (moe_quant_experts) in every format the CUDA target reads, bf16 scales.
    using B = bf16_t;
    {
        const QShape<96, 64, 4, 2, qdetail::MlxInt4<32, B>> q("H96 F64 E4 top2 MLX int4 g32", 31);
        failures += check_quant_shape(q, st, {1, 5, 33});
        const QShape<96, 64, 4, 2, qdetail::Int8Channel<B>> i8("H96 F64 E4 top2 int8", 32);
        failures += check_quant_shape(i8, st, {1, 5, 33});
        const QShape<96, 64, 4, 2, qdetail::Fp8E4M3<B, false>> f8("H96 F64 E4 top2 fp8", 33);
        failures += check_quant_shape(f8, st, {1, 5});
        const QShape<96, 64, 4, 2, qdetail::Fp8E4M3<B, true>> f8t("H96 F64 E4 top2 fp8 per tensor", 34);
        failures += check_quant_shape(f8t, st, {1, 5});
        const QShape<256, 128, 16, 4, qdetail::MlxInt4<128, B>> g128("H256 F128 E16 top4 MLX int4 g128", 35);
        failures += check_quant_shape(g128, st, {1, 8, 40, 80});  // 80 rows: wide (expanded)
        const QShape<256, 128, 16, 4, qdetail::MlxInt4<32, B>> g32("H256 F128 E16 top4 MLX int4 g32", 41);
        failures += check_quant_shape(g32, st, {8});  // the tensor-core form's four groups per chunk
        const QShape<256, 128, 16, 4, qdetail::Int8Channel<B>> i8w("H256 F128 E16 top4 int8", 38);
        failures += check_quant_shape(i8w, st, {8, 80});
        const QShape<256, 128, 16, 4, qdetail::Fp8E4M3<B, false>> f8w("H256 F128 E16 top4 fp8", 39);
        failures += check_quant_shape(f8w, st, {8, 80});
        const QShape<256, 128, 16, 4, qdetail::Fp8E4M3<B, true>> f8tw("H256 F128 E16 top4 fp8 per tensor", 40);
        failures += check_quant_shape(f8tw, st, {8, 80});
    }
    {
        const QShape<2048, 768, 128, 8, qdetail::MlxInt4<64, B>> q("H2048 F768 E128 top8 MLX int4 g64 (Qwen3-30B-A3B)", 36);
        failures += check_quant_shape(q, st, {1, 8, 260});
        if (bench) {
            time_quant_shape(q, big, "MLX int4 g64", st, Route::kUniform, {1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
            time_quant_shape(q, big, "MLX int4 g64", st, Route::kHot, {32, 64, 128, 256, 512, 1024});
        }
    }
    {
        const QShape<2048, 768, 128, 8, qdetail::Int8Channel<B>> q("H2048 F768 E128 top8 int8 (Qwen3-30B-A3B)", 37);
        failures += check_quant_shape(q, st, {1, 8, 260});
        if (bench) {
            time_quant_shape(q, big, "int8", st, Route::kUniform, {1, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
            time_quant_shape(q, big, "int8", st, Route::kHot, {32, 64, 128, 256, 512, 1024});
        }
    }
    std::printf("%s\n", failures ? "FAILED" : "all MoE expert checks passed");
    if (bench) time_shape(big, st);
    return failures ? 1 : 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "scr_cuda_moe: %s\n", e.what());
    return 1;
}
