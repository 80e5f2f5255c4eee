// tokenizer/jinja_lexer.h: splits a Jinja template into text and tag tokens.
// Owns: newline normalisation, whitespace control (`{%-`, `-%}`, `+%}`, and Hugging Face's trim_blocks and
// lstrip_blocks), comments, raw blocks, and the expression tokens inside `{{ }}` and `{% %}`.
// Must not: build syntax trees or evaluate anything.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polylora::jinja {

enum class TokenKind {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  TokenKind kind;
  std::string text;  // text, name, operator or the unescaped string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws polylora::Error with the line number on a malformed template.
std::vector<Token> tokenize(std::string_view source, const LexOptions& options = {});

}  // namespace polylora::jinja
