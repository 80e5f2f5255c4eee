// common/error.cc: reporting of failed internal invariants.
#include "common/error.h"

#include <cstdio>
#include <cstdlib>

namespace polylora {

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message) {
  std::fprintf(stderr, "polylora: internal check failed at %s:%d: %s %s\n", file, line, expr,
               message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace polylora
