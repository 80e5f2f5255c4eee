// server/qwen3_coder_tools.cc: see the header. The markers are found as vLLM's regular expressions find
// them: a <tool_call> runs to the first </tool_call> after it (or to the end of the text, less one final
// newline); a <function= to the first </function> in its block (or the block's end); a <parameter= to the
// first </parameter>, next <parameter= or </function> (or the end of its function, less one final
// newline). With no <tool_call> at all the whole text is the one block.
#include "server/qwen3_coder_tools.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>

#include <nlohmann/json.hpp>

#include "server/text_markers.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kOpen = "<tool_call>", kClose = "</tool_call>",
                           kFunc = "<function=", kFuncEnd = "</function>",
                           kParam = "<parameter=", kParamEnd = "</parameter>";
constexpr size_t npos = std::string_view::npos;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Python's str.strip(): ASCII whitespace at both ends.
std::string_view strip(std::string_view s) {
  auto space = [](char c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// `s` with the underscores Python allows in numbers (one between two digits) removed; nullopt for any other.
std::optional<std::string> without_digit_underscores(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') {
      out.push_back(s[i]);
      continue;
    }
    if (i == 0 || i + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[i - 1])) ||
        !std::isdigit(static_cast<unsigned char>(s[i + 1])))
      return std::nullopt;
  }
  return out;
}

// Python's int(text) for a decimal integer that fits 64 bits.
std::optional<int64_t> python_int(std::string_view text) {
  std::optional<std::string> t = without_digit_underscores(strip(text));
  if (!t || t->empty()) return std::nullopt;
  size_t i = (*t)[0] == '+' || (*t)[0] == '-' ? 1 : 0;
  if (i == t->size()) return std::nullopt;
  for (size_t j = i; j < t->size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>((*t)[j]))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(t->c_str(), &end, 10);
  if (errno != 0 || end != t->c_str() + t->size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

// Python's float(text) for a finite decimal number (no hexadecimal; inf and nan are refused, as vLLM's
// int(float) check refuses them).
std::optional<double> python_float(std::string_view text) {
  std::optional<std::string> t = without_digit_underscores(strip(text));
  if (!t || t->empty()) return std::nullopt;
  for (char c : *t)
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.' || c == 'e' ||
          c == 'E'))
      return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(t->c_str(), &end);
  if (end != t->c_str() + t->size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool has_bool_or_null(const json& v) {
  if (v.is_boolean() || v.is_null()) return true;
  if (v.is_structured())
    for (const auto& item : v)
      if (has_bool_or_null(item)) return true;
  return false;
}

// JSON as Python's json.dumps(..., ensure_ascii=False) writes it.
std::string python_dump(const json& v) {
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, item] : v.items()) {
      if (!first) out += ", ";
      first = false;
      out += json(k).dump(-1, ' ', false, json::error_handler_t::replace) + ": " + python_dump(item);
    }
    return out + "}";
  }
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + python_dump(v[i]);
    return out + "]";
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The value of one parameter, as vLLM's _convert_param_value returns it.
json convert_value(std::string_view raw, const std::string* type) {
  if (lower(raw) == "null") return nullptr;
  const std::string text(raw);
  if (type == nullptr) return text;
  const std::string& t = *type;
  auto starts = [&](std::string_view p) { return t.compare(0, p.size(), p) == 0; };
  if (t == "string" || t == "str" || t == "text" || t == "varchar" || t == "char" || t == "enum") return text;
  if (starts("int") || starts("uint") || starts("long") || starts("short") || starts("unsigned")) {
    if (std::optional<int64_t> v = python_int(raw)) return *v;
    return text;
  }
  if (starts("num") || starts("float")) {
    std::optional<double> v = python_float(raw);
    if (!v) return text;
    const double whole = std::trunc(*v);
    if (*v != whole) return *v;
    if (std::fabs(whole) < 9.2e18) return static_cast<int64_t>(whole);
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.0f", whole);  // Python's int(float): the exact integer
    json big = json::parse(buf, nullptr, false);
    return big.is_discarded() ? json(*v) : big;
  }
  if (t == "boolean" || t == "bool" || t == "binary") return lower(raw) == "true";
  if (t == "object" || t == "array" || t == "arr" || starts("dict") || starts("list")) {
    json v = json::parse(text, nullptr, false);  // json.loads
    if (!v.is_discarded()) return v;
  }
  // ast.literal_eval, for what JSON and Python literals write alike (numbers, lists, dicts and
  // double-quoted strings without true / false / null), and Python's True, False and None.
  const std::string_view lit = strip(raw);
  if (lit == "True") return true;
  if (lit == "False") return false;
  if (lit == "None") return nullptr;
  json v = json::parse(lit, nullptr, false);
  if (!v.is_discarded() && !has_bool_or_null(v)) return v;
  return text;
}

enum class Read { kOk, kStop, kError };

// One function from its text after "<function=" (up to its </function> or the end of its block; complete:
// that end has been seen). Adds the call once its name is known.
Read read_function(std::string_view f, bool complete, bool final, const ToolParamTypes& types,
                   std::vector<ParsedToolCall>& calls) {
  const size_t gt = f.find('>');
  if (gt == npos) return final ? Read::kError : Read::kStop;
  ParsedToolCall call;
  call.name = std::string(f.substr(0, gt));
  const auto declared = types.find(call.name);
  call.arguments = "{";
  std::string_view p = f.substr(gt + 1);
  size_t pos = 0;
  bool first = true, stopped = false;
  while (true) {
    const size_t a = p.find(kParam, pos);
    if (a == npos) break;
    const size_t body = a + kParam.size();
    size_t end = std::min({p.find(kParamEnd, body), p.find(kParam, body), p.find(kFuncEnd, body)});
    size_t next = end;
    if (end == npos) {
      if (!complete) {  // the value may still grow
        stopped = true;
        break;
      }
      end = p.size();
      if (end > body && p[end - 1] == '\n') --end;  // `$` stops before a final newline
      next = p.size();
    } else if (p.compare(end, kParamEnd.size(), kParamEnd) == 0) {
      next = end + kParamEnd.size();
    }
    std::string_view m = p.substr(body, end - body);
    const size_t ngt = m.find('>');
    if (ngt == npos) {
      if (final) return Read::kError;
      stopped = true;
      break;
    }
    const std::string name(m.substr(0, ngt));
    std::string_view value = m.substr(ngt + 1);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    const std::string* type = nullptr;
    if (declared != types.end())
      if (auto it = declared->second.find(name); it != declared->second.end()) type = &it->second;
    if (!first) call.arguments += ", ";
    first = false;
    call.arguments += json(name).dump(-1, ' ', false, json::error_handler_t::replace) + ": " +
                      python_dump(convert_value(value, type));
    pos = next;
  }
  if (complete && !stopped) call.arguments += "}";
  calls.push_back(std::move(call));
  return stopped ? Read::kStop : Read::kOk;
}

}  // namespace

ToolParamTypes tool_param_types(std::string_view tools_json) {
  ToolParamTypes out;
  json tools = json::parse(tools_json.begin(), tools_json.end(), nullptr, false);
  if (!tools.is_array()) return out;
  for (const auto& tool : tools) {
    if (!tool.is_object()) continue;
    if (const auto ty = tool.find("type"); ty != tool.end() && (!ty->is_string() || *ty != "function"))
      continue;
    const auto f = tool.find("function");
    if (f == tool.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string()) continue;
    const std::string name = (*f)["name"].get<std::string>();
    if (out.count(name)) continue;  // vLLM takes the first tool of that name
    auto& params = out[name];
    const auto ps = f->find("parameters");
    if (ps == f->end() || !ps->is_object()) continue;
    const json& props =
        ps->contains("properties") && (*ps)["properties"].is_object() ? (*ps)["properties"] : *ps;
    for (const auto& [pname, spec] : props.items()) {
      std::string type = "string";
      if (spec.is_object() && spec.contains("type"))
        type = spec["type"].is_string() ? lower(strip(spec["type"].get<std::string>())) : "<non-string>";
      params[pname] = type;
    }
  }
  return out;
}

std::string qwen3_coder_value_json(std::string_view raw, const std::string* type) {
  return python_dump(convert_value(raw, type));
}

Qwen3CoderParse parse_qwen3_coder(std::string_view s, bool final, const ToolParamTypes& types) {
  Qwen3CoderParse r;
  const size_t first_open = s.find(kOpen), first_func = s.find(kFunc);
  if (first_func == npos) {  // no call (yet): content, less what may become a marker
    size_t end = s.size();
    if (!final)
      end = first_open != npos ? first_open
                               : s.size() - std::max(partial_suffix(s, kOpen), partial_suffix(s, kFunc));
    r.content = std::string(s.substr(0, end));
    return r;
  }
  r.content = std::string(s.substr(0, first_open != npos ? first_open : first_func));
  // The blocks: each <tool_call>'s text, or the whole output when there is none.
  struct Block {
    std::string_view text;
    bool complete;
  };
  std::vector<Block> blocks;
  if (first_open == npos) {
    blocks.push_back({s, final});
  } else {
    for (size_t pos = first_open; pos != npos;) {
      const size_t body = pos + kOpen.size(), close = s.find(kClose, body);
      if (close == npos) {
        std::string_view b = s.substr(body);
        if (final && !b.empty() && b.back() == '\n') b.remove_suffix(1);
        blocks.push_back({b, final});
        break;
      }
      blocks.push_back({s.substr(body, close - body), true});
      pos = s.find(kOpen, close + kClose.size());
    }
  }
  for (const Block& b : blocks) {
    for (size_t fpos = b.text.find(kFunc); fpos != npos;) {
      const size_t fb = fpos + kFunc.size(), fend = b.text.find(kFuncEnd, fb);
      std::string_view f = b.text.substr(fb, fend == npos ? npos : fend - fb);
      const Read rd = read_function(f, fend != npos || b.complete, final, types, r.calls);
      if (rd == Read::kError) {
        r.calls.clear();
        r.content = std::string(s);
        r.whole_output_is_content = true;
        return r;
      }
      if (rd == Read::kStop || fend == npos) return r;
      fpos = b.text.find(kFunc, fend + kFuncEnd.size());
    }
    if (!b.complete) return r;
  }
  if (final && r.calls.empty()) r.content = std::string(s);  // "<function=" outside every block: no call
  return r;
}

}  // namespace polylora::server
