// tokenizer/jinja_support.cc: argument access, Python str semantics on UTF-8 and value utilities shared by
// the Jinja filters, tests and methods. Must not: hold render state.
#include "tokenizer/jinja_support.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tokenizer/jinja_renderer.h"

namespace polylora::jinja {

// ---- argument helpers ----

// Positional argument `index` or keyword `name`; nullptr when absent.
const Value* arg(const CallArgs& a, size_t index, std::string_view name) {
  if (index < a.args.size()) return &a.args[index];
  for (const auto& [k, v] : a.kwargs) {
    if (k == name) return &v;
  }
  return nullptr;
}
Value arg_or(const CallArgs& a, size_t index, std::string_view name, Value def) {
  const Value* v = arg(a, index, name);
  return v ? *v : def;
}
bool arg_bool(const CallArgs& a, size_t index, std::string_view name, bool def) {
  const Value* v = arg(a, index, name);
  return v ? v->truthy() : def;
}
std::string arg_str(const CallArgs& a, size_t index, std::string_view name, std::string_view fn) {
  const Value* v = arg(a, index, name);
  if (!v) fail("{}() missing argument '{}'", fn, name);
  if (!v->is_string()) fail("{}() argument '{}' must be a string, not {}", fn, name, v->type_name());
  return v->as_string();
}
int64_t arg_int(const CallArgs& a, size_t index, std::string_view name, int64_t def, std::string_view fn) {
  const Value* v = arg(a, index, name);
  if (!v || v->is_none()) return def;
  if (!v->is_int()) fail("{}() argument '{}' must be an integer, not {}", fn, name, v->type_name());
  return v->as_int();
}

// ---- string helpers (Python semantics on UTF-8) ----

uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = n;
  return cp;
}

bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Strips code points that are whitespace (chars == nullptr) or in `chars`.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<size_t> offsets = utf8_offsets(s);
  auto strippable = [&](size_t idx) {
    size_t a = offsets[idx], b = offsets[idx + 1];
    if (!chars) {
      size_t len;
      return is_py_space(decode_at(s, a, &len));
    }
    std::string_view ch = s.substr(a, b - a);
    auto char_offsets = utf8_offsets(*chars);
    for (size_t k = 0; k + 1 < char_offsets.size(); ++k) {
      if (std::string_view(*chars).substr(char_offsets[k], char_offsets[k + 1] - char_offsets[k]) == ch)
        return true;
    }
    return false;
  };
  size_t n = offsets.size() - 1, begin = 0, end = n;
  if (left) {
    while (begin < end && strippable(begin)) ++begin;
  }
  if (right) {
    while (end > begin && strippable(end - 1)) --end;
  }
  return std::string(s.substr(offsets[begin], offsets[end] - offsets[begin]));
}

std::string strip_arg(const std::string& s, const CallArgs& a, bool left, bool right) {
  const Value* chars = arg(a, 0, "chars");
  if (chars && !chars->is_none()) {
    if (!chars->is_string()) fail("strip arg must be None or str");
    return strip(s, &chars->as_string(), left, right);
  }
  return strip(s, nullptr, left, right);
}

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (Python maps all of
// Unicode; other scripts are left unchanged here).
uint32_t case_map(uint32_t c, bool upper) {
  if (c < 0x80) {
    if (upper && c >= 'a' && c <= 'z') return c - 32;
    if (!upper && c >= 'A' && c <= 'Z') return c + 32;
    return c;
  }
  if (upper) {
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7) || (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) ||
        (c >= 0x430 && c <= 0x44F))
      return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0xFF) return 0x178;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (c >= 0x100 && c <= 0x17F && c != 0x131 && c != 0x138 && c != 0x149) {
      bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
      if (odd_lower ? (c % 2 == 0) : (c % 2 == 1)) return c - 1;
    }
    return c;
  }
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7) || (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) ||
      (c >= 0x410 && c <= 0x42F))
    return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x138 && c != 0x149) {
    bool odd_lower = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if (odd_lower ? (c % 2 == 1) : (c % 2 == 0)) return c + 1;
  }
  return c;
}

std::string change_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len;
    uint32_t cp = decode_at(s, i, &len);
    if (cp < 0x80 || len == 1) {
      out += static_cast<char>(cp < 0x80 ? case_map(cp, upper) : static_cast<unsigned char>(s[i]));
    } else {
      append_utf8(out, case_map(cp, upper));
    }
    i += len;
  }
  return out;
}
std::string to_upper(const std::string& s) {
  return change_case(s, true);
}
std::string to_lower(const std::string& s) {
  return change_case(s, false);
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || static_cast<unsigned char>(c) >= 0x80;
}

// Splits into code points (as UTF-8 strings).
std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  auto offsets = utf8_offsets(s);
  for (size_t i = 0; i + 1 < offsets.size(); ++i)
    out.push_back(s.substr(offsets[i], offsets[i + 1] - offsets[i]));
  return out;
}

bool is_cased_letter(const std::string& ch) {
  return to_upper(ch) != ch || to_lower(ch) != ch;
}

std::string capitalize(const std::string& s) {
  auto chars = code_points(s);
  std::string out;
  for (size_t i = 0; i < chars.size(); ++i) out += i == 0 ? to_upper(chars[i]) : to_lower(chars[i]);
  return out;
}

// Python str.title(): upper-case a cased letter following an uncased character, lower-case the others.
std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (const auto& ch : code_points(s)) {
    bool cased = is_cased_letter(ch);
    out += cased ? (prev_cased ? to_lower(ch) : to_upper(ch)) : ch;
    prev_cased = cased;
  }
  return out;
}

// Jinja's title filter: capitalise words separated by whitespace, '-', and opening brackets.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool word_start = true;
  for (const auto& ch : code_points(s)) {
    char c = ch[0];
    bool sep = ch.size() == 1 && (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
                                  c == '-' || c == '(' || c == '{' || c == '[' || c == '<');
    if (sep) {
      out += ch;
      word_start = true;
    } else {
      out += word_start ? to_upper(ch) : to_lower(ch);
      word_start = false;
    }
  }
  return out;
}

std::string replace_all(const std::string& s, const std::string& old_s, const std::string& new_s,
                        int64_t count, Renderer& r) {
  std::string out;
  int64_t done = 0;
  if (old_s.empty()) {
    auto offsets = utf8_offsets(s);
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
      r.check_size(out.size());
    }
    if (count < 0 || done < count) out += new_s;
    r.charge_bytes(out.size());
    return out;
  }
  size_t pos = 0;
  while (true) {
    size_t found = s.find(old_s, pos);
    if (found == std::string::npos || (count >= 0 && done >= count)) break;
    out.append(s, pos, found - pos);
    out += new_s;
    r.check_size(out.size());
    pos = found + old_s.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  r.charge_bytes(out.size());
  return out;
}

Value py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  ValueList parts;
  if (!sep || sep->is_none()) {
    size_t i = 0, n = s.size();
    auto space_at = [&](size_t p, size_t* len) { return is_py_space(decode_at(s, p, len)); };
    size_t len;
    while (true) {
      while (i < n && space_at(i, &len)) i += len;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        parts.push_back(Value::string(s.substr(i)));  // the remainder keeps its trailing whitespace
        break;
      }
      size_t start = i;
      while (i < n && !space_at(i, &len)) i += len;
      parts.push_back(Value::string(s.substr(start, i - start)));
    }
    return Value::list(std::move(parts));
  }
  if (!sep->is_string()) fail("split() separator must be str or None");
  const std::string& d = sep->as_string();
  if (d.empty()) fail("empty separator");
  size_t pos = 0;
  while (true) {
    size_t found = s.find(d, pos);
    if (found == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit))
      break;
    parts.push_back(Value::string(s.substr(pos, found - pos)));
    pos = found + d.size();
  }
  parts.push_back(Value::string(s.substr(pos)));
  return Value::list(std::move(parts));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& v) {
    if (!v.is_string()) fail("{}with first arg must be str or a tuple of str", prefix ? "starts" : "ends");
    const std::string& a = v.as_string();
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_sequence()) {
    for (const auto& v : affix.items()) {
      if (one(v)) return true;
    }
    return false;
  }
  return one(affix);
}

int64_t code_point_index(const std::string& s, size_t byte_pos) {
  return utf8_length(std::string_view(s).substr(0, byte_pos));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python str.format with {} / {0} / {name} fields (no format specs beyond an empty one).
std::string py_format(const std::string& fmt_s, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt_s.size(); ++i) {
    char c = fmt_s[i];
    if (c == '{' && i + 1 < fmt_s.size() && fmt_s[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmt_s.size() && fmt_s[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = fmt_s.find('}', i);
      if (close == std::string::npos) fail("format(): single '{{' encountered in format string");
      std::string field = fmt_s.substr(i + 1, close - i - 1);
      if (field.find(':') != std::string::npos || field.find('!') != std::string::npos) {
        fail("format(): format specifications are not supported");
      }
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < a.args.size() ? &a.args[auto_index] : nullptr;
        ++auto_index;
      } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        size_t idx = std::strtoul(field.c_str(), nullptr, 10);
        v = idx < a.args.size() ? &a.args[idx] : nullptr;
      } else {
        for (const auto& [k, kv] : a.kwargs) {
          if (k == field) v = &kv;
        }
      }
      if (!v) fail("format(): missing value for field '{{{}}}'", field);
      out += v->str();
      i = close;
    } else {
      out += c;
    }
  }
  return out;
}

// ---- value helpers ----

Value attribute_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.has_entries()) {
      const Value* found = cur.entries().find(part);
      cur = found ? *found : Value::undefined(part);
    } else if (cur.is_sequence() && !part.empty() &&
               std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      size_t idx = std::strtoul(part.c_str(), nullptr, 10);
      cur = idx < cur.items().size() ? cur.items()[idx] : Value::undefined(part);
    } else {
      cur = Value::undefined(part);
    }
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

Value lower_if_string(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(to_lower(v.as_string()));
  return v;
}

int compare_or_fail(const Value& a, const Value& b) {
  auto c = compare_values(a, b);
  if (!c) fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
  return *c;
}

ValueList sorted(ValueList items, bool reverse, bool case_sensitive, const Value* attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute && !attribute->is_none() ? attribute_of(v, attribute->str()) : v;
    return lower_if_string(k, case_sensitive);
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& v : items) keyed.emplace_back(key(v), std::move(v));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare_or_fail(y.first, x.first) < 0 : compare_or_fail(x.first, y.first) < 0;
  });
  ValueList out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value to_int(const Value& v, const Value& def, int64_t base) {
  switch (v.kind()) {
    case ValueKind::kBool:
    case ValueKind::kInt:
      return Value::integer(v.as_int());
    case ValueKind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d) || std::isinf(d) || std::fabs(d) > 9.2e18) return def;
      return Value::integer(static_cast<int64_t>(d));
    }
    case ValueKind::kString: {
      std::string s = strip(v.as_string(), nullptr, true, true);
      std::string digits;
      for (char c : s) {
        if (c != '_') digits += c;
      }
      if (digits.empty()) return def;
      char* end = nullptr;
      errno = 0;
      long long i = std::strtoll(digits.c_str(), &end, static_cast<int>(base));
      if (end && *end == '\0' && errno == 0) return Value::integer(i);
      errno = 0;
      double d = std::strtod(digits.c_str(), &end);
      if (end && *end == '\0' && errno == 0 && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value::integer(static_cast<int64_t>(d));
      }
      return def;
    }
    case ValueKind::kUndefined:
    case ValueKind::kNone:
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kDict:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return def;
  }
  return def;
}

Value to_float(const Value& v, const Value& def) {
  if (v.is_number()) return Value::number(v.as_float());
  if (v.is_string()) {
    std::string s = strip(v.as_string(), nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::number(d);
  }
  return def;
}

// Python round(x, ndigits): half-even on the exact binary value (printf rounds the same way).
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits == 0) return std::nearbyint(x);
  if (ndigits > 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(ndigits, 300)), x);
    return std::strtod(buf, nullptr);
  }
  double scale = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / scale) * scale;
}

std::string indent_text(const std::string& s, const Value& width, bool first, bool blank) {
  std::string indention =
      width.is_string()
          ? width.as_string()
          : std::string(static_cast<size_t>(std::clamp<int64_t>(width.as_int(), 0, 1 << 16)), ' ');
  std::vector<std::string> lines;
  std::string text = s + "\n";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return out;
}

}  // namespace polylora::jinja
