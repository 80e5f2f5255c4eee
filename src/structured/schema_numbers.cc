// structured/schema_numbers.cc: the number helpers of the JSON Schema converter (schema_numbers.h):
// integer ranges as GBNF alternatives of digit classes, and decimals compared exactly as written.
#include "structured/schema_numbers.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"

namespace polylora::structured {

std::string digit_class(char lo, char hi) {
  if (lo == hi) return std::string("\"") + lo + "\"";
  return std::string("[") + lo + "-" + hi + "]";
}

namespace {

void same_length(const std::string& a, const std::string& b, const std::string& prefix,
                 std::vector<std::string>& out) {
  if (a.empty()) {
    out.push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  auto join = [&](const std::string& x) { return prefix.empty() ? x : prefix + " " + x; };
  if (a[0] == b[0]) {
    same_length(a.substr(1), b.substr(1), join(digit_class(a[0], a[0])), out);
    return;
  }
  const size_t rest = a.size() - 1;
  char lo = a[0], hi = b[0];
  const bool a_zeros = a.find_first_not_of('0', 1) == std::string::npos;
  const bool b_nines = b.find_first_not_of('9', 1) == std::string::npos;
  if (!a_zeros) {
    same_length(a.substr(1), std::string(rest, '9'), join(digit_class(a[0], a[0])), out);
    ++lo;
  }
  if (lo <= hi - (b_nines ? 0 : 1)) {
    std::string e = join(digit_class(lo, static_cast<char>(b_nines ? hi : hi - 1)));
    if (rest) e += fmt::format(" [0-9]{{{}}}", rest);
    out.push_back(e);
  }
  if (!b_nines) same_length(std::string(rest, '0'), b.substr(1), join(digit_class(b[0], b[0])), out);
}

}  // namespace

void nonnegative_range(int64_t lo, int64_t hi, std::vector<std::string>& out) {
  std::string l = std::to_string(lo), h = std::to_string(hi);
  for (size_t d = l.size(); d <= h.size(); ++d) {
    std::string a = d == l.size() ? l : "1" + std::string(d - 1, '0');
    std::string b = d == h.size() ? h : std::string(d, '9');
    same_length(a, b, "", out);
  }
}

std::string alternatives(const std::vector<std::string>& alts) {
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// Parses what fmt / nlohmann print for a number ("-12", "0.25", "1e-07", "1.5e+20").
Decimal parse_decimal(const std::string& text) {
  Decimal d;
  std::string t = text;
  if (!t.empty() && (t[0] == '-' || t[0] == '+')) {
    d.neg = t[0] == '-';
    t = t.substr(1);
  }
  int64_t exp = 0;
  if (size_t e = t.find_first_of("eE"); e != std::string::npos) {
    exp = std::stoll(t.substr(e + 1));
    t = t.substr(0, e);
  }
  std::string digits;
  int64_t point = static_cast<int64_t>(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '.') {
      point = static_cast<int64_t>(i);
    } else {
      CHECK_MSG(t[i] >= '0' && t[i] <= '9', "not a decimal number: {}", text);
      digits += t[i];
    }
  }
  point += exp;  // digits before the decimal point
  if (point <= 0) {
    d.ip = "";
    d.fp = std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (point >= static_cast<int64_t>(digits.size())) {
    d.ip = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
  } else {
    d.ip = digits.substr(0, static_cast<size_t>(point));
    d.fp = digits.substr(static_cast<size_t>(point));
  }
  d.ip.erase(0, std::min(d.ip.find_first_not_of('0'), d.ip.size()));
  if (d.ip.empty()) d.ip = "0";
  while (!d.fp.empty() && d.fp.back() == '0') d.fp.pop_back();
  if (d.ip == "0" && d.fp.empty()) d.neg = false;
  return d;
}

int compare_magnitude(const Decimal& a, const Decimal& b) {
  if (a.ip.size() != b.ip.size()) return a.ip.size() < b.ip.size() ? -1 : 1;
  if (int c = a.ip.compare(b.ip)) return c < 0 ? -1 : 1;
  const size_t n = std::max(a.fp.size(), b.fp.size());
  std::string x = a.fp + std::string(n - a.fp.size(), '0'), y = b.fp + std::string(n - b.fp.size(), '0');
  if (int c = x.compare(y)) return c < 0 ? -1 : 1;
  return 0;
}

int compare_decimal(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  const int m = compare_magnitude(a, b);
  return a.neg ? -m : m;
}

Decimal abs_decimal(Decimal d) {
  d.neg = false;
  return d;
}

std::string decimal_text(const Decimal& d) {
  return (d.neg ? "-" : "") + d.ip + (d.fp.empty() ? "" : "." + d.fp);
}

std::string integer_range_gbnf(int64_t lo, int64_t hi) {
  CHECK(lo <= hi && lo >= -kIntLimit && hi <= kIntLimit);
  std::vector<std::string> alts;
  if (lo < 0) {
    std::vector<std::string> neg;
    nonnegative_range(hi < 0 ? -hi : 1, -lo, neg);
    alts.push_back("\"-\" " + alternatives(neg));
  }
  if (hi >= 0) nonnegative_range(std::max<int64_t>(lo, 0), hi, alts);
  return alternatives(alts);
}

}  // namespace polylora::structured
