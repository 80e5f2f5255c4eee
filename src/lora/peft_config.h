// lora/peft_config.h: adapter_config.json of a PEFT LoRA adapter, parsed as untrusted input.
// Owns: type-checking every field polylora reads or refuses, the bounds on the document (size, nesting,
// pattern counts and lengths), and rank_pattern / alpha_pattern keys compiled once with PCRE2 and matched
// under match, depth, heap and time limits.
// Must not: read files or know about models (module names are opaque strings here).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_context_8;

namespace polylora {

inline constexpr size_t kMaxPeftConfigBytes = size_t{1} << 20;  // adapter_config.json; real ones are ~1 KB
inline constexpr int kMaxPeftConfigDepth = 64;                  // nesting of objects and arrays
inline constexpr size_t kMaxPatternKeys = 1024;                 // per rank_pattern / alpha_pattern
inline constexpr size_t kMaxPatternKeyBytes = 1024;
inline constexpr size_t kMaxTargetParameters = 1024;
inline constexpr uint32_t kPatternMatchLimit = 100'000;  // PCRE2 match limit per module and key
inline constexpr uint32_t kPatternDepthLimit = 1'000;    // PCRE2 backtracking depth limit
inline constexpr uint32_t kPatternHeapLimitKib = 16 * 1024;
inline constexpr std::chrono::milliseconds kPatternTimeBudget{1000};  // all PCRE2 matches of one table

// The keys of rank_pattern or alpha_pattern, in document order, each compiled once. PEFT's rule
// (peft.utils.get_pattern_key): key K applies to module M when re.match(rf"(.*\.)?({K})$", M); the first
// such key in document order wins. Keys made only of [A-Za-z0-9_-] and '.' (the common case, e.g.
// "model.layers.3.self_attn.q_proj") are matched without PCRE2, with the same result.
class PatternTable {
 public:
  PatternTable() = default;
  // Compiles every key. `field` is "rank_pattern" or "alpha_pattern"; `where` prefixes messages
  // ("adapter 'x': /dir/adapter_config.json"). Throws polylora::Error naming the key when one is longer
  // than kMaxPatternKeyBytes or is not a valid regular expression (with PCRE2's message and offset).
  PatternTable(std::string field, std::string where, const std::vector<std::string>& keys);

  // Index of the first key matching `module`, or nullopt. Throws polylora::Error naming the key and the
  // module when a match hits a PCRE2 limit, or when this table's matches together took longer than
  // kPatternTimeBudget.
  std::optional<size_t> first_match(std::string_view module) const;
  // The same, always through PCRE2 (no literal fast path); for tests and the fuzz target.
  std::optional<size_t> first_match_regex_only(std::string_view module) const;

  size_t size() const { return keys_.size(); }
  const std::string& key(size_t idx) const { return keys_[idx].text; }

 private:
  struct Key {
    std::string text;
    bool literal = false;  // only [A-Za-z0-9_-] and '.'
    std::shared_ptr<pcre2_real_code_8> code;
  };
  bool matches(const Key& key, std::string_view module, bool allow_literal) const;

  std::string field_;
  std::string where_;
  std::vector<Key> keys_;
  std::shared_ptr<pcre2_real_match_context_8> match_context_;
  mutable std::chrono::steady_clock::duration regex_time_{};
};

struct PeftConfig {
  int64_t r = 8;
  double lora_alpha = 8;  // defaults to r when absent
  bool use_rslora = false;
  PatternTable rank_pattern;
  std::vector<int64_t> rank_pattern_values;  // [rank_pattern.size()], each > 0
  PatternTable alpha_pattern;
  std::vector<double> alpha_pattern_values;  // [alpha_pattern.size()]
  std::vector<std::string> target_parameters;

  int64_t rank_for(std::string_view module) const;  // rank_pattern's first match, else r
  double alpha_for(std::string_view module) const;  // alpha_pattern's first match, else lora_alpha
};

// Parses the bytes of adapter_config.json. `where` prefixes every message ("adapter 'x': /dir/file").
// Errors (polylora::Error, messages always valid UTF-8): more than kMaxPeftConfigBytes; not JSON (invalid
// UTF-8 included); nested deeper than kMaxPeftConfigDepth; not an object; a field of the wrong type
// ("'r' must be a positive integer, got 16.5"); a pattern key too long, invalid or too many; a PEFT
// option polylora does not support (non-LORA peft_type, DoRA, bias, lora_bias, modules_to_save,
// fan_in_fan_out).
PeftConfig parse_peft_config(std::string_view bytes, const std::string& where);

}  // namespace polylora
