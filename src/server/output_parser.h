// server/output_parser.h: splits a chat model's generated text into reasoning, content and tool calls, as
// vLLM's reasoning parsers (--reasoning-parser qwen3 | openai_gptoss) and tool-call parsers
// (--tool-call-parser hermes | openai | llama3_json | mistral | qwen3_coder | pythonic |
// llama4_pythonic) do, fed in chunks of any size (a
// chunk may end inside a marker such as "<tool_call>" or "<|channel|>"): each feed returns what can be sent
// now, and what has been sent is never taken back. Also the output forms of tool_choice "required" (a JSON
// array of {"name", "parameters"}) and of a named function (the arguments object alone).
// Must not: know about HTTP, requests or the engine; build response JSON (generation.cc does).
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace polylora::server {

enum class ToolParserKind {
  kNone,        // no tool-call parsing: everything after reasoning is content
  kHermes,      // Qwen / Hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, several allowed
  kOpenai,      // GPT-OSS harmony: a commentary message to=functions.NAME whose body is the arguments
  kLlama3Json,  // Llama 3: [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]
  kMistral,     // [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] or [TOOL_CALLS]NAME[ARGS]{...}
  kQwen3Coder,  // Qwen3-Coder's XML: <tool_call><function=NAME><parameter=P>v</parameter>...</function>...
  kPythonic,    // Llama 3.2 and others: [get_weather(city="Paris"), f()] (server/pythonic_tools.h)
  kLlama4Pythonic,  // Llama 4: the same, optionally inside <|python_start|> ... <|python_end|>
  kRequired,        // tool_choice "required": the whole output is [{"name": ..., "parameters": {...}}, ...]
  kNamed,           // tool_choice naming a function: the whole output is its arguments object
};

enum class ReasoningParserKind {
  kNone,
  kQwen3,       // <think>reasoning</think>content (the <think> may be in the prompt)
  kDeepSeekR1,  // the same tags, the output always starting inside the reasoning (vLLM's deepseek_r1)
  kGptOss,      // harmony channels: analysis -> reasoning, final (and commentary preambles) -> content
};

// vLLM's names; nullopt for a name polylora does not know.
std::optional<ToolParserKind> tool_parser_from_name(std::string_view name);
std::optional<ReasoningParserKind> reasoning_parser_from_name(std::string_view name);
// The names accepted by the two flags, for error messages and --help.
const char* tool_parser_names();
const char* reasoning_parser_names();
// Parsers whose markers are special tokens: the text must be detokenized with them kept.
bool needs_special_tokens(ToolParserKind tools, ReasoningParserKind reasoning);

struct OutputParserOptions {
  ReasoningParserKind reasoning = ReasoningParserKind::kNone;
  ToolParserKind tools = ToolParserKind::kNone;
  std::string named_function;         // kNamed: the function's name
  bool starts_in_reasoning = false;   // qwen3: the prompt ends inside an open <think>
  std::string tools_json;             // kQwen3Coder: the request's tools (their parameters' types)
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text, as the model wrote it
};

// What one feed adds. A call's first delta has is_new set and carries its name; later ones only
// argument text. Concatenating every delta gives the totals of OutputParser.
struct OutputDelta {
  struct Call {
    size_t index = 0;
    bool is_new = false;
    std::string name;
    std::string arguments;
  };
  std::string reasoning;
  std::string content;
  std::vector<Call> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class OutputParser {
 public:
  explicit OutputParser(OutputParserOptions options);
  // Appends generated text; returns the part that is decided (a possible marker prefix at the end is held).
  OutputDelta feed(std::string_view text);
  // The output has ended: releases whatever was held. A tool call whose text does not parse becomes
  // content in the totals (result()), as vLLM's non-streaming parsers do.
  OutputDelta finish();

  struct Result {
    std::string reasoning;
    std::string content;
    std::vector<ParsedToolCall> tool_calls;
    bool has_reasoning = false;  // a reasoning section was present (even empty)
  };
  // The whole output parsed at once (valid after finish(); what a non-streamed response returns).
  const Result& result() const { return final_; }
  const std::string& text() const { return text_; }

  // Parses a complete output in one go (finish() on the whole text).
  static Result parse(const OutputParserOptions& options, std::string_view text);

 private:
  struct Snapshot {
    std::string reasoning;
    std::string content;
    std::vector<ParsedToolCall> calls;  // names known; arguments so far
    std::vector<bool> calls_valid;      // final: the call's text parsed
    bool has_reasoning = false;
  };
  Snapshot snapshot(bool final) const;
  OutputDelta diff(const Snapshot& now);

  OutputParserOptions options_;
  // kQwen3Coder: per function, its parameters' declared types (qwen3_coder_tools.h's ToolParamTypes).
  std::map<std::string, std::map<std::string, std::string>> param_types_;
  std::string text_;
  Snapshot sent_;
  Result final_;
};

// The JSON Schema (as text) that tool_choice "required" constrains the output to: an array of at least
// one {"name": one of the tools, "parameters": that tool's schema}. `tools_json` is the request's tools
// list (OpenAI chat form) as JSON text. The named form's schema is the function's parameters.
std::string required_tools_schema(std::string_view tools_json);

}  // namespace polylora::server
