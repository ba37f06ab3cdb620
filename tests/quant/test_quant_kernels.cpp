// The quantized CPU kernels (kernels/cpu/quant_linear.hpp) against a float64 reference of the same
// dequantization (MLX affine: w = scale * q + bias; channel: w = scale * q), on random non-zero
// inputs at several shapes, group sizes and batch sizes; plus batch invariance (a row's output is
// bit-identical alone and inside any batch) and the fp8 e4m3 decoding table.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

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
    std::vector<float> bias(N), residual(size_t(rows) * N), y(size_t(rows) * N);
    for (auto& b : bias) b = uniform(-1, 1);
    for (auto& r : residual) r = uniform(-1, 1);
    k::qlinear<N, K>(rows, x.data(), w, bias.data(), residual.data(), y.data(), pool());
    std::vector<double> ref, mag;
    reference(w, N, K, x, rows, bias.data(), residual.data(), ref, mag);
    expect_close(y, ref, mag, K);
    k::qlinear<N, K>(rows, x.data(), w, nullptr, nullptr, y.data(), pool());
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
        if ((b & 0x7f) != 0x7f) EXPECT_EQ(k::fp8e4m3_table()[b], k::fp8e4m3_to_f32(uint8_t(b)));
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
    std::vector<double> g, u, mg, mu;
    reference(wg, N, K, x, rows, nullptr, nullptr, g, mg);
    reference(wu, N, K, x, rows, nullptr, nullptr, u, mu);
    for (int i = 0; i < rows * N; ++i) {
        const double want = g[i] / (1 + std::exp(-g[i])) * u[i];
        ASSERT_NEAR(y[i], want, 1e-5 * (std::fabs(want) + mg[i] * mu[i] * 1e-2) + 1e-6) << i;
    }
    // Embedding: rows of the dequantized table, exactly.
    const int32_t ids[3] = {5, 0, 23};
    std::vector<float> e(3 * K);
    k::qembed<K>(3, ids, wg, e.data(), pool());
    for (int t = 0; t < 3; ++t)
        for (int c = 0; c < K; ++c) ASSERT_EQ(e[t * K + c], wg.at(ids[t], c));
}
