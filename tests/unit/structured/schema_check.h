// tests/unit/structured/schema_check.h: a small JSON Schema validator for tests, written independently of
// structured/ (it checks parsed values, not text): type, properties, required, additionalProperties, enum,
// const, anyOf/oneOf, $ref into the document, items/prefixItems, minItems/maxItems, minLength/maxLength
// (code points), minimum/maximum/exclusive bounds, and format date-time by its shape.
// Returns "" when the value conforms, else what is wrong and where.
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace polylora::testing_util {

inline size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

inline std::string schema_violation(const nlohmann::json& v, const nlohmann::json& s,
                                    const nlohmann::json& root, const std::string& at = "$") {
  using nlohmann::json;
  if (s.is_boolean()) return s.get<bool>() ? "" : at + ": schema false";
  if (s.contains("$ref")) {
    std::string ref = s["$ref"];
    const json& target = ref == "#" ? root : root.at(json::json_pointer(ref.substr(1)));
    return schema_violation(v, target, root, at);
  }
  if (s.contains("const") && v != s["const"]) return at + ": not the const";
  if (s.contains("enum")) {
    bool any = false;
    for (const auto& e : s["enum"]) any |= e == v;
    if (!any) return at + ": not in enum";
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s.contains(key)) continue;
    int matched = 0;
    for (const auto& alt : s[key]) matched += schema_violation(v, alt, root, at).empty();
    if (matched == 0) return at + ": matches no " + key + " alternative";
    if (std::string(key) == "oneOf" && matched > 1) return at + ": matches several oneOf alternatives";
  }
  if (s.contains("type")) {
    json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    bool ok = false;
    for (const auto& t : types) {
      std::string n = t;
      ok |= (n == "object" && v.is_object()) || (n == "array" && v.is_array()) ||
            (n == "string" && v.is_string()) ||
            (n == "integer" && (v.is_number_integer() ||
                                (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))) ||
            (n == "number" && v.is_number()) || (n == "boolean" && v.is_boolean()) ||
            (n == "null" && v.is_null());
    }
    if (!ok) return at + ": wrong type " + v.type_name();
  }
  if (v.is_object()) {
    if (s.contains("required"))
      for (const auto& r : s["required"])
        if (!v.contains(r.get<std::string>())) return at + ": missing required " + r.get<std::string>();
    for (const auto& [k, x] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        std::string e = schema_violation(x, s["properties"][k], root, at + "." + k);
        if (!e.empty()) return e;
      } else if (s.contains("additionalProperties")) {
        std::string e = schema_violation(x, s["additionalProperties"], root, at + "." + k);
        if (!e.empty()) return e;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": too few items";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": too many items";
    size_t prefix = s.contains("prefixItems") ? s["prefixItems"].size() : 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const json& item = i < prefix ? s["prefixItems"][i] : s.contains("items") ? s["items"] : json(true);
      std::string e = schema_violation(v[i], item, root, at + "[" + std::to_string(i) + "]");
      if (!e.empty()) return e;
    }
  }
  if (v.is_string()) {
    const std::string str = v.get<std::string>();
    if (s.contains("minLength") && utf8_length(str) < s["minLength"].get<size_t>()) return at + ": too short";
    if (s.contains("maxLength") && utf8_length(str) > s["maxLength"].get<size_t>()) return at + ": too long";
    if (s.contains("pattern") && !std::regex_match(str, std::regex(s["pattern"].get<std::string>())))
      return at + ": does not match pattern";
    if (s.value("format", "") == "date-time" &&
        !std::regex_match(
            str, std::regex(R"(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2}))")))
      return at + ": not a date-time";
  }
  if (v.is_number()) {
    double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return at + ": below minimum";
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return at + ": above maximum";
    if (s.contains("exclusiveMinimum") && s["exclusiveMinimum"].is_number() &&
        x <= s["exclusiveMinimum"].get<double>())
      return at + ": not above exclusiveMinimum";
    if (s.contains("exclusiveMaximum") && s["exclusiveMaximum"].is_number() &&
        x >= s["exclusiveMaximum"].get<double>())
      return at + ": not below exclusiveMaximum";
  }
  return "";
}

}  // namespace polylora::testing_util
