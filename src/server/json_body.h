// server/json_body.h: request bodies as JSON, parsed once and within limits. Checks the bytes before the
// parser sees them (valid UTF-8, nesting depth, members per object), so that no body can exhaust the stack
// or take quadratic time, and renders JSON for responses with invalid UTF-8 replaced (never throws).
// Must not: know about routes or the engine.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace polylora::server {

struct JsonLimits {
  size_t max_depth = 64;               // nested arrays/objects (--max-json-depth)
  size_t max_keys_per_object = 10000;  // members of one object (--max-json-keys)
};

// Parses a request body; throws polylora::Error (400) saying what is wrong and where (byte offset).
nlohmann::ordered_json parse_json_body(std::string_view body, const JsonLimits& limits);

// Serializes for a response: compact, invalid UTF-8 replaced by U+FFFD. Never throws on content.
std::string dump_json(const nlohmann::ordered_json& j);
std::string dump_json(const nlohmann::json& j);

// obj[key] when obj is an object holding a string there, else `otherwise` (nlohmann's value() throws its
// own type_error for a member of another type, which would escape as an internal error).
std::string string_member(const nlohmann::ordered_json& obj, const char* key,
                          const std::string& otherwise = "");

}  // namespace polylora::server
