// tokenizer/regex.cc: PCRE2 + JIT behind tokenizer::Regex, with Oniguruma-compatible \s.
// Must not: know about tokenizers.
#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace polylora::tokenizer {

// The Unicode White_Space property, which Oniguruma (and Rust's regex) use for \s.
static constexpr std::string_view kWhiteSpaceRanges =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpaceRanges;
        } else {
          out += '[';
          out += kWhiteSpaceRanges;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpaceRanges;
        out += ']';
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' (or '^]') right after the opening bracket is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

namespace {
// Per-thread JIT stack and match data, grown on demand and reused across calls.
struct ThreadScratch {
  pcre2_jit_stack* stack = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_match_data* data = nullptr;
  ThreadScratch() {
    stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack_assign(context, nullptr, stack);
    data = pcre2_match_data_create(16, nullptr);
  }
  ~ThreadScratch() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};
ThreadScratch& scratch() {
  thread_local ThreadScratch s;
  return s;
}
}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  std::string translated = onig_to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(error, buffer, sizeof(buffer));
    fail("tokenizer: cannot compile regex '{}' at offset {}: {}", pattern_, offset,
         reinterpret_cast<const char*>(buffer));
  }
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(std::string_view text) {
  std::string quoted;
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) quoted += '\\';
    quoted += c;
  }
  Regex r(quoted);
  r.pattern_ = std::string(text);
  return r;
}

// A tokenizer.json {"String": s} or {"Regex": r} pattern.
Regex make_pattern(const nlohmann::json& pattern) {
  if (pattern.contains("String")) return Regex::literal(pattern["String"].get<std::string>());
  if (pattern.contains("Regex")) return Regex(pattern["Regex"].get<std::string>());
  fail("tokenizer.json: a pattern must be {{\"String\": ...}} or {{\"Regex\": ...}}, got {}", pattern.dump());
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  ThreadScratch& s = scratch();
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start <= text.size()) {
    int rc = impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, s.data, s.context)
                        : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, s.data,
                                      s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buffer[256];
      pcre2_get_error_message(rc, buffer, sizeof(buffer));
      fail("tokenizer: regex '{}' failed on input: {}", pattern_, reinterpret_cast<const char*>(buffer));
    }
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      start = end;
    } else {
      // Empty match: step over one character.
      if (start == text.size()) break;
      ++start;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
  return matches;
}

}  // namespace polylora::tokenizer
