// structured/rules.h: a grammar as byte-level rules (internal to structured/): every terminal is a set
// of bytes, every other element a reference to a rule; code-point classes are lowered to UTF-8 byte
// sequences here. Owns the GBNF parser and the checks (undefined rules, left recursion, size limits).
// Must not: know about tokens or vocabularies.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polylora::structured {

struct Element {
  enum Kind : uint8_t { kBytes, kRule };
  Kind kind = kBytes;
  int32_t value = 0;  // kBytes: index into Rules::byte_sets; kRule: rule index
};

using Sequence = std::vector<Element>;

struct Rule {
  std::string name;
  std::vector<Sequence> alts;
};

struct Rules {
  std::vector<Rule> rules;
  std::vector<std::bitset<256>> byte_sets;
  int32_t root = -1;
};

// Parses GBNF (llama.cpp's syntax: `name ::= alternatives`, "literals", [classes], ., ( groups ),
// * + ? {m} {m,} {m,n}, # comments; rules may continue over several lines). Throws polylora::Error with
// the line and column of a syntax error, an undefined rule, left recursion or a grammar too large.
Rules parse_gbnf(std::string_view text, std::string_view root_name = "root");

// Limits that keep a hostile grammar from exhausting memory.
inline constexpr size_t kMaxGrammarElements = 2'000'000;
inline constexpr int64_t kMaxRepetition = 100'000;

}  // namespace polylora::structured
