// api/sampling_params.h: how one request samples its output (the fields of vLLM's SamplingParams).
// Plain data; validate() names the first invalid field. Must not: include JSON or CUDA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace polylora {

struct SamplingParams {
  int64_t n = 1;                    // sequences per prompt (they share the prompt's KV blocks)
  double temperature = 1.0;         // 0: greedy
  double top_p = 1.0;               // (0, 1]
  int64_t top_k = -1;               // -1 (or 0): all tokens
  double min_p = 0.0;               // [0, 1]
  std::optional<uint64_t> seed;     // per-request generator, reproducible whatever else is batched
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  double repetition_penalty = 1.0;  // > 0
  std::vector<std::pair<int32_t, double>> logit_bias;  // token id -> bias added to its logit, [-100, 100]
  int64_t min_tokens = 0;
  std::optional<int64_t> max_tokens = 16;  // nullopt: up to the model's context length
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings, matched on the detokenized text
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  static constexpr int64_t kMaxLogprobs = 20;  // vLLM's default --max-logprobs
  // The most alternatives per token the samplers report (--max-logprobs at most this; the device sampler's
  // kernels::kSampleMaxTop).
  static constexpr int64_t kLogprobsLimit = 1024;
  std::optional<int64_t> logprobs;         // top alternatives per generated token (0: the sampled one only)
  std::optional<int64_t> prompt_logprobs;  // top alternatives per prompt token
  bool skip_special_tokens = true;
  // Accepted for vLLM's API; as in vLLM, it changes nothing with a fast (tokenizer.json) tokenizer, the
  // only kind polylora loads.
  bool spaces_between_special_tokens = true;
  // Only these ids may be sampled (empty: all). vLLM's allowed_token_ids.
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words: the words as sent, and their token ids (each word tokenized with and without a
  // leading space; filled by the server, which has the tokenizer). The last token of a word is banned when
  // the tokens generated just before match the word's other tokens.
  std::vector<std::string> bad_words;
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // Structured output (response_format, structured_outputs, guided_*): the grammar the output must match.
  // The engine compiles it; the host sampler masks every token it does not allow.
  std::optional<structured::GrammarSpec> structured_output;
  // Keep only the last N prompt tokens (vLLM's truncate_prompt_tokens; applied by the server).
  std::optional<int64_t> truncate_prompt_tokens;

  bool greedy() const { return temperature < 1e-5; }
  // Logit masks only the host sampler applies (allowed_token_ids, bad_words). Structured-output masks
  // are applied by either sampler (worker/model_runner.h).
  bool needs_host_masks() const { return !allowed_token_ids.empty() || !bad_words_token_ids.empty(); }
  // Throws polylora::Error naming the field, e.g. "temperature must be >= 0, got -1".
  // max_logprobs: the server's --max-logprobs (logprobs and prompt_logprobs above it are refused with
  // vLLM's message).
  void validate(int64_t vocab_size, int64_t max_logprobs = kMaxLogprobs) const;
};

// How the model runner samples one sequence: fixed when the request arrives, carried to the runner inside
// the step plan (with the sequence's first appearance there).
struct RequestSampling {
  SamplingParams params;
  uint64_t seed = 0;             // this sequence's generator seed (request seed + index, or random)
  std::vector<int32_t> eos_ids;  // masked until min_tokens; empty under ignore_eos
  // With params.structured_output: this sequence's matcher. The engine advances it with each token it
  // accepts (on the engine thread, before the next step that samples this sequence is launched); the
  // host sampler reads its mask.
  std::shared_ptr<structured::GrammarMatcher> grammar;
};

}  // namespace polylora
