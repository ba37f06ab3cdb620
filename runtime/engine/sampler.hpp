// Turns one row of logits into the next token of one sequence, with vLLM v1's processing order
// (vllm/v1/sample/sampler.py:L20, the Sampler docstring):
//   raw logprobs -> min_tokens and logit_bias (non-argmax-invariant processors) -> penalties ->
//   greedy, or temperature -> min_p -> top-k -> top-p -> random draw.
// Rows are independent (nothing depends on the batch), and all scratch is allocated once.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "runtime/engine/rng.hpp"

namespace scr::engine {

struct Sequence;

class Sampler {
public:
    explicit Sampler(int vocab_size);

    // `logits` (vocab_size floats) is modified in place. `context` is the prompt then the outputs
    // so far (penalties read it); `num_output_tokens` of them are outputs. Fills *logprobs when
    // params.logprobs >= 0 (with logprobs->top reusing its capacity).
    int32_t sample(float* logits, const SamplingParams& params, std::span<const int32_t> context,
                   int num_output_tokens, std::span<const int32_t> eos_ids, Rng& rng,
                   TokenLogprob* logprobs);

    // The steps, public for tests. Each works on one row in place.
    void apply_min_tokens(float* logits, const SamplingParams& p, int num_output_tokens,
                          std::span<const int32_t> eos_ids) const;
    void apply_logit_bias(float* logits, const SamplingParams& p) const;
    void apply_penalties(float* logits, const SamplingParams& p, std::span<const int32_t> context,
                         int num_output_tokens);
    // After temperature: masks to -inf what min_p, top_k and top_p remove.
    void apply_min_p_top_k_top_p(float* logits, const SamplingParams& p);
    int32_t argmax(const float* logits) const;
    // The random draw: inverts the CDF of the kept tokens (the finite entries of `logits`, after
    // temperature and filters) in id order at u in [0, 1). Masses exp(x - max) in float64
    // (exp_shifted), each computed once and summed in id order.
    int32_t draw(const float* logits, double u);

    static constexpr float kSamplingEps = 1e-5f;  // vLLM: vllm/v1/sample/sampler.py:L17

    // Speculative decoding's check of one draft token against this row (docs/ENGINE.md,
    // "Speculative decoding: the plan"), for a draft with no probabilities of its own (the n-gram
    // proposer's). Greedy: accepted iff the draft is the argmax; the token is the argmax either
    // way. Random: with p the row's distribution after temperature, min_p, top_k and top_p (as
    // sample() makes it), accepted with probability p(draft); on a rejection the token is drawn from
    // p without the draft, renormalized. Either way the token is distributed as p. One uniform, and
    // a second on a rejection. `logits` is modified in place. Only for rows that need nothing else
    // (device_supports: no penalties, logit bias, pending min_tokens or logprobs); throws otherwise.
    // vLLM: vllm/v1/sample/rejection_sampler.py@7f6fc1c5ce8d02f473b1b923debbfef3fa0b7a6a
    // (rejection_greedy_sample_kernel; rejection_random_sample_kernel with NO_DRAFT_PROBS, and the
    // recovered token drawn from max(p - q, 0) with q one-hot at the draft).
    struct DraftVerdict {
        bool accepted = false;
        int32_t token = 0;
    };
    DraftVerdict verify_draft(float* logits, const SamplingParams& p, int num_output_tokens, int32_t draft, Rng& rng);

    // Whether this step of a sequence needs nothing but what a device sampler implements
    // (DeviceSamplingRow, runtime/model/compiled_model.hpp: temperature, min_p, top_k, top_p, one draw).
    // Anything else this sampler does (penalties, logit bias, an active min_tokens, logprobs) needs the
    // logits on the host. Keep this in step with sample(): a new feature there is false here.
    static bool device_supports(const SamplingParams& p, int num_output_tokens);

private:
    // weights_[i] = exp(x[i] - m) with m the row's maximum (exp_shifted); returns their sum.
    double masses(const float* logits, float& m);
    // Temperature, then min_p, top_k and top_p (sample()'s non-greedy processing, in place).
    void temper_and_filter(float* logits, const SamplingParams& p);

    int vocab_;
    std::vector<float> raw_;           // raw logits kept for logprobs
    std::vector<int32_t> order_;       // candidate ids (top-k / top-p selection)
    std::vector<int32_t> counts_;      // output token counts (frequency/presence penalties)
    std::vector<uint8_t> seen_;        // prompt+output membership (repetition penalty)
    std::vector<int32_t> touched_;     // ids set in counts_/seen_, to reset them
    std::vector<double> weights_;      // exp(x - max) per id (top-p, the draw, logprobs)
    std::vector<float> heap_;          // top-k: the k largest values so far
    static constexpr int kHeapTopK = 4096;  // larger k: nth_element
};

// w[i] = exp(double(x[i]) - m) for every x[i] <= m, in float64 within 4.5e-16 relative of std::exp
// (range reduction by ln 2 in two parts, a degree-13 polynomial, the power of two by its bits); 0
// below m - 708 (std::exp's value there is under 1e-307) and for -inf or NaN. Branch-free, so the
// compiler vectorizes it: a vocabulary's worth is ~10x faster than std::exp one at a time.
void exp_shifted(const float* x, int n, float m, double* w);

}  // namespace scr::engine
