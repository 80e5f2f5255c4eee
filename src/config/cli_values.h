// config/cli_values.h: vLLM's command-line value syntaxes, parsed without CLI11 so they can be unit-tested:
// human-readable integers (--max-model-len 32K) and the flat YAML of `--config FILE.yaml`.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace polylora {

// vLLM's human_readable_int: a plain integer, or a number with a suffix: k/m/g/t decimal (1k = 1000,
// 1.5k = 1500), K/M/G/T binary (1K = 1024; no decimals: 1.5K is an error). `flag` names the flag in the
// error (polylora::Error).
int64_t parse_human_int(std::string_view text, std::string_view flag);

// One `key: value` entry of a vLLM config file. A scalar has one value; a list (`[a, b]` or `- a` lines)
// has its items. Booleans stay as the text "true"/"false"; quotes are removed.
struct ConfigEntry {
  std::string key;
  std::vector<std::string> values;
  bool is_list = false;
  bool is_bool() const { return !is_list && values.size() == 1 && (values[0] == "true" || values[0] == "false"); }
};

// Parses the flat YAML subset vLLM config files use: `key: scalar`, `key: [a, b]`, `key:` followed by
// `  - item` lines, `# comments`, blank lines, single- or double-quoted scalars. Anything else (nested
// mappings, multi-line scalars, anchors) is an error naming the line. `source` names the file in errors.
std::vector<ConfigEntry> parse_flat_yaml(std::string_view text, const std::string& source);

// Turns config entries into command-line arguments the way vLLM does: `key: value` -> `--key value`,
// `key: true` -> `--key`, `key: false` -> `--no-key` when `has_negation(key)` else nothing, lists ->
// `--key item1 item2 ...`, except keys in `repeated` (`--key a --key b`). Underscores in keys become dashes.
// `model` becomes the positional model. Keys for which `given(key)` is true (set on the command line,
// which wins) are skipped.
template <typename Given, typename HasNeg>
std::vector<std::string> config_to_args(const std::vector<ConfigEntry>& entries, Given given, HasNeg has_negation) {
  std::vector<std::string> out;
  for (const ConfigEntry& e : entries) {
    std::string key = e.key;
    for (char& c : key)
      if (c == '_') c = '-';
    if (given(key)) continue;
    if (e.is_bool()) {
      if (e.values[0] == "true")
        out.push_back("--" + key);
      else if (has_negation(key))
        out.push_back("--no-" + key);
      continue;
    }
    if (e.is_list) {
      for (const std::string& v : e.values) {
        out.push_back("--" + key);
        out.push_back(v);
      }
      continue;
    }
    out.push_back("--" + key);
    out.push_back(e.values.empty() ? "" : e.values[0]);
  }
  return out;
}

// vLLM's argv normalisation: `--max_model_len` -> `--max-model-len` (the name part only), `-tp N` ->
// `--tensor-parallel-size N`, `-pp` / `-dp` / `-q` / `-O<level>` to their long names.
std::vector<std::string> normalize_vllm_args(std::vector<std::string> args);

}  // namespace polylora
