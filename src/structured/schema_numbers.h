// structured/schema_numbers.h: the number helpers of the JSON Schema converter (json_schema.cc): integer
// ranges as GBNF expressions, GBNF alternatives, and decimal numbers parsed from their text and compared
// exactly (bounds are never rounded through a double). Internal to structured/. Must not: know about tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace polylora::structured {

constexpr int64_t kIntLimit = 999'999'999'999'999'999;  // 18 digits: the integers a grammar can bound

// The decimal integers in [lo, hi] (no leading zeros, "-0" excluded; |lo|, |hi| <= kIntLimit) as a GBNF
// expression.
std::string integer_range_gbnf(int64_t lo, int64_t hi);
// One GBNF character class for the digits lo..hi ("\"5\"" when lo == hi).
std::string digit_class(char lo, char hi);
// Appends the alternatives for the non-negative integers in [lo, hi] (0 <= lo <= hi), one or more per
// digit count, to out.
void nonnegative_range(int64_t lo, int64_t hi, std::vector<std::string>& out);
// "(a | b | ...)".
std::string alternatives(const std::vector<std::string>& alts);

// A decimal number as written: sign, integer digits (no leading zeros, "0" for none) and fraction digits
// (no trailing zeros). Zero is never negative.
struct Decimal {
  bool neg = false;
  std::string ip = "0";
  std::string fp;
};

// Parses what fmt / nlohmann print for a number ("-12", "0.25", "1e-07", "1.5e+20"); anything else fails.
Decimal parse_decimal(const std::string& text);
// −1, 0, 1 as |a| is below, equal to or above |b|.
int compare_magnitude(const Decimal& a, const Decimal& b);
// −1, 0, 1 as a is below, equal to or above b.
int compare_decimal(const Decimal& a, const Decimal& b);
Decimal abs_decimal(Decimal d);
// The number as plain decimal text (no exponent).
std::string decimal_text(const Decimal& d);

}  // namespace polylora::structured
