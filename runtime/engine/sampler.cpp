#include "runtime/engine/sampler.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>

namespace scr::engine {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Max over a row in 16 independent lanes, so the compiler can keep them in vector registers (a
// single running max is a serial dependency chain). NaNs are ignored.
float max_of(const float* x, int n) {
    float lanes[16];
    std::fill(lanes, lanes + 16, kNegInf);
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; ++k) lanes[k] = lanes[k] < x[i + k] ? x[i + k] : lanes[k];
    float m = kNegInf;
    for (int k = 0; k < 16; ++k) m = m < lanes[k] ? lanes[k] : m;
    for (; i < n; ++i) m = m < x[i] ? x[i] : m;
    return m;
}
}  // namespace

void exp_shifted(const float* x, int n, float m, double* w) {
    constexpr double kLog2e = 1.4426950408889634074;
    constexpr double kLn2Hi = 6.93147180369123816490e-01;  // fdlibm's split: k * kLn2Hi is exact for |k| < 2^20
    constexpr double kLn2Lo = 1.90821492927058770002e-10;
    constexpr double kRound = 0x1.8p52;                     // adding it rounds to an integer, kept in the low bits
    constexpr double kFloor = -708.0;                       // exp(-708) = 3.3e-308, still normal
    const int64_t round_bits = std::bit_cast<int64_t>(kRound);
    for (int i = 0; i < n; ++i) {
        const double d = double(x[i]) - double(m);
        const bool zero = !(d >= kFloor);            // also -inf and NaN
        const double c = zero ? 0.0 : (d > 0.0 ? 0.0 : d);
        const double t = c * kLog2e + kRound;
        const double k = t - kRound;                 // round(c / ln 2), in [-1022, 0]
        const int64_t ki = std::bit_cast<int64_t>(t) - round_bits;
        const double r = (c - k * kLn2Hi) - k * kLn2Lo;  // |r| <= ln 2 / 2
        // exp(r) by Taylor to r^13: the remainder is below 4e-18 for |r| <= 0.347.
        double p = 1.0 / 6227020800.0;
        p = p * r + 1.0 / 479001600.0;
        p = p * r + 1.0 / 39916800.0;
        p = p * r + 1.0 / 3628800.0;
        p = p * r + 1.0 / 362880.0;
        p = p * r + 1.0 / 40320.0;
        p = p * r + 1.0 / 5040.0;
        p = p * r + 1.0 / 720.0;
        p = p * r + 1.0 / 120.0;
        p = p * r + 1.0 / 24.0;
        p = p * r + 1.0 / 6.0;
        p = p * r + 0.5;
        p = p * r + 1.0;
        p = p * r + 1.0;
        const double scale = std::bit_cast<double>((ki + 1023) << 52);
        w[i] = zero ? 0.0 : p * scale;
    }
}

Sampler::Sampler(int vocab_size)
    : vocab_(vocab_size), raw_(size_t(vocab_size)), order_(size_t(vocab_size)),
      counts_(size_t(vocab_size), 0), seen_(size_t(vocab_size), 0), weights_(size_t(vocab_size)) {
    touched_.reserve(4096);
    heap_.reserve(size_t(std::min(vocab_size, kHeapTopK)));
}

// vLLM: vllm/v1/sample/logits_processor/builtin.py:L229 (MinTokensLogitsProcessor.apply): until
// min_tokens outputs exist, every stop token (eos unless ignored, and stop_token_ids) is banned.
void Sampler::apply_min_tokens(float* logits, const SamplingParams& p, int num_output_tokens,
                               std::span<const int32_t> eos_ids) const {
    if (num_output_tokens >= p.min_tokens) return;
    if (!p.ignore_eos)
        for (int32_t id : eos_ids) if (id >= 0 && id < vocab_) logits[id] = kNegInf;
    for (int32_t id : p.stop_token_ids) if (id >= 0 && id < vocab_) logits[id] = kNegInf;
}

// vLLM: vllm/v1/sample/logits_processor/builtin.py:L160 (LogitBiasLogitsProcessor.apply)
void Sampler::apply_logit_bias(float* logits, const SamplingParams& p) const {
    for (auto [id, bias] : p.logit_bias) if (id >= 0 && id < vocab_) logits[id] += bias;
}

// vLLM: vllm/model_executor/layers/utils.py:L72 (apply_penalties): repetition over prompt and
// output tokens (L104: divide positive logits, multiply negative ones), then the OpenAI frequency
// (L108: minus f * count) and presence (L109: minus p if present) penalties over output tokens.
void Sampler::apply_penalties(float* logits, const SamplingParams& p, std::span<const int32_t> context,
                              int num_output_tokens) {
    const bool repetition = p.repetition_penalty != 1.0f;
    const bool freq_or_presence = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    if (!repetition && !freq_or_presence) return;  // vLLM: sampler.py:L350 (no_penalties)
    touched_.clear();
    if (repetition) {
        for (int32_t id : context) {
            if (id < 0 || id >= vocab_ || seen_[id]) continue;
            seen_[id] = 1;
            touched_.push_back(id);
            float& l = logits[id];
            l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
        }
    }
    if (freq_or_presence) {
        const size_t first_output = context.size() - size_t(num_output_tokens);
        for (size_t i = first_output; i < context.size(); ++i) {
            int32_t id = context[i];
            if (id < 0 || id >= vocab_) continue;
            if (counts_[id]++ == 0 && !seen_[id]) touched_.push_back(id);
        }
        for (int32_t id : touched_) {
            if (counts_[id] == 0) continue;
            logits[id] -= p.frequency_penalty * float(counts_[id]) + p.presence_penalty;
        }
    }
    for (int32_t id : touched_) { seen_[id] = 0; counts_[id] = 0; }
}

int32_t Sampler::argmax(const float* logits) const {
    // vLLM: vllm/v1/sample/sampler.py:L168 (greedy_sample); the first maximum wins.
    // One pass, 16 lanes each keeping its maximum and where it first occurred (vectorizable);
    // then the best lane, the lowest index among equal maxima. NaNs are ignored.
    float val[16];
    int32_t idx[16];
    std::fill(val, val + 16, kNegInf);
    std::fill(idx, idx + 16, 0);
    int32_t i = 0;
    for (; i + 16 <= vocab_; i += 16)
        for (int k = 0; k < 16; ++k) {
            const bool better = logits[i + k] > val[k];
            val[k] = better ? logits[i + k] : val[k];
            idx[k] = better ? i + k : idx[k];
        }
    float best = kNegInf;
    int32_t best_i = 0;
    for (int k = 0; k < 16; ++k)
        if (val[k] > best || (val[k] == best && idx[k] < best_i)) { best = val[k]; best_i = idx[k]; }
    for (; i < vocab_; ++i) if (logits[i] > best) { best = logits[i]; best_i = i; }
    return best_i;
}

void Sampler::apply_min_p_top_k_top_p(float* logits, const SamplingParams& p) {
    const int V = vocab_;
    const float m = max_of(logits, V);
    if (!(m > kNegInf)) return;

    // vLLM: vllm/v1/sample/logits_processor/builtin.py:L100 (MinPLogitsProcessor.apply): drop tokens
    // whose probability is below min_p times the top probability; in logit space
    // l < max + log(min_p).
    if (p.min_p > 0.0f) {
        const float threshold = m + std::log(p.min_p);
        for (int i = 0; i < V; ++i) if (logits[i] < threshold) logits[i] = kNegInf;
    }

    const bool top_k = p.top_k > 0 && p.top_k < V;
    const bool top_p = p.top_p < 1.0f;
    if (!top_k && !top_p) return;

    int n = 0;
    for (int i = 0; i < V; ++i) if (logits[i] > kNegInf) order_[size_t(n++)] = i;
    auto desc = [&](int32_t a, int32_t b) { return logits[a] > logits[b]; };

    // vLLM: vllm/v1/sample/ops/topk_topp_sampler.py:L265 (top-k in apply_top_k_top_p): keep what is
    // at least the k-th largest value (ties with it survive).
    if (top_k && p.top_k < n) {
        float kth;
        if (p.top_k <= kHeapTopK) {
            // The k largest values in a min-heap, one pass in id order: after the first k, a value
            // enters only if it beats the heap's least (rarely, for k much smaller than n), so this
            // is ~one comparison per token against nth_element's several indirect ones (~10x).
            heap_.clear();
            const auto greater = std::greater<float>();
            for (int i = 0; i < V; ++i) {
                const float v = logits[i];
                if (!(v > kNegInf)) continue;
                if (int(heap_.size()) < p.top_k) {
                    heap_.push_back(v);
                    std::push_heap(heap_.begin(), heap_.end(), greater);
                } else if (v > heap_.front()) {
                    std::pop_heap(heap_.begin(), heap_.end(), greater);
                    heap_.back() = v;
                    std::push_heap(heap_.begin(), heap_.end(), greater);
                }
            }
            kth = heap_.front();  // the k-th largest, ties counted one by one
        } else {
            std::nth_element(order_.begin(), order_.begin() + (p.top_k - 1), order_.begin() + n, desc);
            kth = logits[order_[size_t(p.top_k - 1)]];
        }
        int kept = 0;
        for (int j = 0; j < n; ++j) {
            int32_t id = order_[size_t(j)];
            if (logits[id] < kth) logits[id] = kNegInf;
            else order_[size_t(kept++)] = id;
        }
        n = kept;
    }
    if (!top_p) return;

    // vLLM: vllm/v1/sample/ops/topk_topp_sampler.py:L273 (top-p): sorting ascending and masking
    // where the cumulative probability is <= 1 - p is the same as keeping, in descending order,
    // every token whose better-ranked tokens hold less than p of the mass (the top one always).
    // Only the head of the order is sorted, growing it until it holds p of the mass.
    exp_shifted(logits, V, m, weights_.data());
    double z = 0;
    for (int j = 0; j < n; ++j) z += weights_[size_t(order_[size_t(j)])];
    const double target = double(p.top_p) * z;
    int sorted = std::min(n, 64);
    int keep = n;
    for (;;) {
        std::partial_sort(order_.begin(), order_.begin() + sorted, order_.begin() + n, desc);
        double cum = 0;
        int r = 0;
        for (; r < sorted; ++r) {
            if (r > 0 && cum >= target) break;
            cum += weights_[size_t(order_[size_t(r)])];
        }
        if (r < sorted || sorted == n) { keep = r; break; }
        sorted = std::min(n, sorted * 4);
    }
    for (int j = keep; j < n; ++j) logits[order_[size_t(j)]] = kNegInf;
}

double Sampler::masses(const float* logits, float& m) {
    const int V = vocab_;
    m = max_of(logits, V);
    exp_shifted(logits, V, m, weights_.data());
    double z = 0;
    for (int i = 0; i < V; ++i) z += weights_[size_t(i)];
    return z;
}

void Sampler::temper_and_filter(float* logits, const SamplingParams& p) {
    const float inv_t = 1.0f / p.temperature;
    for (int i = 0; i < vocab_; ++i) logits[i] *= inv_t;
    apply_min_p_top_k_top_p(logits, p);
}

int32_t Sampler::draw(const float* logits, double u01) {
    const int V = vocab_;
    float m;
    const double u = u01 * masses(logits, m);
    double cum = 0;
    int32_t last_finite = 0;
    for (int i = 0; i < V; ++i) {
        if (!(logits[i] > kNegInf)) continue;
        last_finite = i;
        cum += weights_[size_t(i)];
        if (cum > u) return i;
    }
    return last_finite;  // rounding at the very end of the CDF (or no finite logit: 0)
}

Sampler::DraftVerdict Sampler::verify_draft(float* logits, const SamplingParams& p, int num_output_tokens, int32_t draft,
                                             Rng& rng) {
    if (!device_supports(p, num_output_tokens))
        throw std::logic_error("Sampler::verify_draft: the row needs penalties, logit bias, min_tokens or logprobs");
    if (draft < 0 || draft >= vocab_) throw std::out_of_range("Sampler::verify_draft: draft token outside the vocabulary");
    if (p.temperature < kSamplingEps) {  // vLLM: rejection_sampler.py (rejection_greedy_sample_kernel)
        const int32_t t = argmax(logits);
        return {t == draft, t};
    }
    const int V = vocab_;
    temper_and_filter(logits, p);  // as sample()
    // p(draft): its mass over the kept tokens' (the same float64 masses as draw()).
    double p_draft = 0;
    if (logits[draft] > kNegInf) {
        float m;
        const double z = masses(logits, m);  // fills weights_ first
        p_draft = weights_[size_t(draft)] / z;
    }
    // vLLM: rejection_sampler.py (rejection_random_sample_kernel): accepted iff draft_prob > 0 and
    // target_prob / draft_prob >= u, draft_prob being 1 with no draft probabilities.
    const double u = rng.uniform();
    if (p_draft > 0 && p_draft >= u) return {true, draft};
    // The recovered token: p with the draft removed. If nothing else is kept, the draft was
    // certain (p_draft rounded below u): it stands.
    logits[draft] = kNegInf;
    bool any = false;
    for (int i = 0; i < V && !any; ++i) any = logits[i] > kNegInf;
    if (!any) return {true, draft};
    return {false, draw(logits, rng.uniform())};
}

bool Sampler::device_supports(const SamplingParams& p, int num_output_tokens) {
    return p.logprobs < 0 && p.logit_bias.empty() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
           p.frequency_penalty == 0.0f && num_output_tokens >= p.min_tokens;
}

// vLLM: vllm/v1/sample/sampler.py:L67 (Sampler.forward) and L171 (sample).
int32_t Sampler::sample(float* logits, const SamplingParams& p, std::span<const int32_t> context,
                        int num_output_tokens, std::span<const int32_t> eos_ids, Rng& rng,
                        TokenLogprob* logprobs) {
    const int V = vocab_;
    // vLLM: sampler.py:L93: logprobs come from the raw logits, before any processing.
    const bool want_logprobs = p.logprobs >= 0 && logprobs;
    if (want_logprobs) std::copy(logits, logits + V, raw_.begin());

    // vLLM: sampler.py:L308 (apply_logits_processors): L337 non-argmax-invariant processors
    // (min_tokens, logit_bias), then L341 penalties.
    apply_min_tokens(logits, p, num_output_tokens, eos_ids);
    apply_logit_bias(logits, p);
    apply_penalties(logits, p, context, num_output_tokens);

    int32_t token;
    if (p.temperature < kSamplingEps) {
        token = argmax(logits);  // vLLM: sampler.py:L195 (greedy), L240 (temperature < eps)
    } else {
        // vLLM: sampler.py:L156 (apply_temperature), L225 (argmax-invariant processors: min_p),
        // L229 (top-k/top-p), then a draw from the remaining distribution. vLLM draws with an
        // exponential race (topk_topp_sampler.py:L311, random_sample); we invert the CDF with one
        // uniform per token: the same distribution, far fewer random numbers.
        temper_and_filter(logits, p);
        token = draw(logits, rng.uniform());
    }

    if (want_logprobs) {
        // vLLM: sampler.py:L252 (gather_logprobs): the sampled token's logprob and the top-k.
        float m;
        const double z = masses(raw_.data(), m);
        const double lse = double(m) + std::log(z);
        logprobs->token_id = token;
        logprobs->logprob = float(double(raw_[size_t(token)]) - lse);
        logprobs->top.clear();
        const int k = std::min(p.logprobs, V);
        if (k > 0) {
            for (int i = 0; i < V; ++i) order_[size_t(i)] = i;
            std::partial_sort(order_.begin(), order_.begin() + k, order_.begin() + V,
                              [&](int32_t a, int32_t b) {
                                  return raw_[size_t(a)] > raw_[size_t(b)] ||
                                         (raw_[size_t(a)] == raw_[size_t(b)] && a < b);
                              });
            for (int j = 0; j < k; ++j) {
                int32_t id = order_[size_t(j)];
                logprobs->top.emplace_back(id, float(double(raw_[size_t(id)]) - lse));
            }
        }
    }
    return token;
}

}  // namespace scr::engine
