// server/json_body.cc: bounded JSON parsing of request bodies (see the header).
#include "server/json_body.h"

#include <vector>

#include "common/error.h"
#include "server/http_transport.h"

namespace polylora::server {

namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 (overlong forms, surrogates and values above U+10FFFF
// are invalid, as RFC 3629 says).
size_t utf8_sequence(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k)
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  return len;
}

}  // namespace

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
      size_t len = utf8_sequence(body, i);
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

}  // namespace polylora::server
