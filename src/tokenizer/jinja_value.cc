// tokenizer/jinja_value.cc: Python semantics of Jinja values (truthiness, equality, ordering, str/repr,
// json.dumps). Must not: evaluate templates.
#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace polylora::jinja {

const std::string& Value::empty_string() {
  static const std::string kEmpty;
  return kEmpty;
}

Value Value::undefined(std::string name) {
  Value v;
  if (!name.empty()) v.str_ = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = ValueKind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = ValueKind::kBool;
  v.bool_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = ValueKind::kInt;
  v.int_ = i;
  return v;
}
Value Value::number(double f) {
  Value v;
  v.kind_ = ValueKind::kFloat;
  v.float_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = ValueKind::kString;
  v.str_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::list(ValueList items) {
  Value v;
  v.kind_ = ValueKind::kList;
  int depth = 0;
  for (const auto& item : items) depth = std::max(depth, item.depth());
  v.depth_ = depth + 1;
  if (v.depth_ > kMaxValueDepth) fail("value nested more than {} levels deep", kMaxValueDepth);
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}
Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.kind_ = ValueKind::kTuple;
  return v;
}
Value Value::dict() {
  Value v;
  v.kind_ = ValueKind::kDict;
  v.dict_ = std::make_shared<ValueDict>();
  return v;
}
Value Value::name_space() {
  Value v = dict();
  v.kind_ = ValueKind::kNamespace;
  return v;
}
Value Value::function(std::string name, std::function<Value(Renderer&, CallArgs&)> call) {
  Value v;
  v.kind_ = ValueKind::kFunction;
  v.fn_ = std::make_shared<const Function>(Function{std::move(name), std::move(call)});
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return false;
    case ValueKind::kBool:
      return bool_;
    case ValueKind::kInt:
      return int_ != 0;
    case ValueKind::kFloat:
      return float_ != 0.0;
    case ValueKind::kString:
      return !as_string().empty();
    case ValueKind::kList:
    case ValueKind::kTuple:
      return !list_->empty();
    case ValueKind::kDict:
      return !dict_->entries.empty();
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return true;
  }
  return false;
}

std::optional<int64_t> Value::length() const {
  switch (kind_) {
    case ValueKind::kString:
      return utf8_length(as_string());
    case ValueKind::kList:
    case ValueKind::kTuple:
      return static_cast<int64_t>(list_->size());
    case ValueKind::kDict:
      return static_cast<int64_t>(dict_->entries.size());
    case ValueKind::kUndefined:
      return 0;
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return std::nullopt;
  }
  return std::nullopt;
}

const char* Value::type_name() const {
  switch (kind_) {
    case ValueKind::kUndefined:
      return "Undefined";
    case ValueKind::kNone:
      return "NoneType";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return "str";
    case ValueKind::kList:
      return "list";
    case ValueKind::kTuple:
      return "tuple";
    case ValueKind::kDict:
      return "dict";
    case ValueKind::kNamespace:
      return "Namespace";
    case ValueKind::kFunction:
      return "function";
  }
  return "?";
}

std::string Value::str() const {
  switch (kind_) {
    case ValueKind::kUndefined:
      return "";
    case ValueKind::kString:
      return as_string();
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kDict:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return repr();
  }
  return "";
}

int Value::depth() const {
  if (is_sequence()) return depth_;
  if (has_entries()) return dict_->depth;
  return 0;
}

std::string Value::repr() const {
  return repr_at(0);
}

std::string Value::repr_at(int level) const {
  if (level > kMaxValueDepth) fail("value nested too deeply to print (a namespace containing itself?)");
  switch (kind_) {
    case ValueKind::kUndefined:
      return "";
    case ValueKind::kNone:
      return "None";
    case ValueKind::kBool:
      return bool_ ? "True" : "False";
    case ValueKind::kInt:
      return std::to_string(int_);
    case ValueKind::kFloat:
      return py_float_repr(float_);
    case ValueKind::kString:
      return py_string_repr(as_string());
    case ValueKind::kList:
    case ValueKind::kTuple: {
      bool tuple = kind_ == ValueKind::kTuple;
      std::string out = tuple ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr_at(level + 1);
        if (out.size() > kMaxPrintedBytes) fail("value too large to print (over {} bytes)", kMaxPrintedBytes);
      }
      if (tuple && list_->size() == 1) out += ",";
      out += tuple ? ")" : "]";
      return out;
    }
    case ValueKind::kDict:
    case ValueKind::kNamespace: {
      std::string out = kind_ == ValueKind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr_at(level + 1);
        if (out.size() > kMaxPrintedBytes) fail("value too large to print (over {} bytes)", kMaxPrintedBytes);
      }
      out += kind_ == ValueKind::kNamespace ? "}>" : "}";
      return out;
    }
    case ValueKind::kFunction:
      return "<function " + fn_->name + ">";
  }
  return "";
}

ValueList Value::iterate() const {
  switch (kind_) {
    case ValueKind::kList:
    case ValueKind::kTuple:
      return *list_;
    case ValueKind::kDict: {
      ValueList keys;
      keys.reserve(dict_->entries.size());
      for (const auto& e : dict_->entries) keys.push_back(e.first);
      return keys;
    }
    case ValueKind::kString: {
      ValueList chars;
      const std::string& text = as_string();
      auto offsets = utf8_offsets(text);
      for (size_t i = 0; i + 1 < offsets.size(); ++i) {
        chars.push_back(string(text.substr(offsets[i], offsets[i + 1] - offsets[i])));
      }
      return chars;
    }
    case ValueKind::kUndefined:
      return {};
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      break;
  }
  fail("'{}' object is not iterable", type_name());
}

Value Value::get(std::string_view key) const {
  if (has_entries()) {
    if (const Value* v = dict_->find(key)) return *v;
  }
  return undefined(std::string(key));
}

const Value* ValueDict::find(const Value& key) const {
  for (const auto& e : entries) {
    if (values_equal(e.first, key)) return &e.second;
  }
  return nullptr;
}

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& e : entries) {
    if (e.first.is_string() && e.first.as_string() == key) return &e.second;
  }
  return nullptr;
}

void ValueDict::set(const Value& key, Value value) {
  for (auto& e : entries) {
    if (values_equal(e.first, key)) {
      depth = std::max(depth, value.depth() + 1);
      e.second = std::move(value);
      if (depth > kMaxValueDepth) fail("value nested more than {} levels deep", kMaxValueDepth);
      return;
    }
  }
  depth = std::max(depth, value.depth() + 1);
  if (depth > kMaxValueDepth) fail("value nested more than {} levels deep", kMaxValueDepth);
  entries.emplace_back(key, std::move(value));
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == ValueKind::kFloat || b.kind() == ValueKind::kFloat) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;  // also list != tuple, as in Python
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
      return false;  // handled above
    case ValueKind::kString:
      return a.as_string() == b.as_string();
    case ValueKind::kList:
    case ValueKind::kTuple: {
      if (a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!values_equal(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      if (a.entries().entries.size() != b.entries().entries.size()) return false;
      for (const auto& [k, v] : a.entries().entries) {
        const Value* other = b.entries().find(k);
        if (!other || !values_equal(v, *other)) return false;
      }
      return true;
    }
    case ValueKind::kNamespace:
      return &a.entries() == &b.entries();
    case ValueKind::kFunction:
      return &a.as_function() == &b.as_function();
  }
  return false;
}

std::optional<int> compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == ValueKind::kFloat || b.kind() == ValueKind::kFloat) {
      double x = a.as_float(), y = b.as_float();
      if (std::isnan(x) || std::isnan(y)) return std::nullopt;
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && b.kind() == a.kind()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_equal(x[i], y[i])) continue;
      return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return std::nullopt;
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci looks like "-1.2345e+02": split mantissa digits and exponent.
  bool negative = sci[0] == '-';
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(negative ? 1 : 0, e_pos - (negative ? 1 : 0));
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(static_cast<size_t>(exponent + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent + 1)) + "." +
             digits.substr(static_cast<size_t>(exponent + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

std::string py_string_repr(std::string_view s) {
  char quote = '\'';
  if (s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos) quote = '"';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

namespace {

std::string json_key(const Value& k) {
  switch (k.kind()) {
    case ValueKind::kString:
      return json_string(k.as_string());
    case ValueKind::kBool:
      return k.as_bool() ? "\"true\"" : "\"false\"";
    case ValueKind::kNone:
      return "\"null\"";
    case ValueKind::kInt:
    case ValueKind::kFloat:
      return "\"" + k.repr() + "\"";
    case ValueKind::kUndefined:
    case ValueKind::kList:
    case ValueKind::kTuple:
    case ValueKind::kDict:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      break;
  }
  fail("keys must be str, int, float, bool or None, not {}", k.type_name());
}

void dump_json(const Value& v, int indent, bool sort_keys, int level, std::string& out) {
  if (out.size() > kMaxPrintedBytes) fail("value too large to serialise (over {} bytes)", kMaxPrintedBytes);
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case ValueKind::kNone:
      out += "null";
      return;
    case ValueKind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case ValueKind::kInt:
      out += std::to_string(v.as_int());
      return;
    case ValueKind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d < 0 ? "-Infinity" : "Infinity";
      } else {
        out += py_float_repr(d);
      }
      return;
    }
    case ValueKind::kString:
      out += json_string(v.as_string());
      return;
    case ValueKind::kList:
    case ValueKind::kTuple: {
      if (level > 200) fail("tojson: value nested too deeply");
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(level + 1);
        dump_json(items[i], indent, sort_keys, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case ValueKind::kDict: {
      if (level > 200) fail("tojson: value nested too deeply");
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.entries().entries) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto* a, const auto* b) {
          auto c = compare_values(a->first, b->first);
          if (!c)
            fail("tojson: cannot sort keys of types {} and {}", a->first.type_name(), b->first.type_name());
          return *c < 0;
        });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(level + 1);
        out += json_key(entries[i]->first);
        out += ": ";
        dump_json(entries[i]->second, indent, sort_keys, level + 1, out);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
    case ValueKind::kUndefined:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      break;
  }
  fail("Object of type {} is not JSON serializable", v.type_name());
}

}  // namespace

std::string Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  dump_json(*this, indent, sort_keys, 0, out);
  return out;
}

int64_t utf8_length(std::string_view s) {
  int64_t n = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 0 || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++n;
  }
  return n;
}

std::vector<size_t> utf8_offsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == 0 || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) offsets.push_back(i);
  }
  offsets.push_back(s.size());
  return offsets;
}

}  // namespace polylora::jinja
