// server/pythonic_tools.cc: a parser of the Python call lists of vLLM's pythonic tool parsers (see the
// header): recursive descent over the literal subset vLLM's _get_parameter_value accepts, each value written
// back as json.dumps writes it. A text that ends inside the list gives the calls seen so far.
#include "server/pythonic_tools.h"

#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/escapes.h"
#include "common/utf8.h"

namespace polylora::server {

namespace {

enum class R { kOk, kEnd, kBad };  // parsed; the text ended inside; not a literal call list

constexpr int kMaxDepth = 64;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_word(char c) {
  return is_alpha(c) || is_digit(c) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}

// A string as json.dumps(ensure_ascii=False) writes it: nlohmann's escapes are Python's (qwen3_coder_tools
// writes its strings the same way); invalid UTF-8 becomes U+FFFD.
std::string json_string(std::string_view v) {
  return nlohmann::json(std::string(v)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  void ws() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }
  size_t pos() const { return pos_; }
  void advance() { ++pos_; }

  // An identifier starting with a letter (vLLM's regex: [a-zA-Z]+\w*); kEnd when the text ends in it.
  R name(std::string& out) {
    if (at_end()) return R::kEnd;
    if (!is_alpha(peek())) return R::kBad;
    const size_t b = pos_;
    while (pos_ < s_.size() && is_word(s_[pos_])) ++pos_;
    if (at_end()) return R::kEnd;
    out = std::string(s_.substr(b, pos_ - b));
    return R::kOk;
  }

  // A value, as JSON text.
  R value(std::string& out, int depth) {
    if (depth > kMaxDepth) return R::kBad;
    ws();
    if (at_end()) return R::kEnd;
    const char c = peek();
    if (c == '"' || c == '\'' ||
        ((c == 'r' || c == 'R' || c == 'u' || c == 'U') && pos_ + 1 < s_.size() &&
         (s_[pos_ + 1] == '"' || s_[pos_ + 1] == '\''))) {
      std::string text;
      // Adjacent literals are one string, as in Python.
      while (true) {
        R r = string(text);
        if (r != R::kOk) return r;
        const size_t save = pos_;
        ws();
        if (at_end()) return R::kEnd;
        const char n = peek();
        if (!(n == '"' || n == '\'' ||
              ((n == 'r' || n == 'R' || n == 'u' || n == 'U') && pos_ + 1 < s_.size() &&
               (s_[pos_ + 1] == '"' || s_[pos_ + 1] == '\'')))) {
          pos_ = save;
          break;
        }
      }
      out = json_string(text);
      return R::kOk;
    }
    if (c == '[') return list(out, depth);
    if (c == '{') return dict(out, depth);
    if (is_digit(c) || c == '-' || c == '+' || c == '.') return number(out);
    if (is_alpha(c) || c == '_') {
      std::string id;
      R r = name(id);
      if (r != R::kOk) return r;
      if (id == "True" || id == "true")
        out = "true";
      else if (id == "False" || id == "false")
        out = "false";
      else if (id == "None" || id == "null")
        out = "null";
      else
        return R::kBad;  // a name, a call or an attribute: not a literal
      return R::kOk;
    }
    return R::kBad;  // tuples, sets, expressions
  }

 private:
  R string(std::string& out) {
    bool raw = false;
    while (peek() != '"' && peek() != '\'') {
      if (peek() == 'r' || peek() == 'R') raw = true;
      ++pos_;
    }
    const char q = peek();
    const bool triple = s_.substr(pos_, 3) == std::string(3, q);
    pos_ += triple ? 3 : 1;
    while (true) {
      if (at_end()) return R::kEnd;
      const char c = peek();
      if (c == q) {
        if (!triple) {
          ++pos_;
          return R::kOk;
        }
        if (s_.size() - pos_ < 3) return R::kEnd;
        if (s_.substr(pos_, 3) == std::string(3, q)) {
          pos_ += 3;
          return R::kOk;
        }
        out += c;
        ++pos_;
        continue;
      }
      if (c == '\n' && !triple) return R::kBad;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= s_.size()) return R::kEnd;
      const char e = s_[pos_ + 1];
      if (raw) {  // the backslash stays; it only keeps a quote from ending the string
        out += c;
        out += e;
        pos_ += 2;
        continue;
      }
      pos_ += 2;
      if (const int simple = python_simple_escape(e); simple >= 0) {
        out += static_cast<char>(simple);
        continue;
      }
      switch (e) {
        case '\n':
          break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (s_.size() - pos_ < digits) return R::kEnd;
          uint32_t cp = 0;
          for (size_t i = 0; i < digits; ++i) {
            const char h = s_[pos_ + i];
            const int v = hex_digit_value(h);
            if (v < 0) return R::kBad;
            cp = cp * 16 + static_cast<uint32_t>(v);
          }
          pos_ += digits;
          // A UTF-16 pair written as two \u escapes is one character.
          if (e == 'u' && cp >= 0xD800 && cp <= 0xDBFF && s_.size() - pos_ >= 6 && s_[pos_] == '\\' &&
              s_[pos_ + 1] == 'u') {
            uint32_t lo = 0;
            bool hex = true;
            for (size_t i = 2; i < 6 && hex; ++i) {
              const char h = s_[pos_ + i];
              const int v = hex_digit_value(h);
              hex = v >= 0;
              lo = lo * 16 + static_cast<uint32_t>(v < 0 ? 0 : v);
            }
            if (hex && lo >= 0xDC00 && lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              pos_ += 6;
            }
          }
          append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {  // up to three octal digits
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '7'; ++i)
              cp = cp * 8 + static_cast<uint32_t>(s_[pos_++] - '0');
            append_utf8(out, cp);
          } else if (e == 'N') {
            return R::kBad;  // \N{NAME}: not supported
          } else {           // an unknown escape keeps its backslash, as Python does
            out += '\\';
            out += e;
          }
      }
    }
  }

  // An int or a float (a sign allowed: vLLM's ast path refuses "-1" as an expression; polylora takes it).
  R number(std::string& out) {
    const size_t b = pos_;
    if (peek() == '-' || peek() == '+') ++pos_;
    while (pos_ < s_.size() &&
           (is_word(s_[pos_]) || s_[pos_] == '.' ||
            ((s_[pos_] == '-' || s_[pos_] == '+') && (s_[pos_ - 1] == 'e' || s_[pos_ - 1] == 'E'))))
      ++pos_;
    if (at_end()) return R::kEnd;  // it may go on
    std::string text;
    for (char c : s_.substr(b, pos_ - b))
      if (c != '_') text += c;
    const bool negative = !text.empty() && text[0] == '-';
    std::string body = text.substr(!text.empty() && (text[0] == '-' || text[0] == '+') ? 1 : 0);
    if (body.empty()) return R::kBad;
    const bool radix =
        body.size() > 2 && body[0] == '0' && std::string("xXoObB").find(body[1]) != std::string::npos;
    if (radix) {
      const int base = (body[1] == 'x' || body[1] == 'X') ? 16 : (body[1] == 'o' || body[1] == 'O') ? 8 : 2;
      uint64_t v = 0;
      auto [p, ec] = std::from_chars(body.data() + 2, body.data() + body.size(), v, base);
      if (ec != std::errc() || p != body.data() + body.size()) return R::kBad;
      out = (negative ? "-" : "") + std::to_string(v);
      return R::kOk;
    }
    const bool is_float = body.find_first_of(".eE") != std::string::npos;
    if (!is_float) {
      for (char c : body)
        if (!is_digit(c)) return R::kBad;
      if (body.size() > 1 && body[0] == '0' && body.find_first_not_of('0') != std::string::npos)
        return R::kBad;
      const size_t nz = body.find_first_not_of('0');
      out = (negative ? "-" : "") + (nz == std::string::npos ? std::string("0") : body.substr(nz));
      return R::kOk;
    }
    double v = 0;
    auto [p, ec] = std::from_chars(body.data(), body.data() + body.size(), v);
    if (p != body.data() + body.size() || ec != std::errc()) return R::kBad;
    if (negative) v = -v;
    // Python's repr: the shortest round-trip digits, ".0" on integral values, inf as Infinity.
    char buf[64];
    auto [e, ec2] = std::to_chars(buf, buf + sizeof buf, v);
    std::string r(buf, e);
    if (r == "inf" || r == "-inf") {
      out = r == "inf" ? "Infinity" : "-Infinity";
      return R::kOk;
    }
    if (r.find_first_of(".e") == std::string::npos) r += ".0";
    size_t ex = r.find('e');
    if (ex != std::string::npos) {  // 1e+16 / 1.5e-07: a sign and at least two exponent digits
      std::string mant = r.substr(0, ex), exp = r.substr(ex + 1);
      char sign = '+';
      if (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) {
        sign = exp[0];
        exp = exp.substr(1);
      }
      if (exp.size() < 2) exp = "0" + exp;
      r = mant + "e" + sign + exp;
    }
    out = r;
    return R::kOk;
  }

  R list(std::string& out, int depth) {
    ++pos_;  // [
    std::string items;
    bool first = true;
    while (true) {
      ws();
      if (at_end()) return R::kEnd;
      if (peek() == ']') {
        ++pos_;
        out = "[" + items + "]";
        return R::kOk;
      }
      std::string v;
      R r = value(v, depth + 1);
      if (r != R::kOk) return r;
      items += (first ? "" : ", ") + v;
      first = false;
      ws();
      if (at_end()) return R::kEnd;
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ']') {
        return R::kBad;
      }
    }
  }

  R dict(std::string& out, int depth) {
    ++pos_;  // {
    std::vector<std::pair<std::string, std::string>> items;
    while (true) {
      ws();
      if (at_end()) return R::kEnd;
      if (peek() == '}') {
        ++pos_;
        out = "{";
        for (size_t i = 0; i < items.size(); ++i)
          out += (i ? ", " : "") + items[i].first + ": " + items[i].second;
        out += "}";
        return R::kOk;
      }
      std::string k;
      R r = value(k, depth + 1);
      if (r != R::kOk) return r;
      // json.dumps turns keys into strings: numbers and true / false / null by their JSON text.
      if (k.empty()) return R::kBad;
      if (k[0] == '[' || k[0] == '{') return R::kBad;  // not a constant
      if (k[0] != '"') k = json_string(k);
      ws();
      if (at_end()) return R::kEnd;
      if (peek() != ':') return R::kBad;
      ++pos_;
      std::string v;
      r = value(v, depth + 1);
      if (r != R::kOk) return r;
      bool replaced = false;  // a repeated key keeps its place and takes the last value
      for (auto& item : items)
        if (item.first == k) {
          item.second = v;
          replaced = true;
        }
      if (!replaced) items.emplace_back(std::move(k), std::move(v));
      ws();
      if (at_end()) return R::kEnd;
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        return R::kBad;
      }
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// One call's arguments object: `{` + the keyword arguments so far (+ `}` when closed).
std::string arguments_json(const std::vector<std::pair<std::string, std::string>>& args, bool closed) {
  std::string out = "{";
  for (size_t i = 0; i < args.size(); ++i)
    out += (i ? ", " : "") + json_string(args[i].first) + ": " + args[i].second;
  return closed ? out + "}" : out;
}

}  // namespace

PythonicParse parse_pythonic_calls(std::string_view s, bool final) {
  PythonicParse out;
  Parser p(s);
  if (p.at_end() || p.peek() != '[') return out;
  p.advance();
  while (true) {
    p.ws();
    if (p.at_end()) return out;
    if (p.peek() == ']') {
      if (out.calls.empty()) return out;  // [] is not a call list (vLLM's regex wants one call)
      p.advance();
      p.ws();
      out.ok = final && p.at_end();  // text after the list: not a call list
      return out;
    }
    std::string name;
    if (p.name(name) != R::kOk) return out;
    p.ws();
    if (p.at_end() || p.peek() != '(') return out;
    p.advance();
    out.calls.push_back({name, "{"});
    std::vector<std::pair<std::string, std::string>> args;
    bool closed = false;
    while (!closed) {
      p.ws();
      if (p.at_end()) return out;
      if (p.peek() == ')') {
        p.advance();
        closed = true;
        break;
      }
      std::string key;
      if (p.name(key) != R::kOk) return out;  // positional arguments are not tool calls (vLLM's regex)
      p.ws();
      if (p.at_end() || p.peek() != '=') return out;
      p.advance();
      std::string v;
      if (p.value(v, 0) != R::kOk) return out;
      p.ws();
      if (p.at_end()) return out;
      if (p.peek() != ',' && p.peek() != ')') return out;
      for (auto& a : args)
        if (a.first == key) return out;  // Python: "keyword argument repeated"
      args.emplace_back(std::move(key), std::move(v));
      out.calls.back().arguments = arguments_json(args, false);
      if (p.peek() == ',') p.advance();
    }
    out.calls.back().arguments = arguments_json(args, true);
    p.ws();
    if (p.at_end()) return out;
    if (p.peek() == ',') {
      p.advance();
      p.ws();
      if (!p.at_end() && p.peek() == ']') return out;  // a trailing comma: not vLLM's form
    } else if (p.peek() != ']') {
      return out;
    }
  }
}

}  // namespace polylora::server
