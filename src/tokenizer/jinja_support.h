// tokenizer/jinja_support.h: helpers shared by the Jinja filters, tests and methods: argument access, Python
// str semantics on UTF-8 (strip, split, case mapping, title, replace, format) and value utilities (attribute
// paths, sorting, int/float conversion, rounding, indent).
// Must not: hold render state; these are internal to the jinja_* files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"  // append_utf8
#include "tokenizer/jinja_value.h"

namespace polylora::jinja {

const Value* arg(const CallArgs& a, size_t index, std::string_view name);
Value arg_or(const CallArgs& a, size_t index, std::string_view name, Value def);
bool arg_bool(const CallArgs& a, size_t index, std::string_view name, bool def);
std::string arg_str(const CallArgs& a, size_t index, std::string_view name, std::string_view fn);
int64_t arg_int(const CallArgs& a, size_t index, std::string_view name, int64_t def, std::string_view fn);
uint32_t decode_at(std::string_view s, size_t i, size_t* len);
bool is_py_space(uint32_t cp);
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string strip_arg(const std::string& s, const CallArgs& a, bool left, bool right);
uint32_t case_map(uint32_t c, bool upper);
std::string change_case(const std::string& s, bool upper);
std::string to_upper(const std::string& s);
std::string to_lower(const std::string& s);
bool is_alpha(char c);
std::vector<std::string> code_points(const std::string& s);
bool is_cased_letter(const std::string& ch);
std::string capitalize(const std::string& s);
std::string py_title(const std::string& s);
std::string jinja_title(const std::string& s);
std::string replace_all(const std::string& s, const std::string& old_s, const std::string& new_s,
                        int64_t count, Renderer& r);
Value py_split(const std::string& s, const Value* sep, int64_t maxsplit);
bool affix_match(const std::string& s, const Value& affix, bool prefix);
int64_t code_point_index(const std::string& s, size_t byte_pos);
std::string html_escape(const std::string& s);
std::string py_format(const std::string& fmt_s, const CallArgs& a);
Value attribute_of(const Value& v, const std::string& path);
Value lower_if_string(const Value& v, bool case_sensitive);
int compare_or_fail(const Value& a, const Value& b);
ValueList sorted(ValueList items, bool reverse, bool case_sensitive, const Value* attribute);
Value to_int(const Value& v, const Value& def, int64_t base);
Value to_float(const Value& v, const Value& def);
double py_round(double x, int64_t ndigits);
std::string indent_text(const std::string& s, const Value& width, bool first, bool blank);

}  // namespace polylora::jinja
