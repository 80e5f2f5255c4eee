// server/structured_fields.h: the request fields that ask for structured output (OpenAI's response_format,
// vLLM's structured_outputs and the older guided_json / guided_regex / guided_choice / guided_grammar) read
// into SamplingParams::structured_output. The grammar itself is compiled (and a bad schema refused) by the
// engine. Must not: compile grammars or know about tokens.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/sampling_params.h"

namespace polylora::server {

// Throws polylora::Error (a 400) naming the field: an unknown response_format type, a missing schema,
// a choice that is not a list of strings, two ways of constraining the output in one request.
void read_structured_output(const nlohmann::ordered_json& body, SamplingParams& sp);

// The body fields read above (for the lists of accepted fields).
const std::vector<std::string>& structured_output_fields();

}  // namespace polylora::server
