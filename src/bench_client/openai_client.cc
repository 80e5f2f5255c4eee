// bench_client/openai_client.cc: see openai_client.h.
#include "bench_client/openai_client.h"

#include <httplib.h>

#include <cmath>

#include "bench_client/sse_parser.h"
#include "common/error.h"

namespace polylora::bench_client {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBodyBytes = 1000;
constexpr time_t kConnectTimeoutS = 30;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string truncated(const std::string& text) {
  if (text.size() <= kMaxErrorBodyBytes) return text;
  return text.substr(0, kMaxErrorBodyBytes) + "...";
}

// The message of an OpenAI-style error body ({"error": {"message": ...}}), else the body itself.
std::string error_message(const std::string& body) {
  auto parsed = nlohmann::json::parse(body, nullptr, false);
  if (parsed.is_object() && parsed.contains("error")) {
    const auto& error = parsed["error"];
    if (error.is_object() && error.contains("message") && error["message"].is_string()) {
      return error["message"].get<std::string>();
    }
    if (error.is_string()) return error.get<std::string>();
  }
  return truncated(body);
}

httplib::Headers auth_headers(const ClientOptions& options) {
  httplib::Headers headers;
  if (!options.api_key.empty()) headers.emplace("Authorization", "Bearer " + options.api_key);
  for (const auto& [key, value] : options.headers) {
    headers.erase(key);
    headers.emplace(key, value);
  }
  return headers;
}

}  // namespace

ServerAddress parse_base_url(const std::string& base_url) {
  auto scheme_end = base_url.find("://");
  std::string scheme = scheme_end == std::string::npos ? "" : base_url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    fail("--base-url '{}' must start with http:// or https:// (e.g. http://127.0.0.1:8000)", base_url);
  }
  size_t host_begin = scheme_end + 3;
  size_t path_begin = base_url.find('/', host_begin);
  ServerAddress address;
  address.scheme_host_port = base_url.substr(0, path_begin);
  if (address.scheme_host_port.size() == host_begin) fail("--base-url '{}' has no host", base_url);
  if (path_begin != std::string::npos) address.path_prefix = base_url.substr(path_begin);
  while (!address.path_prefix.empty() && address.path_prefix.back() == '/') address.path_prefix.pop_back();
  return address;
}

std::optional<EndpointKind> endpoint_kind(const std::string& endpoint) {
  auto ends_with = [&](std::string_view suffix) {
    return endpoint.size() >= suffix.size() &&
           endpoint.compare(endpoint.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with("chat/completions")) return EndpointKind::kChatCompletions;
  if (ends_with("completions")) return EndpointKind::kCompletions;
  return std::nullopt;
}

OpenAiClient::OpenAiClient(ClientOptions options)
    : options_(std::move(options)), address_(parse_base_url(options_.base_url)) {
  auto kind = endpoint_kind(options_.endpoint);
  if (!kind) {
    fail("--endpoint '{}' is not supported: use /v1/completions or /v1/chat/completions", options_.endpoint);
  }
  kind_ = *kind;
  http_ = std::make_unique<httplib::Client>(address_.scheme_host_port);
  if (!http_->is_valid()) fail("--base-url '{}' is not a valid server address", options_.base_url);
  http_->set_keep_alive(true);
  http_->set_connection_timeout(kConnectTimeoutS, 0);
  auto timeout_us = static_cast<int64_t>(std::ceil(options_.timeout_s * 1e6));
  http_->set_read_timeout(static_cast<time_t>(timeout_us / 1000000),
                          static_cast<time_t>(timeout_us % 1000000));
  http_->set_write_timeout(static_cast<time_t>(timeout_us / 1000000),
                           static_cast<time_t>(timeout_us % 1000000));
}

OpenAiClient::~OpenAiClient() = default;

std::vector<std::string> OpenAiClient::list_models() {
  std::string path = address_.path_prefix + "/v1/models";
  auto result = http_->Get(path, auth_headers(options_));
  if (!result) {
    fail("GET {}{}: {} (is the server running? check --base-url, --host, --port)", address_.scheme_host_port,
         path, httplib::to_string(result.error()));
  }
  if (result->status != 200) {
    fail("GET {}{} returned HTTP {}: {}", address_.scheme_host_port, path, result->status,
         error_message(result->body));
  }
  auto parsed = nlohmann::json::parse(result->body, nullptr, false);
  std::vector<std::string> ids;
  if (parsed.is_object() && parsed.contains("data") && parsed["data"].is_array()) {
    for (const auto& model : parsed["data"]) {
      if (model.is_object() && model.contains("id") && model["id"].is_string()) ids.push_back(model["id"]);
    }
  }
  return ids;
}

std::optional<std::vector<int32_t>> OpenAiClient::tokenize(const std::string& model,
                                                           const std::string& text) {
  nlohmann::json body = {{"model", model}, {"prompt", text}, {"add_special_tokens", false}};
  auto result = http_->Post(address_.path_prefix + "/tokenize", auth_headers(options_), body.dump(),
                            "application/json");
  if (!result || result->status != 200) return std::nullopt;
  auto parsed = nlohmann::json::parse(result->body, nullptr, false);
  if (!parsed.is_object() || !parsed.contains("tokens") || !parsed["tokens"].is_array()) return std::nullopt;
  std::vector<int32_t> ids;
  for (const auto& id : parsed["tokens"]) {
    if (!id.is_number_integer()) return std::nullopt;
    ids.push_back(id.get<int32_t>());
  }
  return ids;
}

nlohmann::json OpenAiClient::request_body(const BenchRequest& request) const {
  nlohmann::json body = {
      {"model", request.model},
      {"temperature", options_.temperature},
      {"max_tokens", request.output_len},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
  };
  switch (kind_) {
    case EndpointKind::kCompletions:
      if (!request.prompt_token_ids.empty()) {
        body["prompt"] = request.prompt_token_ids;
      } else {
        body["prompt"] = request.prompt_text;
      }
      break;
    case EndpointKind::kChatCompletions:
      CHECK_MSG(request.prompt_token_ids.empty(), "chat requests take text prompts");
      body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", request.prompt_text}}});
      break;
  }
  if (options_.top_p) body["top_p"] = *options_.top_p;
  if (options_.top_k) body["top_k"] = *options_.top_k;
  if (options_.min_p) body["min_p"] = *options_.min_p;
  if (options_.ignore_eos) body["ignore_eos"] = true;
  if (options_.extra_body.is_object())
    for (const auto& [key, value] : options_.extra_body.items()) body[key] = value;
  return body;
}

nlohmann::json parse_extra_body(const std::string& text) {
  nlohmann::json parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) fail("--extra-body: not valid JSON: {}", text.substr(0, 200));
  if (!parsed.is_object()) fail("--extra-body: expected a JSON object, got {}", parsed.type_name());
  return parsed;
}

RequestOutcome OpenAiClient::send(const BenchRequest& request) {
  RequestOutcome outcome;
  outcome.model = request.model;
  outcome.prompt_len = request.prompt_len;

  int status = 0;
  std::string error_body;
  std::string stream_error;
  bool first_chunk = false;
  int64_t num_content_chunks = 0;
  int64_t usage_completion_tokens = -1;
  Clock::time_point start, last_chunk;

  SseParser parser([&](std::string_view data) {
    if (data == "[DONE]") return true;
    auto chunk = nlohmann::json::parse(data, nullptr, false);
    if (!chunk.is_object()) {
      if (stream_error.empty())
        stream_error =
            "the stream carried a data line that is not a JSON object: " + truncated(std::string(data));
      return true;
    }
    if (chunk.contains("error")) {
      if (stream_error.empty())
        stream_error = "error event in the stream: " + error_message(std::string(data));
      return true;
    }
    if (chunk.contains("choices") && chunk["choices"].is_array() && !chunk["choices"].empty()) {
      const auto& choice = chunk["choices"][0];
      std::string text;
      auto append = [&](const nlohmann::json& owner, const char* key) {
        if (owner.is_object() && owner.contains(key) && owner[key].is_string())
          text += owner[key].get<std::string>();
      };
      switch (kind_) {
        case EndpointKind::kCompletions:
          append(choice, "text");
          break;
        case EndpointKind::kChatCompletions:
          if (choice.is_object() && choice.contains("delta")) {
            append(choice["delta"], "reasoning_content");
            append(choice["delta"], "content");
          }
          break;
      }
      if (!text.empty()) {
        auto now = Clock::now();
        if (!first_chunk) {
          first_chunk = true;
          outcome.ttft = seconds_between(start, now);
        } else {
          outcome.itl.push_back(seconds_between(last_chunk, now));
        }
        last_chunk = now;
        ++num_content_chunks;
        outcome.generated_text += text;
      }
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      const auto& usage = chunk["usage"];
      if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer()) {
        usage_completion_tokens = usage["completion_tokens"].get<int64_t>();
      }
      if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer()) {
        outcome.prompt_len = usage["prompt_tokens"].get<int64_t>();
      }
    }
    return true;
  });

  httplib::Request http_request;
  http_request.method = "POST";
  http_request.path = address_.path_prefix + options_.endpoint;
  http_request.headers = auth_headers(options_);
  http_request.headers.emplace("Content-Type", "application/json");
  http_request.headers.emplace("Accept", "text/event-stream");
  http_request.body = request_body(request).dump();
  http_request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  http_request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < kMaxErrorBodyBytes) error_body.append(data, size);
      return true;
    }
    parser.feed(std::string_view(data, size));
    return true;
  };

  start = Clock::now();
  auto result = http_->send(http_request);
  if (status == 200) parser.finish();

  if (!result) {
    outcome.error = "transport error: " + httplib::to_string(result.error());
  } else if (status != 200) {
    outcome.error = "HTTP " + std::to_string(status) + ": " + error_message(error_body);
  } else if (!stream_error.empty()) {
    outcome.error = stream_error;
  } else if (!first_chunk) {
    outcome.error = "never received a content chunk to measure TTFT from";
  } else {
    outcome.success = true;
    outcome.latency = seconds_between(start, last_chunk);
    outcome.output_tokens = usage_completion_tokens >= 0 ? usage_completion_tokens : num_content_chunks;
  }
  return outcome;
}

}  // namespace polylora::bench_client
