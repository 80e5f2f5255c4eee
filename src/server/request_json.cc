// server/request_json.cc: sampling fields from JSON with precise type errors.
#include "server/request_json.h"

#include <cmath>

#include "common/error.h"

namespace polylora::server {

using nlohmann::json;

namespace {

const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

double number(const json& body, const char* name) {
  const json* f = field(body, name);
  if (!f->is_number()) fail("'{}' must be a number, got {}", name, f->type_name());
  return f->get<double>();
}

int64_t integer(const json& body, const char* name) {
  const json* f = field(body, name);
  if (f->is_number_integer() || f->is_number_unsigned()) return f->get<int64_t>();
  if (f->is_number_float() && std::floor(f->get<double>()) == f->get<double>())
    return static_cast<int64_t>(f->get<double>());
  fail("'{}' must be an integer, got {}", name, f->is_number() ? f->dump() : std::string(f->type_name()));
}

bool boolean(const json& body, const char* name) {
  const json* f = field(body, name);
  if (!f->is_boolean()) fail("'{}' must be a boolean, got {}", name, f->type_name());
  return f->get<bool>();
}

std::vector<int32_t> id_list(const json& body, const char* name) {
  const json* f = field(body, name);
  if (!f->is_array()) fail("'{}' must be a list of token ids", name);
  std::vector<int32_t> ids;
  for (const auto& v : *f) {
    if (!v.is_number_integer()) fail("'{}' must be a list of integer token ids, got {}", name, v.dump());
    int64_t x = v.get<int64_t>();
    if (x < 0 || x > INT32_MAX) fail("'{}': token id {} is out of range", name, x);
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

}  // namespace

void read_sampling_fields(const json& body, SamplingParams& p) {
  if (!body.is_object()) fail("the request body must be a JSON object");
  if (field(body, "n")) p.n = integer(body, "n");
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
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(k, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != k.size()) fail("'logit_bias': key '{}' is not a token id", k);
      if (!v.is_number()) fail("'logit_bias': the bias of token {} must be a number", k);
      p.logit_bias.emplace_back(static_cast<int32_t>(id), v.get<double>());
    }
  }
  if (field(body, "min_tokens")) p.min_tokens = integer(body, "min_tokens");
  if (field(body, "max_tokens")) p.max_tokens = integer(body, "max_tokens");
  if (field(body, "max_completion_tokens")) p.max_tokens = integer(body, "max_completion_tokens");
  if (field(body, "stop_token_ids")) p.stop_token_ids = id_list(body, "stop_token_ids");
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
    if (k < 0 || k > 20) fail("'top_logprobs' must be in [0, 20], got {}", k);
    if (p.logprobs) p.logprobs = k;
  }
  if (field(body, "prompt_logprobs")) p.prompt_logprobs = integer(body, "prompt_logprobs");
}

json logprob_entry_json(const LogprobEntry& e) {
  json top = json::array();
  for (const auto& t : e.top) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
  return {{"id", e.id}, {"logprob", e.logprob}, {"rank", e.rank}, {"top", top}};
}

}  // namespace polylora::server
