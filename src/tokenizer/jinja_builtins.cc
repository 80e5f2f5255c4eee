// tokenizer/jinja_builtins.cc: Python str/dict/list methods, operators (+ - * / // % ** ~ in) and the global
// functions (range, namespace, dict, raise_exception, strftime_now) of Hugging Face's chat-template
// environment. Must not: hold render state.
#include "tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "tokenizer/jinja_renderer.h"
#include "tokenizer/jinja_support.h"

namespace polylora::jinja {

// ---- methods ----

bool has_method(const Value& object, std::string_view name) {
  static const std::string_view kStringMethods[] = {
      "strip",   "lstrip",  "rstrip",  "split",      "rsplit",       "startswith",  "endswith",
      "upper",   "lower",   "title",   "capitalize", "replace",      "find",        "rfind",
      "index",   "count",   "join",    "format",     "splitlines",   "isdigit",     "isalpha",
      "isalnum", "isspace", "isupper", "islower",    "removeprefix", "removesuffix"};
  static const std::string_view kDictMethods[] = {"get", "items", "keys", "values"};
  static const std::string_view kListMethods[] = {"index", "count"};
  auto in = [&](const auto& list) {
    return std::find(std::begin(list), std::end(list), name) != std::end(list);
  };
  switch (object.kind()) {
    case ValueKind::kString:
      return in(kStringMethods);
    case ValueKind::kDict:
      return in(kDictMethods);
    case ValueKind::kList:
    case ValueKind::kTuple:
      return in(kListMethods);
    case ValueKind::kUndefined:
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kNamespace:
    case ValueKind::kFunction:
      return false;
  }
  return false;
}

namespace {

Value string_method(Renderer& r, const std::string& s, std::string_view name, CallArgs& a) {
  if (name == "strip") return Value::string(strip_arg(s, a, true, true));
  if (name == "lstrip") return Value::string(strip_arg(s, a, true, false));
  if (name == "rstrip") return Value::string(strip_arg(s, a, false, true));
  if (name == "split" || name == "rsplit") {
    int64_t maxsplit = arg_int(a, 1, "maxsplit", -1, "split");
    if (name == "rsplit" && maxsplit >= 0) fail("rsplit with maxsplit is not supported");
    return py_split(s, arg(a, 0, "sep"), maxsplit);
  }
  if (name == "startswith" || name == "endswith") {
    const Value* affix = arg(a, 0, "prefix");
    if (!affix) fail("{}() takes at least 1 argument", name);
    return Value::boolean(affix_match(s, *affix, name == "startswith"));
  }
  if (name == "upper") return Value::string(to_upper(s));
  if (name == "lower") return Value::string(to_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "replace") {
    return Value::string(replace_all(s, arg_str(a, 0, "old", "replace"), arg_str(a, 1, "new", "replace"),
                                     arg_int(a, 2, "count", -1, "replace"), r));
  }
  if (name == "find" || name == "rfind" || name == "index") {
    std::string sub = arg_str(a, 0, "sub", name);
    size_t pos = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (pos == std::string::npos) {
      if (name == "index") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(code_point_index(s, pos));
  }
  if (name == "count") {
    std::string sub = arg_str(a, 0, "sub", "count");
    if (sub.empty()) return Value::integer(utf8_length(s) + 1);
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = arg(a, 0, "iterable");
    if (!items) fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const auto& v : items->iterate()) {
      if (!v.is_string()) fail("sequence item: expected str instance, {} found", v.type_name());
      if (!first) out += s;
      first = false;
      out += v.as_string();
      r.check_size(out.size());
    }
    r.charge_bytes(out.size());
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(py_format(s, a));
  if (name == "splitlines") {
    ValueList lines;
    size_t pos = 0;
    while (pos < s.size()) {
      size_t nl = s.find_first_of("\r\n", pos);
      if (nl == std::string::npos) {
        lines.push_back(Value::string(s.substr(pos)));
        break;
      }
      lines.push_back(Value::string(s.substr(pos, nl - pos)));
      pos = nl + ((s[nl] == '\r' && nl + 1 < s.size() && s[nl + 1] == '\n') ? 2 : 1);
    }
    return Value::list(std::move(lines));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string affix = arg_str(a, 0, "affix", name);
    bool prefix = name == "removeprefix";
    if (affix_match(s, Value::string(affix), prefix)) {
      return Value::string(prefix ? s.substr(affix.size()) : s.substr(0, s.size() - affix.size()));
    }
    return Value::string(s);
  }
  auto all = [&](auto pred) {
    if (s.empty()) return Value::boolean(false);
    return Value::boolean(
        std::all_of(s.begin(), s.end(), [&](char c) { return pred(static_cast<unsigned char>(c)); }));
  };
  if (name == "isdigit") return all([](unsigned char c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all([](unsigned char c) { return is_alpha(static_cast<char>(c)); });
  if (name == "isalnum")
    return all([](unsigned char c) { return is_alpha(static_cast<char>(c)) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return Value::boolean(!s.empty() && strip(s, nullptr, true, true).empty());
  if (name == "isupper") return Value::boolean(to_lower(s) != s && to_upper(s) == s);
  if (name == "islower") return Value::boolean(to_upper(s) != s && to_lower(s) == s);
  fail("'str' object has no attribute '{}'", name);
}

}  // namespace

Value call_method(Renderer& r, const Value& object, std::string_view name, CallArgs& a) {
  if (object.is_string()) return string_method(r, object.as_string(), name, a);
  if (object.is_mapping()) {
    auto& d = object.entries();
    if (name == "get") {
      const Value* key = arg(a, 0, "key");
      if (!key) fail("get() takes at least 1 argument");
      const Value* found = d.find(*key);
      return found ? *found : arg_or(a, 1, "default", Value::none());
    }
    ValueList out;
    for (const auto& [k, v] : d.entries) {
      if (name == "items") {
        out.push_back(Value::tuple({k, v}));
      } else if (name == "keys") {
        out.push_back(k);
      } else {
        out.push_back(v);
      }
    }
    return Value::list(std::move(out));
  }
  if (object.is_sequence()) {
    const Value* x = arg(a, 0, "value");
    if (!x) fail("{}() takes exactly one argument", name);
    int64_t count = 0;
    for (size_t i = 0; i < object.items().size(); ++i) {
      if (values_equal(object.items()[i], *x)) {
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++count;
      }
    }
    if (name == "index") fail("{} is not in list", x->repr());
    return Value::integer(count);
  }
  fail("'{}' object has no attribute '{}'", object.type_name(), name);
}

// ---- operators ----

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case ValueKind::kString:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not {}", item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case ValueKind::kList:
    case ValueKind::kTuple:
      for (const auto& v : container.items()) {
        if (values_equal(v, item)) return true;
      }
      return false;
    case ValueKind::kDict:
    case ValueKind::kNamespace:
      return container.entries().find(item) != nullptr;
    case ValueKind::kUndefined:
      return false;
    case ValueKind::kNone:
    case ValueKind::kBool:
    case ValueKind::kInt:
    case ValueKind::kFloat:
    case ValueKind::kFunction:
      break;
  }
  fail("argument of type '{}' is not iterable", container.type_name());
}

namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    fail("'{}' is undefined", a.is_undefined() ? a.as_string() : b.as_string());
  }
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

Value repeat(Renderer& r, const Value& seq, int64_t n) {
  if (n <= 0)
    return seq.is_string() ? Value::string("")
                           : (seq.kind() == ValueKind::kTuple ? Value::tuple({}) : Value::list());
  if (seq.is_string()) {
    r.charge_bytes(seq.as_string().size() * static_cast<size_t>(std::min<int64_t>(n, 1 << 30)));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::string(std::move(out));
  }
  r.charge_items(seq.items().size() * static_cast<size_t>(std::min<int64_t>(n, 1 << 30)));
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.kind() == ValueKind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Value binary_op(Renderer& r, std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.str() + b.str();
    r.charge_bytes(s.size());
    return Value::string(std::move(s));
  }
  bool ints = a.is_int() && b.is_int();
  bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) {
      int64_t out;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &out)) fail("integer overflow");
      return Value::integer(out);
    }
    if (nums) return Value::number(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      r.charge_bytes(a.as_string().size() + b.as_string().size());
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      r.charge_items(a.items().size() + b.items().size());
      ValueList out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.kind() == ValueKind::kTuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t out;
      if (__builtin_sub_overflow(a.as_int(), b.as_int(), &out)) fail("integer overflow");
      return Value::integer(out);
    }
    if (nums) return Value::number(a.as_float() - b.as_float());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t out;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &out)) fail("integer overflow");
      return Value::integer(out);
    }
    if (nums) return Value::number(a.as_float() * b.as_float());
    if ((a.is_string() || a.is_sequence()) && b.is_int()) return repeat(r, a, b.as_int());
    if ((b.is_string() || b.is_sequence()) && a.is_int()) return repeat(r, b, a.as_int());
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!nums) unsupported(op, a, b);
    if (b.as_float() == 0) fail("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (!nums) {
      if (op == "%" && a.is_string()) fail("printf-style string formatting ('%') is not supported");
      unsupported(op, a, b);
    }
    if (ints) {
      if (b.as_int() == 0) fail("integer division or modulo by zero");
      if (a.as_int() == INT64_MIN && b.as_int() == -1) fail("integer overflow");
      int64_t q = floor_div(a.as_int(), b.as_int());
      return Value::integer(op == "//" ? q : a.as_int() - q * b.as_int());
    }
    double x = a.as_float(), y = b.as_float();
    if (y == 0) fail("float division by zero");
    double q = std::floor(x / y);
    if (op == "//") return Value::number(q);
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::number(m);
  }
  if (op == "**") {
    if (!nums) unsupported(op, a, b);
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), exp = b.as_int(), out = 1;
      while (exp > 0) {
        if (exp & 1) {
          if (__builtin_mul_overflow(out, base, &out)) fail("integer overflow");
        }
        exp >>= 1;
        if (exp > 0 && __builtin_mul_overflow(base, base, &base)) fail("integer overflow");
      }
      return Value::integer(out);
    }
    return Value::number(std::pow(a.as_float(), b.as_float()));
  }
  fail("unknown operator '{}'", op);
}

// ---- globals ----

namespace {

std::string strftime_with(const std::string& format, const std::optional<std::string>& date) {
  std::tm tm{};
  if (date) {
    int y = 0, m = 0, d = 0;
    if (std::sscanf(date->c_str(), "%d-%d-%d", &y, &m, &d) != 3 || m < 1 || m > 12 || d < 1 || d > 31) {
      fail("strftime_now: date '{}' is not YYYY-MM-DD", *date);
    }
    tm.tm_year = y - 1900;
    tm.tm_mon = m - 1;
    tm.tm_mday = d;
    std::time_t t = timegm(&tm);
    gmtime_r(&t, &tm);
  } else {
    std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  if (format.empty()) return "";
  std::string buf(format.size() * 8 + 64, '\0');
  size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
  buf.resize(n);
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, Value>> builtin_globals(std::optional<std::string> date) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", [](Renderer& r, CallArgs& a) {
                   if (a.args.empty() || a.args.size() > 3) fail("range expected 1 to 3 arguments");
                   for (const auto& v : a.args) {
                     if (!v.is_int()) fail("range() arguments must be integers, not {}", v.type_name());
                   }
                   int64_t start = 0, stop, step = 1;
                   if (a.args.size() == 1) {
                     stop = a.args[0].as_int();
                   } else {
                     start = a.args[0].as_int();
                     stop = a.args[1].as_int();
                     if (a.args.size() == 3) step = a.args[2].as_int();
                   }
                   if (step == 0) fail("range() arg 3 must not be zero");
                   ValueList out;
                   for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
                     if (out.size() % 4096 == 0) r.charge_items(4096);
                     out.push_back(Value::integer(i));
                     if ((step > 0 && i > INT64_MAX - step) || (step < 0 && i < INT64_MIN - step)) break;
                   }
                   return Value::list(std::move(out));
                 }));
  auto make_mapping = [](Value target, CallArgs& a) {
    for (const auto& v : a.args) {
      if (!v.has_entries()) fail("namespace()/dict() positional argument must be a mapping");
      for (const auto& [k, x] : v.entries().entries) target.entries().set(k, x);
    }
    for (const auto& [k, x] : a.kwargs) target.entries().set(Value::string(k), x);
    return target;
  };
  g.emplace_back("namespace", Value::function("namespace", [make_mapping](Renderer& r, CallArgs& a) {
                   Value ns = make_mapping(Value::name_space(), a);
                   r.track_namespace(ns);
                   return ns;
                 }));
  g.emplace_back("dict", Value::function("dict", [make_mapping](Renderer&, CallArgs& a) {
                   return make_mapping(Value::dict(), a);
                 }));
  g.emplace_back("raise_exception", Value::function("raise_exception", [](Renderer&, CallArgs& a) -> Value {
                   throw TemplateRaisedError(a.args.empty() ? std::string() : a.args[0].str());
                 }));
  g.emplace_back("strftime_now", Value::function("strftime_now", [date](Renderer&, CallArgs& a) {
                   if (a.args.empty() || !a.args[0].is_string())
                     fail("strftime_now() expects a format string");
                   return Value::string(strftime_with(a.args[0].as_string(), date));
                 }));
  return g;
}

}  // namespace polylora::jinja
