// tokenizer/jinja_filters.cc: the Jinja2 filters (trim, tojson, map, selectattr, dictsort, ...) and tests
// (defined, string, mapping, divisibleby, ...) of Hugging Face's chat-template environment.
// Must not: hold render state.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_renderer.h"
#include "tokenizer/jinja_support.h"

namespace polylora::jinja {
namespace {

// ---- filters ----

Value select_like(Renderer& r, const Value& input, CallArgs& a, bool select, bool by_attr) {
  ValueList out;
  size_t shift = by_attr ? 1 : 0;
  std::string attribute = by_attr ? arg_str(a, 0, "attribute", "selectattr") : "";
  std::string test = a.args.size() > shift ? a.args[shift].str() : "";
  CallArgs test_args;
  for (size_t i = shift + 1; i < a.args.size(); ++i) test_args.args.push_back(a.args[i]);
  for (const auto& v : input.iterate()) {
    Value subject = by_attr ? attribute_of(v, attribute) : v;
    bool ok;
    if (test.empty()) {
      ok = subject.truthy();
    } else {
      CallArgs copy = test_args;
      ok = apply_test(r, test, subject, copy);
    }
    if (ok == select) out.push_back(v);
  }
  return Value::list(std::move(out));
}

Value map_filter(Renderer& r, const Value& input, CallArgs& a) {
  ValueList out;
  const Value* attribute = arg(a, 9999, "attribute");
  if (attribute) {
    Value def = arg_or(a, 9999, "default", Value::undefined());
    for (const auto& v : input.iterate()) {
      Value x = attribute_of(v, attribute->str());
      out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
    }
    return Value::list(std::move(out));
  }
  if (a.args.empty()) fail("map() requires a filter name or attribute=");
  std::string filter = a.args[0].str();
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const auto& v : input.iterate()) {
    CallArgs copy = rest;
    out.push_back(apply_filter(r, filter, v, copy));
  }
  return Value::list(std::move(out));
}

Value join_filter(Renderer& r, const Value& input, const CallArgs& a) {
  std::string sep = arg_or(a, 0, "d", Value::string("")).str();
  const Value* attribute = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& v : input.iterate()) {
    if (!first) out += sep;
    first = false;
    out += (attribute && !attribute->is_none() ? attribute_of(v, attribute->str()) : v).str();
    r.check_size(out.size());
  }
  r.charge_bytes(out.size());
  return Value::string(std::move(out));
}

Value tojson_filter(const Value& input, const CallArgs& a) {
  const Value* indent = arg(a, 0, "indent");
  int width = -1;
  if (indent && !indent->is_none()) {
    if (!indent->is_int()) fail("tojson indent must be an integer");
    width = static_cast<int>(std::clamp<int64_t>(indent->as_int(), 0, 64));
  }
  return Value::string(input.to_json(width, arg_bool(a, 9999, "sort_keys", false)));
}

Value dictsort_filter(const Value& input, const CallArgs& a) {
  if (!input.has_entries()) fail("dictsort expects a mapping, not {}", input.type_name());
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  std::string by = arg_or(a, 1, "by", Value::string("key")).str();
  bool reverse = arg_bool(a, 2, "reverse", false);
  int pos = by == "key" ? 0 : by == "value" ? 1 : -1;
  if (pos < 0) fail("You can only sort by either 'key' or 'value'");
  ValueList pairs;
  for (const auto& [k, v] : input.entries().entries) pairs.push_back(Value::tuple({k, v}));
  Value attr = Value::string(std::to_string(pos));
  return Value::list(sorted(std::move(pairs), reverse, case_sensitive, &attr));
}

Value unique_filter(const Value& input, const CallArgs& a) {
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  ValueList out, seen;
  for (const auto& v : input.iterate()) {
    Value key = lower_if_string(attribute && !attribute->is_none() ? attribute_of(v, attribute->str()) : v,
                                case_sensitive);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return values_equal(s, key); })) {
      seen.push_back(key);
      out.push_back(v);
    }
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& input, const CallArgs& a, bool want_max) {
  bool case_sensitive = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  ValueList items = input.iterate();
  if (items.empty()) return Value::undefined("min/max of an empty sequence");
  ValueList s = sorted(items, want_max, case_sensitive, attribute);
  return s.front();
}

Value items_filter(const Value& input) {
  if (input.is_undefined()) return Value::list();
  if (!input.has_entries()) fail("items filter expects a mapping, not {}", input.type_name());
  ValueList out;
  for (const auto& [k, v] : input.entries().entries) out.push_back(Value::tuple({k, v}));
  return Value::list(std::move(out));
}

Value sum_filter(Renderer& r, const Value& input, const CallArgs& a) {
  const Value* attribute = arg(a, 0, "attribute");
  Value total = arg_or(a, 1, "start", Value::integer(0));
  for (const auto& v : input.iterate()) {
    total =
        binary_op(r, "+", total, attribute && !attribute->is_none() ? attribute_of(v, attribute->str()) : v);
  }
  return total;
}

Value reverse_filter(const Value& input) {
  if (input.is_string()) {
    auto offsets = utf8_offsets(input.as_string());
    std::string out;
    for (size_t i = offsets.size() - 1; i > 0; --i)
      out.append(input.as_string(), offsets[i - 1], offsets[i] - offsets[i - 1]);
    return Value::string(std::move(out));
  }
  ValueList items = input.iterate();
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

int64_t wordcount(const std::string& s) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : s) {
    bool w = is_alpha(c) || (c >= '0' && c <= '9') || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

}  // namespace

Value apply_filter(Renderer& r, std::string_view name, const Value& input, CallArgs& a) {
  auto str_input = [&]() -> std::string { return input.str(); };
  if (name == "trim") return Value::string(strip_arg(str_input(), a, true, true));
  if (name == "length" || name == "count") {
    auto n = input.length();
    if (!n) fail("object of type '{}' has no len()", input.type_name());
    return Value::integer(*n);
  }
  if (name == "tojson") return tojson_filter(input, a);
  if (name == "upper") return Value::string(to_upper(str_input()));
  if (name == "lower") return Value::string(to_lower(str_input()));
  if (name == "capitalize") return Value::string(capitalize(str_input()));
  if (name == "title") return Value::string(jinja_title(str_input()));
  if (name == "replace") {
    std::string s = str_input();
    return Value::string(replace_all(s, arg_or(a, 0, "old", Value::string("")).str(),
                                     arg_or(a, 1, "new", Value::string("")).str(),
                                     arg_int(a, 2, "count", -1, "replace"), r));
  }
  if (name == "default" || name == "d") {
    bool boolean = arg_bool(a, 1, "boolean", false);
    if (input.is_undefined() || (boolean && !input.truthy()))
      return arg_or(a, 0, "default_value", Value::string(""));
    return input;
  }
  if (name == "first") {
    if (input.is_sequence()) return input.items().empty() ? Value::undefined("first") : input.items().front();
    ValueList items = input.iterate();
    return items.empty() ? Value::undefined("first") : items.front();
  }
  if (name == "last") {
    ValueList items = input.iterate();
    return items.empty() ? Value::undefined("last") : items.back();
  }
  if (name == "join") return join_filter(r, input, a);
  if (name == "list") return Value::list(input.iterate());
  if (name == "map") return map_filter(r, input, a);
  if (name == "select" || name == "reject") return select_like(r, input, a, name == "select", false);
  if (name == "selectattr" || name == "rejectattr")
    return select_like(r, input, a, name == "selectattr", true);
  if (name == "items") return items_filter(input);
  if (name == "dictsort") return dictsort_filter(input, a);
  if (name == "string") return Value::string(str_input());
  if (name == "int") {
    return to_int(input, arg_or(a, 0, "default", Value::integer(0)), arg_int(a, 1, "base", 10, "int"));
  }
  if (name == "float") return to_float(input, arg_or(a, 0, "default", Value::number(0.0)));
  if (name == "abs") {
    if (input.kind() == ValueKind::kFloat) return Value::number(std::fabs(input.as_float()));
    if (input.is_int()) {
      if (input.as_int() == INT64_MIN) fail("integer overflow");
      return Value::integer(std::llabs(input.as_int()));
    }
    fail("bad operand type for abs(): '{}'", input.type_name());
  }
  if (name == "round") {
    if (!input.is_number()) fail("round expects a number, not {}", input.type_name());
    int64_t precision = arg_int(a, 0, "precision", 0, "round");
    std::string method = arg_or(a, 1, "method", Value::string("common")).str();
    double x = input.as_float();
    double scale = std::pow(10.0, static_cast<double>(precision));
    if (method == "common") {
      if (input.is_int() && precision >= 0) return Value::integer(input.as_int());
      return Value::number(py_round(x, precision));
    }
    if (method == "ceil") return Value::number(std::ceil(x * scale) / scale);
    if (method == "floor") return Value::number(std::floor(x * scale) / scale);
    fail("method must be common, ceil or floor");
  }
  if (name == "indent") {
    return Value::string(indent_text(str_input(), arg_or(a, 0, "width", Value::integer(4)),
                                     arg_bool(a, 1, "first", false), arg_bool(a, 2, "blank", false)));
  }
  if (name == "safe") return input;
  if (name == "escape" || name == "e" || name == "forceescape")
    return Value::string(html_escape(str_input()));
  if (name == "unique") return unique_filter(input, a);
  if (name == "sort") {
    return Value::list(sorted(input.iterate(), arg_bool(a, 0, "reverse", false),
                              arg_bool(a, 1, "case_sensitive", false), arg(a, 2, "attribute")));
  }
  if (name == "reverse") return reverse_filter(input);
  if (name == "wordcount") return Value::integer(wordcount(str_input()));
  if (name == "sum") return sum_filter(r, input, a);
  if (name == "min" || name == "max") return min_max(input, a, name == "max");
  if (name == "attr") return attribute_of(input, arg_str(a, 0, "name", "attr"));
  if (name == "center") {
    std::string s = str_input();
    int64_t width = std::min<int64_t>(arg_int(a, 0, "width", 80, "center"), 1 << 20);
    int64_t len = utf8_length(s);
    if (width <= len) return Value::string(s);
    int64_t total = width - len, left = total / 2 + (total & width & 1);
    return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                         std::string(static_cast<size_t>(total - left), ' '));
  }
  if (name == "format") {
    fail("the format filter (printf-style) is not supported; use str.format or ~");
  }
  if (name == "batch" || name == "slice") {
    int64_t n = arg_int(a, 0, name == "batch" ? "linecount" : "slices", 1, name);
    if (n <= 0) fail("{}: size must be positive", name);
    ValueList items = input.iterate(), out;
    if (name == "batch") {
      for (size_t i = 0; i < items.size(); i += static_cast<size_t>(n)) {
        out.push_back(Value::list(ValueList(
            items.begin() + static_cast<long>(i),
            items.begin() + static_cast<long>(std::min(items.size(), i + static_cast<size_t>(n))))));
      }
      return Value::list(std::move(out));
    }
    size_t per = items.size() / static_cast<size_t>(n), extra = items.size() % static_cast<size_t>(n),
           offset = 0;
    for (size_t i = 0; i < static_cast<size_t>(n) && i < 1'000'000; ++i) {
      size_t count = per + (i < extra ? 1 : 0);
      out.push_back(Value::list(ValueList(items.begin() + static_cast<long>(offset),
                                          items.begin() + static_cast<long>(offset + count))));
      offset += count;
    }
    return Value::list(std::move(out));
  }
  fail("no filter named '{}'", name);
}

// ---- tests ----

bool apply_test(Renderer& r, std::string_view name, const Value& v, CallArgs& a) {
  auto other = [&]() -> const Value& {
    if (a.args.empty()) fail("test '{}' needs an argument", name);
    return a.args[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == ValueKind::kBool;
  if (name == "true") return v.kind() == ValueKind::kBool && v.as_bool();
  if (name == "false") return v.kind() == ValueKind::kBool && !v.as_bool();
  if (name == "integer") return v.kind() == ValueKind::kInt;
  if (name == "float") return v.kind() == ValueKind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_mapping();
  if (name == "iterable") return v.is_sequence() || v.is_string() || v.is_mapping() || v.is_undefined();
  if (name == "sequence") return v.is_sequence() || v.is_string() || v.is_mapping();
  if (name == "callable") return v.kind() == ValueKind::kFunction;
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind() != o.kind()) return false;
    if (v.is_sequence()) return &v.items() == &o.items();
    if (v.has_entries()) return &v.entries() == &o.entries();
    return values_equal(v, o);
  }
  if (name == "equalto" || name == "eq" || name == "==") return values_equal(v, other());
  if (name == "ne" || name == "!=") return !values_equal(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return compare_or_fail(v, other()) < 0;
  if (name == "le" || name == "<=") return compare_or_fail(v, other()) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare_or_fail(v, other()) > 0;
  if (name == "ge" || name == ">=") return compare_or_fail(v, other()) >= 0;
  if (name == "in") return contains(other(), v);
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_int()) fail("test '{}' expects an integer, not {}", name, v.type_name());
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    const Value& d = other();
    if (!d.is_int() || d.as_int() == 0) fail("divisibleby needs a non-zero integer");
    if (d.as_int() == -1) return true;
    return v.as_int() % d.as_int() == 0;
  }
  if (name == "lower") return v.is_string() && to_lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && to_upper(v.as_string()) == v.as_string();
  if (name == "escaped") return false;
  if (name == "filter" || name == "test") {
    static const char* kKnown[] = {"trim", "length", "tojson", "upper",   "lower", "default",
                                   "join", "map",    "select", "defined", "string"};
    std::string n = other().str();
    return std::any_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return n == k; });
  }
  (void)r;
  fail("no test named '{}'", name);
}

}  // namespace polylora::jinja
