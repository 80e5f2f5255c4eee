// server/structured_fields.cc: response_format, structured_outputs and guided_* -> a grammar spec.
#include "server/structured_fields.h"

#include "common/error.h"

namespace polylora::server {

using json = nlohmann::ordered_json;
using structured::GrammarSpec;
using structured::SpecKind;

namespace {

const json* get(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string schema_text(const json& v, const std::string& field) {
  if (v.is_string()) return v.get<std::string>();  // vLLM accepts the schema as JSON text too
  if (!v.is_object() && !v.is_boolean())
    fail("'{}' must be a JSON Schema (an object), got {}", field, v.type_name());
  return v.dump();
}

std::string string_of(const json& v, const std::string& field) {
  if (!v.is_string()) fail("'{}' must be a string, got {}", field, v.type_name());
  return v.get<std::string>();
}

std::vector<std::string> choices_of(const json& v, const std::string& field) {
  if (!v.is_array() || v.empty()) fail("'{}' must be a non-empty list of strings", field);
  std::vector<std::string> out;
  for (const auto& c : v) {
    if (!c.is_string())
      fail("'{}' must be a non-empty list of strings, got an element of type {}", field, c.type_name());
    out.push_back(c.get<std::string>());
  }
  return out;
}

std::optional<GrammarSpec> from_response_format(const json& rf) {
  if (!rf.is_object()) fail("'response_format' must be an object, got {}", rf.type_name());
  const json* type = get(rf, "type");
  if (!type || !type->is_string())
    fail("'response_format.type' is required: 'text', 'json_object' or 'json_schema'");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") return GrammarSpec{SpecKind::kJsonObject, "", {}};
  if (t == "json_schema") {
    const json* js = get(rf, "json_schema");
    if (!js || !js->is_object())
      fail("'response_format.json_schema' must be an object with the schema, for type 'json_schema'");
    if (const json* strict = get(*js, "strict"))
      if (!strict->is_boolean()) fail("'response_format.json_schema.strict' must be a boolean");
    if (const json* name = get(*js, "name"))
      if (!name->is_string()) fail("'response_format.json_schema.name' must be a string");
    const json* schema = get(*js, "schema");
    if (!schema) fail("'response_format.json_schema.schema' is required");
    return GrammarSpec{SpecKind::kJsonSchema, schema_text(*schema, "response_format.json_schema.schema"), {}};
  }
  fail("'response_format.type' must be 'text', 'json_object' or 'json_schema', got '{}'", t);
}

}  // namespace

const std::vector<std::string>& structured_output_fields() {
  static const std::vector<std::string> f = {"response_format",
                                             "structured_outputs",
                                             "guided_json",
                                             "guided_regex",
                                             "guided_choice",
                                             "guided_grammar",
                                             "guided_decoding_backend",
                                             "guided_whitespace_pattern"};
  return f;
}

void read_structured_output(const json& body, SamplingParams& sp) {
  std::vector<std::pair<std::string, GrammarSpec>> found;  // (field, spec)
  if (const json* rf = get(body, "response_format"))
    if (auto spec = from_response_format(*rf)) found.push_back({"response_format", std::move(*spec)});
  if (const json* so = get(body, "structured_outputs")) {
    if (!so->is_object()) fail("'structured_outputs' must be an object, got {}", so->type_name());
    for (const auto& [key, v] : so->items()) {
      if (v.is_null()) continue;
      const std::string field = "structured_outputs." + key;
      if (key == "json") {
        found.push_back({field, {SpecKind::kJsonSchema, schema_text(v, field), {}}});
      } else if (key == "regex") {
        found.push_back({field, {SpecKind::kRegex, string_of(v, field), {}}});
      } else if (key == "choice") {
        found.push_back({field, {SpecKind::kChoice, "", choices_of(v, field)}});
      } else if (key == "grammar") {
        found.push_back({field, {SpecKind::kGrammar, string_of(v, field), {}}});
      } else if (key == "json_object") {
        if (!v.is_boolean()) fail("'{}' must be a boolean", field);
        if (v.get<bool>()) found.push_back({field, {SpecKind::kJsonObject, "", {}}});
      } else if (key == "disable_fallback" || key == "disable_any_whitespace" ||
                 key == "disable_additional_properties" || key == "whitespace_pattern") {
        // Options of vLLM's backends; polylora's engine has one behaviour (see docs/structured-outputs.md).
      } else if (key == "structural_tag") {
        fail("'structured_outputs.structural_tag' is not supported");
      } else {
        fail("'{}' is not a structured_outputs field (json, regex, choice, grammar, json_object)", field);
      }
    }
  }
  if (const json* v = get(body, "guided_json"))
    found.push_back({"guided_json", {SpecKind::kJsonSchema, schema_text(*v, "guided_json"), {}}});
  if (const json* v = get(body, "guided_regex"))
    found.push_back({"guided_regex", {SpecKind::kRegex, string_of(*v, "guided_regex"), {}}});
  if (const json* v = get(body, "guided_choice"))
    found.push_back({"guided_choice", {SpecKind::kChoice, "", choices_of(*v, "guided_choice")}});
  if (const json* v = get(body, "guided_grammar"))
    found.push_back({"guided_grammar", {SpecKind::kGrammar, string_of(*v, "guided_grammar"), {}}});
  if (const json* v = get(body, "guided_decoding_backend")) string_of(*v, "guided_decoding_backend");
  if (const json* v = get(body, "guided_whitespace_pattern")) string_of(*v, "guided_whitespace_pattern");
  if (found.size() > 1)
    fail("only one structured-output constraint may be given per request, got '{}' and '{}'", found[0].first,
         found[1].first);
  if (!found.empty()) sp.structured_output = std::move(found[0].second);
}

}  // namespace polylora::server
