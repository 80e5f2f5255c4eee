// tokenizer/unicode_util.cc: UTF-8 helpers, normalization forms (utf8proc), byte-level alphabet.
// Must not: know about vocabularies or tokenizer.json.
#include "tokenizer/unicode_util.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <vector>

namespace polylora::tokenizer {

size_t utf8_char_len(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char c = p[pos];
  if (c < 0x80) return 1;
  auto cont = [&](size_t i) { return pos + i < n && (p[pos + i] & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (pos + 1 >= n) return 0;
    unsigned char c1 = p[pos + 1];
    if (c == 0xE0 && c1 < 0xA0) return 0;
    if (c == 0xED && c1 > 0x9F) return 0;  // surrogates
    return cont(1) && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (pos + 1 >= n) return 0;
    unsigned char c1 = p[pos + 1];
    if (c == 0xF0 && c1 < 0x90) return 0;
    if (c == 0xF4 && c1 > 0x8F) return 0;
    return cont(1) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = utf8_char_len(s, i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

// Length of the maximal prefix of an invalid sequence at pos that could start a valid character
// (at least 1): the unit that from_utf8_lossy replaces by one U+FFFD.
static size_t invalid_prefix_len(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char c = p[pos];
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t len = 1;
  for (size_t i = 0; i < need; ++i) {
    if (pos + len >= n) break;
    unsigned char b = p[pos + len];
    if (i == 0 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
    ++len;
  }
  return len;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t len = utf8_char_len(s, i);
    if (len) {
      i += len;
      continue;
    }
    out.append(s.substr(start, i - start));
    out.append(kReplacementChar);
    i += invalid_prefix_len(s, i);
    start = i;
  }
  if (start == 0) return std::string(s);
  out.append(s.substr(start));
  return out;
}

char32_t utf8_next(std::string_view s, size_t& pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  unsigned char c = p[pos];
  if (c < 0x80) {
    ++pos;
    return c;
  }
  size_t len = utf8_char_len(s, pos);
  if (len == 0) {
    ++pos;
    return 0xFFFD;
  }
  char32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t i = 1; i < len; ++i) cp = (cp << 6) | (p[pos + i] & 0x3F);
  pos += len;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool is_unicode_alnum(char32_t cp) {
  if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

std::string unicode_normalize(std::string_view s, NormalForm form) {
  bool ascii = true;
  for (unsigned char c : s) ascii &= c < 0x80;
  if (ascii) return std::string(s);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  std::string valid = utf8_lossy(s);
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()),
                                    static_cast<utf8proc_ssize_t>(valid.size()), &out,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) return valid;
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> hold(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

std::string unicode_lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp = utf8_next(s, i);
    utf8_append(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
  }
  return out;
}

namespace {
struct ByteLevelTables {
  std::array<std::string, 256> chars;
  std::vector<int> byte_of;  // indexed by code point < 512
  ByteLevelTables() : byte_of(512, -1) {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      utf8_append(chars[b], cp);
      byte_of[cp] = b;
    }
  }
};
const ByteLevelTables& tables() {
  static const ByteLevelTables t;
  return t;
}
}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  return tables().chars;
}

int byte_level_byte(char32_t cp) {
  return cp < 512 ? tables().byte_of[cp] : -1;
}

}  // namespace polylora::tokenizer
