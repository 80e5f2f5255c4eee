// common/error.h: the user-facing error type and the CHECK macros used for invariants.
// Owns: polylora::Error (a failure a user can act on, with a precise message) and CHECK/CHECK_EQ.
// Must not: know about models, CUDA, or any layer above common.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace polylora {

// A failure caused by input (files, flags, requests). Its message says what was wrong and what to do.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message);

}  // namespace polylora

// Internal invariants: a violation is a bug in polylora, reported with file, line and expression.
#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) ::polylora::check_failed(__FILE__, __LINE__, #cond, "");     \
  } while (0)
#define CHECK_MSG(cond, ...)                                                              \
  do {                                                                                    \
    if (!(cond)) ::polylora::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
