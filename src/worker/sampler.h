// worker/sampler.h: turns one logits row per sequence into the next token, with vLLM v1 semantics:
// raw log-probs (log_softmax of the unprocessed logits), min_tokens, logit_bias, repetition / frequency /
// presence penalties, then greedy argmax, or temperature, min_p, top_k, top_p and an inverse-CDF draw.
// Randomness is counter-based, keyed by (seed, output step), so a seeded request gets the same tokens
// alone or in any batch. Also the prompt-logprob helper.
// Owns: the per-row processing and its scratch memory (per thread). Must not: keep request state between
// calls (everything it needs arrives in SamplerRow) or make scheduling decisions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "api/request.h"  // TokenLogprob
#include "api/sampling_params.h"

namespace polylora {

// One sequence to sample from.
struct SamplerRow {
  float* logits = nullptr;  // [vocab] f32 host memory; processed in place
  const SamplingParams* params = nullptr;
  std::span<const int32_t> prompt_ids;  // [prompt_len]: for the repetition penalty
  std::span<const int32_t> output_ids;  // [num_output] generated so far; its size is the output step
  std::span<const int32_t> eos_ids;     // the model's / tokenizer's EOS ids (masked under min_tokens)
  uint64_t seed = 0;                    // params.seed, or assign_seed()'s value kept by the request
  // [mask_words(vocab)] structured output: bit id set = id allowed; empty = no grammar.
  std::span<const uint32_t> grammar_mask;
};

struct SampleResult {
  int32_t token = -1;
  // Raw log-prob of `token` and its 1-based rank among the raw log-probs (ties count against it, as
  // vLLM's: rank = #{tokens with logprob >= its logprob}). Filled only when params.logprobs is set
  // (for prompt_logprob(): always); otherwise 0.
  float logprob = 0.0f;
  int64_t rank = 0;
  std::vector<TokenLogprob> top;  // [params.logprobs] best raw log-probs first, lower id first on ties
};

// Temperatures below this sample greedily (vLLM's _SAMPLING_EPS).
inline constexpr double kGreedyTemperature = 1e-5;

// The seed of a request's generator: params.seed, or a random one; call once when the request's state
// is created and keep the value for all its steps.
uint64_t assign_seed(const SamplingParams& params);
// The uniform draw in [0, 1) of step `step` (the number of tokens generated so far) of generator `seed`:
// a pure function of both, so batching cannot change it.
double sampler_uniform(uint64_t seed, int64_t step);

// The processing steps, exposed for tests; each works on one row [vocab] in place.
// log(sum(exp(logits))) in double, without writing a log-prob array.
double log_sum_exp(const float* logits, int64_t vocab);
// The ids of the `k` largest logits (all when k >= vocab), best first, lower id first on ties.
std::vector<int32_t> top_ids(const float* logits, int64_t vocab, int64_t k);
// While num_output < params.min_tokens, sets stop_token_ids and (unless ignore_eos) eos_ids to -inf.
void apply_min_tokens(float* logits, int64_t vocab, const SamplingParams& params, int64_t num_output,
                      std::span<const int32_t> eos_ids);
// Adds params.logit_bias to the listed logits.
void apply_logit_bias(float* logits, int64_t vocab, const SamplingParams& params);
// allowed_token_ids: every other logit set to -inf (nothing when the list is empty).
void apply_allowed_token_ids(float* logits, int64_t vocab, const SamplingParams& params);
// Structured output: every token whose bit is clear in mask set to -inf (nothing when mask is empty).
void apply_grammar_mask(float* logits, int64_t vocab, std::span<const uint32_t> mask);
// bad_words (vLLM's semantics): for each word's token ids, its last token is set to -inf when the output
// so far ends with the word's other tokens (a one-token word is always banned).
void apply_bad_words(float* logits, int64_t vocab, const SamplingParams& params,
                     std::span<const int32_t> output_ids);
// Repetition penalty on tokens seen in the prompt or the output (logit > 0: divided, else multiplied),
// then frequency_penalty * count and presence_penalty * [count > 0] subtracted for output tokens.
void apply_penalties(float* logits, int64_t vocab, const SamplingParams& params,
                     std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids);
// Lowest id among the largest logits.
int32_t argmax(const float* logits, int64_t vocab);
// The ids that survive min_p (prob >= min_p * max prob), then top_k (every token whose logit is >= the
// k-th largest; -1 or 0: off), then top_p (renormalised over the survivors; in descending order, lower id
// first on ties, the shortest prefix whose cumulative prob reaches top_p) on temperature-scaled logits.
// -inf (or NaN) logits are never kept. Ascending ids.
std::vector<int32_t> filter_min_p_top_k_top_p(const float* logits, int64_t vocab, double min_p, int64_t top_k,
                                              double top_p);
// Inverse-CDF draw with uniform `u` over softmax(logits) restricted to `kept` (ascending ids), in double.
int32_t sample_from(const float* logits, std::span<const int32_t> kept, double u);

class Sampler {
 public:
  explicit Sampler(int64_t vocab_size);
  int64_t vocab_size() const { return vocab_size_; }

  // One result per row; rows are independent (processed in parallel when the batch is large).
  std::vector<SampleResult> sample(std::span<const SamplerRow> rows) const;
  // One row, on the calling thread.
  SampleResult sample_row(const SamplerRow& row) const;

  // The raw log-prob and rank of `token` given the logits [vocab] at the position before it, and the
  // `top_k` best alternatives (prompt_logprobs).
  static SampleResult prompt_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top_k);

 private:
  int64_t vocab_size_;
};

}  // namespace polylora
