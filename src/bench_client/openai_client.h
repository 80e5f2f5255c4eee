// bench_client/openai_client.h: the HTTP side of the benchmark: one connection to an OpenAI-compatible
// server (polylora, vLLM, ...) that lists models, probes POST /tokenize, and sends one streamed
// completion or chat-completion request, timing every content chunk as it arrives.
// Owns: the base-URL split, request bodies (vLLM's benchmark payloads), SSE/JSON decoding of the stream.
// Must not: aggregate metrics or schedule requests (metrics.h and runner.h do); not thread-safe: use one
// client per thread.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_client/metrics.h"
#include "bench_client/workload.h"

namespace httplib {
class Client;
}

namespace polylora::bench_client {

// "http://host:port/prefix" split into what httplib connects to and the path prefix of every route.
struct ServerAddress {
  std::string scheme_host_port;  // "http://127.0.0.1:8000"
  std::string path_prefix;       // "" or "/prefix" (no trailing slash)
};

// Fails with a precise message on anything but http(s)://host[:port][/path].
ServerAddress parse_base_url(const std::string& base_url);

enum class EndpointKind { kCompletions, kChatCompletions };

// "/v1/completions" → kCompletions, "/v1/chat/completions" → kChatCompletions (by suffix).
std::optional<EndpointKind> endpoint_kind(const std::string& endpoint);

struct ClientOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // appended to the base URL's path
  std::string api_key;                       // sent as "Authorization: Bearer ..." when non-empty
  bool ignore_eos = false;                   // vLLM's extension, so outputs run to max_tokens (off as in vLLM)
  double temperature = 0.0;                  // vLLM's bench default: greedy
  std::optional<double> top_p, min_p;        // sent only when given
  std::optional<int64_t> top_k;
  std::vector<std::pair<std::string, std::string>> headers;  // --header KEY=VALUE, on every request
  double timeout_s = 6 * 3600.0;  // read timeout per request (vLLM's aiohttp default is 6 h)
  // --extra-body: members merged into every request body last (they override the fields above), as
  // vLLM's `bench serve --extra-body` does; null when not given.
  nlohmann::json extra_body;
};

// The --extra-body argument: a JSON object (e.g. '{"response_format": {...}}'); fails naming what is wrong.
nlohmann::json parse_extra_body(const std::string& text);

class OpenAiClient {
 public:
  explicit OpenAiClient(ClientOptions options);
  ~OpenAiClient();
  OpenAiClient(const OpenAiClient&) = delete;
  OpenAiClient& operator=(const OpenAiClient&) = delete;

  // The ids of GET /v1/models, in order. Fails with the status or transport error.
  std::vector<std::string> list_models();

  // POST /tokenize {"model", "prompt", "add_special_tokens": false} → token ids (vLLM's route);
  // nullopt when the server has no such route or the answer is not a token list.
  std::optional<std::vector<int32_t>> tokenize(const std::string& model, const std::string& text);

  // The JSON body sent for request (stream with usage, max_tokens = output_len).
  nlohmann::json request_body(const BenchRequest& request) const;

  // Sends request and reads the stream to its end. start_time of the outcome is left 0 (the runner sets
  // it); failures (HTTP status, transport, error events, no content) come back as success = false.
  RequestOutcome send(const BenchRequest& request);

 private:
  ClientOptions options_;
  ServerAddress address_;
  EndpointKind kind_;
  std::unique_ptr<httplib::Client> http_;
};

}  // namespace polylora::bench_client
