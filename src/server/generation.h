// server/generation.h: one completion or chat request in flight, from the engine's output streams to the
// client: hands its prompts to the engine, is woken by the streams (never waits on them), accumulates the
// choices, writes SSE chunks or the final body, and aborts the engine requests when the client goes.
// Must not: parse requests (openai_api.cc does) or touch sockets (http_transport.cc does).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_thread.h"
#include "server/beam_search.h"
#include "server/http_transport.h"
#include "server/openai_api.h"
#include "server/responses_api.h"

namespace polylora::server {

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  using PostWork = std::function<void(std::function<void()>)>;
  Generation(ParsedRequest parsed, EngineThread& engine, const tokenizer::Tokenizer* tokenizer,
             std::shared_ptr<HttpResponder> responder, PostWork post_work);
  // Hands every prompt to the engine; the answer follows asynchronously.
  void start();

 private:
  void on_added(size_t prompt_idx, std::shared_ptr<OutputStream> stream, std::exception_ptr error);
  void wake();
  void pump();  // under mu_
  void abort_all();
  void finish_stream();
  void finish_body();
  void fail_request(int status, const std::string& message);
  nlohmann::ordered_json chunk(nlohmann::ordered_json choice) const;
  nlohmann::ordered_json finish_json(const ChoiceState& ch) const;
  std::string completion_echo_text(size_t prompt_idx) const;
  nlohmann::ordered_json stream_usage_json() const;
  std::string parsed_delta_chunk(size_t choice, ChoiceState& ch, const std::string& new_text,
                                 const std::vector<int32_t>& new_token_ids,
                                 const std::vector<LogprobEntry>& new_logprobs, bool finished);
  void add_token_ids(size_t choice, nlohmann::ordered_json& choice_json,
                     const std::vector<int32_t>& new_token_ids);
  void send_json(int status, const nlohmann::ordered_json& body);

  ParsedRequest parsed_;
  EngineThread& engine_;
  const tokenizer::Tokenizer* tokenizer_;
  std::shared_ptr<HttpResponder> responder_;
  PostWork post_work_;
  bool chat_ = false;  // chat completions or responses
  std::unique_ptr<ResponsesWriter> responses_;  // /v1/responses: its response object and events
  std::string id_;         // the response id: "cmpl-" / "chatcmpl-" + the request id
  std::string engine_id_;  // the engine's request ids: engine_id_ + "-" + prompt index (unique)
  std::string engine_request_id(size_t prompt_idx) const { return engine_id_ + "-" + std::to_string(prompt_idx); }
  nlohmann::ordered_json continuous_usage(size_t choice) const;
  int64_t created_ = 0;

  std::mutex mu_;
  std::atomic<bool> wake_pending_{false};
  std::vector<std::shared_ptr<OutputStream>> streams_;  // [prompts]
  std::vector<std::shared_ptr<BeamSearch>> beam_searches_;  // [prompts] with use_beam_search
  std::vector<bool> stream_done_;
  size_t num_answered_ = 0;  // prompts the engine has accepted or refused
  std::optional<std::pair<int, std::string>> add_error_;
  std::vector<ChoiceState> choices_;                                       // [prompts · n]
  std::vector<std::vector<std::optional<LogprobEntry>>> prompt_logprobs_;  // [prompts]
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  std::optional<std::string> error_;
  bool error_is_shutdown_ = false;
  bool finished_ = false;
  bool stream_started_ = false;  // the 200 and its SSE headers have been sent
  std::atomic<bool> client_gone_{false};
};

}  // namespace polylora::server
