// config/generation_config.h: vLLM's --generation-config / --override-generation-config: request defaults
// and extra EOS ids from a model's generation_config.json.
//   auto (vLLM's default): read <model>/generation_config.json
//   vllm: the model's file gives only its EOS ids (polylora's own sampling defaults, no max_tokens cap)
//   DIR:  read DIR/generation_config.json
// Its temperature, top_p, top_k, min_p and repetition_penalty become the defaults of requests that omit
// them, its max_new_tokens (as max_tokens) caps every request (vLLM's get_max_tokens); its eos_token_id (an
// id or a list) adds stop ids. The override JSON (same keys, plus max_tokens) is applied on top in every
// mode, as vLLM does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace polylora {

struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int64_t> max_tokens;  // generation_config.json's max_new_tokens
  std::vector<int64_t> eos_token_ids;  // extra stop ids (added to the model's own)

  bool empty() const {
    return !temperature && !top_p && !top_k && !min_p && !repetition_penalty && !max_tokens &&
           eos_token_ids.empty();
  }
  // The defaults as a JSON object text (for the startup log).
  std::string describe() const;

  // Parses generation_config.json text (unknown keys are ignored, as vLLM does); `source` names it.
  static GenerationDefaults from_json(const std::string& json_text, const std::string& source);
  // Merges --override-generation-config JSON over these defaults (throws polylora::Error on bad JSON or a
  // field of the wrong type).
  void apply_override(const std::string& json_text);
};

// Resolves --generation-config MODE for the model directory `model_dir` (see above) and applies the
// override (may be empty). A missing generation_config.json under `auto` gives empty defaults; a DIR
// without one is an error.
GenerationDefaults load_generation_defaults(const std::string& mode, const std::string& model_dir,
                                            const std::string& override_json);

}  // namespace polylora
