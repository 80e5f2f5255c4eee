// common/error.h: the user-facing error type and the CHECK macros used for invariants.
// Owns: polylora::Error (a failure a user can act on, with a precise message) and CHECK/CHECK_EQ.
// Must not: know about models, CUDA, or any layer above common.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace polylora {

// What kind of failure an Error is, so API layers can map it (400, 404, 503).
enum class ErrorKind { kInvalid, kNotFound, kOverloaded };

// A failure caused by input (files, flags, requests). Its message says what was wrong and what to do.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::kInvalid)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_with(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...), kind);
}

[[noreturn]] void check_failed(const char* file, int line, const char* expr, const std::string& message);

}  // namespace polylora

// Internal invariants: a violation is a bug in polylora, reported with file, line and expression.
#define CHECK(cond)                                                       \
  do {                                                                    \
    if (!(cond)) ::polylora::check_failed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define CHECK_MSG(cond, ...)                                                                    \
  do {                                                                                          \
    if (!(cond)) ::polylora::check_failed(__FILE__, __LINE__, #cond, fmt::format(__VA_ARGS__)); \
  } while (0)
