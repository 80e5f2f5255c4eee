// common/utf8.h: UTF-8 checks for bytes that come from outside (request bodies, paths, file contents),
// so that anything echoed into JSON or logs is valid UTF-8.
// Must not: know about JSON or HTTP.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace polylora {

// Length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 when it is invalid (overlong forms,
// surrogates, values above U+10FFFF, truncated sequences; RFC 3629).
size_t utf8_sequence_length(std::string_view s, size_t i);

// Characters in `s` (code points; each byte of an invalid sequence counts as one, as a replacement
// character would): the unit of Python's len(), in which vLLM's completion text_offset counts.
size_t utf8_char_count(std::string_view s);

// Bytes of `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);

// Appends code point `cp` as UTF-8; a surrogate or a value above U+10FFFF becomes U+FFFD (the output stays
// valid UTF-8).
void append_utf8(std::string& out, uint32_t cp);

// At most `max_bytes` of `s` for a message, cut on a character boundary (then "..."), valid UTF-8.
std::string clip_utf8(std::string_view s, size_t max_bytes = 64);

}  // namespace polylora
