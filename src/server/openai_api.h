// server/openai_api.h: the OpenAI / vLLM request and response formats of /v1/completions and
// /v1/chat/completions: JSON body -> engine requests (validated, fields named in errors), and engine
// outputs -> response objects and streamed chunks (the pieces built in response_json.cc). The only place
// completion JSON is built.
// Must not: talk to sockets or the engine (http_server.cc does).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "api/request.h"
#include "config/generation_config.h"
#include "server/output_parser.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace polylora::server {

enum class ApiKind { kCompletion, kChat, kResponses };

// use_beam_search (vLLM's BeamSearchParams; server/beam_search.h runs it): width is n; max_tokens and
// logprobs come from the request's sampling.
struct BeamSearchOptions {
  int64_t width = 1;
  double length_penalty = 1.0;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
};

// A parsed completion or chat request: one engine request per prompt (the engine fans out n).
struct ParsedRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;    // as the client named it (base model name or adapter)
  std::string adapter;  // empty: base model
  std::vector<EngineRequest> prompts;
  std::vector<std::string> prompt_texts;  // for echo
  std::string chat_echo;                  // chat echo: the final message's content when it is the assistant's
  std::string request_id;                 // the client's request_id field (empty: none)
  std::string response_id;                // /v1/responses: the body's request_id, the response's id as given
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;
  bool echo = false;
  // Completions: echo with max_tokens 0 (the prompt alone; one token made and dropped).
  bool echo_only = false;
  bool return_tokens_as_token_ids = false;
  // vLLM's return_token_ids: the prompt's token ids (chat: the response's / first chunk's prompt_token_ids;
  // completions: each choice's) and each choice's generated ids (streamed: each chunk's new ones) as
  // token_ids.
  bool return_token_ids = false;
  std::string role = "assistant";  // chat: the role of the generated message (vLLM's get_chat_request_role)
  int64_t n = 1;
  // chat: how the generated text is split into reasoning, content and tool calls (server/output_parser.h)
  std::optional<OutputParserOptions> output_parser;  // nullopt: all of it is content
  bool parallel_tool_calls = true;                    // false: only the first tool call is returned
  bool include_reasoning = true;                      // false: the parsed reasoning is left out (vLLM)
  std::optional<std::string> output_schema;           // tool_choice required / named: the schema it follows
  nlohmann::ordered_json responses;                   // /v1/responses: the request's fields echoed back
  std::optional<int64_t> logprobs;  // completions: top-N; chat: top_logprobs when logprobs is true
  std::optional<int64_t>
      prompt_logprobs;  // as the client asked (echo + logprobs may ask the engine for more)
  std::optional<BeamSearchOptions> beam_search;  // use_beam_search: each prompt runs as a BeamSearch
};

struct ParseContext {
  const tokenizer::Tokenizer* tokenizer = nullptr;  // may be null (token-id prompts only)
  const ChatTemplate* chat_template = nullptr;      // the default template (may be null)
  std::vector<std::string> served_model_names;
  std::function<bool(const std::string&)> has_adapter;
  int64_t max_model_len = 0;
  int64_t vocab_size = 0;  // token ids must be below it (0: unchecked)
  // Server flags that set request defaults (vLLM's frontend flags, docs/vllm-flags.md).
  const GenerationDefaults* generation_defaults = nullptr;  // --generation-config: fields a request omits
  std::string response_role = "assistant";                  // --response-role
  bool return_tokens_as_token_ids = false;                  // --return-tokens-as-token-ids
  bool force_include_usage = false;                         // --enable-force-include-usage
  nlohmann::ordered_json default_chat_template_kwargs;      // --default-chat-template-kwargs (null: none)
  // --enable-auto-tool-choice, --tool-call-parser, --reasoning-parser
  bool enable_auto_tool_choice = false;
  bool exclude_tools_when_tool_choice_none = false;  // --exclude-tools-when-tool-choice-none
  // --chat-template-content-format: string or openai; none (auto) takes the template's own
  // (ChatTemplate::content_format, vLLM's detection).
  std::optional<ChatContentFormat> content_format;
  ToolParserKind tool_parser = ToolParserKind::kNone;
  ReasoningParserKind reasoning_parser = ReasoningParserKind::kNone;
};

// The top-level fields a route accepts (vLLM's protocol, less what polylora does not implement); any other
// field is refused with a 400 naming it. "/v1/completions" or "/v1/chat/completions".
const std::vector<std::string>& known_fields(ApiKind kind);

// The request's `model` (when given) names the served model or a registered adapter: else the 404 of the
// completion routes (/tokenize and /detokenize check it too, as vLLM's _check_model).
void check_model(const nlohmann::ordered_json& body, const ParseContext& ctx);
// Throws polylora::Error (kInvalid -> 400, kNotFound -> 404) naming the offending field.
ParsedRequest parse_completion(const nlohmann::ordered_json& body, const ParseContext& ctx);
ParsedRequest parse_chat(const nlohmann::ordered_json& body, const ParseContext& ctx);
// POST /v1/responses (server/responses_api.cc): the body as a chat request, kind kResponses.
ParsedRequest parse_responses(const nlohmann::ordered_json& body, const ParseContext& ctx);

// Accumulated state of one choice while streaming or collecting.
struct ChoiceState {
  std::string text;
  size_t text_chars = 0;  // characters in text (completion logprobs' text_offset counts them)
  std::vector<int32_t> token_ids;
  std::vector<LogprobEntry> logprobs;
  std::optional<FinishReason> finish_reason;
  std::optional<StopReason> stop_reason;
  bool role_sent = false;
  bool prompt_ids_sent = false;  // streamed completions with return_token_ids: the first chunk carried them
  bool echo_sent = false;        // streamed completions with echo: the first chunk carried the prompt
  std::optional<OutputParser> parser;   // streaming chat with a parser: the text so far, split
  std::vector<std::string> tool_call_ids;  // ids of the tool calls announced
};

// A chat delta (streamed) from a parser's delta: reasoning (as reasoning and reasoning_content), content, and
// tool-call deltas as OpenAI sends them (the first with index, id, type and the name; then argument
// fragments). New call ids are appended to `ch.tool_call_ids`. `parallel`: false drops every call after the
// first.
nlohmann::ordered_json chat_delta_json(const OutputDelta& delta, ChoiceState& ch, bool parallel);
// The tool_calls list of a chat message, with new ids.
nlohmann::ordered_json tool_calls_json(const std::vector<ParsedToolCall>& calls, bool parallel);
// The finish reason of a parsed chat choice: "tool_calls" when it called tools and stopped on its own.
std::string chat_finish_reason(FinishReason reason, bool called_tools, const OutputParserOptions& parser);
std::string tool_call_id();

// Builders. `token_text(id)` renders one token for logprobs.
nlohmann::ordered_json completion_logprobs_json(const std::vector<LogprobEntry>& entries,
                                                const ParsedRequest& req, const tokenizer::Tokenizer* tok,
                                                size_t text_offset_start);  // in characters
nlohmann::ordered_json chat_logprobs_json(const std::vector<LogprobEntry>& entries, const ParsedRequest& req,
                                          const tokenizer::Tokenizer* tok);
// `max_top`: alternatives per position kept (the engine may have computed more).
nlohmann::ordered_json prompt_logprobs_json(const std::vector<std::optional<LogprobEntry>>& entries,
                                            const tokenizer::Tokenizer* tok, size_t max_top);
// Completions logprobs with echo: the prompt's tokens first (the first one null, as it has no context),
// then the generated ones; text offsets count from the start of the prompt text.
nlohmann::ordered_json completion_echo_logprobs_json(const std::vector<int32_t>& prompt_ids,
                                                     const std::vector<std::optional<LogprobEntry>>& prompt,
                                                     const std::vector<LogprobEntry>& generated,
                                                     const ParsedRequest& req,
                                                     const tokenizer::Tokenizer* tok);
// A stop token id as a number, a stop string as a string, null when neither stopped the sequence.
nlohmann::ordered_json stop_reason_json(const std::optional<StopReason>& reason);
nlohmann::ordered_json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens);
std::string token_text(int32_t id, const ParsedRequest& req, const tokenizer::Tokenizer* tok);

}  // namespace polylora::server
