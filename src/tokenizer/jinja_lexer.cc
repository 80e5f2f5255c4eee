// tokenizer/jinja_lexer.cc: the Jinja tokenizer (text, tags, expression tokens, whitespace control).
// Must not: build syntax trees or evaluate anything.
#include "tokenizer/jinja_lexer.h"

#include <cerrno>
#include <cstdlib>

#include "common/error.h"
#include "common/escapes.h"
#include "tokenizer/jinja_support.h"

namespace polylora::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options) : src_(std::move(source)), options_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t start = find_tag_start(pos_);
      std::string text = src_.substr(pos_, (start == std::string::npos ? src_.size() : start) - pos_);
      if (start == std::string::npos) {
        emit_text(std::move(text));
        pos_ = src_.size();
        break;
      }
      char kind = src_[start + 1];
      char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      if (sign == '-') {
        text = rstrip(text);
      } else if (sign != '+' && options_.lstrip_blocks && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting_) {
          bool blank = true;
          for (size_t i = l_pos; i < text.size(); ++i) blank = blank && is_space(text[i]);
          if (blank) text.resize(l_pos);
        }
      }
      emit_text(std::move(text));
      line_ += count_newlines(pos_, start);
      pos_ = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind == '{');
      }
    }
    tokens_.push_back({TokenKind::kEof, "", 0, 0, line_});
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    while (true) {
      size_t p = src_.find('{', from);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      from = p + 1;
    }
  }

  static std::string rstrip(const std::string& s) {
    size_t end = s.size();
    while (end > 0 && is_space(s[end - 1])) --end;
    return s.substr(0, end);
  }

  int count_newlines(size_t from, size_t to) const {
    int n = 0;
    for (size_t i = from; i < to && i < src_.size(); ++i) n += src_[i] == '\n';
    return n;
  }

  void emit_text(std::string text) {
    if (!text.empty()) tokens_.push_back({TokenKind::kText, std::move(text), 0, 0, line_});
  }

  [[noreturn]] void error(const std::string& what) const {
    fail("template syntax error at line {}: {}", line_, what);
  }

  // After a block or comment end at pos_: '-' strips all following whitespace; otherwise trim_blocks
  // removes one newline (unless the tag ended with '+').
  void after_tag_end(char sign, bool block) {
    size_t start = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (block && sign != '+' && options_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += count_newlines(start, pos_);
    line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
  }

  void lex_comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) error("missing end of comment tag");
    char sign = (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) ? src_[end - 1] : '\0';
    line_ += count_newlines(pos_, end);
    pos_ = end + 2;
    after_tag_end(sign, true);
  }

  void lex_tag(bool variable) {
    tokens_.push_back({variable ? TokenKind::kVarBegin : TokenKind::kBlockBegin, "", 0, 0, line_});
    size_t first_token = tokens_.size();
    int depth = 0;
    const char* end_marker = variable ? "}}" : "%}";
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size())
        error(std::string("unexpected end of template, expected '") + end_marker + "'");
      if (depth == 0) {
        char sign = '\0';
        size_t p = pos_;
        if (src_[p] == '-' || (src_[p] == '+' && !variable)) sign = src_[p++];
        if (src_.compare(p, 2, end_marker) == 0) {
          tokens_.push_back({variable ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "", 0, 0, line_});
          pos_ = p + 2;
          if (variable) {
            size_t start = pos_;
            if (sign == '-') {
              while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
            }
            line_ += count_newlines(start, pos_);
            line_starting_ = pos_ > 0 && src_[pos_ - 1] == '\n';
          } else {
            after_tag_end(sign, true);
            if (tokens_.size() == first_token + 2 && tokens_[first_token].kind == TokenKind::kName &&
                tokens_[first_token].text == "raw") {
              tokens_.resize(first_token - 1);
              lex_raw();
            }
          }
          return;
        }
      }
      lex_expression_token(depth);
    }
  }

  // After `{% raw %}`: everything up to `{% endraw %}` is text.
  void lex_raw() {
    size_t search = pos_;
    while (true) {
      size_t p = src_.find("{%", search);
      if (p == std::string::npos) error("missing '{% endraw %}'");
      size_t q = p + 2;
      char begin_sign = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) begin_sign = src_[q++];
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = p + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char end_sign = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) {
        search = p + 2;
        continue;
      }
      std::string text = src_.substr(pos_, p - pos_);
      if (begin_sign == '-') text = rstrip(text);
      emit_text(std::move(text));
      line_ += count_newlines(pos_, q);
      pos_ = q + 2;
      after_tag_end(end_sign, true);
      return;
    }
  }

  void lex_expression_token(int& depth) {
    char c = src_[pos_];
    if (is_name_start(c)) {
      size_t start = pos_;
      while (pos_ < src_.size() && is_name_char(src_[pos_])) ++pos_;
      tokens_.push_back({TokenKind::kName, src_.substr(start, pos_ - start), 0, 0, line_});
      return;
    }
    if (is_digit(c)) {
      lex_number();
      return;
    }
    if (c == '\'' || c == '"') {
      lex_string(c);
      return;
    }
    static const char* kTwoCharOps[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwoCharOps) {
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({TokenKind::kOp, op, 0, 0, line_});
        pos_ += 2;
        return;
      }
    }
    static const std::string kOneCharOps = "+-*/%~<>=()[]{},.:|";
    if (kOneCharOps.find(c) != std::string::npos) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) error(std::string("unexpected '") + c + "'");
        --depth;
      }
      tokens_.push_back({TokenKind::kOp, std::string(1, c), 0, 0, line_});
      ++pos_;
      return;
    }
    error(std::string("unexpected character '") + c + "'");
  }

  void lex_number() {
    size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                                             is_digit(src_[pos_ + 1])))) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && is_digit(src_[p])) {
        is_float = true;
        pos_ = p;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t{is_float ? TokenKind::kFloat : TokenKind::kInt, text, 0, 0, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error("integer literal out of range: " + text);
    }
    tokens_.push_back(std::move(t));
  }

  void lex_string(char quote) {
    int line = line_;
    ++pos_;
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) error("unterminated string literal");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= src_.size()) error("unterminated string literal");
      char e = src_[pos_++];
      if (const int simple = python_simple_escape(e); simple >= 0) {
        out += static_cast<char>(simple);
        continue;
      }
      switch (e) {
        case '0':
          out += '\0';
          break;
        case '\n':
          ++line_;
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          if (pos_ + n > src_.size()) error("truncated \\" + std::string(1, e) + " escape");
          uint32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            char h = src_[pos_ + i];
            int d = hex_digit_value(h);
            if (d < 0) error("malformed \\" + std::string(1, e) + " escape");
            cp = cp * 16 + static_cast<uint32_t>(d);
          }
          if (cp > 0x10FFFF) error("invalid code point in escape");
          pos_ += n;
          append_utf8(out, cp);
          break;
        }
        default:
          out += '\\';
          out += e;
      }
    }
    tokens_.push_back({TokenKind::kString, std::move(out), 0, 0, line});
  }

  std::string src_;
  LexOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexOptions& options) {
  return Lexer(normalize_newlines(source), options).run();
}

}  // namespace polylora::jinja
