// server/request_json.h: JSON <-> api types (the one place request JSON is interpreted), shared by the
// HTTP server and the offline CLI's --requests files. Field names and meanings follow vLLM's sampling
// parameters. Errors (polylora::Error) name the field and say what was expected.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "api/request.h"
#include "api/sampling_params.h"

namespace polylora::server {

// Reads every sampling field present in `body` into `params` (fields absent keep their value). Unknown
// fields are not checked here (see known_fields). Type and range errors name the field; integers are checked for range before use.
void read_sampling_fields(const nlohmann::ordered_json& body, SamplingParams& params);

// Fills params.bad_words_token_ids from params.bad_words with `encode` (no special tokens), as vLLM.
void tokenize_bad_words(SamplingParams& params,
                        const std::function<std::vector<int32_t>(const std::string&)>& encode);

// pydantic's lax mode, in which vLLM reads requests: a number also from a string holding one ("0.5",
// " 2 "), a boolean also from 0 / 1 and the strings true/false, t/f, yes/no, y/n, on/off, 1/0 (any case).
// nullopt when `v` is none of these.
std::optional<double> lax_number(const nlohmann::ordered_json& v);
std::optional<bool> lax_bool(const nlohmann::ordered_json& v);

// The largest `n` a request may ask for (checked before anything is allocated).
inline constexpr int64_t kMaxN = 1024;
// Sequences one request may ask for in all (prompts × n), and the bounds of its stop conditions (each is
// checked against every generated token).
inline constexpr int64_t kMaxSequencesPerRequest = 4096;
inline constexpr size_t kMaxStopStrings = 256;
inline constexpr size_t kMaxStopStringBytes = 4096;
inline constexpr size_t kMaxStopTokenIds = 4096;
inline constexpr size_t kMaxAllowedTokenIds = 1 << 20;

// JSON of a LogprobEntry as {"id", "logprob", "rank", "top": [{"id", "logprob"}]}.
nlohmann::json logprob_entry_json(const LogprobEntry& entry);

}  // namespace polylora::server
