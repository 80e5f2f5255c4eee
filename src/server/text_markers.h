// server/text_markers.h: what the streaming output parsers (output_parser.cc, qwen3_coder_tools.cc) share
// about text that may still become a marker. Must not: know about HTTP, requests or the engine.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace polylora::server {

// Length of the longest suffix of `s` that is a proper prefix of `marker` (text that may still become it).
inline size_t partial_suffix(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  return 0;
}

}  // namespace polylora::server
