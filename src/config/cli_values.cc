// config/cli_values.cc: human-readable integers and the flat YAML of vLLM config files.
#include "config/cli_values.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace polylora {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

int64_t parse_human_int(std::string_view text, std::string_view flag) {
  std::string_view s = trim(text);
  auto bad = [&] {
    fail("{} '{}': expected an integer, optionally with a suffix k/m/g/t (x1000) or K/M/G/T (x1024), e.g. "
         "32k or 32K",
         flag, text);
  };
  if (s.empty()) bad();
  char last = s.back();
  int decimal_exp = 0, binary_exp = 0;
  switch (last) {
    case 'k': decimal_exp = 1; break;
    case 'm': decimal_exp = 2; break;
    case 'g': decimal_exp = 3; break;
    case 't': decimal_exp = 4; break;
    case 'K': binary_exp = 1; break;
    case 'M': binary_exp = 2; break;
    case 'G': binary_exp = 3; break;
    case 'T': binary_exp = 4; break;
    default: break;
  }
  if (decimal_exp == 0 && binary_exp == 0) {
    std::string_view digits = s;
    bool neg = !digits.empty() && digits.front() == '-';
    if (neg || (!digits.empty() && digits.front() == '+')) digits.remove_prefix(1);
    if (!all_digits(digits) || digits.size() > 18) bad();
    int64_t v = std::stoll(std::string(digits));
    return neg ? -v : v;
  }
  std::string_view number = s.substr(0, s.size() - 1);
  size_t dot = number.find('.');
  std::string_view int_part = number.substr(0, dot);
  std::string_view frac_part = dot == std::string_view::npos ? std::string_view{} : number.substr(dot + 1);
  if (!all_digits(int_part) || (dot != std::string_view::npos && !all_digits(frac_part))) bad();
  if (binary_exp > 0) {
    if (dot != std::string_view::npos)
      fail("{} '{}': decimals are not allowed with binary suffixes like {}; did you mean {}{}?", flag, text,
           last, number, static_cast<char>(std::tolower(static_cast<unsigned char>(last))));
    if (int_part.size() > 12) bad();
    int64_t v = std::stoll(std::string(int_part));
    for (int i = 0; i < binary_exp; ++i) {
      if (v > std::numeric_limits<int64_t>::max() / 1024) bad();
      v *= 1024;
    }
    return v;
  }
  double v = std::stod(std::string(number));
  v *= std::pow(1000.0, decimal_exp);
  if (!(v < 9.2e18)) bad();
  return static_cast<int64_t>(v);  // int(float(number) * mult), as vLLM
}

std::vector<ConfigEntry> parse_flat_yaml(std::string_view text, const std::string& source) {
  std::vector<ConfigEntry> out;
  auto unquote = [&](std::string_view v, int line) -> std::string {
    v = trim(v);
    if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
      return std::string(v.substr(1, v.size() - 2));
    if (!v.empty() && (v.front() == '"' || v.front() == '\''))
      fail("{}:{}: unterminated quoted value", source, line);
    // A trailing comment on an unquoted scalar.
    size_t hash = v.find(" #");
    if (hash != std::string_view::npos) v = trim(v.substr(0, hash));
    std::string s(v);
    if (s == "True" || s == "TRUE" || s == "yes" || s == "on") s = "true";
    if (s == "False" || s == "FALSE" || s == "no" || s == "off") s = "false";
    return s;
  };
  size_t pos = 0;
  int line_no = 0;
  ConfigEntry* open_list = nullptr;  // a `key:` with no value, taking `- item` lines
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view raw = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() + 1 : nl + 1;
    ++line_no;
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    if (line == "---") continue;
    bool indented = std::isspace(static_cast<unsigned char>(raw.front()));
    if (line.front() == '-' && (line.size() == 1 || line[1] == ' ')) {
      if (!open_list) fail("{}:{}: a list item '{}' outside a list", source, line_no, line);
      open_list->values.push_back(unquote(line.substr(1), line_no));
      continue;
    }
    if (indented)
      fail("{}:{}: nested mappings are not supported (vLLM config files are flat `key: value` lines)", source,
           line_no);
    size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0)
      fail("{}:{}: expected `key: value`, got '{}'", source, line_no, line);
    ConfigEntry e;
    e.key = std::string(trim(line.substr(0, colon)));
    std::string_view value = trim(line.substr(colon + 1));
    open_list = nullptr;
    if (!value.empty() && value.front() == '#') value = {};
    if (value.empty()) {
      e.is_list = true;
      out.push_back(std::move(e));
      open_list = &out.back();
      continue;
    }
    if (value.front() == '[') {
      if (value.back() != ']') fail("{}:{}: a flow list must end on the same line with ']'", source, line_no);
      e.is_list = true;
      std::string_view items = trim(value.substr(1, value.size() - 2));
      while (!items.empty()) {
        size_t comma = items.find(',');
        e.values.push_back(unquote(items.substr(0, comma), line_no));
        if (comma == std::string_view::npos) break;
        items = items.substr(comma + 1);
      }
    } else if (value.front() == '{') {
      // A JSON object on one line (e.g. override-generation-config: {"temperature": 0.5}): passed as text.
      e.values.push_back(std::string(value));
    } else if (value.front() == '|' || value.front() == '>' || value.front() == '&' || value.front() == '*') {
      fail("{}:{}: block scalars, anchors and aliases are not supported", source, line_no);
    } else {
      e.values.push_back(unquote(value, line_no));
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<std::string> normalize_vllm_args(std::vector<std::string> args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  for (std::string& a : args) {
    if (a == "--") {
      out.push_back(a);
      continue;
    }
    if (a.rfind("--", 0) == 0) {
      size_t eq = a.find('=');
      for (size_t i = 2; i < std::min(eq, a.size()); ++i)
        if (a[i] == '_') a[i] = '-';
      out.push_back(a);
      continue;
    }
    auto starts = [&](const char* p) { return a == p || a.rfind(std::string(p) + "=", 0) == 0; };
    auto rename = [&](const char* shrt, const char* lng) {
      if (!starts(shrt)) return false;
      out.push_back(std::string(lng) + a.substr(std::string(shrt).size()));
      return true;
    };
    if (rename("-tp", "--tensor-parallel-size") || rename("-pp", "--pipeline-parallel-size") ||
        rename("-dp", "--data-parallel-size") || rename("-q", "--quantization") ||
        rename("-dcp", "--decode-context-parallel-size") || rename("-dpl", "--data-parallel-size-local") ||
        rename("-dpr", "--data-parallel-rank") || rename("-dpa", "--data-parallel-address") ||
        rename("-dpp", "--data-parallel-rpc-port") || rename("-dpb", "--data-parallel-backend") ||
        rename("-asc", "--api-server-count") || rename("-ep", "--enable-expert-parallel"))
      continue;
    if (a.size() > 2 && a.rfind("-O", 0) == 0) {  // -O3, -O.level=3: compilation config
      out.push_back("--compilation-config=" + a.substr(2));
      continue;
    }
    if (a == "-O") {
      out.push_back("--compilation-config");
      continue;
    }
    out.push_back(a);
  }
  return out;
}

}  // namespace polylora
