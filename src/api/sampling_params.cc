// api/sampling_params.cc: validation of sampling parameters (messages name the field, as vLLM's do).
#include "api/sampling_params.h"

#include <cmath>

#include "common/error.h"

namespace polylora {

void SamplingParams::validate(int64_t vocab_size, int64_t max_logprobs) const {
  if (n < 1) fail("n must be at least 1, got {}", n);
  if (!(temperature >= 0.0) || !std::isfinite(temperature))
    fail("temperature must be >= 0, got {}", temperature);
  if (!(top_p > 0.0 && top_p <= 1.0)) fail("top_p must be in (0, 1], got {}", top_p);
  if (top_k < -1) fail("top_k must be -1 (disable), or at least 1, got {}", top_k);
  if (!(min_p >= 0.0 && min_p <= 1.0)) fail("min_p must be in [0, 1], got {}", min_p);
  if (!(presence_penalty >= -2.0 && presence_penalty <= 2.0))
    fail("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  if (!(frequency_penalty >= -2.0 && frequency_penalty <= 2.0))
    fail("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  if (!(repetition_penalty > 0.0 && repetition_penalty <= 100.0))
    fail("repetition_penalty must be in (0, 100], got {}", repetition_penalty);
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size)
      fail("logit_bias: token id {} is outside the vocabulary (size {})", id, vocab_size);
    if (!(bias >= -100.0 && bias <= 100.0))
      fail("logit_bias: bias for token {} must be in [-100, 100], got {}", id, bias);
  }
  if (min_tokens < 0) fail("min_tokens must be >= 0, got {}", min_tokens);
  if (max_tokens && *max_tokens < 1) fail("max_tokens must be at least 1, got {}", *max_tokens);
  if (max_tokens && min_tokens > *max_tokens)
    fail("min_tokens ({}) must be less than or equal to max_tokens ({})", min_tokens, *max_tokens);
  for (int32_t id : stop_token_ids)
    if (id < 0 || id >= vocab_size)
      fail("stop_token_ids: token id {} is outside the vocabulary (size {})", id, vocab_size);
  for (const auto& s : stop)
    if (s.empty()) fail("stop: stop strings must not be empty");
  for (int32_t id : allowed_token_ids)
    if (id < 0 || id >= vocab_size)
      fail("allowed_token_ids: token id {} is outside the vocabulary (size {})", id, vocab_size);
  for (const auto& word : bad_words_token_ids)
    for (int32_t id : word)
      if (id < 0 || id >= vocab_size)
        fail("bad_words: token id {} is outside the vocabulary (size {})", id, vocab_size);
  if (truncate_prompt_tokens && *truncate_prompt_tokens < 1)
    fail("truncate_prompt_tokens must be at least 1, got {}", *truncate_prompt_tokens);
  // Against the server's cap with vLLM's messages; vLLM's -1 (every token of the vocabulary) counts as the
  // vocabulary's size.
  auto check_logprobs = [&](const std::optional<int64_t>& v, const char* field, const char* kind) {
    if (!v) return;
    if (*v == -1 && vocab_size > max_logprobs)
      fail("Requested {} logprobs of {} (-1: the whole vocabulary), which is greater than max allowed: {}",
           kind, vocab_size, max_logprobs);
    if (*v < 0) fail("{} must be >= 0, got {}", field, *v);
    if (*v > max_logprobs)
      fail("Requested {} logprobs of {}, which is greater than max allowed: {}", kind, *v, max_logprobs);
  };
  check_logprobs(logprobs, "logprobs", "sample");
  check_logprobs(prompt_logprobs, "prompt_logprobs", "prompt");
}

}  // namespace polylora
