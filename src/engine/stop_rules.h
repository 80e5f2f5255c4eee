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

// A token stop (EOS or a stop id) for the token that made num_output tokens. As vLLM: the tokenizer's own
// EOS (primary_eos) reports no stop_reason, even when also in stop_token_ids; the other EOS ids (the model's
// and generation config's eos_token_id lists, which vLLM moves into stop_token_ids) report their id, as
// stop_token_ids do; ignore_eos turns all of eos_ids off.
std::optional<TokenStop> check_token_stop(int32_t token, int64_t num_output, const SamplingParams& params,
                                          std::span<const int32_t> eos_ids,
                                          std::optional<int32_t> primary_eos);
// The length limits after num_output tokens of a sequence of total_tokens (prompt included).
bool reached_length(int64_t num_output, int64_t total_tokens, const SamplingParams& params,
                    int64_t max_model_len);

}  // namespace polylora
