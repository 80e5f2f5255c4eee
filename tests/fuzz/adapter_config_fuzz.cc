// fuzz-sources: src/lora/peft_config.cc src/runtime/safetensors.cc
// tests/fuzz/adapter_config_fuzz.cc: libFuzzer target for parse_peft_config (adapter_config.json bytes)
// and rank_pattern / alpha_pattern matching against a few module names.
// Owns: proving the parser either throws polylora::Error with a valid UTF-8 message or returns a config
// whose values respect their types, and that the literal fast path of pattern matching agrees with PCRE2.
// Must not: catch anything but polylora::Error (any other exception or crash is a finding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"
#include "lora/peft_config.h"

namespace {

// Throws nlohmann::json::type_error (a finding) when `message` is not valid UTF-8.
void check_utf8(const std::string& message) {
  (void)nlohmann::json(message).dump();
}

void check_table(const polylora::PatternTable& table, std::string_view module) {
  std::optional<size_t> fast, slow;
  try {
    fast = table.first_match(module);
  } catch (const polylora::Error& e) {
    check_utf8(e.what());
    return;  // a limit was hit; the regex-only path would hit it too or take as long
  }
  try {
    slow = table.first_match_regex_only(module);
  } catch (const polylora::Error& e) {
    check_utf8(e.what());
    return;
  }
  if (fast != slow) std::abort();
  if (fast && *fast >= table.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* kModules[] = {
      "model.layers.0.self_attn.q_proj",
      "model.layers.12.mlp.down_proj",
      "model.layers.3.mlp.experts.7.w1",
      "model.layers.1.mlp.experts.gate_up_proj",
      "q_proj",
      "model.layers.0.self_attn.o_proj.base_layer",
      "model.layers.99.self_attnXq_proj",
      "",
  };
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    polylora::PeftConfig c = polylora::parse_peft_config(bytes, "adapter 'fuzz': adapter_config.json");
    if (c.r <= 0 || c.rank_pattern.size() != c.rank_pattern_values.size() ||
        c.alpha_pattern.size() != c.alpha_pattern_values.size() ||
        c.rank_pattern.size() > polylora::kMaxPatternKeys)
      std::abort();
    for (int64_t v : c.rank_pattern_values)
      if (v <= 0) std::abort();
    for (const char* module : kModules) {
      check_table(c.rank_pattern, module);
      check_table(c.alpha_pattern, module);
      try {
        if (c.rank_for(module) <= 0) std::abort();
        (void)c.alpha_for(module);
      } catch (const polylora::Error& e) {
        check_utf8(e.what());
      }
    }
  } catch (const polylora::Error& e) {
    check_utf8(e.what());
  }
  return 0;
}
