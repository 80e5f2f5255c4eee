// structured/rules.cc: the GBNF parser and its lowering to byte-level rules (UTF-8 range splitting,
// repetition as right-recursive rules), then the checks: every rule defined, no left recursion.
#include "structured/rules.h"

#include <algorithm>
#include <map>
#include <utility>

#include "common/error.h"

namespace polylora::structured {
namespace {

using Range = std::pair<uint32_t, uint32_t>;  // code points, inclusive

void utf8_encode(uint32_t cp, uint8_t* out, int& n) {
  if (cp < 0x80) {
    out[0] = static_cast<uint8_t>(cp);
    n = 1;
  } else if (cp < 0x800) {
    out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
    out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    n = 2;
  } else if (cp < 0x10000) {
    out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    n = 3;
  } else {
    out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
    out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
    out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
    out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    n = 4;
  }
}

// Splits [lo, hi] into ranges whose UTF-8 encodings are products of byte ranges (RE2's method), each
// appended as a list of (first byte, last byte) per position. Surrogates are left out.
void split_utf8(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) split_utf8(lo, 0xD7FF, out);
    if (hi > 0xDFFF) split_utf8(0xE000, hi, out);
    return;
  }
  for (uint32_t max : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= max && hi > max) {
      split_utf8(lo, max, out);
      split_utf8(max + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split_utf8(lo, lo | m, out);
        split_utf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split_utf8(lo, (hi & ~m) - 1, out);
        split_utf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  int na = 0, nb = 0;
  utf8_encode(lo, a, na);
  utf8_encode(hi, b, nb);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < na; ++i) seq.push_back({a[i], b[i]});
  out.push_back(std::move(seq));
}

std::vector<Range> normalize(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!out.empty() && r.first <= out.back().second + 1)
      out.back().second = std::max(out.back().second, r.second);
    else
      out.push_back(r);
  }
  return out;
}

std::vector<Range> negate(const std::vector<Range>& ranges) {
  std::vector<Range> out;
  uint32_t next = 0;
  for (const Range& r : normalize(ranges)) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.second + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

class Parser {
 public:
  Parser(std::string_view text, Rules& out) : s_(text), out_(out) {}

  void parse(std::string_view root_name) {
    skip_space();
    if (at_end()) error("the grammar is empty: it needs a rule `{} ::= ...`", root_name);
    while (!at_end()) {
      size_t name_pos = pos_;
      std::string name = parse_name();
      if (name.empty()) error("expected a rule name");
      skip_space();
      if (!consume("::=")) error("expected '::=' after rule name '{}'", name);
      int32_t id = rule_id(name);
      if (defined_[static_cast<size_t>(id)]) error_at(name_pos, "rule '{}' is defined twice", name);
      defined_[static_cast<size_t>(id)] = true;
      out_.rules[static_cast<size_t>(id)].alts = parse_alternates(false);
    }
    for (size_t i = 0; i < out_.rules.size(); ++i)
      if (!defined_[i])
        fail("grammar: rule '{}' is used but never defined (first use at {})", out_.rules[i].name,
             where(first_use_[i]));
    auto root = names_.find(std::string(root_name));
    if (root == names_.end() || !defined_[static_cast<size_t>(root->second)])
      fail("grammar: it has no '{}' rule, where matching starts", root_name);
    out_.root = root->second;
  }

 private:
  template <typename... Args>
  [[noreturn]] void error(fmt::format_string<Args...> f, Args&&... args) {
    error_at(pos_, f, std::forward<Args>(args)...);
  }
  template <typename... Args>
  [[noreturn]] void error_at(size_t pos, fmt::format_string<Args...> f, Args&&... args) {
    fail("grammar: {} (at {})", fmt::format(f, std::forward<Args>(args)...), where(pos));
  }
  std::string where(size_t pos) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return fmt::format("line {}, column {}", line, col);
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
  bool consume(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) return false;
    pos_ += lit.size();
    return true;
  }
  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }
  void skip_space() {
    while (!at_end()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  std::string parse_name() {
    size_t start = pos_;
    while (!at_end() && is_name_char(peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }
  // At a rule definition: a name followed by `::=`.
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < s_.size() && is_name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }
  int32_t rule_id(const std::string& name) {
    auto it = names_.find(name);
    if (it != names_.end()) return it->second;
    auto id = static_cast<int32_t>(out_.rules.size());
    out_.rules.push_back({name, {}});
    defined_.push_back(false);
    first_use_.push_back(pos_);
    names_[name] = id;
    return id;
  }
  int32_t new_rule(std::vector<Sequence> alts) {
    auto id = static_cast<int32_t>(out_.rules.size());
    out_.rules.push_back({fmt::format("_anon{}", id), std::move(alts)});
    defined_.push_back(true);
    first_use_.push_back(pos_);
    return id;
  }
  void count(size_t n) {
    num_elements_ += n;
    if (num_elements_ > kMaxGrammarElements)
      error("the grammar is too large (more than {} elements once repetitions are expanded)",
            kMaxGrammarElements);
  }
  int32_t byte_set(const std::bitset<256>& set) {
    auto key = set.to_string();
    auto it = sets_.find(key);
    if (it != sets_.end()) return it->second;
    auto id = static_cast<int32_t>(out_.byte_sets.size());
    out_.byte_sets.push_back(set);
    sets_[key] = id;
    return id;
  }
  Element byte_range(uint8_t lo, uint8_t hi) {
    std::bitset<256> set;
    for (int b = lo; b <= hi; ++b) set.set(static_cast<size_t>(b));
    return {Element::kBytes, byte_set(set)};
  }
  // A code-point set as one element: a byte set when every code point is ASCII, else a rule with one
  // alternative per UTF-8 byte-range sequence.
  Sequence lower_class(const std::vector<Range>& ranges) {
    std::vector<Range> norm = normalize(ranges);
    if (norm.empty()) error("the character class matches nothing");
    if (norm.back().second < 0x80) {
      std::bitset<256> set;
      for (const Range& r : norm)
        for (uint32_t c = r.first; c <= r.second; ++c) set.set(c);
      count(1);
      return {{Element::kBytes, byte_set(set)}};
    }
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    std::bitset<256> ascii;
    for (const Range& r : norm) {
      if (r.first < 0x80)
        for (uint32_t c = r.first; c <= std::min<uint32_t>(r.second, 0x7F); ++c) ascii.set(c);
      if (r.second >= 0x80) split_utf8(std::max<uint32_t>(r.first, 0x80), r.second, seqs);
    }
    std::vector<Sequence> alts;
    if (ascii.any()) alts.push_back({{Element::kBytes, byte_set(ascii)}});
    for (const auto& seq : seqs) {
      Sequence s;
      for (auto [lo, hi] : seq) s.push_back(byte_range(lo, hi));
      count(s.size());
      alts.push_back(std::move(s));
    }
    return {{Element::kRule, new_rule(std::move(alts))}};
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char c = peek();
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) error("expected {} hex digits in an escape", digits);
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }
  // One code point of a literal or class (after the opening quote/bracket), escapes decoded.
  uint32_t parse_char() {
    if (at_end()) error("unexpected end of the grammar inside a literal or class");
    auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      char e = peek();
      ++pos_;
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '0':
          return 0;
        case 'x':
          return parse_hex(2);
        case 'u':
          return parse_hex(4);
        case 'U':
          return parse_hex(8);
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '.':
          return static_cast<uint32_t>(e);
        default:
          error("unknown escape '\\{}'", e);
      }
    }
    // A UTF-8 code point of the grammar text.
    int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) > s_.size()) error("invalid UTF-8 in the grammar");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int i = 1; i < n; ++i)
      cp = (cp << 6) | (static_cast<unsigned char>(s_[pos_ + static_cast<size_t>(i)]) & 0x3F);
    pos_ += static_cast<size_t>(n);
    return cp;
  }
  Sequence parse_literal(char quote) {
    Sequence seq;
    while (peek() != quote) {
      if (at_end()) error("unterminated string literal");
      uint32_t cp = parse_char();
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error("invalid code point U+{:X}", cp);
      uint8_t b[4];
      int n = 0;
      utf8_encode(cp, b, n);
      for (int i = 0; i < n; ++i) seq.push_back(byte_range(b[i], b[i]));
    }
    ++pos_;
    count(seq.size());
    return seq;
  }
  Sequence parse_class() {
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<Range> ranges;
    while (peek() != ']') {
      if (at_end()) error("unterminated character class");
      uint32_t lo = parse_char(), hi = lo;
      if (peek() == '-' && peek(1) != ']') {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("character range is out of order");
      }
      if (hi > 0x10FFFF) error("invalid code point U+{:X}", hi);
      ranges.push_back({lo, hi});
    }
    ++pos_;
    return lower_class(negated ? negate(ranges) : ranges);
  }
  int64_t parse_int() {
    if (!(peek() >= '0' && peek() <= '9')) error("expected a number in a {{m,n}} repetition");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepetition) error("repetition count above {}", kMaxRepetition);
      ++pos_;
    }
    return v;
  }
  // atom repeated min..max times (max < 0: unbounded), appended to seq.
  void repeat(Sequence& seq, const Sequence& atom, int64_t min, int64_t max) {
    Element unit = atom.size() == 1 ? atom[0] : Element{Element::kRule, new_rule({atom})};
    count(static_cast<size_t>(min) + 1);
    for (int64_t i = 0; i < min; ++i) seq.push_back(unit);
    if (max < 0) {  // star ::= unit star | ε
      int32_t star = new_rule({});
      out_.rules[static_cast<size_t>(star)].alts = {{unit, {Element::kRule, star}}, {}};
      seq.push_back({Element::kRule, star});
      return;
    }
    // opt_k ::= unit opt_{k-1} | ε
    int32_t prev = -1;
    for (int64_t k = 0; k < max - min; ++k) {
      Sequence first = {unit};
      if (prev >= 0) first.push_back({Element::kRule, prev});
      prev = new_rule({std::move(first), {}});
    }
    count(static_cast<size_t>(max - min));
    if (prev >= 0) seq.push_back({Element::kRule, prev});
  }
  Sequence parse_sequence(bool nested) {
    Sequence seq;
    Sequence last;  // the last atom, not yet appended (a quantifier may follow)
    bool have_last = false;
    auto flush = [&] {
      if (have_last) seq.insert(seq.end(), last.begin(), last.end());
      have_last = false;
    };
    while (true) {
      skip_space();
      if (at_end()) break;
      char c = peek();
      if (c == '|' || c == ')') break;
      if (!nested && at_rule_start()) break;
      if (c == '"' || c == '\'') {
        flush();
        ++pos_;
        last = parse_literal(c);
        have_last = true;
      } else if (c == '[') {
        flush();
        ++pos_;
        last = parse_class();
        have_last = true;
      } else if (c == '.') {
        flush();
        ++pos_;
        last = lower_class({{0, 0x10FFFF}});
        have_last = true;
      } else if (c == '(') {
        flush();
        ++pos_;
        if (++depth_ > 200) error("groups nested too deeply");
        std::vector<Sequence> alts = parse_alternates(true);
        --depth_;
        skip_space();
        if (!consume(")")) error("expected ')'");
        last = {{Element::kRule, new_rule(std::move(alts))}};
        have_last = true;
      } else if (is_name_char(c)) {
        flush();
        std::string name = parse_name();
        last = {{Element::kRule, rule_id(name)}};
        count(1);
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) error("'{}' has nothing to repeat", c);
        ++pos_;
        int64_t min = 0, max = -1;
        if (c == '+') {
          min = 1;
        } else if (c == '?') {
          max = 1;
        } else if (c == '{') {
          skip_space();
          min = parse_int();
          skip_space();
          max = min;
          if (consume(",")) {
            skip_space();
            max = peek() == '}' ? -1 : parse_int();
            skip_space();
          }
          if (!consume("}")) error("expected '}}' closing a repetition");
          if (max >= 0 && max < min) error("repetition {{{},{}}} has max < min", min, max);
        }
        Sequence atom = std::move(last);
        have_last = false;
        repeat(seq, atom, min, max);
      } else {
        error("unexpected character '{}'", c);
      }
    }
    flush();
    return seq;
  }
  std::vector<Sequence> parse_alternates(bool nested) {
    std::vector<Sequence> alts;
    alts.push_back(parse_sequence(nested));
    while (true) {
      skip_space();
      if (!consume("|")) break;
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  std::string_view s_;
  Rules& out_;
  size_t pos_ = 0;
  int depth_ = 0;
  size_t num_elements_ = 0;
  std::map<std::string, int32_t> names_;
  std::map<std::string, int32_t> sets_;
  std::vector<bool> defined_;
  std::vector<size_t> first_use_;
};

// Left recursion (a rule reaching itself before consuming a byte) would make matching loop; it is
// refused, naming the rule.
void check_left_recursion(const Rules& g) {
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : g.rules[r].alts) {
        bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == Element::kRule && nullable[static_cast<size_t>(e.value)];
        });
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<int32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (const Sequence& alt : g.rules[r].alts)
      for (const Element& e : alt) {
        if (e.kind == Element::kBytes) break;
        left[r].push_back(e.value);
        if (!nullable[static_cast<size_t>(e.value)]) break;
      }
  // Iterative DFS for a cycle.
  std::vector<uint8_t> color(n, 0);
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    std::vector<std::pair<int32_t, size_t>> stack = {{static_cast<int32_t>(start), 0}};
    color[start] = 1;
    while (!stack.empty()) {
      auto& [r, i] = stack.back();
      if (i < left[static_cast<size_t>(r)].size()) {
        int32_t next = left[static_cast<size_t>(r)][i++];
        if (color[static_cast<size_t>(next)] == 1) {
          // Name the first user-named rule on the cycle.
          std::string name = g.rules[static_cast<size_t>(next)].name;
          for (auto it = stack.rbegin(); it != stack.rend() && name.starts_with("_anon"); ++it)
            name = g.rules[static_cast<size_t>(it->first)].name;
          fail(
              "grammar: rule '{}' is left-recursive (it can reach itself without matching anything); "
              "rewrite it with repetition, e.g. `list ::= item (\",\" item)*`",
              name);
        }
        if (color[static_cast<size_t>(next)] == 0) {
          color[static_cast<size_t>(next)] = 1;
          stack.push_back({next, 0});
        }
      } else {
        color[static_cast<size_t>(r)] = 2;
        stack.pop_back();
      }
    }
  }
}

}  // namespace

Rules parse_gbnf(std::string_view text, std::string_view root_name) {
  Rules rules;
  Parser(text, rules).parse(root_name);
  check_left_recursion(rules);
  return rules;
}

}  // namespace polylora::structured
