// structured/regex.cc: regular expressions (the ECMAScript/Python subset that schemas and vLLM's
// guided_regex use) as GBNF expressions: literals and escapes, classes with ranges and \d \w \s, `.`,
// groups ((?:...), named), alternation, * + ? {m} {m,} {m,n} (lazy and possessive suffixes ignored),
// and ^ / $ at the ends. Backreferences, lookaround, word boundaries and flags are refused by name.
// In JSON-string mode every character is written as JSON escapes it (for `pattern` inside a string).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"

namespace polylora::structured {
namespace {

using Range = std::pair<uint32_t, uint32_t>;

std::vector<Range> normalized(std::vector<Range> r) {
  std::sort(r.begin(), r.end());
  std::vector<Range> out;
  for (const Range& x : r) {
    if (!out.empty() && x.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, x.second);
    else
      out.push_back(x);
  }
  return out;
}

std::vector<Range> negated(const std::vector<Range>& ranges) {
  std::vector<Range> out;
  uint32_t next = 0;
  for (const Range& r : normalized(ranges)) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

std::string class_char(uint32_t cp) {
  if ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z'))
    return std::string(1, static_cast<char>(cp));
  return fmt::format("\\U{:08X}", cp);
}

std::string render_class(const std::vector<Range>& ranges) {
  std::string out = "[";
  for (const Range& r : ranges) {
    out += class_char(r.first);
    if (r.second != r.first) out += "-" + class_char(r.second);
  }
  return out + "]";
}

class RegexParser {
 public:
  RegexParser(std::string_view re, bool json_string) : s_(re), json_(json_string) {}

  std::string parse() {
    if (peek() == '^') ++pos_;
    std::string out = parse_alt();
    if (pos_ < s_.size()) {
      if (peek() == ')') error("unbalanced ')'");
      error("unexpected '{}'", peek());
    }
    return out.empty() ? "\"\"" : out;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) {
    fail("regex: {} (at offset {} of /{}/)", fmt::format(f, std::forward<Args>(args)...), pos_, s_);
  }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  bool at_end() const { return pos_ >= s_.size(); }

  // The GBNF for one code point set, JSON-escaped in JSON-string mode.
  std::string set_expr(std::vector<Range> ranges) {
    ranges = normalized(std::move(ranges));
    if (ranges.empty()) error("a character class matches nothing");
    if (!json_) return render_class(ranges);
    std::vector<std::string> alts;
    std::vector<Range> plain;
    auto contains = [&](uint32_t c) {
      for (const Range& r : ranges)
        if (c >= r.first && c <= r.second) return true;
      return false;
    };
    for (const Range& r : ranges) {
      uint32_t lo = r.first, hi = r.second;
      // Split out the characters JSON escapes: controls, '"' and '\\'.
      uint32_t c = lo;
      while (c <= hi) {
        if (c < 0x20 || c == '"' || c == '\\') {
          ++c;
          continue;
        }
        uint32_t end = c;
        while (end < hi && !(end + 1 < 0x20 || end + 1 == '"' || end + 1 == '\\')) ++end;
        plain.push_back({c, end});
        c = end + 1;
      }
    }
    if (!plain.empty()) alts.push_back(render_class(plain));
    for (uint32_t c = 0; c < 0x20; ++c) {
      if (!contains(c)) continue;
      const char* short_form = c == '\n'   ? "\\n"
                               : c == '\t' ? "\\t"
                               : c == '\r' ? "\\r"
                               : c == '\b' ? "\\b"
                               : c == '\f' ? "\\f"
                                           : nullptr;
      alts.push_back(gbnf_literal(short_form ? std::string(short_form) : fmt::format("\\u{:04x}", c)));
    }
    if (contains('"')) alts.push_back(gbnf_literal("\\\""));
    if (contains('\\')) alts.push_back(gbnf_literal("\\\\"));
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out + ")";
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char c = peek();
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) error("expected {} hex digits", digits);
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }
  uint32_t parse_utf8() {
    auto c = static_cast<unsigned char>(peek());
    int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) > s_.size()) error("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_ + static_cast<size_t>(i)]) & 0x3F);
    pos_ += static_cast<size_t>(n);
    return cp;
  }
  // After a backslash: a class escape (\d \w \s and negations) or one code point.
  std::vector<Range> parse_escape() {
    if (at_end()) error("a trailing backslash");
    char e = peek();
    ++pos_;
    switch (e) {
      case 'd':
        return {{'0', '9'}};
      case 'D':
        return negated({{'0', '9'}});
      case 'w':
        return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
      case 'W':
        return negated({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}});
      case 's':
        return {{'\t', '\r'}, {' ', ' '}};
      case 'S':
        return negated({{'\t', '\r'}, {' ', ' '}});
      case 'n':
        return {{'\n', '\n'}};
      case 'r':
        return {{'\r', '\r'}};
      case 't':
        return {{'\t', '\t'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        return {{0, 0}};
      case 'x': {
        uint32_t v = parse_hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v = 0;
        if (peek() == '{') {
          ++pos_;
          while (!at_end() && peek() != '}') v = v * 16 + parse_hex(1);
          ++pos_;
        } else {
          v = parse_hex(4);
        }
        if (v > 0x10FFFF) error("code point out of range");
        return {{v, v}};
      }
      case 'b':
      case 'B':
        error("word boundaries (\\{}) are not supported", e);
      default:
        if (e >= '1' && e <= '9') error("backreferences (\\{}) are not supported", e);
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) error("unknown escape \\{}", e);
        --pos_;
        uint32_t cp = parse_utf8();
        return {{cp, cp}};
    }
  }
  std::string parse_class() {
    bool neg = false;
    if (peek() == '^') {
      neg = true;
      ++pos_;
    }
    std::vector<Range> ranges;
    bool first = true;
    while (at_end() || peek() != ']' || first) {
      if (at_end()) error("unterminated character class");
      first = false;
      std::vector<Range> item;
      if (peek() == '\\') {
        ++pos_;
        item = parse_escape();
      } else if (peek() == '[' && peek(1) == ':') {
        error("POSIX classes ([:name:]) are not supported");
      } else {
        uint32_t cp = parse_utf8();
        item = {{cp, cp}};
      }
      if (item.size() == 1 && item[0].first == item[0].second && peek() == '-' && peek(1) != ']' &&
          peek(1) != '\0') {
        ++pos_;
        std::vector<Range> hi;
        if (peek() == '\\') {
          ++pos_;
          hi = parse_escape();
        } else {
          uint32_t cp = parse_utf8();
          hi = {{cp, cp}};
        }
        if (hi.size() != 1 || hi[0].first != hi[0].second) error("a class escape cannot end a range");
        if (hi[0].first < item[0].first) error("range out of order in a character class");
        item = {{item[0].first, hi[0].first}};
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    ++pos_;
    return set_expr(neg ? negated(ranges) : ranges);
  }
  int64_t parse_int() {
    if (!(peek() >= '0' && peek() <= '9')) error("expected a number in {{m,n}}");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 10000) error("repetition count above 10000");
      ++pos_;
    }
    return v;
  }
  std::string parse_atom() {
    char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        if (peek(1) == ':') {
          pos_ += 2;
        } else if (peek(1) == '<' && peek(2) != '=' && peek(2) != '!') {
          pos_ += 2;
          while (!at_end() && peek() != '>') ++pos_;
          ++pos_;
        } else if (peek(1) == 'P' && peek(2) == '<') {
          pos_ += 3;
          while (!at_end() && peek() != '>') ++pos_;
          ++pos_;
        } else if (peek(1) == '=' || peek(1) == '!' || peek(1) == '<') {
          error("lookaround assertions are not supported");
        } else {
          error("inline flags and other (?...) groups are not supported");
        }
      }
      if (++depth_ > 200) error("groups nested too deeply");
      std::string inner = parse_alt();
      --depth_;
      if (peek() != ')') error("missing ')'");
      ++pos_;
      return "(" + (inner.empty() ? std::string("\"\"") : inner) + ")";
    }
    if (c == '[') {
      ++pos_;
      return parse_class();
    }
    if (c == '.') {
      ++pos_;
      return set_expr(negated({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++pos_;
      return set_expr(parse_escape());
    }
    if (c == '^') error("'^' inside the pattern is not supported (only at its start)");
    if (c == '*' || c == '+' || c == '?' || c == '{') error("'{}' has nothing to repeat", c);
    uint32_t cp = parse_utf8();
    return set_expr({{cp, cp}});
  }
  std::string parse_concat() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && (pos_ + 1 == s_.size() || peek(1) == '|' || peek(1) == ')')) {
        ++pos_;
        continue;
      }
      if (peek() == '$') error("'$' inside the pattern is not supported (only at its end)");
      std::string atom = parse_atom();
      char q = peek();
      if (q == '*' || q == '+' || q == '?') {
        ++pos_;
        atom += q;
      } else if (q == '{' && peek(1) >= '0' && peek(1) <= '9') {
        ++pos_;
        int64_t min = parse_int(), max = min;
        bool unbounded = false;
        if (peek() == ',') {
          ++pos_;
          if (peek() == '}')
            unbounded = true;
          else
            max = parse_int();
        }
        if (peek() != '}') error("expected '}}'");
        ++pos_;
        if (!unbounded && max < min) error("{{{},{}}} has max < min", min, max);
        atom += unbounded ? fmt::format("{{{},}}", min) : fmt::format("{{{},{}}}", min, max);
      } else {
        out += (out.empty() ? "" : " ") + atom;
        continue;
      }
      if (peek() == '?' || peek() == '+') ++pos_;  // lazy / possessive: the same language
      if (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{') error("nested quantifier");
      out += (out.empty() ? "" : " ") + atom;
    }
    return out;
  }
  std::string parse_alt() {
    std::vector<std::string> alts = {parse_concat()};
    while (peek() == '|') {
      ++pos_;
      alts.push_back(parse_concat());
    }
    if (alts.size() == 1) return alts[0];
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i)
      out += (i ? " | " : "") + (alts[i].empty() ? std::string("\"\"") : alts[i]);
    return out;
  }

  std::string_view s_;
  bool json_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string regex_to_gbnf(std::string_view regex) {
  return "(" + RegexParser(regex, false).parse() + ")";
}

std::string regex_to_gbnf_json_string(std::string_view regex) {
  return "(" + RegexParser(regex, true).parse() + ")";
}

}  // namespace polylora::structured
