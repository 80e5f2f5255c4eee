// tokenizer/jinja_builtins.h: the filters, tests, methods, global functions and operators of the Jinja
// renderer, with Python/Jinja2 semantics (as Hugging Face's chat-template environment configures them).
// Must not: hold render state beyond what a call receives.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace polylora::jinja {

// Throw polylora::Error (no line number: the renderer adds it) on bad arguments or unknown names.
Value apply_filter(Renderer& r, std::string_view name, const Value& input, CallArgs& args);
bool apply_test(Renderer& r, std::string_view name, const Value& input, CallArgs& args);
bool has_method(const Value& object, std::string_view name);
Value call_method(Renderer& r, const Value& object, std::string_view name, CallArgs& args);

// Python binary operators (+ - * / // % ** ~) and `in`.
Value binary_op(Renderer& r, std::string_view op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);

// The globals every template sees: range, namespace, dict, raise_exception, and strftime_now, whose
// clock is pinned to `date` ("YYYY-MM-DD") when given, for reproducible renders.
std::vector<std::pair<std::string, Value>> builtin_globals(std::optional<std::string> date);

}  // namespace polylora::jinja
