// server/request_json.cc: sampling fields from JSON with precise type errors.
#include "server/request_json.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

std::optional<double> lax_number(const json& v) {
  if (v.is_number()) return v.get<double>();
  if (!v.is_string()) return std::nullopt;
  const std::string& t = v.get_ref<const std::string&>();
  size_t a = t.find_first_not_of(" \t\n\r"), b = t.find_last_not_of(" \t\n\r");
  if (a == std::string::npos) return std::nullopt;
  const char* first = t.data() + a;
  const char* last = t.data() + b + 1;
  if (*first == '+') ++first;  // from_chars takes no plus sign; Python's float() does
  double d = 0;
  auto [end, ec] = std::from_chars(first, last, d);
  if (ec != std::errc() || end != last || first == last) return std::nullopt;
  return d;
}

std::optional<bool> lax_bool(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number_integer()) {
    if (v == 0 || v == 1) return v == 1;
    return std::nullopt;
  }
  if (!v.is_string()) return std::nullopt;
  std::string t = v.get<std::string>();
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* yes : {"true", "t", "yes", "y", "on", "1"})
    if (t == yes) return true;
  for (const char* no : {"false", "f", "no", "n", "off", "0"})
    if (t == no) return false;
  return std::nullopt;
}

namespace {

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& body, const char* name) {
  const json* f = field(body, name);
  if (std::optional<double> v = lax_number(*f)) return *v;
  fail("'{}' must be a number, got {}", name, f->type_name());
}

// An integer field; floats with an integral value are accepted (as Python's int() of a JSON 2.0 would
// not be, but clients send them), values beyond int64 (or beyond 2^53 as floats) are refused.
int64_t integer(const json& body, const char* name) {
  const json* f = field(body, name);
  if (f->is_number_unsigned()) {
    if (f->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("'{}' is out of range, got {}", name, f->dump());
    return static_cast<int64_t>(f->get<uint64_t>());
  }
  if (f->is_number_integer()) return f->get<int64_t>();
  if (f->is_number_float() || f->is_string()) {
    const std::optional<double> d = f->is_string() ? lax_number(*f) : std::optional<double>(f->get<double>());
    if (d && std::isfinite(*d) && std::floor(*d) == *d && std::fabs(*d) <= 9007199254740992.0)
      return static_cast<int64_t>(*d);
  }
  fail("'{}' must be an integer, got {}", name,
       f->is_number() ? f->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      : std::string(f->type_name()));
}

bool boolean(const json& body, const char* name) {
  const json* f = field(body, name);
  if (std::optional<bool> b = lax_bool(*f)) return *b;
  fail("'{}' must be a boolean, got {}", name, f->type_name());
}

std::vector<int32_t> id_list(const json& body, const char* name) {
  const json* f = field(body, name);
  if (!f->is_array()) fail("'{}' must be a list of token ids", name);
  std::vector<int32_t> ids;
  for (const auto& v : *f) {
    if (!v.is_number_integer())
      fail("'{}' must be a list of integer token ids, got {}", name,
           v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX
                               : v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail("'{}': token id {} is out of range", name, v.dump());
    int64_t x = v.get<int64_t>();
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

}  // namespace

void read_sampling_fields(const json& body, SamplingParams& p) {
  if (!body.is_object()) fail("the request body must be a JSON object");
  if (field(body, "n")) {
    p.n = integer(body, "n");
    if (p.n < 1 || p.n > kMaxN) fail("'n' must be between 1 and {}, got {}", kMaxN, p.n);
  }
  if (field(body, "temperature")) p.temperature = number(body, "temperature");
  if (field(body, "top_p")) p.top_p = number(body, "top_p");
  if (field(body, "top_k")) p.top_k = integer(body, "top_k");
  if (field(body, "min_p")) p.min_p = number(body, "min_p");
  if (field(body, "seed")) {
    int64_t s = integer(body, "seed");
    p.seed = static_cast<uint64_t>(s);
  }
  if (field(body, "presence_penalty")) p.presence_penalty = number(body, "presence_penalty");
  if (field(body, "frequency_penalty")) p.frequency_penalty = number(body, "frequency_penalty");
  if (field(body, "repetition_penalty")) p.repetition_penalty = number(body, "repetition_penalty");
  if (const json* lb = field(body, "logit_bias")) {
    if (!lb->is_object()) fail("'logit_bias' must be an object mapping token ids to biases");
    p.logit_bias.clear();
    for (const auto& [k, v] : lb->items()) {
      int64_t id = -1;
      auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), id);
      if (k.empty() || ec == std::errc::invalid_argument || end != k.data() + k.size())
        fail("'logit_bias': key '{}' is not a token id",
             json(k).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
      if (ec == std::errc::result_out_of_range || id < 0 || id > INT32_MAX)
        fail("'logit_bias': token id {} is out of range", k);
      if (!v.is_number()) fail("'logit_bias': the bias of token {} must be a number", k);
      // Clamped to [-100, 100] as vLLM does (SamplingParams.from_optional, "per OpenAI API spec"): clients
      // ban tokens with -1e9.
      p.logit_bias.emplace_back(static_cast<int32_t>(id), std::clamp(v.get<double>(), -100.0, 100.0));
    }
  }
  if (field(body, "min_tokens")) p.min_tokens = integer(body, "min_tokens");
  if (field(body, "max_tokens")) p.max_tokens = integer(body, "max_tokens");
  if (field(body, "max_completion_tokens")) p.max_tokens = integer(body, "max_completion_tokens");
  if (field(body, "stop_token_ids")) {
    p.stop_token_ids = id_list(body, "stop_token_ids");
    if (p.stop_token_ids.size() > kMaxStopTokenIds)
      fail("'stop_token_ids' has {} ids; at most {} are allowed", p.stop_token_ids.size(), kMaxStopTokenIds);
  }
  if (const json* stop = field(body, "stop")) {
    p.stop.clear();
    if (stop->is_string()) {
      p.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const auto& s : *stop) {
        if (!s.is_string()) fail("'stop' must be a string or a list of strings");
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      fail("'stop' must be a string or a list of strings");
    }
    if (p.stop.size() > kMaxStopStrings)
      fail("'stop' has {} strings; at most {} are allowed", p.stop.size(), kMaxStopStrings);
    for (const auto& s : p.stop)
      if (s.size() > kMaxStopStringBytes)
        fail("'stop': a stop string is {} bytes long; at most {} are allowed", s.size(), kMaxStopStringBytes);
  }
  if (field(body, "include_stop_str_in_output"))
    p.include_stop_str_in_output = boolean(body, "include_stop_str_in_output");
  if (field(body, "ignore_eos")) p.ignore_eos = boolean(body, "ignore_eos");
  if (field(body, "skip_special_tokens")) p.skip_special_tokens = boolean(body, "skip_special_tokens");
  if (const json* lp = field(body, "logprobs")) {
    if (lp->is_boolean()) {  // chat API: logprobs: true with top_logprobs
      if (lp->get<bool>()) p.logprobs = 0;
    } else {
      p.logprobs = integer(body, "logprobs");
    }
  }
  if (field(body, "top_logprobs")) {
    int64_t k = integer(body, "top_logprobs");
    // The upper bound is the server's --max-logprobs (the engine's check, with vLLM's message).
    if (k < -1) fail("'top_logprobs' must be >= 0 (or -1), got {}", k);
    if (p.logprobs) p.logprobs = k;
  }
  if (field(body, "prompt_logprobs")) p.prompt_logprobs = integer(body, "prompt_logprobs");
  if (field(body, "spaces_between_special_tokens"))
    p.spaces_between_special_tokens = boolean(body, "spaces_between_special_tokens");
  if (field(body, "allowed_token_ids")) {
    p.allowed_token_ids = id_list(body, "allowed_token_ids");
    if (p.allowed_token_ids.empty()) fail("'allowed_token_ids' must not be empty");
    if (p.allowed_token_ids.size() > kMaxAllowedTokenIds)
      fail("'allowed_token_ids' has {} ids; at most {} are allowed", p.allowed_token_ids.size(),
           kMaxAllowedTokenIds);
  }
  if (const json* bw = field(body, "bad_words")) {
    if (!bw->is_array()) fail("'bad_words' must be a list of strings");
    p.bad_words.clear();
    for (const auto& w : *bw) {
      if (!w.is_string()) fail("'bad_words' must be a list of strings");
      p.bad_words.push_back(w.get<std::string>());
    }
    if (p.bad_words.size() > kMaxStopStrings)
      fail("'bad_words' has {} words; at most {} are allowed", p.bad_words.size(), kMaxStopStrings);
    for (const auto& w : p.bad_words)
      if (w.size() > kMaxStopStringBytes)
        fail("'bad_words': a word is {} bytes long; at most {} are allowed", w.size(), kMaxStopStringBytes);
  }
  if (field(body, "truncate_prompt_tokens")) {
    int64_t t = integer(body, "truncate_prompt_tokens");
    if (t < -1 || t == 0) fail("'truncate_prompt_tokens' must be -1 or at least 1, got {}", t);
    p.truncate_prompt_tokens = t;  // -1: the model's context length (resolved by the caller)
  }
}

void tokenize_bad_words(SamplingParams& p, const std::function<std::vector<int32_t>(const std::string&)>& encode) {
  p.bad_words_token_ids.clear();
  for (const auto& word : p.bad_words) {
    // As vLLM's SamplingParams.update_from_tokenizer: the word alone, and with a leading space when that
    // gives a different first token and the same number of tokens.
    size_t start = word.find_first_not_of(" \t\n\r\f\v");
    std::string stripped = start == std::string::npos ? std::string() : word.substr(start);
    std::vector<int32_t> plain = encode(stripped);
    if (!plain.empty()) p.bad_words_token_ids.push_back(plain);
    std::vector<int32_t> spaced = encode(" " + stripped);
    if (!spaced.empty() && (plain.empty() || (spaced[0] != plain[0] && spaced.size() == plain.size())))
      p.bad_words_token_ids.push_back(spaced);
  }
}

nlohmann::json logprob_entry_json(const LogprobEntry& e) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : e.top) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
  return {{"id", e.id}, {"logprob", e.logprob}, {"rank", e.rank}, {"top", top}};
}

}  // namespace polylora::server
