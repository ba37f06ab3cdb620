// The quantized CPU kernels (kernels/cpu/quant_linear.hpp, quant_int4_dot.hpp) on random non-zero
// inputs at several shapes, group sizes and batch sizes:
//  - int8 / fp8 (channel: w = scale * q, f32 activations): against a float64 reference of the same
//    dequantization;
//  - MLX int4 (w = scale * q + bias, int8 activations per 32 elements): against a float64 reference
//    of the same math (the activation quantization redone here from its definition, then exact
//    products), within the fp32 rounding of the combine; against the dense product within the
//    activation rounding bound; and bit for bit against the portable definition in the header (this
//    file is also built for AVX2 and for the portable path, so every ISA is held to the same bits);
//  - batch invariance (a row's output is bit-identical alone and inside any batch), the quantizer's
//    rounding and special blocks, and the fp8 e4m3 decoding table.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/moe.hpp"
#include "kernels/cpu/quant_linear.hpp"

namespace k = scr::kernels::cpu;
using scr::bf16_t;

namespace {

scr::ThreadPool& pool() {
    static scr::ThreadPool p(2);
    return p;
}

std::mt19937& rng() {
    static std::mt19937 r(1234);
    return r;
}

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng()); }

bf16_t bf16(float v) { return bf16_t{scr::f32_to_bf16(v)}; }

std::vector<float> random_x(int rows, int K) {
    std::vector<float> x(size_t(rows) * K);
    for (auto& v : x) {
        v = uniform(-1.0f, 1.0f);
        if (v == 0) v = 0.5f;
    }
    return x;
}

// y = x W^T in float64 from the dequantized weights; bound: the fp32 rounding allowance of one
// dot product of length K (K ulps of the sum of |terms|, generous for the lane-wise order).
void expect_close(const std::vector<float>& y, const std::vector<double>& ref, const std::vector<double>& mag, int K) {
    ASSERT_EQ(y.size(), ref.size());
    for (size_t i = 0; i < y.size(); ++i)
        ASSERT_NEAR(double(y[i]), ref[i], mag[i] * K * 1.2e-7 + 1e-30) << "output " << i;
}

template <typename QW>
void reference(const QW& w, int N, int K, const std::vector<float>& x, int rows, const float* bias, const float* residual,
               std::vector<double>& ref, std::vector<double>& mag) {
    ref.assign(size_t(rows) * N, 0.0);
    mag.assign(size_t(rows) * N, 0.0);
    for (int t = 0; t < rows; ++t)
        for (int n = 0; n < N; ++n) {
            double s = 0, m = 0;
            for (int c = 0; c < K; ++c) {
                const double term = double(x[size_t(t) * K + c]) * double(w.at(n, c));
                s += term;
                m += std::fabs(term);
            }
            if (bias) s += bias[n], m += std::fabs(bias[n]);
            if (residual) s += residual[size_t(t) * N + n], m += std::fabs(residual[size_t(t) * N + n]);
            ref[size_t(t) * N + n] = s;
            mag[size_t(t) * N + n] = m;
        }
}

// The same outputs computed one row at a time must be bit-identical (batch invariance).
template <int N, int K, typename QW>
void expect_batch_invariant(const QW& w, const std::vector<float>& x, int rows, const std::vector<float>& batched) {
    for (int t = 0; t < rows; ++t) {
        std::vector<float> alone(N);
        k::qlinear<N, K>(1, x.data() + size_t(t) * K, w, nullptr, nullptr, alone.data(), pool());
        for (int n = 0; n < N; ++n) ASSERT_EQ(alone[n], batched[size_t(t) * N + n]) << "row " << t << " col " << n;
    }
}

// The int8 activation quantization of docs/QUANT.md, redone from its definition: per block of 32,
// d = amax / 127 and q = x * (127 / amax) (f32 product) rounded half to even; a block whose amax is
// below 2^-100 is zero. Finite inputs only.
struct QuantizedRow {
    std::vector<int> q;
    std::vector<float> d;  // per block of 32
};
QuantizedRow quantize_reference(const float* x, int K) {
    QuantizedRow r{std::vector<int>(size_t(K), 0), std::vector<float>(size_t(K / 32), 0.0f)};
    for (int b = 0; b < K / 32; ++b) {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        if (amax < 0x1p-100f) continue;
        const float inv = 127.0f / amax;
        r.d[size_t(b)] = amax / 127.0f;
        for (int i = 0; i < 32; ++i) {
            const float v = x[b * 32 + i] * inv;
            const float lower = std::floor(v), frac = v - lower;  // exact for |v| < 2^23
            const bool odd = std::fmod(lower, 2.0f) != 0.0f;
            const int q = int(lower) + ((frac > 0.5f || (frac == 0.5f && odd)) ? 1 : 0);
            r.q[size_t(b * 32 + i)] = q;
        }
    }
    return r;
}

// y = sum_k (s_g q_k + b_g) * (d_b qx_k) in float64 (the same math as the kernel, exactly), with the
// magnitude of its terms; and the bound on its distance to the dense product sum_k w_k x_k from the
// activation rounding, |x - d q| <= d / 2 per element (checked here too).
template <typename QW>
void reference_int4(const QW& w, int N, int K, int G, const std::vector<float>& x, int rows, const float* bias,
                    const float* residual, std::vector<double>& ref, std::vector<double>& mag, std::vector<double>& dense_bound,
                    std::vector<double>* dense = nullptr) {
    ref.assign(size_t(rows) * N, 0.0);
    mag.assign(size_t(rows) * N, 0.0);
    dense_bound.assign(size_t(rows) * N, 0.0);
    if (dense) dense->assign(size_t(rows) * N, 0.0);
    for (int t = 0; t < rows; ++t) {
        const float* xr = x.data() + size_t(t) * K;
        const QuantizedRow qx = quantize_reference(xr, K);
        for (int c = 0; c < K; ++c) {
            const double step = qx.d[size_t(c / 32)];
            EXPECT_LE(std::fabs(double(xr[c]) - step * qx.q[size_t(c)]), step / 2 * (1 + 1e-6)) << "x[" << t << "][" << c << "]";
        }
        for (int n = 0; n < N; ++n) {
            double s = 0, m = 0, bound = 0, d = 0;
            for (int c = 0; c < K; ++c) {
                const uint32_t word = w.q[size_t(n) * (K / 8) + size_t(c / 8)];
                const double wq = double((word >> (4 * (c % 8))) & 15u);
                const double wv = double(w.scale(n, c / G)) * wq + double(w.bias(n, c / G));  // exact in float64
                const double xv = double(qx.d[size_t(c / 32)]) * qx.q[size_t(c)];
                s += wv * xv;
                m += (std::fabs(double(w.scale(n, c / G)) * wq) + std::fabs(double(w.bias(n, c / G)))) * std::fabs(xv);
                bound += std::fabs(wv) * qx.d[size_t(c / 32)] / 2;
                d += wv * double(xr[c]);
            }
            if (bias) s += bias[n], m += std::fabs(bias[n]), d += bias[n];
            if (residual) {
                const double r = residual[size_t(t) * N + n];
                s += r, m += std::fabs(r), d += r;
            }
            ref[size_t(t) * N + n] = s;
            mag[size_t(t) * N + n] = m;
            dense_bound[size_t(t) * N + n] = bound;
            if (dense) (*dense)[size_t(t) * N + n] = d;
        }
    }
}

// The fp32 rounding allowance of the int4 combine: a lane adds K/128 chunk terms and K/512 bias
// terms, each product rounded once (s * d) before its fma, then a 4-level tree and the bias and
// residual adds: n roundings of at most 2^-24 of the running magnitude, doubled for slack.
double int4_tolerance(double mag, int K) { return mag * (K / 128 + K / 512 + 10) * 0x1p-23; }

// The kernel equals the portable definition bit for bit: the quantized rows byte for byte, each
// output as dot_portable computes it.
template <int N, int K, int G, typename QW>
void expect_portable_bits(const QW& w, const std::vector<float>& x, int rows, const std::vector<float>& y) {
    using L = k::int4::ActLayout<K>;
    std::vector<uint8_t> simd(L::kRowBytes), portable(L::kRowBytes);
    for (int t = 0; t < rows; ++t) {
        k::int4::quantize_row<K>(x.data() + size_t(t) * K, simd.data());
        k::int4::quantize_row_portable<K>(x.data() + size_t(t) * K, portable.data());
        ASSERT_EQ(0, std::memcmp(simd.data(), portable.data(), L::kRowBytes)) << "quantized row " << t;
        for (int n = 0; n < N; ++n)
            ASSERT_EQ(y[size_t(t) * N + n], (k::int4::dot_portable<K, G>(portable.data(), w, n))) << "row " << t << " col " << n;
    }
}

template <int N, int K, int G>
void affine_case(int rows) {
    SCOPED_TRACE(testing::Message() << "affine N=" << N << " K=" << K << " G=" << G << " rows=" << rows);
    std::vector<uint32_t> q(N * K / 8);
    for (auto& v : q) v = uint32_t(rng()());
    std::vector<bf16_t> scales(N * K / G), biases(scales.size());
    for (size_t i = 0; i < scales.size(); ++i) {
        scales[i] = bf16(uniform(0.01f, 0.1f) * (i % 2 ? -1.0f : 1.0f));
        biases[i] = bf16(uniform(-0.5f, 0.5f));
    }
    const k::AffineW<K, 4, G, bf16_t> w{q.data(), scales.data(), biases.data()};
    // The view's scalar dequantization against the format, element by element.
    for (int n = 0; n < N; n += 3)
        for (int c = 0; c < K; c += 5) {
            const uint32_t nib = (q[size_t(n) * K / 8 + c / 8] >> (4 * (c % 8))) & 15u;
            const size_t g = size_t(n) * (K / G) + c / G;
            ASSERT_EQ(double(w.at(n, c)), double(scr::bf16_to_f32(scales[g].bits)) * nib + scr::bf16_to_f32(biases[g].bits));
        }
    auto x = random_x(rows, K);
    for (int t = 0; t < rows; ++t) x[size_t(t) * K + size_t(t) % K] *= 8.0f;  // an outlier per row
    std::vector<float> bias(N), residual(size_t(rows) * N), y(size_t(rows) * N);
    for (auto& b : bias) b = uniform(-1, 1);
    for (auto& r : residual) r = uniform(-1, 1);
    k::qlinear<N, K>(rows, x.data(), w, bias.data(), residual.data(), y.data(), pool());
    std::vector<double> ref, mag, bound, dense;
    reference_int4(w, N, K, G, x, rows, bias.data(), residual.data(), ref, mag, bound, &dense);
    for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_NEAR(double(y[i]), ref[i], int4_tolerance(mag[i], K)) << "output " << i << " vs the same math in float64";
        ASSERT_NEAR(double(y[i]), dense[i], bound[i] + int4_tolerance(mag[i], K)) << "output " << i << " vs the dense product";
    }
    k::qlinear<N, K>(rows, x.data(), w, nullptr, nullptr, y.data(), pool());
    expect_portable_bits<N, K, G>(w, x, rows, y);
    expect_batch_invariant<N, K>(w, x, rows, y);
}

template <int N, int K, typename QT, bool PER_TENSOR>
void channel_case(int rows) {
    SCOPED_TRACE(testing::Message() << "channel N=" << N << " K=" << K << " rows=" << rows << " per_tensor=" << PER_TENSOR);
    std::vector<QT> q(N * K);
    for (auto& v : q) {
        if constexpr (std::is_same_v<QT, int8_t>) v = int8_t(int(rng()() % 256) - 128);
        else {
            uint8_t b = uint8_t(rng()());
            if ((b & 0x7f) == 0x7f) b ^= 1;  // not NaN
            v = k::fp8e4m3{b};
        }
    }
    std::vector<bf16_t> scales(PER_TENSOR ? 1 : N);
    for (auto& s : scales) s = bf16(uniform(0.001f, 0.02f));
    const k::ChannelW<K, QT, bf16_t, PER_TENSOR> w{q.data(), scales.data()};
    auto x = random_x(rows, K);
    std::vector<float> y(size_t(rows) * N);
    k::qlinear<N, K>(rows, x.data(), w, nullptr, nullptr, y.data(), pool());
    std::vector<double> ref, mag;
    reference(w, N, K, x, rows, nullptr, nullptr, ref, mag);
    expect_close(y, ref, mag, K);
    expect_batch_invariant<N, K>(w, x, rows, y);
}

}  // namespace

TEST(QuantKernels, AffineInt4ShapesGroupsBatches) {
    for (int rows : {1, 3, 5, 17, 40}) {
        affine_case<4, 32, 32>(rows);
        affine_case<7, 64, 32>(rows);
        affine_case<33, 128, 64>(rows);
        affine_case<64, 256, 128>(rows);
        affine_case<19, 384, 64>(rows);
        // K not a multiple of 128 (a partial chunk) or of 16 groups (a partial scale vector).
        affine_case<6, 96, 32>(rows);
        affine_case<9, 192, 64>(rows);
        affine_case<5, 640, 128>(rows);
        affine_case<8, 1056, 32>(rows);
    }
}

// The activation quantizer on hand-made blocks: ties round to even, the zero and tiny blocks, the
// lane-expanded scales, and inf/NaN making every output of the row NaN.
TEST(QuantKernels, Int4ActivationQuantizer) {
    constexpr int K = 128;
    using L = k::int4::ActLayout<K>;
    std::vector<float> x(K, 0.0f);
    // Block 0: amax 127 so 127 / amax = 1 and q is x rounded half to even.
    const float block0[8] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -126.5f, 3.25f};
    const int want0[8] = {127, 0, 2, 2, 0, -2, -126, 3};
    for (int i = 0; i < 8; ++i) x[size_t(i)] = block0[i];
    // Block 1: all zero. Block 2: below 2^-100, treated as zero. Block 3: amax 2, a step of 2/127.
    for (int i = 64; i < 96; ++i) x[size_t(i)] = 0x1p-110f;
    x[96] = 2.0f, x[97] = -1.0f, x[98] = 1.0f / 127.0f;
    std::vector<uint8_t> row(L::kRowBytes, 0xee), portable(L::kRowBytes, 0x11);
    k::int4::quantize_row<K>(x.data(), row.data());
    k::int4::quantize_row_portable<K>(x.data(), portable.data());
    ASSERT_EQ(0, std::memcmp(row.data(), portable.data(), L::kRowBytes));
    const auto* q = reinterpret_cast<const int8_t*>(row.data());
    const auto* dx = reinterpret_cast<const float*>(row.data() + L::kDxOffset);
    const auto* sx = reinterpret_cast<const float*>(row.data() + L::kSxOffset);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(q[k::int4::q_pos(i)], want0[i]) << "element " << i;
    EXPECT_EQ(q[0], 127);  // element 0 is byte 0 (evens first), element 1 byte 64 (odds)
    EXPECT_EQ(q[64], 0);
    EXPECT_EQ(q[1], 2);    // element 2
    EXPECT_EQ(q[65], 2);   // element 3
    for (int i = 32; i < 96; ++i) EXPECT_EQ(q[k::int4::q_pos(i)], 0) << "element " << i;
    EXPECT_EQ(q[k::int4::q_pos(96)], 127);
    EXPECT_EQ(q[k::int4::q_pos(97)], -64);  // -63.5 -> -64 (even)
    EXPECT_EQ(q[k::int4::q_pos(98)], 0);    // (1/127) * 63.5 = 0.5 -> 0
    for (int j = 0; j < 16; ++j) EXPECT_EQ(dx[j], (j < 4 ? 1.0f : j < 12 ? 0.0f : 2.0f / 127.0f)) << "lane " << j;
    EXPECT_EQ(sx[0], 127.0f + 0 + 2 + 2 + 0 - 2 - 126 + 3);
    EXPECT_EQ(sx[1], 0.0f);
    EXPECT_EQ(sx[2], 0.0f);
    EXPECT_EQ(sx[3], (2.0f / 127.0f) * float(127 - 64));
    for (int j = 4; j < 16; ++j) EXPECT_EQ(sx[j], 0.0f);

    // A non-finite activation poisons its row (and only its row).
    constexpr int N = 8;
    std::vector<uint32_t> w4(N * K / 8, 0x76543210u);
    std::vector<bf16_t> s(N * K / 32, bf16(0.25f)), b(N * K / 32, bf16(-0.5f));
    const k::AffineW<K, 4, 32, bf16_t> w{w4.data(), s.data(), b.data()};
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
        auto xs = random_x(2, K);
        xs[K + 77] = bad;
        std::vector<float> y(2 * N);
        k::qlinear<N, K>(2, xs.data(), w, nullptr, nullptr, y.data(), pool());
        for (int n = 0; n < N; ++n) {
            EXPECT_TRUE(std::isfinite(y[size_t(n)])) << "clean row, col " << n;
            EXPECT_TRUE(std::isnan(y[size_t(N + n)])) << "poisoned row, col " << n << " = " << y[size_t(N + n)];
        }
    }
}

TEST(QuantKernels, Int8ChannelWithTails) {
    for (int rows : {1, 4, 9, 33}) {
        channel_case<5, 32, int8_t, false>(rows);
        channel_case<13, 100, int8_t, false>(rows);  // K not a multiple of the lanes
        channel_case<64, 256, int8_t, false>(rows);
    }
}

TEST(QuantKernels, Fp8ChannelAndTensor) {
    for (int rows : {1, 6, 21}) {
        channel_case<9, 48, k::fp8e4m3, false>(rows);
        channel_case<17, 100, k::fp8e4m3, true>(rows);
        channel_case<32, 256, k::fp8e4m3, false>(rows);
    }
}

TEST(QuantKernels, Fp8DecodeTable) {
    // e4m3fn anchors from the OCP spec: max normal 448, min normal 2^-6, min subnormal 2^-9.
    EXPECT_EQ(k::fp8e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(k::fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));
    EXPECT_EQ(k::fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
    EXPECT_EQ(k::fp8e4m3_to_f32(0x38), 1.0f);
    EXPECT_EQ(k::fp8e4m3_to_f32(0xc0), -2.0f);
    EXPECT_TRUE(std::isnan(k::fp8e4m3_to_f32(0x7f)));
    EXPECT_TRUE(std::isnan(k::fp8e4m3_to_f32(0xff)));
    for (int b = 0; b < 256; ++b)
        if ((b & 0x7f) != 0x7f) {
            EXPECT_EQ(k::fp8e4m3_table()[b], k::fp8e4m3_to_f32(uint8_t(b)));
        }
    // The in-register decode (SIMD builds: bit placement and a 2^120 scale) equals the table for
    // every non-NaN code, subnormals and signed zero included.
    k::fp8e4m3 codes[256];
    for (int b = 0; b < 256; ++b) codes[b] = k::fp8e4m3{uint8_t(b)};
    for (int b = 0; b < 256; b += k::kLanes) {
        float got[k::kLanes];
        k::vstore(got, k::detail::fp8_to_vf(codes + b));
        for (int i = 0; i < k::kLanes; ++i)
            if (((b + i) & 0x7f) != 0x7f) {
                const float want = k::fp8e4m3_to_f32(uint8_t(b + i));
                EXPECT_EQ(got[i], want) << "code " << b + i;
                EXPECT_EQ(std::signbit(got[i]), std::signbit(want)) << "code " << b + i;
            }
    }
}

TEST(QuantKernels, GluAndEmbedding) {
    constexpr int N = 24, K = 64, G = 32, rows = 7;
    std::vector<uint32_t> qg(N * K / 8), qu(N * K / 8);
    for (auto& v : qg) v = uint32_t(rng()());
    for (auto& v : qu) v = uint32_t(rng()());
    std::vector<bf16_t> s(N * K / G), b(N * K / G);
    for (size_t i = 0; i < s.size(); ++i) s[i] = bf16(uniform(0.01f, 0.05f)), b[i] = bf16(uniform(-0.2f, 0.2f));
    const k::AffineW<K, 4, G, bf16_t> wg{qg.data(), s.data(), b.data()}, wu{qu.data(), s.data(), b.data()};
    auto x = random_x(rows, K);
    std::vector<float> y(rows * N);
    k::qlinear_glu<N, K, k::Act::silu>(rows, x.data(), wg, wu, y.data(), pool());
    std::vector<double> g, u, mg, mu, bound;
    reference_int4(wg, N, K, G, x, rows, nullptr, nullptr, g, mg, bound);
    reference_int4(wu, N, K, G, x, rows, nullptr, nullptr, u, mu, bound);
    for (int i = 0; i < rows * N; ++i) {
        const double want = g[i] / (1 + std::exp(-g[i])) * u[i];
        // gate and up each within their fp32 allowance, then silu and the product in f32
        const double tg = int4_tolerance(mg[i], K), tu = int4_tolerance(mu[i], K);
        ASSERT_NEAR(y[i], want, 1.2 * (tg * std::fabs(u[i]) + tu * (std::fabs(g[i]) + tg)) + 1e-6 * std::fabs(want) + 1e-30) << i;
    }
    // Embedding: rows of the dequantized table, exactly.
    const int32_t ids[3] = {5, 0, 23};
    std::vector<float> e(3 * K);
    k::qembed<K>(3, ids, wg, e.data(), pool());
    for (int t = 0; t < 3; ++t)
        for (int c = 0; c < K; ++c) ASSERT_EQ(e[t * K + c], wg.at(ids[t], c));
}

// ---- MoE over quantized experts (kernels/cpu/moe.hpp: moe_quant) ----
// The routing, the gather of each expert's rows, the weight table's layout (3 projections x the
// view's tensors per expert) and the weighted sum are what moe_quant adds to the tested linear
// kernels. Checked against a float64 reference: the router's softmax, top-k and normalized weights,
// and the sum residual + sum_j w_j y_j, where y is each chosen expert's output from the linear
// kernels on that token alone (batch invariant, so the same bits as inside the expert's batch). For
// int8 / fp8 (f32 activations, exact dequantization) the expert outputs are also checked against
// float64 on the dequantized weights; MLX int4's linear kernels are held to float64 above.
namespace {

// One projection's storage, in the form its view reads.
template <typename QW>
struct QuantMatrix;
template <int K, int G>
struct QuantMatrix<k::AffineW<K, 4, G, bf16_t>> {
    std::vector<uint32_t> q;
    std::vector<bf16_t> s, b;
    QuantMatrix(int n) : q(size_t(n) * K / 8), s(size_t(n) * K / G), b(s.size()) {
        for (auto& v : q) v = uint32_t(rng()());
        for (size_t i = 0; i < s.size(); ++i) s[i] = bf16(uniform(0.01f, 0.05f) * (i % 3 ? 1.0f : -1.0f)), b[i] = bf16(uniform(-0.2f, 0.2f));
    }
    void table(const void** t) const { t[0] = q.data(), t[1] = s.data(), t[2] = b.data(); }
};
template <int K, typename QT, bool PER_TENSOR>
struct QuantMatrix<k::ChannelW<K, QT, bf16_t, PER_TENSOR>> {
    std::vector<QT> q;
    std::vector<bf16_t> s;
    QuantMatrix(int n) : q(size_t(n) * K), s(PER_TENSOR ? 1 : size_t(n)) {
        for (auto& v : q) {
            if constexpr (std::is_same_v<QT, int8_t>) v = int8_t(int(rng()() % 255) - 127);
            else {
                uint8_t b = uint8_t(rng()() & 0xf7);  // |v| <= 240, never NaN
                v = k::fp8e4m3{b};
            }
        }
        for (auto& v : s) v = bf16(uniform(0.002f, 0.02f));
    }
    void table(const void** t) const { t[0] = q.data(), t[1] = s.data(); }
};

template <typename QG, typename QD, int H, int F, int E, int TOPK>
void moe_quant_case(int rows, bool dequantized_reference) {
    constexpr int P = QG::kTensors;
    SCOPED_TRACE(testing::Message() << "moe_quant H=" << H << " F=" << F << " E=" << E << " top-k=" << TOPK << " tensors/projection=" << P);
    std::vector<QuantMatrix<QG>> gate, up;
    std::vector<QuantMatrix<QD>> down;
    std::vector<const void*> table(size_t(3 * P * E));
    for (int e = 0; e < E; ++e) {
        gate.emplace_back(F), up.emplace_back(F), down.emplace_back(H);
    }
    for (int e = 0; e < E; ++e) {
        gate[e].table(&table[size_t(3 * P * e)]);
        up[e].table(&table[size_t(3 * P * e + P)]);
        down[e].table(&table[size_t(3 * P * e + 2 * P)]);
    }
    std::vector<float> router(static_cast<size_t>(E * H));
    for (auto& v : router) v = uniform(-0.5f, 0.5f);
    const auto x = random_x(rows, H);
    std::vector<float> residual(size_t(rows) * H), out(size_t(rows) * H);
    for (auto& v : residual) v = uniform(-1, 1);
    std::vector<float> ws(size_t(rows) * (3 * H + 2 * F + E + 2 * TOPK + 2) + 2 * E + 64);
    k::moe_quant<H, F, E, TOPK, true, QG, QD, float>(rows, x.data(), router.data(), table.data(), residual.data(), out.data(),
                                                      ws.data(), pool());
    int used[E] = {};
    for (int t = 0; t < rows; ++t) {
        const float* xt = x.data() + size_t(t) * H;
        double p[E], z = 0, mx = -1e300;
        for (int e = 0; e < E; ++e) {
            p[e] = 0;
            for (int c = 0; c < H; ++c) p[e] += double(xt[c]) * router[size_t(e) * H + c];
            mx = std::max(mx, p[e]);
        }
        for (int e = 0; e < E; ++e) z += (p[e] = std::exp(p[e] - mx));
        int order[E];
        for (int e = 0; e < E; ++e) order[e] = e, p[e] /= z;
        std::sort(order, order + E, [&](int a, int b) { return p[a] > p[b]; });
        ASSERT_GT(p[order[TOPK - 1]] - p[order[TOPK]], 1e-5) << "token " << t << ": a near tie in the routing (choose another seed)";
        double wsum = 0;
        for (int j = 0; j < TOPK; ++j) wsum += p[order[j]];
        std::vector<double> ref(H), mag(H);
        for (int c = 0; c < H; ++c) ref[c] = residual[size_t(t) * H + c], mag[c] = std::fabs(ref[c]);
        for (int j = 0; j < TOPK; ++j) {
            const int e = order[j];
            ++used[e];
            const double wt = p[e] / wsum;
            const void* const* te = &table[size_t(3 * P * e)];
            std::vector<float> act(F), y(H);
            k::qlinear_glu<F, H, k::Act::silu>(1, xt, QG::from(te), QG::from(te + P), act.data(), pool());
            k::qlinear<H, F>(1, act.data(), QD::from(te + 2 * P), nullptr, nullptr, y.data(), pool());
            if (dequantized_reference) {  // the expert itself, in float64 on the dequantized weights
                const QG wg = QG::from(te), wu = QG::from(te + P);
                const QD wd = QD::from(te + 2 * P);
                // Bounds: a dot product of length K within K ulps (2^-23 K) of the sum of its |terms|
                // (expect_close's allowance); silu and the product in f32 add a few ulps of |a|.
                std::vector<double> a(F), ta(F);
                for (int f = 0; f < F; ++f) {
                    double g = 0, u = 0, mg = 0, mu = 0;
                    for (int c = 0; c < H; ++c) {
                        g += double(xt[c]) * wg.at(f, c), mg += std::fabs(double(xt[c]) * wg.at(f, c));
                        u += double(xt[c]) * wu.at(f, c), mu += std::fabs(double(xt[c]) * wu.at(f, c));
                    }
                    a[f] = g / (1 + std::exp(-g)) * u;
                    const double tg = mg * H * 1.2e-7, tu = mu * H * 1.2e-7;
                    ta[f] = 1.2 * tg * (std::fabs(u) + tu) + (std::fabs(g) + tg) * tu + 1e-6 * std::fabs(a[f]) + 1e-30;
                    ASSERT_NEAR(act[f], a[f], ta[f]) << "token " << t << " expert " << e << " act " << f;
                }
                for (int c = 0; c < H; ++c) {
                    double yd = 0, ym = 0, carried = 0;
                    for (int f = 0; f < F; ++f) {
                        yd += a[f] * wd.at(c, f);
                        ym += std::fabs(a[f] * wd.at(c, f));
                        carried += ta[f] * std::fabs(wd.at(c, f));
                    }
                    ASSERT_NEAR(y[c], yd, carried + (ym + carried) * F * 1.2e-7 + 1e-30) << "token " << t << " expert " << e << " out " << c;
                }
            }
            for (int c = 0; c < H; ++c) ref[c] += wt * y[c], mag[c] += std::fabs(wt * y[c]);
        }
        for (int c = 0; c < H; ++c)
            ASSERT_NEAR(out[size_t(t) * H + c], ref[c], mag[c] * 4e-6 + 1e-30) << "token " << t << " col " << c;
    }
    int experts_used = 0;
    for (int e = 0; e < E; ++e) experts_used += used[e] > 0;
    if (rows * TOPK >= 12) {
        EXPECT_GE(experts_used, 3) << "the case should route tokens to most experts";
    }
}

}  // namespace

TEST(QuantKernels, MoeOverQuantizedExperts) {
    constexpr int H = 64, F = 96, E = 4, TOPK = 2;
    moe_quant_case<k::AffineW<H, 4, 32, bf16_t>, k::AffineW<F, 4, 32, bf16_t>, H, F, E, TOPK>(9, false);
    moe_quant_case<k::AffineW<H, 4, 64, bf16_t>, k::AffineW<F, 4, 32, bf16_t>, H, F, E, TOPK>(1, false);
    moe_quant_case<k::ChannelW<H, int8_t, bf16_t, false>, k::ChannelW<F, int8_t, bf16_t, false>, H, F, E, TOPK>(9, true);
    moe_quant_case<k::ChannelW<H, k::fp8e4m3, bf16_t, true>, k::ChannelW<F, k::fp8e4m3, bf16_t, true>, H, F, E, TOPK>(6, true);
}
