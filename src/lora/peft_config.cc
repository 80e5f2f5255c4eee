// lora/peft_config.cc: parses adapter_config.json as untrusted bytes and matches PEFT pattern keys.
// Owns: the JSON bounds (size, depth), the type of every field, PCRE2 compilation and bounded matching.
// Must not: read files, or let any input bytes reach a message without making them valid UTF-8.
#include "lora/peft_config.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/utf8.h"
#include "runtime/safetensors.h"

namespace polylora {
namespace {

using Json = nlohmann::ordered_json;  // document order: the first matching pattern key wins

// Wraps a key the way PEFT does: re.match(rf"(.*\.)?({key})$", module).
constexpr std::string_view kPatternPrefix = "(?:.*\\.)?(?:";
constexpr std::string_view kPatternSuffix = ")$";

// A short rendering of an untrusted value: a scalar, or what kind of container it is (never a deep dump).
std::string brief(const Json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return clip_utf8(v.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  if (n < 0) return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buffer), static_cast<size_t>(n));
}

bool is_literal_key(std::string_view key) {
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// The fast path's precondition: in an ASCII name without newlines, '.' matches exactly one byte.
bool is_plain_ascii(std::string_view module) {
  for (char c : module)
    if (static_cast<unsigned char>(c) >= 0x80 || c == '\n') return false;
  return true;
}

// (.*\.)?(K)$ for a K of literals and '.': the last |K| bytes match K ('.' = any byte) and are the whole
// name or follow a '.'.
bool literal_matches(std::string_view key, std::string_view module) {
  if (key.size() > module.size()) return false;
  size_t start = module.size() - key.size();
  if (start > 0 && module[start - 1] != '.') return false;
  for (size_t i = 0; i < key.size(); ++i)
    if (key[i] != '.' && key[i] != module[start + i]) return false;
  return true;
}

bool is_positive_integer(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() > 0 && v.get<uint64_t>() <= uint64_t{INT64_MAX};
  return v.is_number_integer() && v.get<int64_t>() > 0;
}

bool is_finite_number(const Json& v) {
  return v.is_number() && std::isfinite(v.get<double>());
}

class ConfigReader {
 public:
  ConfigReader(const Json& j, const std::string& where) : j_(j), where_(where) {}

  template <typename... Args>
  [[noreturn]] void bad(fmt::format_string<Args...> format, Args&&... args) const {
    fail("{}: {}", where_, fmt::format(format, std::forward<Args>(args)...));
  }
  // The field, or nullptr when absent.
  const Json* get(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  // The field, or nullptr when absent or null.
  const Json* get_nullable(const char* key) const {
    const Json* v = get(key);
    return v != nullptr && v->is_null() ? nullptr : v;
  }
  bool get_bool(const char* key, bool fallback) const {
    const Json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) bad("'{}' must be true or false, got {}", key, brief(*v));
    return v->get<bool>();
  }
  std::string get_string(const char* key, const std::string& fallback) const {
    const Json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) bad("'{}' must be a string, got {}", key, brief(*v));
    return v->get<std::string>();
  }
  // A list of strings (or null, which is empty), at most `max_entries` long.
  std::vector<std::string> get_string_list(const char* key, size_t max_entries) const {
    std::vector<std::string> out;
    const Json* v = get_nullable(key);
    if (v == nullptr) return out;
    if (!v->is_array()) bad("'{}' must be a list of strings or null, got {}", key, brief(*v));
    if (v->size() > max_entries)
      bad("'{}' has {} entries, more than the {} allowed", key, v->size(), max_entries);
    for (const Json& e : *v) {
      if (!e.is_string()) bad("'{}' must be a list of strings, but one entry is {}", key, brief(e));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  // An object (or null, which is empty) of at most kMaxPatternKeys entries.
  const Json* get_pattern_object(const char* key) const {
    const Json* v = get_nullable(key);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) bad("'{}' must be an object (module pattern -> value), got {}", key, brief(*v));
    if (v->size() > kMaxPatternKeys)
      bad("'{}' has {} keys, more than the {} allowed", key, v->size(), kMaxPatternKeys);
    return v;
  }

 private:
  const Json& j_;
  const std::string& where_;
};

PeftConfig parse_checked(std::string_view bytes, const std::string& where) {
  if (bytes.size() > kMaxPeftConfigBytes)
    fail("{} is larger than {} bytes (it has {})", where, kMaxPeftConfigBytes, bytes.size());
  Json j;
  auto depth_guard = [&](int depth, Json::parse_event_t event, Json& /*parsed*/) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= kMaxPeftConfigDepth)
      fail("{} nests objects and arrays deeper than {} levels", where, kMaxPeftConfigDepth);
    return true;
  };
  try {
    j = Json::parse(bytes.begin(), bytes.end(), depth_guard);
  } catch (const Json::exception& e) {
    fail("{} is not valid JSON: {}", where, e.what());  // sanitize_utf8'd by parse_peft_config
  }
  if (!j.is_object()) fail("{} must hold a JSON object, got {}", where, brief(j));
  ConfigReader in(j, where);

  std::string peft_type = in.get_string("peft_type", "LORA");
  if (peft_type != "LORA")
    in.bad("peft_type is '{}'; only LORA adapters are supported", clip_utf8(peft_type));
  if (in.get_bool("use_dora", false)) in.bad("DoRA adapters (use_dora: true) are not supported");
  std::string bias = in.get_string("bias", "none");
  if (bias != "none") in.bad("LoRA bias '{}' is not supported (only \"none\")", clip_utf8(bias));
  if (in.get_bool("lora_bias", false)) in.bad("lora_bias is not supported");
  if (const Json* save = in.get_nullable("modules_to_save")) {
    if (!save->is_array()) in.bad("'modules_to_save' must be a list or null, got {}", brief(*save));
    if (!save->empty()) in.bad("modules_to_save is not supported (the adapter would replace whole modules)");
  }
  if (in.get_bool("fan_in_fan_out", false)) in.bad("fan_in_fan_out adapters are not supported");
  if (const Json* targets = in.get_nullable("target_modules"); targets != nullptr && !targets->is_string()) {
    if (!targets->is_array())
      in.bad("'target_modules' must be a string, a list of strings or null, got {}", brief(*targets));
    for (const Json& t : *targets)
      if (!t.is_string()) in.bad("'target_modules' must be a list of strings, but one entry is {}", brief(t));
  }

  PeftConfig c;
  if (const Json* r = in.get("r")) {
    if (!is_positive_integer(*r)) in.bad("'r' must be a positive integer, got {}", brief(*r));
    c.r = r->get<int64_t>();
  }
  c.lora_alpha = static_cast<double>(c.r);
  if (const Json* alpha = in.get("lora_alpha")) {
    if (!is_finite_number(*alpha)) in.bad("'lora_alpha' must be a number, got {}", brief(*alpha));
    c.lora_alpha = alpha->get<double>();
  }
  c.use_rslora = in.get_bool("use_rslora", false);

  std::vector<std::string> keys;
  if (const Json* ranks = in.get_pattern_object("rank_pattern")) {
    for (const auto& [key, value] : ranks->items()) {
      if (!is_positive_integer(value))
        in.bad("rank_pattern value of key '{}' must be a positive integer, got {}", clip_utf8(key),
               brief(value));
      keys.push_back(key);
      c.rank_pattern_values.push_back(value.get<int64_t>());
    }
  }
  c.rank_pattern = PatternTable("rank_pattern", where, keys);
  keys.clear();
  if (const Json* alphas = in.get_pattern_object("alpha_pattern")) {
    for (const auto& [key, value] : alphas->items()) {
      if (!is_finite_number(value))
        in.bad("alpha_pattern value of key '{}' must be a number, got {}", clip_utf8(key), brief(value));
      keys.push_back(key);
      c.alpha_pattern_values.push_back(value.get<double>());
    }
  }
  c.alpha_pattern = PatternTable("alpha_pattern", where, keys);
  c.target_parameters = in.get_string_list("target_parameters", kMaxTargetParameters);
  return c;
}

}  // namespace

PatternTable::PatternTable(std::string field, std::string where, const std::vector<std::string>& keys)
    : field_(std::move(field)), where_(std::move(where)) {
  if (keys.empty()) return;
  std::unique_ptr<pcre2_compile_context, decltype(&pcre2_compile_context_free)> compile_context(
      pcre2_compile_context_create(nullptr), &pcre2_compile_context_free);
  if (!compile_context) throw std::bad_alloc();
  pcre2_set_parens_nest_limit(compile_context.get(), 64);
  pcre2_set_max_pattern_length(compile_context.get(),
                               kMaxPatternKeyBytes + kPatternPrefix.size() + kPatternSuffix.size());
  match_context_.reset(pcre2_match_context_create(nullptr), &pcre2_match_context_free);
  if (!match_context_) throw std::bad_alloc();
  pcre2_set_match_limit(match_context_.get(), kPatternMatchLimit);
  pcre2_set_depth_limit(match_context_.get(), kPatternDepthLimit);
  pcre2_set_heap_limit(match_context_.get(), kPatternHeapLimitKib);
  for (const std::string& text : keys) {
    if (text.size() > kMaxPatternKeyBytes)
      fail("{}: {} key '{}' is {} bytes long, more than the {} allowed", where_, field_, clip_utf8(text),
           text.size(), kMaxPatternKeyBytes);
    std::string pattern = std::string(kPatternPrefix) + text + std::string(kPatternSuffix);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_ANCHORED | PCRE2_UTF | PCRE2_NEVER_BACKSLASH_C, &error, &offset,
                                     compile_context.get());
    if (code == nullptr) {
      size_t at = offset > kPatternPrefix.size() ? offset - kPatternPrefix.size() : 0;
      fail("{}: {} key '{}' is not a valid regular expression: {} at offset {}", where_, field_,
           clip_utf8(text), pcre2_message(error), std::min(at, text.size()));
    }
    Key key;
    key.text = text;
    key.literal = is_literal_key(text);
    key.code.reset(code, &pcre2_code_free);
    keys_.push_back(std::move(key));
  }
}

bool PatternTable::matches(const Key& key, std::string_view module, bool allow_literal) const {
  if (allow_literal && key.literal && is_plain_ascii(module)) return literal_matches(key.text, module);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  if (!data) throw std::bad_alloc();
  auto start = std::chrono::steady_clock::now();
  int rc = pcre2_match(key.code.get(), reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0, 0,
                       data.get(), match_context_.get());
  regex_time_ += std::chrono::steady_clock::now() - start;
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT)
    fail("{}: {} key '{}' is too costly to match against module '{}' ({}); simplify the pattern", where_,
         field_, clip_utf8(key.text), clip_utf8(module), pcre2_message(rc));
  if (rc < 0 && rc != PCRE2_ERROR_NOMATCH)
    fail("{}: {} key '{}' cannot be matched against module '{}': {}", where_, field_, clip_utf8(key.text),
         clip_utf8(module), pcre2_message(rc));
  if (regex_time_ > kPatternTimeBudget)
    fail(
        "{}: matching the {} keys against the adapter's modules took longer than {} ms; simplify the "
        "patterns",
        where_, field_, kPatternTimeBudget.count());
  return rc >= 0;
}

std::optional<size_t> PatternTable::first_match(std::string_view module) const {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (matches(keys_[i], module, true)) return i;
  return std::nullopt;
}

std::optional<size_t> PatternTable::first_match_regex_only(std::string_view module) const {
  for (size_t i = 0; i < keys_.size(); ++i)
    if (matches(keys_[i], module, false)) return i;
  return std::nullopt;
}

int64_t PeftConfig::rank_for(std::string_view module) const {
  std::optional<size_t> idx = rank_pattern.first_match(module);
  return idx ? rank_pattern_values[*idx] : r;
}

double PeftConfig::alpha_for(std::string_view module) const {
  std::optional<size_t> idx = alpha_pattern.first_match(module);
  return idx ? alpha_pattern_values[*idx] : lora_alpha;
}

PeftConfig parse_peft_config(std::string_view bytes, const std::string& where) {
  try {
    return parse_checked(bytes, where);
  } catch (const Error& e) {
    throw Error(sanitize_utf8(e.what()), e.kind());  // parser excerpts quote raw input bytes
  }
}

}  // namespace polylora
