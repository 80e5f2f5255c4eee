// server/qwen3_coder_tools.h: the tool calls of Qwen3-Coder's XML format, as vLLM's qwen3_coder parser
// (vllm/entrypoints/openai/tool_parsers/qwen3coder_tool_parser.py) reads them:
//
//   <tool_call>
//   <function=get_weather>
//   <parameter=city>
//   San Francisco
//   </parameter>
//   </function>
//   </tool_call>
//
// A parameter's value is raw text (one leading and one trailing newline dropped) converted by the type its
// tool declares in the request (`tools[].function.parameters.properties.NAME.type`): strings stay strings,
// int*/uint*/long*/short*/unsigned* become integers, num*/float* numbers (whole ones integers), bool/boolean/
// binary true exactly when the text is "true" in any case, object/array/dict*/list* JSON values; "null" in
// any case is null whatever the type; parameters the tool does not declare, and text that does not convert,
// stay strings. The arguments are the JSON object of the parameters in order, written as Python's
// json.dumps writes it (", " and ": " separators, non-ASCII kept), so they are vLLM's text. Used by
// output_parser.cc (--tool-call-parser qwen3_coder). Must not: know about HTTP, requests or the engine.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "server/output_parser.h"

namespace polylora::server {

// Per function name, its parameters' declared types (lower case, trimmed; "string" where a parameter
// declares none; a type that is not a string, such as a list, is kept as "<non-string>"). Functions the
// request does not list have no entry (every value is then a string).
using ToolParamTypes = std::map<std::string, std::map<std::string, std::string>>;

// The types of a request's `tools` (OpenAI chat form, JSON text); empty for anything else.
ToolParamTypes tool_param_types(std::string_view tools_json);

// A parameter's value as vLLM converts it, written as JSON (Python's json.dumps form). `type` is nullptr
// when the function does not declare the parameter.
std::string qwen3_coder_value_json(std::string_view raw, const std::string* type);

struct Qwen3CoderParse {
  std::string content;                   // text before the first <tool_call> (or <function=)
  std::vector<ParsedToolCall> calls;     // a call once its name is known; arguments so far
  bool whole_output_is_content = false;  // final only: a call did not parse (vLLM returns the text as is)
};

// The text after any reasoning. Not final: only what later text cannot change (a suffix that may become
// "<tool_call>" or "<function=" is held back from the content; a parameter counts once its end is seen,
// "}" once its function has ended), so every snapshot is a prefix of the final one.
Qwen3CoderParse parse_qwen3_coder(std::string_view s, bool final, const ToolParamTypes& types);

}  // namespace polylora::server
