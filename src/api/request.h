// api/request.h: a generation request as the engine receives it, and what it gives back.
// Plain data shared by server/, engine/ and the offline CLI. Must not: include JSON or CUDA.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "api/sampling_params.h"

namespace polylora {

enum class FinishReason { kStop, kLength, kAbort };

// Why a sequence stopped early: the stop token id it sampled, or the stop string it matched (vLLM reports
// the first as a number and the second as a string).
using StopReason = std::variant<int32_t, std::string>;

// vLLM's spelling: "stop", "length", "abort".
const char* finish_reason_name(FinishReason reason);

struct EngineRequest {
  std::string request_id;  // unique among live requests
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  std::string adapter;     // empty: the base model
  std::string cache_salt;  // optional prefix-cache isolation key
  int64_t priority = 0;    // lower runs first under the priority policy (as vLLM)
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// Logprob information of one token: its own logprob and rank, and the top alternatives.
struct LogprobEntry {
  int32_t id = 0;
  float logprob = 0.0f;
  int64_t rank = 0;  // 1 = most likely
  std::vector<TokenLogprob> top;
};

// One sequence of a request (index < n): what is new since the last output, and the state.
struct SequenceOutput {
  int64_t index = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<LogprobEntry> new_logprobs;  // one per new token when logprobs were asked
  std::string new_text;                    // detokenized text of the new tokens (stop strings applied)
  std::optional<FinishReason> finish_reason;
  std::optional<StopReason> stop_reason;  // the stop token id or the stop string
  int64_t num_output_tokens = 0;          // total so far
};

struct RequestOutput {
  std::string request_id;
  std::vector<SequenceOutput> sequences;  // the sequences that changed
  std::vector<std::optional<LogprobEntry>>
      prompt_logprobs;  // once, with the first output (first entry empty)
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;     // prompt tokens served from the prefix cache
  bool finished = false;             // every sequence has finished
  std::optional<std::string> error;  // set when the request failed (e.g. unknown adapter)
  bool error_is_shutdown = false;    // the error: the server stopped before the request finished
};

}  // namespace polylora
