// server/responses_api.h: OpenAI's Responses API (POST /v1/responses). The request is read as a chat
// request (parse_responses in openai_api.h: input items -> messages, instructions -> a system message,
// function tools, tool_choice, text.format, reasoning, max_output_tokens); this file owns the way back:
// the response object and, when streaming, the event sequence (response.created, response.in_progress,
// response.output_item.added, response.content_part.added, response.output_text.delta / .done,
// response.reasoning_text.delta / .done, response.function_call_arguments.delta / .done,
// response.output_item.done, response.completed (status "incomplete" when cut by max_output_tokens)),
// each with its sequence_number.
// Must not: talk to sockets or the engine (generation.cc does).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/request.h"
#include "server/openai_api.h"
#include "server/output_parser.h"

namespace polylora::server {

struct ResponsesUsage {
  int64_t input_tokens = 0, output_tokens = 0, cached_tokens = 0;
};

class ResponsesWriter {
 public:
  ResponsesWriter(const ParsedRequest& request, std::string id, int64_t created_at);
  // Streaming: the opening events.
  std::string start();
  // Streaming: the events of one parsed delta (items are opened and closed as the output moves on).
  std::string on_delta(const OutputDelta& delta);
  // Streaming: closes the open item and ends with response.completed.
  std::string finish(FinishReason reason, const ResponsesUsage& usage);
  // Not streaming: the response object of a whole, parsed output.
  // `logprobs`: the output's logprobs in chat form (include "message.output_text.logprobs"), else null.
  nlohmann::ordered_json response(const OutputParser::Result& result, FinishReason reason,
                                  const ResponsesUsage& usage,
                                  nlohmann::ordered_json logprobs = nullptr) const;

 private:
  enum class ItemKind { kNone, kReasoning, kMessage, kCall };
  nlohmann::ordered_json base(const std::string& status) const;
  std::string event(const char* type, nlohmann::ordered_json fields);
  std::string close_item();
  std::string open_item(ItemKind kind, const OutputDelta::Call* call);

  const ParsedRequest& request_;
  std::string id_;
  int64_t created_at_ = 0;
  int64_t sequence_ = 0;
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();  // finished items
  ItemKind open_ = ItemKind::kNone;
  nlohmann::ordered_json item_;  // the open item
  std::string text_;             // its text so far (output text, reasoning, or arguments)
  size_t open_call_ = 0;         // index of the open call
  bool parallel_ = true;
};

}  // namespace polylora::server
