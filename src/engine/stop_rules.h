// engine/stop_rules.h: vLLM's stop conditions on a sampled token (v1/core/sched/utils.py::check_stop):
// EOS (unless ignore_eos) and stop_token_ids once min_tokens are out, then max_tokens and the model length.
// Stop strings are matched on the text (engine/text_stream.h).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "api/request.h"
#include "api/sampling_params.h"

namespace polylora {

struct TokenStop {
  FinishReason reason = FinishReason::kStop;
  std::optional<StopReason> stop_reason;  // the stop token id (none for EOS or length)
};

// A token stop (EOS or a stop id) for the token that made num_output tokens; EOS first, as vLLM: an EOS id
// that is also in stop_token_ids reports no stop_reason.
std::optional<TokenStop> check_token_stop(int32_t token, int64_t num_output, const SamplingParams& params,
                                          std::span<const int32_t> eos_ids);
// The length limits after num_output tokens of a sequence of total_tokens (prompt included).
bool reached_length(int64_t num_output, int64_t total_tokens, const SamplingParams& params,
                    int64_t max_model_len);

}  // namespace polylora
