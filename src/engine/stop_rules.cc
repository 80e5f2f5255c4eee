// engine/stop_rules.cc: token stops and length limits.
#include "engine/stop_rules.h"

#include <algorithm>

namespace polylora {

std::optional<TokenStop> check_token_stop(int32_t token, int64_t num_output, const SamplingParams& params,
                                          std::span<const int32_t> eos_ids,
                                          std::optional<int32_t> primary_eos) {
  if (num_output < params.min_tokens) return std::nullopt;
  const bool is_eos = !params.ignore_eos && std::find(eos_ids.begin(), eos_ids.end(), token) != eos_ids.end();
  if (is_eos) {
    if (primary_eos && token == *primary_eos) return TokenStop{FinishReason::kStop, std::nullopt};
    return TokenStop{FinishReason::kStop, token};
  }
  const auto& ids = params.stop_token_ids;
  if (std::find(ids.begin(), ids.end(), token) != ids.end()) return TokenStop{FinishReason::kStop, token};
  return std::nullopt;
}

bool reached_length(int64_t num_output, int64_t total_tokens, const SamplingParams& params,
                    int64_t max_model_len) {
  return (params.max_tokens && num_output >= *params.max_tokens) || total_tokens >= max_model_len;
}

}  // namespace polylora
