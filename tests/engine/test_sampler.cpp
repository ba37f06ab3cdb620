// Sampler: every step checked against an independent float64 reference, and the random draw
// checked statistically against the reference distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/engine/rng.hpp"
#include "runtime/engine/sampler.hpp"

using namespace scr::engine;
using scr::SamplingParams;
using scr::TokenLogprob;

namespace {

std::vector<float> random_logits(int V, uint32_t seed, float scale = 2.0f) {
    std::mt19937 g(seed);
    std::normal_distribution<float> n(0.f, scale);
    std::vector<float> v(static_cast<size_t>(V));
    for (float& x : v) x = n(g);
    return v;
}

// The float64 reference of temperature -> min_p -> top-k -> top-p, as vLLM defines them.
std::vector<double> reference_distribution(const std::vector<float>& logits, const SamplingParams& p) {
    const size_t V = logits.size();
    std::vector<double> l(V);
    for (size_t i = 0; i < V; ++i) l[i] = double(logits[i]) / p.temperature;
    std::vector<bool> keep(V, true);
    double m = *std::max_element(l.begin(), l.end());
    if (p.min_p > 0) {  // prob < min_p * max_prob is dropped
        double z = 0;
        for (double x : l) z += std::exp(x - m);
        for (size_t i = 0; i < V; ++i) keep[i] = std::exp(l[i] - m) / z >= p.min_p * (1.0 / z);
    }
    if (p.top_k > 0 && size_t(p.top_k) < V) {
        std::vector<double> kept;
        for (size_t i = 0; i < V; ++i) if (keep[i]) kept.push_back(l[i]);
        if (size_t(p.top_k) < kept.size()) {
            std::sort(kept.rbegin(), kept.rend());
            double kth = kept[size_t(p.top_k) - 1];
            for (size_t i = 0; i < V; ++i) if (l[i] < kth) keep[i] = false;
        }
    }
    if (p.top_p < 1) {
        std::vector<size_t> idx;
        double z = 0;
        for (size_t i = 0; i < V; ++i) if (keep[i]) { idx.push_back(i); z += std::exp(l[i] - m); }
        std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return l[a] > l[b]; });
        double before = 0;
        for (size_t r = 0; r < idx.size(); ++r) {
            if (r > 0 && before >= p.top_p) keep[idx[r]] = false;
            before += std::exp(l[idx[r]] - m) / z;
        }
    }
    std::vector<double> prob(V, 0.0);
    double z = 0;
    for (size_t i = 0; i < V; ++i) if (keep[i]) z += (prob[i] = std::exp(l[i] - m));
    for (double& x : prob) x /= z;
    return prob;
}

// Draws n tokens and checks each token's frequency against the reference within 5 sigma (and
// that tokens outside the reference support are never drawn).
void check_distribution(const std::vector<float>& logits, const SamplingParams& p, int n, uint64_t seed) {
    const int V = int(logits.size());
    Sampler sampler(V);
    Rng rng(seed);
    std::vector<int> hist(size_t(V), 0);
    std::vector<float> row;
    const std::vector<int32_t> ctx = {1};
    for (int i = 0; i < n; ++i) {
        row = logits;
        int32_t t = sampler.sample(row.data(), p, ctx, 0, {}, rng, nullptr);
        ASSERT_GE(t, 0);
        ASSERT_LT(t, V);
        hist[size_t(t)]++;
    }
    const std::vector<double> ref = reference_distribution(logits, p);
    double tv = 0;
    for (int v = 0; v < V; ++v) {
        const double f = double(hist[size_t(v)]) / n, q = ref[size_t(v)];
        tv += std::abs(f - q) / 2;
        if (q == 0) {
            EXPECT_EQ(hist[size_t(v)], 0) << "token " << v << " is outside the reference support";
            continue;
        }
        const double sigma = std::sqrt(q * (1 - q) / n);
        EXPECT_LE(std::abs(f - q), 5 * sigma + 1e-12) << "token " << v << " freq " << f << " ref " << q;
    }
    EXPECT_LT(tv, 0.02);
}

}  // namespace

TEST(Sampler, GreedyIsArgmaxAndDrawsNoRandomness) {
    auto logits = random_logits(300, 1);
    SamplingParams p;
    p.temperature = 0;
    Sampler s(300);
    Rng a(5), b(5);
    auto row = logits;
    int32_t t = s.sample(row.data(), p, std::vector<int32_t>{1}, 0, {}, a, nullptr);
    EXPECT_EQ(t, int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    EXPECT_EQ(a.next(), b.next());  // greedy consumed nothing from the generator
}

TEST(Sampler, TemperatureMatchesReference) {
    SamplingParams p;
    p.temperature = 0.7f;
    check_distribution(random_logits(40, 2, 1.0f), p, 60000, 11);
}

TEST(Sampler, TopKMatchesReference) {
    SamplingParams p;
    p.top_k = 5;
    check_distribution(random_logits(40, 3), p, 40000, 12);
}

TEST(Sampler, TopPMatchesReference) {
    SamplingParams p;
    p.top_p = 0.8f;
    check_distribution(random_logits(40, 4), p, 40000, 13);
}

TEST(Sampler, MinPMatchesReference) {
    SamplingParams p;
    p.min_p = 0.1f;
    check_distribution(random_logits(40, 5), p, 40000, 14);
}

TEST(Sampler, CombinedFiltersMatchReference) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.top_k = 12;
    p.top_p = 0.9f;
    p.min_p = 0.02f;
    check_distribution(random_logits(60, 6), p, 40000, 15);
}

// The kept set of top-p (mass of what is kept >= p, and dropping the least likely kept token
// would fall below p) over many rows, including vocabularies large enough that the sampler must
// grow its partially sorted head several times.
TEST(Sampler, TopPKeptSetIsExact) {
    for (int trial = 0; trial < 60; ++trial) {
        const int V = trial % 3 == 0 ? 5000 : 257;
        auto logits = random_logits(V, 100 + uint32_t(trial), trial % 2 ? 0.5f : 3.0f);
        SamplingParams p;
        p.top_p = 0.05f + 0.9f * float(trial) / 60.0f;
        p.top_k = trial % 4 == 1 ? 50 : 0;
        Sampler s(V);
        auto row = logits;
        s.apply_min_p_top_k_top_p(row.data(), p);
        const auto ref = reference_distribution(logits, p);
        for (int v = 0; v < V; ++v) {
            ASSERT_EQ(std::isinf(row[size_t(v)]), ref[size_t(v)] == 0) << "trial " << trial << " token " << v;
            if (ref[size_t(v)] > 0) { EXPECT_EQ(row[size_t(v)], logits[size_t(v)]); }
        }
        if (p.top_k > 0) continue;
        // Without top-k: the kept tokens hold at least p of the mass, and without the least
        // likely kept token they would hold less.
        const double m = *std::max_element(logits.begin(), logits.end());
        double z = 0, kept = 0, smallest_kept = 1e300;
        for (int v = 0; v < V; ++v) {
            const double e = std::exp(double(logits[size_t(v)]) - m);
            z += e;
            if (!std::isinf(row[size_t(v)])) { kept += e; smallest_kept = std::min(smallest_kept, e); }
        }
        EXPECT_GE(kept / z, p.top_p - 1e-6) << "trial " << trial;
        EXPECT_LT((kept - smallest_kept) / z, p.top_p + 1e-6) << "trial " << trial;
    }
}

// The kept set of top-k, ties with the k-th value kept, for k on both sides of the sampler's switch
// from a min-heap to nth_element (4096), on rows of many ties and smooth rows, some with -inf entries.
TEST(Sampler, TopKKeptSetIsExact) {
    const int V = 6000;
    for (int trial = 0; trial < 12; ++trial) {
        std::mt19937 g(900 + uint32_t(trial));
        std::vector<float> logits(static_cast<size_t>(V));
        for (float& x : logits) x = trial % 2 ? float(int(g() % 40)) * 0.25f : std::normal_distribution<float>(0.f, 3.f)(g);
        if (trial % 3 == 2)
            for (int i = 0; i < V; i += 5) logits[size_t(i)] = -std::numeric_limits<float>::infinity();
        const int ks[] = {1, 7, 50, 4096, 4097, 4700};
        SamplingParams p;
        p.top_k = ks[trial % 6];
        Sampler s(V);
        auto row = logits;
        s.apply_min_p_top_k_top_p(row.data(), p);
        // Reference: the k-th largest finite value, by a full sort.
        std::vector<float> finite;
        for (float x : logits) if (x > -std::numeric_limits<float>::infinity()) finite.push_back(x);
        std::sort(finite.rbegin(), finite.rend());
        const float kth = size_t(p.top_k) < finite.size() ? finite[size_t(p.top_k) - 1] : -std::numeric_limits<float>::infinity();
        int kept = 0;
        for (int v = 0; v < V; ++v) {
            const bool want = logits[size_t(v)] > -std::numeric_limits<float>::infinity() && logits[size_t(v)] >= kth;
            ASSERT_EQ(row[size_t(v)] > -std::numeric_limits<float>::infinity(), want) << "trial " << trial << " k " << p.top_k << " token " << v;
            kept += want;
        }
        EXPECT_GE(kept, std::min(p.top_k, int(finite.size())));
    }
}

// exp_shifted against std::exp (float64) on random rows over its whole range, and at its edges: the
// maximum itself, the floor at m - 708, the tiny values below it, -inf and NaN.
TEST(Sampler, ExpShiftedMatchesStdExp) {
    std::mt19937 g(77);
    std::uniform_real_distribution<float> below(-720.0f, 0.0f);
    const float ms[] = {0.0f, 12.5f, -3.25f, 1e4f};
    for (float m : ms) {
        std::vector<float> x(4099);  // not a multiple of any vector width
        for (float& v : x) v = m + below(g) * (g() % 4 == 0 ? 1.0f : 0.05f);
        x[0] = m;
        x[1] = m - 707.9f;
        x[2] = m - 708.5f;
        x[3] = -std::numeric_limits<float>::infinity();
        x[4] = std::nanf("");
        x[5] = m - 1e-6f;
        std::vector<double> w(x.size());
        exp_shifted(x.data(), int(x.size()), m, w.data());
        double worst = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            const double d = double(x[i]) - double(m);
            if (!(d >= -708.0)) {  // below the floor, -inf, NaN: no mass (std::exp < 3.3e-308 there)
                EXPECT_EQ(w[i], 0.0) << "x " << x[i] << " m " << m;
                continue;
            }
            const double ref = std::exp(d);
            worst = std::max(worst, std::abs(w[i] - ref) / ref);
        }
        EXPECT_LE(worst, 4.5e-16) << "m " << m;
        EXPECT_EQ(w[0], 1.0);
    }
}

// The draw inverts the CDF of the kept tokens in id order: for every uniform on a grid, the token
// whose float64 reference CDF interval (std::exp masses) holds it; uniforms within 1e-12 of a
// boundary are skipped (the two sums may round differently there).
TEST(Sampler, DrawInvertsTheCdf) {
    for (int trial = 0; trial < 6; ++trial) {
        const int V = trial % 2 ? 5003 : 64;
        auto x = random_logits(V, 300 + uint32_t(trial), 3.0f);
        for (int i = 0; i < V; i += 7) x[size_t(i)] = -std::numeric_limits<float>::infinity();  // filtered
        if (trial == 4) x[3] = std::nanf("");
        Sampler s(V);
        const float m = *std::max_element(x.begin(), x.end(), [](float a, float b) { return std::isnan(a) || a < b; });
        std::vector<double> cdf(static_cast<size_t>(V));
        double z = 0;
        for (int i = 0; i < V; ++i) {
            if (x[size_t(i)] > -std::numeric_limits<float>::infinity()) z += std::exp(double(x[size_t(i)]) - m);
            cdf[size_t(i)] = z;
        }
        int checked = 0;
        for (int j = 0; j < 2000; ++j) {
            const double u = (j + 0.5) / 2000.0;
            const auto it = std::upper_bound(cdf.begin(), cdf.end(), u * z);
            const double near = std::min(std::abs(*it - u * z), it == cdf.begin() ? 1e300 : std::abs(*(it - 1) - u * z));
            if (near <= 1e-12 * z) continue;
            ++checked;
            ASSERT_EQ(s.draw(x.data(), u), int32_t(it - cdf.begin())) << "trial " << trial << " u " << u;
        }
        EXPECT_GT(checked, 1990);
    }
}

// vLLM: vllm/model_executor/layers/utils.py:L72 (apply_penalties) against the definitions computed
// here in double: repetition over prompt+output, frequency/presence over outputs only.
TEST(Sampler, PenaltiesMatchDefinitions) {
    const int V = 30;
    auto logits = random_logits(V, 7);
    SamplingParams p;
    p.repetition_penalty = 1.3f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.7f;
    const std::vector<int32_t> ctx = {1, 2, 2, 3, /*outputs:*/ 3, 4, 4, 4, 9};
    const int num_out = 5;
    Sampler s(V);
    auto row = logits;
    s.apply_penalties(row.data(), p, ctx, num_out);
    for (int v = 0; v < V; ++v) {
        double l = logits[size_t(v)];
        bool in_ctx = std::count(ctx.begin(), ctx.end(), v) > 0;
        int out_count = int(std::count(ctx.end() - num_out, ctx.end(), v));
        if (in_ctx) l = l > 0 ? l / 1.3 : l * 1.3;
        l -= 0.5 * out_count;
        if (out_count) l -= 0.7;
        EXPECT_NEAR(row[size_t(v)], l, 1e-5) << "token " << v;
    }
    // Scratch is reset: applying again to fresh logits gives the same result.
    auto row2 = logits;
    s.apply_penalties(row2.data(), p, ctx, num_out);
    EXPECT_EQ(row, row2);
}

TEST(Sampler, LogitBiasAndMinTokens) {
    const int V = 20;
    std::vector<float> logits(V, 0.f);
    logits[3] = 5.f;  // eos would win
    SamplingParams p;
    p.temperature = 0;
    p.min_tokens = 2;
    p.stop_token_ids = {7};
    p.logit_bias = {{7, 10.f}, {11, 4.f}};
    Sampler s(V);
    Rng rng(1);
    const std::vector<int32_t> eos = {3};
    auto row = logits;
    // 0 outputs < min_tokens: eos (3) and the stop token (7, biased to 10) are banned -> 11 wins.
    EXPECT_EQ(s.sample(row.data(), p, std::vector<int32_t>{1}, 0, eos, rng, nullptr), 11);
    row = logits;
    // Enough outputs: the biased stop token wins.
    EXPECT_EQ(s.sample(row.data(), p, std::vector<int32_t>{1, 2, 3}, 2, eos, rng, nullptr), 7);
    p.ignore_eos = true;
    p.logit_bias.clear();
    row = logits;
    // ignore_eos: eos is a normal token and may be sampled even before min_tokens.
    EXPECT_EQ(s.sample(row.data(), p, std::vector<int32_t>{1}, 0, eos, rng, nullptr), 3);
}

TEST(Sampler, SeededDrawsAreReproducible) {
    auto logits = random_logits(100, 8, 1.0f);
    SamplingParams p;
    p.top_p = 0.95f;
    Sampler s(100);
    auto draw = [&](uint64_t seed) {
        Rng rng(seed);
        std::vector<int32_t> out;
        for (int i = 0; i < 200; ++i) {
            auto row = logits;
            out.push_back(s.sample(row.data(), p, std::vector<int32_t>{1}, 0, {}, rng, nullptr));
        }
        return out;
    };
    EXPECT_EQ(draw(42), draw(42));
    EXPECT_NE(draw(42), draw(43));
}

// vLLM: vllm/v1/sample/sampler.py:L252 (gather_logprobs): raw-logit logprobs of the sampled token
// and the top-k, best first.
TEST(Sampler, LogprobsAreRawLogSoftmax) {
    const int V = 64;
    auto logits = random_logits(V, 9);
    SamplingParams p;
    p.temperature = 0.5f;
    p.repetition_penalty = 2.0f;  // processing must not leak into the reported logprobs
    p.logprobs = 5;
    Sampler s(V);
    Rng rng(3);
    TokenLogprob lp;
    auto row = logits;
    int32_t t = s.sample(row.data(), p, std::vector<int32_t>{1, 2}, 1, {}, rng, &lp);
    double m = *std::max_element(logits.begin(), logits.end()), z = 0;
    for (float x : logits) z += std::exp(double(x) - m);
    auto ref = [&](int v) { return double(logits[size_t(v)]) - m - std::log(z); };
    EXPECT_EQ(lp.token_id, t);
    EXPECT_NEAR(lp.logprob, ref(t), 1e-5);
    ASSERT_EQ(lp.top.size(), 5u);
    std::vector<int> order(V);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    for (int j = 0; j < 5; ++j) {
        EXPECT_EQ(lp.top[size_t(j)].first, order[size_t(j)]);
        EXPECT_NEAR(lp.top[size_t(j)].second, ref(order[size_t(j)]), 1e-5);
    }
}

// Speculative decoding's check of a draft token (Sampler::verify_draft): whatever the draft, the
// token that comes out is distributed as the row's processed distribution p (the float64 reference
// above), and the draft is accepted with probability p(draft).
namespace {
void check_verify_draft(const std::vector<float>& logits, const SamplingParams& p, int32_t draft, int n, uint64_t seed) {
    const int V = int(logits.size());
    Sampler sampler(V);
    Rng rng(seed);
    std::vector<int> hist(size_t(V), 0);
    int accepted = 0;
    std::vector<float> row;
    for (int i = 0; i < n; ++i) {
        row = logits;
        const Sampler::DraftVerdict v = sampler.verify_draft(row.data(), p, 0, draft, rng);
        ASSERT_GE(v.token, 0);
        ASSERT_LT(v.token, V);
        if (v.accepted) {
            ASSERT_EQ(v.token, draft);
            ++accepted;
        } else {
            ASSERT_NE(v.token, draft) << "a rejected draft came back as the token";
        }
        hist[size_t(v.token)]++;
    }
    const std::vector<double> ref = reference_distribution(logits, p);
    for (int v = 0; v < V; ++v) {
        const double f = double(hist[size_t(v)]) / n, q = ref[size_t(v)];
        if (q == 0) {
            EXPECT_EQ(hist[size_t(v)], 0) << "token " << v << " is outside the reference support";
            continue;
        }
        const double sigma = std::sqrt(q * (1 - q) / n);
        EXPECT_LE(std::abs(f - q), 5 * sigma + 1e-12) << "token " << v << " freq " << f << " ref " << q << " draft " << draft;
    }
    const double qd = ref[size_t(draft)];  // P(accepted) = p(draft)
    EXPECT_LE(std::abs(double(accepted) / n - qd), 5 * std::sqrt(qd * (1 - qd) / n) + 1e-12) << "draft " << draft;
}
}  // namespace

TEST(Sampler, VerifyDraftKeepsTheDistribution) {
    const auto logits = random_logits(40, 21, 1.5f);
    const int32_t likely = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const int32_t unlikely = int32_t(std::min_element(logits.begin(), logits.end()) - logits.begin());
    const int32_t middle = likely == 7 || unlikely == 7 ? 8 : 7;
    SamplingParams temp;
    temp.temperature = 0.8f;
    SamplingParams filtered;  // the draft may lie outside what the filters keep
    filtered.temperature = 1.2f;
    filtered.top_k = 12;
    filtered.top_p = 0.9f;
    filtered.min_p = 0.02f;
    uint64_t seed = 100;
    for (const SamplingParams* p : {&temp, &filtered})
        for (int32_t draft : {likely, middle, unlikely}) check_verify_draft(logits, *p, draft, 30000, ++seed);
}

TEST(Sampler, VerifyDraftGreedyIsArgmax) {
    const auto logits = random_logits(300, 22);
    const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    SamplingParams p;
    p.temperature = 0;
    Sampler s(300);
    Rng a(9), b(9);
    for (int32_t draft : {best, (best + 1) % 300}) {
        auto row = logits;
        const Sampler::DraftVerdict v = s.verify_draft(row.data(), p, 0, draft, a);
        EXPECT_EQ(v.token, best);
        EXPECT_EQ(v.accepted, draft == best);
    }
    EXPECT_EQ(a.next(), b.next());  // greedy consumed nothing from the generator
}

TEST(Sampler, VerifyDraftRefusesRowsItCannotCheck) {
    auto logits = random_logits(50, 23);
    Sampler s(50);
    Rng rng(1);
    SamplingParams p;
    p.temperature = 1.0f;
    EXPECT_THROW(s.verify_draft(logits.data(), p, 0, 50, rng), std::out_of_range);
    EXPECT_THROW(s.verify_draft(logits.data(), p, 0, -1, rng), std::out_of_range);
    SamplingParams pen = p;
    pen.repetition_penalty = 1.1f;
    EXPECT_THROW(s.verify_draft(logits.data(), pen, 0, 3, rng), std::logic_error);
    SamplingParams lp = p;
    lp.logprobs = 2;
    EXPECT_THROW(s.verify_draft(logits.data(), lp, 0, 3, rng), std::logic_error);
    SamplingParams mt = p;
    mt.min_tokens = 4;
    EXPECT_THROW(s.verify_draft(logits.data(), mt, 3, 3, rng), std::logic_error);  // 3 of 4 outputs so far
}
