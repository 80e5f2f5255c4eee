// structured/json_schema.h: JSON Schema -> GBNF (internal to structured/; the public entry point is
// json_schema_to_gbnf in grammar.h), and the regex helpers it shares with regex.cc.
// Must not: know about tokens.
#pragma once

#include <string>
#include <string_view>

namespace polylora::structured {

// Rules for any JSON object; the start rule is `root_name`.
std::string json_object_gbnf(std::string_view root_name);
// A regex as a GBNF expression over the JSON-escaped characters of a string's contents (quotes not
// included): a literal '"' in the pattern is written \" and so on.
std::string regex_to_gbnf_json_string(std::string_view regex);

}  // namespace polylora::structured
