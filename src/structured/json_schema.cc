// structured/json_schema.cc: JSON Schema -> GBNF. Supported: type (one or a list), properties /
// required / additionalProperties (absent means false, as OpenAI's strict mode and xgrammar), enum,
// const, anyOf, oneOf (as anyOf), allOf of one schema, $ref to "#" and JSON pointers into the document
// ($defs, definitions), items / prefixItems / minItems / maxItems, string minLength / maxLength /
// pattern / format (date-time, date, time, uuid, email, ipv4), integer and number minimum / maximum /
// exclusive bounds exactly (bounded numbers are written as plain decimals, without an exponent). Known
// keywords that cannot be enforced are refused by name; annotations and unknown keywords are ignored.
// Properties come out in the schema's order.
#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "common/error.h"
#include "structured/grammar.h"
#include "structured/schema_numbers.h"

namespace polylora::structured {
namespace {

using nlohmann::ordered_json;

const std::set<std::string>& unsupported_keywords() {
  static const std::set<std::string> k = {"not",
                                          "if",
                                          "then",
                                          "else",
                                          "patternProperties",
                                          "propertyNames",
                                          "dependentRequired",
                                          "dependentSchemas",
                                          "dependencies",
                                          "unevaluatedProperties",
                                          "unevaluatedItems",
                                          "contains",
                                          "minContains",
                                          "maxContains",
                                          "uniqueItems",
                                          "multipleOf",
                                          "minProperties",
                                          "maxProperties",
                                          "$dynamicRef",
                                          "$recursiveRef",
                                          "contentSchema",
                                          "additionalItems"};
  return k;
}

class SchemaConverter {
 public:
  SchemaConverter(const ordered_json& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}

  std::string convert() {
    std::string body = visit(root_, "#");
    std::string out = prefix_ + " ::= " + body + "\n";
    for (const auto& [name, def] : rules_) out += name + " ::= " + def + "\n";
    return out;
  }

  // Only the generic-value rules (json_object).
  std::string object_only() {
    std::string out = prefix_ + " ::= " + basic("object") + "\n";
    for (const auto& [name, def] : rules_) out += name + " ::= " + def + "\n";
    return out;
  }

 private:
  template <typename... Args>
  [[noreturn]] static void error(const std::string& path, fmt::format_string<Args...> f, Args&&... args) {
    fail("json_schema: {} (at {})", fmt::format(f, std::forward<Args>(args)...), path);
  }

  // Shared building blocks, defined once under the prefix.
  std::string basic(const std::string& what) {
    std::string name = prefix_ + "-" + what;
    if (rules_.count(name)) return name;
    rules_[name] = "";  // reserve (recursion)
    std::string ws = prefix_ + "-ws";
    std::string def;
    if (what == "ws") {
      def = "[ \\t\\n]{0,20}";
    } else if (what == "char") {
      def =
          "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] "
          "[0-7] [0-9a-fA-F]{2}))";  // no lone surrogates
    } else if (what == "string") {
      def = "\"\\\"\" " + basic("char") + "* \"\\\"\"";
    } else if (what == "int") {
      def = "\"0\" | [1-9] [0-9]{0,17}";
    } else if (what == "integer") {
      def = "\"-\"? " + basic("int");
    } else if (what == "number") {
      def = "\"-\"? " + basic("int") + " (\".\" [0-9]{1,17})? ([eE] [-+]? [0-9]{1,2})?";
    } else if (what == "boolean") {
      def = "\"true\" | \"false\"";
    } else if (what == "null") {
      def = "\"null\"";
    } else if (what == "value") {
      def = basic("object") + " | " + basic("array") + " | " + basic("string") + " | " + basic("number") +
            " | " + basic("boolean") + " | " + basic("null");
    } else if (what == "object") {
      basic("ws");
      std::string member = basic("string") + " " + ws + " \":\" " + ws + " " + basic("value");
      def =
          "\"{\" " + ws + " (" + member + " (" + ws + " \",\" " + ws + " " + member + ")* " + ws + ")? \"}\"";
    } else if (what == "array") {
      basic("ws");
      def = "\"[\" " + ws + " (" + basic("value") + " (" + ws + " \",\" " + ws + " " + basic("value") +
            ")* " + ws + ")? \"]\"";
    }
    rules_[name] = def;
    return name;
  }

  std::string new_rule_name(const std::string& hint) {
    std::string clean;
    for (char c : hint) clean += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
    if (clean.size() > 40) clean.resize(40);
    return fmt::format("{}-{}{}", prefix_, clean, counter_++);
  }

  const ordered_json& resolve(const std::string& ref, const std::string& path) {
    if (ref == "#") return root_;
    if (!ref.starts_with("#/"))
      error(path, "$ref '{}' is not supported: only references into this schema (\"#/$defs/Name\")", ref);
    try {
      return root_.at(ordered_json::json_pointer(ref.substr(1)));
    } catch (const std::exception&) {
      error(path, "$ref '{}' points at nothing in the schema", ref);
    }
  }

  std::string literal_value(const ordered_json& v) { return gbnf_literal(v.dump()); }

  std::string visit(const ordered_json& s, const std::string& path) {
    if (++depth_ > 64) error(path, "the schema is nested too deeply");
    std::string out = visit_inner(s, path);
    --depth_;
    return out;
  }

  std::string visit_inner(const ordered_json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) error(path, "the schema `false` matches nothing");
      return basic("value");
    }
    if (!s.is_object()) error(path, "a schema must be an object or a boolean, got {}", s.type_name());
    for (const auto& [key, value] : s.items())
      if (unsupported_keywords().count(key)) error(path, "the keyword '{}' is not supported", key);
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) error(path, "$ref must be a string");
      std::string ref = s["$ref"].get<std::string>();
      auto it = refs_.find(ref);
      if (it != refs_.end()) return it->second;
      std::string name = new_rule_name("ref-" + ref.substr(ref.rfind('/') + 1));
      refs_[ref] = name;
      rules_[name] = "";
      rules_[name] = visit(resolve(ref, path), ref);
      return name;
    }
    if (s.contains("const")) return literal_value(s["const"]);
    if (s.contains("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) error(path, "enum must be a non-empty array");
      std::vector<std::string> alts;
      for (const auto& v : s["enum"]) alts.push_back(literal_value(v));
      return alternatives(alts);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const auto& list = s[key];
      if (!list.is_array() || list.empty()) error(path, "{} must be a non-empty array", key);
      std::vector<std::string> alts;
      for (size_t i = 0; i < list.size(); ++i)
        alts.push_back(visit(list[i], fmt::format("{}/{}/{}", path, key, i)));
      return alternatives(alts);
    }
    if (s.contains("allOf")) {
      const auto& list = s["allOf"];
      if (!list.is_array() || list.size() != 1)
        error(path, "allOf is supported with exactly one schema (merging several is not)");
      return visit(list[0], path + "/allOf/0");
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const auto& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array()) {
        for (const auto& x : t) {
          if (!x.is_string()) error(path, "type must be a string or a list of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        error(path, "type must be a string or a list of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
               s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") ||
               s.contains("maxLength")) {
      types.push_back("string");
    } else {
      return basic("value");
    }
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>())
      types.push_back("null");
    std::vector<std::string> alts;
    for (const std::string& t : types) alts.push_back(visit_type(s, t, path));
    return alts.size() == 1 ? alts[0] : alternatives(alts);
  }

  static std::optional<double> number_of(const ordered_json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number()) error(path, "{} must be a number", key);
    return s[key].get<double>();
  }
  static std::optional<int64_t> count_of(const ordered_json& s, const char* key, const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    if (!s[key].is_number_integer() || s[key].get<int64_t>() < 0)
      error(path, "{} must be a non-negative integer", key);
    return s[key].get<int64_t>();
  }

  std::string visit_type(const ordered_json& s, const std::string& t, const std::string& path) {
    if (t == "string") return string_schema(s, path);
    if (t == "integer") return integer_schema(s, path);
    if (t == "number") return number_schema(s, path);
    if (t == "boolean") return basic("boolean");
    if (t == "null") return basic("null");
    if (t == "object") return object_schema(s, path);
    if (t == "array") return array_schema(s, path);
    error(path, "unknown type '{}'", t);
  }

  std::string string_schema(const ordered_json& s, const std::string& path) {
    std::string q = "\"\\\"\"";
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) error(path, "pattern must be a string");
      if (s.contains("minLength") || s.contains("maxLength"))
        error(path,
              "minLength / maxLength together with pattern are not supported (bound the length in the "
              "pattern)");
      if (s.contains("format")) error(path, "format together with pattern is not supported");
      return q + " " + regex_to_gbnf_json_string(s["pattern"].get<std::string>()) + " " + q;
    }
    if (s.contains("format")) {
      if (!s["format"].is_string()) error(path, "format must be a string");
      if (s.contains("minLength") || s.contains("maxLength"))
        error(path, "minLength / maxLength together with format are not supported");
      // RFC 3339: days as each month has them (29 February in leap years only); seconds 00-59 (leap
      // seconds are valid only at 23:59:60 UTC and are left out).
      static constexpr const char* kDate =
          R"(([0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|[0-9]{4}-(0[13-9]|1[0-2])-(29|30)|[0-9]{4}-(0[13578]|1[02])-31|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29))";
      static constexpr const char* kTime =
          R"(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9]))";
      std::string f = s["format"].get<std::string>();
      static const std::map<std::string, std::string> formats = {
          {"date-time", std::string(kDate) + "[Tt]" + kTime},
          {"date", kDate},
          {"time", kTime},
          {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
          {"email",
           R"([A-Za-z0-9_%+-]{1,32}(\.[A-Za-z0-9_%+-]{1,32}){0,3}@([A-Za-z0-9]([A-Za-z0-9-]{0,20}[A-Za-z0-9])?\.){1,4}[A-Za-z]{2,10})"},
          {"ipv4",
           R"(((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9]))"},
      };
      auto it = formats.find(f);
      if (it == formats.end())
        error(path, "format '{}' is not supported (supported: date-time, date, time, uuid, email, ipv4)", f);
      return q + " " + regex_to_gbnf_json_string(it->second) + " " + q;
    }
    std::optional<int64_t> min = count_of(s, "minLength", path), max = count_of(s, "maxLength", path);
    if (!min && !max) return basic("string");
    int64_t lo = min.value_or(0);
    if (max && *max < lo) error(path, "maxLength {} is below minLength {}", *max, lo);
    if (lo > 10000 || (max && *max > 10000))
      error(path, "minLength / maxLength above 10000 are not supported");
    std::string rep = max ? fmt::format("{{{},{}}}", lo, *max) : fmt::format("{{{},}}", lo);
    return q + " " + basic("char") + rep + " " + q;
  }

  std::string integer_schema(const ordered_json& s, const std::string& path) {
    std::optional<double> min = number_of(s, "minimum", path), max = number_of(s, "maximum", path);
    // exclusiveMinimum: a number (draft 6+) or a flag on minimum (draft 4).
    auto exclusive = [&](const char* key, std::optional<double>& bound, bool lower) {
      if (!s.contains(key)) return;
      const auto& v = s[key];
      if (v.is_boolean()) {
        if (v.get<bool>() && bound) bound = lower ? std::floor(*bound) + 1 : std::ceil(*bound) - 1;
      } else if (v.is_number()) {
        double b = lower ? std::floor(v.get<double>()) + 1 : std::ceil(v.get<double>()) - 1;
        bound = bound ? (lower ? std::max(*bound, b) : std::min(*bound, b)) : b;
      } else {
        error(path, "{} must be a number", key);
      }
    };
    exclusive("exclusiveMinimum", min, true);
    exclusive("exclusiveMaximum", max, false);
    const auto limit = static_cast<double>(kIntLimit);
    // Bounds beyond what the grammar writes (18 digits) on the open side are no limit.
    if (min && std::ceil(*min) < -limit) min.reset();
    if (max && std::floor(*max) > limit) max.reset();
    if (!min && !max) return basic("integer");
    if ((min && std::ceil(*min) > limit) || (max && std::floor(*max) < -limit))
      error(path, "integer bounds beyond ±{} are not supported", kIntLimit);
    const int64_t lo = min ? static_cast<int64_t>(std::ceil(*min)) : -kIntLimit;
    const int64_t hi = max ? static_cast<int64_t>(std::floor(*max)) : kIntLimit;
    if (lo > hi) error(path, "no integer lies between minimum {} and maximum {}", lo, hi);
    return integer_range_gbnf(lo, hi);
  }

  // A bound of a number schema, as the decimal the schema wrote (its shortest round-trip form).
  struct Bound {
    Decimal value;
    bool exclusive = false;
  };

  static Decimal decimal_of(const ordered_json& v) {
    if (v.is_number_integer()) return parse_decimal(v.dump());
    return parse_decimal(fmt::format("{}", v.get<double>()));
  }

  // minimum / maximum and their exclusive forms (a number in draft 6+, a flag on the bound in draft 4);
  // the tighter one wins.
  std::optional<Bound> number_bound(const ordered_json& s, bool lower, const std::string& path) {
    const char* key = lower ? "minimum" : "maximum";
    const char* ex_key = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<Bound> b;
    if (s.contains(key)) {
      if (!s[key].is_number()) error(path, "{} must be a number", key);
      b = Bound{decimal_of(s[key]), false};
    }
    if (s.contains(ex_key)) {
      const auto& v = s[ex_key];
      if (v.is_boolean()) {
        if (v.get<bool>() && b) b->exclusive = true;
      } else if (v.is_number()) {
        Bound e{decimal_of(v), true};
        const int c = b ? compare_decimal(e.value, b->value) : 0;
        if (!b || (lower ? c >= 0 : c <= 0)) b = e;
      } else {
        error(path, "{} must be a number", ex_key);
      }
    }
    return b;
  }

  // Plain decimals (no exponent) with at most 18 integer and 17 fraction digits in [lower, upper],
  // exactly: the integer part is a digit range, the fraction next to a bound a digit automaton against
  // the bound's fraction digits. "-0" is not written.
  std::string number_schema(const ordered_json& s, const std::string& path) {
    std::optional<Bound> lo = number_bound(s, true, path), hi = number_bound(s, false, path);
    if (!lo && !hi) return basic("number");
    // Bounds at or beyond ±10^18 lie outside every number the grammar writes.
    auto huge = [](const Bound& b) { return b.value.ip.size() > 18; };
    if (lo && huge(*lo)) {
      if (!lo->value.neg) error(path, "number bounds beyond ±{} are not supported", kIntLimit);
      lo.reset();
    }
    if (hi && huge(*hi)) {
      if (hi->value.neg) error(path, "number bounds beyond ±{} are not supported", kIntLimit);
      hi.reset();
    }
    std::vector<std::string> alts;
    const Bound zero_in{Decimal{}, false}, zero_ex{Decimal{}, true};
    // Non-negative values, written without a sign.
    if (!(hi && hi->value.neg)) {
      Bound a = lo && !lo->value.neg ? *lo : zero_in;
      magnitude_range(a, hi, alts, "");
    }
    // Negative values: "-" and a magnitude m > 0 with -m in [lo, hi].
    if (!(lo && !lo->value.neg)) {
      Bound a = hi && hi->value.neg ? Bound{abs_decimal(hi->value), hi->exclusive} : zero_ex;
      std::optional<Bound> b;
      if (lo) b = Bound{abs_decimal(lo->value), lo->exclusive};
      magnitude_range(a, b, alts, "\"-\" ");
    }
    if (alts.empty())
      error(path, "no number lies between the bounds ({} and {})",
            lo ? (lo->exclusive ? "> " : ">= ") + decimal_text(lo->value) : std::string("no minimum"),
            hi ? (hi->exclusive ? "< " : "<= ") + decimal_text(hi->value) : std::string("no maximum"));
    return alternatives(alts);
  }

  // Magnitudes m (>= 0, b absent: up to 18 integer digits) with a <= m <= b (or < by the flags), each
  // alternative prefixed by `sign`.
  void magnitude_range(const Bound& a, const std::optional<Bound>& b, std::vector<std::string>& out,
                       const std::string& sign) {
    if (b) {
      const int c = compare_decimal(a.value, b->value);
      if (c > 0 || (c == 0 && (a.exclusive || b->exclusive))) return;
    }
    const int64_t ia = std::stoll(a.value.ip);
    auto lit = [](int64_t v) { return "\"" + std::to_string(v) + "\""; };
    if (b && a.value.ip == b->value.ip) {
      if (auto f = fraction_rule(&a, &*b)) out.push_back(sign + lit(ia) + " " + *f);
      return;
    }
    const int64_t ib = b ? std::stoll(b->value.ip) : kIntLimit;
    if (auto f = fraction_rule(&a, nullptr)) out.push_back(sign + lit(ia) + " " + *f);
    if (ia + 1 <= (b ? ib - 1 : kIntLimit)) {
      std::vector<std::string> mid;
      nonnegative_range(ia + 1, b ? ib - 1 : kIntLimit, mid);
      out.push_back(sign + alternatives(mid) + " (\".\" [0-9]{1,17})?");
    }
    if (b)
      if (auto f = fraction_rule(nullptr, &*b)) out.push_back(sign + lit(ib) + " " + *f);
  }

  // The optional fraction ("" or "." and 1..17 digits) whose value, read after the same integer part
  // as the bounds, is >= / > lo's fraction and <= / < hi's (a null bound: no limit on that side).
  // Nothing when no fraction fits.
  std::optional<std::string> fraction_rule(const Bound* lo, const Bound* hi) {
    constexpr int kMaxFrac = 17;
    const std::string lf = lo ? lo->value.fp : "", hf = hi ? hi->value.fp : "";
    std::map<std::tuple<int, bool, bool, bool>, std::optional<std::string>> memo;
    // The digits still to come after i were read; le / he: the digits so far equal the bound's.
    std::function<std::optional<std::string>(int, bool, bool, bool)> state =
        [&](int i, bool le, bool he, bool may_end) -> std::optional<std::string> {
      auto key = std::make_tuple(i, le, he, may_end);
      if (auto it = memo.find(key); it != memo.end()) return it->second;
      std::vector<std::string> alts;
      const bool lo_ok = !le || (static_cast<size_t>(i) >= lf.size() && !lo->exclusive);
      const bool hi_ok = !he || static_cast<size_t>(i) < hf.size() || !hi->exclusive;
      if (!le && !he) {  // free digits: no rule needed
        const int left = kMaxFrac - i, least = may_end ? 0 : 1;
        if (left < least) return memo[key] = std::nullopt;
        return memo[key] = left == 0 ? std::string("\"\"") : fmt::format("[0-9]{{{},{}}}", least, left);
      }
      if (may_end && lo_ok && hi_ok) alts.push_back("\"\"");
      if (i < kMaxFrac) {
        {
          const char p = le && static_cast<size_t>(i) < lf.size() ? lf[static_cast<size_t>(i)] : '0';
          const char q = he && static_cast<size_t>(i) < hf.size() ? hf[static_cast<size_t>(i)] : '0';
          // Runs of digits going to the same state become one class.
          int d = 0;
          while (d <= 9) {
            const char c = static_cast<char>('0' + d);
            if ((le && c < p) || (he && c > q)) {
              ++d;
              continue;
            }
            const bool nle = le && c == p, nhe = he && c == q;
            int e = d;
            while (e + 1 <= 9) {
              const char n = static_cast<char>('0' + e + 1);
              if ((le && n < p) || (he && n > q) || (le && n == p) != nle || (he && n == q) != nhe) break;
              ++e;
            }
            if (auto next = state(i + 1, nle, nhe, true))
              alts.push_back(digit_class(c, static_cast<char>('0' + e)) + " " + *next);
            d = e + 1;
          }
        }
      }
      std::optional<std::string> result;
      if (!alts.empty()) {
        std::string name = new_rule_name("frac");
        std::string def;
        for (size_t k = 0; k < alts.size(); ++k) def += (k ? " | " : "") + alts[k];
        rules_[name] = def;
        result = name;
      }
      memo[key] = result;
      return result;
    };
    const bool le0 = lo != nullptr, he0 = hi != nullptr;
    std::vector<std::string> alts;
    // No fraction at all: the value of an empty digit string.
    const bool lo_ok = !le0 || (lf.empty() && !lo->exclusive);
    const bool hi_ok = !he0 || !hf.empty() || !hi->exclusive;
    if (lo_ok && hi_ok) alts.push_back("\"\"");
    if (auto digits = state(0, le0, he0, false)) alts.push_back("\".\" " + *digits);
    if (alts.empty()) return std::nullopt;
    return alternatives(alts);
  }

  // A JSON string naming an extra member: any key but the declared `names` (so an extra member never
  // repeats a listed property under another schema). A trie over the names' code points: while the key
  // is a prefix of some name, each character is written plainly (no escape, which could spell a name's
  // character another way); it may end there unless the prefix is a name; a plain character that no
  // name continues with, or any character after a complete name, leaves the trie, and then the rest is
  // any string content.
  std::string extra_key(const std::vector<std::string>& names) {
    struct Node {
      std::map<uint32_t, int> next;
      bool name = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& n : names) {
      int at = 0;
      bool complete = true;
      for (size_t i = 0; i < n.size();) {
        auto c = static_cast<unsigned char>(n[i]);
        int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
        uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
        for (int k = 1; k < len && i + static_cast<size_t>(k) < n.size(); ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(n[i + static_cast<size_t>(k)]) & 0x3F);
        i += static_cast<size_t>(len);
        // A character JSON must escape: keys through here need an escape, which the trie never allows.
        if (cp == '"' || cp == '\\' || cp < 0x20) {
          complete = false;
          break;
        }
        auto it = trie[static_cast<size_t>(at)].next.find(cp);
        if (it == trie[static_cast<size_t>(at)].next.end()) {
          trie.push_back({});
          const int id = static_cast<int>(trie.size()) - 1;
          trie[static_cast<size_t>(at)].next[cp] = id;
          at = id;
        } else {
          at = it->second;
        }
      }
      if (complete) trie[static_cast<size_t>(at)].name = true;
    }
    const std::string base = new_rule_name("key");
    const std::string rest = basic("char") + "* \"\\\"\"";  // any content, then the closing quote
    auto cp_escape = [](uint32_t cp) { return fmt::format("\\U{:08X}", cp); };
    for (size_t i = 0; i < trie.size(); ++i) {
      const Node& node = trie[i];
      std::vector<std::string> alts;
      if (!node.name) alts.push_back("\"\\\"\"");
      std::string diverge = "[^\"\\\\\\x00-\\x1F";
      for (const auto& [cp, child] : node.next) {
        alts.push_back("\"" + cp_escape(cp) + "\" " + base + "-" + std::to_string(child));
        diverge += cp_escape(cp);
      }
      alts.push_back(diverge + "] " + rest);
      std::string def;
      for (size_t k = 0; k < alts.size(); ++k) def += (k ? " | " : "") + alts[k];
      rules_[base + "-" + std::to_string(i)] = def;
    }
    rules_[base] = "\"\\\"\" " + base + "-0";
    return base;
  }

  std::string object_schema(const ordered_json& s, const std::string& path) {
    std::string ws = basic("ws");
    std::vector<std::pair<std::string, const ordered_json*>> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) error(path, "properties must be an object");
      for (const auto& [k, v] : s["properties"].items()) props.push_back({k, &v});
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) error(path, "required must be an array of names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) error(path, "required must be an array of names");
        required.insert(r.get<std::string>());
      }
    }
    // Extra members: additionalProperties true / {} / a schema allow them (after the listed ones).
    std::string extra;
    if (s.contains("additionalProperties")) {
      const auto& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) {
        std::string value = ap.is_boolean() ? basic("value") : visit(ap, path + "/additionalProperties");
        std::vector<std::string> names;
        for (const auto& p : props) names.push_back(p.first);
        extra =
            (names.empty() ? basic("string") : extra_key(names)) + " " + ws + " \":\" " + ws + " " + value;
      }
    } else if (props.empty()) {
      extra = basic("string") + " " + ws + " \":\" " + ws + " " + basic("value");
    }
    for (const std::string& r : required) {
      bool listed = std::any_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; });
      if (!listed && extra.empty())
        error(path, "required property '{}' is not in properties and additionalProperties is false", r);
    }
    // first[i]: members i.. when none was written yet; rest[i]: after one was (each with its comma).
    const size_t n = props.size();
    std::vector<std::string> first(n + 1), rest(n + 1);
    std::string base = new_rule_name("obj");
    std::string tail_first =
        extra.empty() ? "\"\"" : "(" + extra + " (" + ws + " \",\" " + ws + " " + extra + ")*)?";
    std::string tail_rest = extra.empty() ? "\"\"" : "(" + ws + " \",\" " + ws + " " + extra + ")*";
    first[n] = base + "-f" + std::to_string(n);
    rest[n] = base + "-r" + std::to_string(n);
    rules_[first[n]] = tail_first;
    rules_[rest[n]] = tail_rest;
    for (size_t i = n; i-- > 0;) {
      const auto& [key, schema] = props[i];
      std::string member = gbnf_literal(ordered_json(key).dump()) + " " + ws + " \":\" " + ws + " " +
                           visit(*schema, path + "/properties/" + key);
      std::string member_rule = new_rule_name("prop-" + key);
      rules_[member_rule] = member;
      first[i] = base + "-f" + std::to_string(i);
      rest[i] = base + "-r" + std::to_string(i);
      bool req = required.count(key) > 0;
      rules_[first[i]] = member_rule + " " + rest[i + 1] + (req ? "" : " | " + first[i + 1]);
      rules_[rest[i]] =
          ws + " \",\" " + ws + " " + member_rule + " " + rest[i + 1] + (req ? "" : " | " + rest[i + 1]);
    }
    return "\"{\" " + ws + " " + first[0] + " " + ws + " \"}\"";
  }

  std::string array_schema(const ordered_json& s, const std::string& path) {
    std::string ws = basic("ws");
    std::optional<int64_t> min = count_of(s, "minItems", path), max = count_of(s, "maxItems", path);
    int64_t lo = min.value_or(0);
    if (max && *max < lo) error(path, "maxItems {} is below minItems {}", *max, lo);
    if (lo > 1000 || (max && *max > 1000)) error(path, "minItems / maxItems above 1000 are not supported");
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) error(path, "prefixItems must be an array of schemas");
      for (size_t i = 0; i < s["prefixItems"].size(); ++i)
        prefix.push_back(visit(s["prefixItems"][i], fmt::format("{}/prefixItems/{}", path, i)));
    }
    std::string item;
    bool items_false = false;
    if (s.contains("items")) {
      const auto& it = s["items"];
      if (it.is_boolean() && !it.get<bool>()) {
        items_false = true;
      } else if (it.is_array()) {
        error(path, "items as an array (draft 4 tuples) is not supported: use prefixItems");
      } else {
        item = visit(it, path + "/items");
      }
    } else {
      item = basic("value");
    }
    // Element k (0-based) is prefix[k] while k < prefix.size(), then item.
    auto elem = [&](int64_t k) {
      return static_cast<size_t>(k) < prefix.size() ? prefix[static_cast<size_t>(k)] : item;
    };
    int64_t hard_max = max.value_or(-1);
    if (items_false)
      hard_max = hard_max < 0 ? static_cast<int64_t>(prefix.size())
                              : std::min<int64_t>(hard_max, static_cast<int64_t>(prefix.size()));
    if (hard_max >= 0 && hard_max < lo) error(path, "minItems {} cannot be met", lo);
    std::string sep = ws + " \",\" " + ws + " ";
    // Build from the back: tail(k) = what may follow once k elements are written.
    std::string name = new_rule_name("arr");
    int64_t fixed = std::max<int64_t>(lo, static_cast<int64_t>(prefix.size()));
    if (hard_max >= 0) fixed = std::min(fixed, hard_max);
    // After `fixed` elements: optional more, bounded by hard_max.
    std::string more;
    if (hard_max < 0) {
      more = "(" + sep + item + ")*";
    } else {
      more = "\"\"";
      for (int64_t k = hard_max - 1; k >= fixed; --k) more = "(" + sep + elem(k) + " " + more + ")?";
    }
    // Elements 0..fixed-1; those at or above lo optional (only prefix ones can be).
    std::string body = more;
    for (int64_t k = fixed - 1; k >= 0; --k) {
      std::string e = (k == 0 ? "" : sep) + elem(k) + " " + body;
      body = k >= lo ? "(" + e + ")?" : e;
    }
    if (fixed == 0) {
      // Nothing required: the first element is optional, then the rest.
      if (hard_max == 0) {
        rules_[name] = "\"[\" " + ws + " \"]\"";
      } else {
        std::string rest_part;
        if (hard_max < 0) {
          rest_part = "(" + sep + item + ")*";
        } else {
          rest_part = "\"\"";
          for (int64_t k = hard_max - 1; k >= 1; --k)
            rest_part = "(" + sep + elem(k) + " " + rest_part + ")?";
        }
        rules_[name] = "\"[\" " + ws + " (" + elem(0) + " " + rest_part + " " + ws + ")? \"]\"";
      }
    } else {
      rules_[name] = "\"[\" " + ws + " " + body + " " + ws + " \"]\"";
    }
    return name;
  }

  const ordered_json& root_;
  std::string prefix_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
  int counter_ = 0;
  int depth_ = 0;
};

std::string check_prefix(std::string_view root_name) {
  std::string p(root_name);
  if (p.empty()) fail("json_schema_to_gbnf: the rule name is empty");
  for (char c : p)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'))
      fail("json_schema_to_gbnf: rule name '{}' may hold only letters, digits, '-' and '_'", p);
  return p;
}

}  // namespace

std::string json_schema_to_gbnf(std::string_view schema_json, std::string_view root_name) {
  std::string prefix = check_prefix(root_name);
  ordered_json schema;
  try {
    schema = ordered_json::parse(schema_json);
  } catch (const std::exception& e) {
    fail("json_schema: the schema is not valid JSON: {}", e.what());
  }
  return SchemaConverter(schema, prefix).convert();
}

std::string json_object_gbnf(std::string_view root_name) {
  ordered_json empty = ordered_json::object();
  return SchemaConverter(empty, check_prefix(root_name)).object_only();
}

}  // namespace polylora::structured
