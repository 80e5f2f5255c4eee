// server/json_body.cc: bounded JSON parsing of request bodies (see the header).
#include "server/json_body.h"

#include <vector>

#include "common/error.h"
#include "common/utf8.h"

namespace polylora::server {

nlohmann::ordered_json parse_json_body(std::string_view body, const JsonLimits& limits) {
  // One pass over the bytes: UTF-8, depth, members per object (counted at each ':' outside strings).
  struct Level {
    bool object;
    size_t members;
  };
  std::vector<Level> stack;
  bool in_string = false, escape = false;
  for (size_t i = 0; i < body.size();) {
    unsigned char c = static_cast<unsigned char>(body[i]);
    if (c >= 0x80) {
      size_t len = utf8_sequence_length(body, i);
      if (len == 0) fail("the request body is not valid UTF-8 (invalid byte 0x{:02x} at offset {})", c, i);
      i += len;
      escape = false;
      continue;
    }
    if (in_string) {
      if (escape)
        escape = false;
      else if (c == '\\')
        escape = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (stack.size() >= limits.max_depth)
        fail("the request body nests JSON deeper than {} levels (--max-json-depth)", limits.max_depth);
      stack.push_back({c == '{', 0});
    } else if (c == '}' || c == ']') {
      if (!stack.empty()) stack.pop_back();
    } else if (c == ':' && !stack.empty() && stack.back().object) {
      if (++stack.back().members > limits.max_keys_per_object)
        fail("a JSON object in the request body has more than {} members (--max-json-keys)",
             limits.max_keys_per_object);
    }
    ++i;
  }
  try {
    return nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    fail("the request body is not valid JSON: {}", sanitize_utf8(e.what()));
  }
}

std::string dump_json(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string string_member(const nlohmann::ordered_json& obj, const char* key, const std::string& otherwise) {
  if (!obj.is_object()) return otherwise;
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

}  // namespace polylora::server
