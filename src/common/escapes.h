// common/escapes.h: the pieces of Python string-literal escapes that both parsers of Python-like text share
// (the Jinja lexer's string literals, the pythonic tool-call parser's arguments).
// Must not: know about JSON, HTTP or either parser's error handling.
#pragma once

namespace polylora {

// The value of hex digit h, or −1.
inline int hex_digit_value(char h) {
  return h >= '0' && h <= '9'   ? h - '0'
         : h >= 'a' && h <= 'f' ? h - 'a' + 10
         : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                : -1;
}

// The character a one-letter escape stands for (\\ \' \" \a \b \f \n \r \t \v), or −1 for any other letter
// (the numeric, line-continuation and unknown escapes are each parser's own).
inline int python_simple_escape(char e) {
  switch (e) {
    case '\\':
    case '\'':
    case '"':
      return e;
    case 'a':
      return '\a';
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    case 'v':
      return '\v';
    default:
      return -1;
  }
}

}  // namespace polylora
