// tokenizer/regex.h: the compiled regular expressions of tokenizer.json (Split and Replace patterns).
// Owns: a PCRE2 (JIT) pattern compiled with Unicode semantics matching Oniguruma's (the engine HF
// tokenizers uses): \s and \S mean the Unicode White_Space property.
// Must not: be given invalid UTF-8 (callers repair input first), or know about tokenizers.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace polylora::tokenizer {

class Regex {
 public:
  // Throws polylora::Error when the pattern does not compile.
  explicit Regex(std::string_view pattern);
  static Regex literal(std::string_view text);  // matches text exactly
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches [begin, end) in order, skipping empty matches. Thread-safe.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

// Compiles a tokenizer.json pattern: {"String": literal} or {"Regex": pattern}.
Regex make_pattern(const nlohmann::json& pattern);

// Rewrites Oniguruma-isms of a tokenizer.json pattern into PCRE2 syntax (exposed for tests).
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace polylora::tokenizer
