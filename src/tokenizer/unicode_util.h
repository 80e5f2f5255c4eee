// tokenizer/unicode_util.h: UTF-8 helpers shared by the tokenizer pipeline.
// Owns: UTF-8 decoding/encoding and validation, lossy repair (invalid bytes -> U+FFFD, as Rust's
// from_utf8_lossy), Unicode normalization forms (via utf8proc), and the GPT-2 byte-level alphabet.
// Must not: know about vocabularies, models or tokenizer.json.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace polylora::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 character starting at s[pos], or 0 when the bytes there are not one.
size_t utf8_char_len(std::string_view s, size_t pos);
// True when every byte of s belongs to a well-formed UTF-8 character.
bool is_valid_utf8(std::string_view s);
// Replaces each maximal invalid subsequence with U+FFFD (the WHATWG / Rust from_utf8_lossy rule).
std::string utf8_lossy(std::string_view s);
// Decodes the (valid) character at s[pos]; advances pos.
char32_t utf8_next(std::string_view s, size_t& pos);
void utf8_append(std::string& out, char32_t cp);
// Number of characters of a valid UTF-8 string.
size_t utf8_length(std::string_view s);

bool is_unicode_whitespace(char32_t cp);  // the White_Space property
bool is_unicode_alnum(char32_t cp);       // letters (L*) and numbers (N*)

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string unicode_normalize(std::string_view s, NormalForm form);
std::string unicode_lowercase(std::string_view s);

// The GPT-2 byte-level alphabet: byte b <-> one printable code point (as UTF-8).
const std::array<std::string, 256>& byte_level_chars();
// Inverse map: code point -> byte, or -1 when cp is not part of the alphabet.
int byte_level_byte(char32_t cp);

}  // namespace polylora::tokenizer
