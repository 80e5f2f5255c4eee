// fuzz-sources: src/server/output_parser.cc src/server/qwen3_coder_tools.cc src/server/pythonic_tools.cc
// tests/fuzz/output_parser_fuzz.cc: libFuzzer target for the reasoning and tool-call parsers
// (server/output_parser.h) on arbitrary model text. Byte 0 picks the tool parser and byte 1 the reasoning
// parser and the chunk sizes; the rest is the text, fed in those chunks. Owns: proving every parser
// finishes on any text, that what a stream sends never has to be taken back (the content and reasoning sent
// are prefixes of the whole parse's, every call is announced before its arguments, in order), and that a
// streamed answer equals the whole one when no call was broken.
// Must not: catch anything (any exception or crash is a finding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "server/output_parser.h"

using polylora::server::OutputDelta;
using polylora::server::OutputParser;
using polylora::server::OutputParserOptions;
using polylora::server::ReasoningParserKind;
using polylora::server::ToolParserKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const ToolParserKind kTools[] = {ToolParserKind::kNone,     ToolParserKind::kHermes,
                                          ToolParserKind::kOpenai,   ToolParserKind::kLlama3Json,
                                          ToolParserKind::kMistral,  ToolParserKind::kQwen3Coder,
                                          ToolParserKind::kRequired, ToolParserKind::kNamed,
                                          ToolParserKind::kPythonic, ToolParserKind::kLlama4Pythonic};
  static const ReasoningParserKind kReasoning[] = {ReasoningParserKind::kNone, ReasoningParserKind::kQwen3,
                                                   ReasoningParserKind::kDeepSeekR1,
                                                   ReasoningParserKind::kGptOss};
  OutputParserOptions o;
  o.tools = kTools[data[0] % (sizeof kTools / sizeof kTools[0])];
  o.reasoning = kReasoning[data[1] % 4];
  o.starts_in_reasoning = (data[1] & 4) != 0;
  o.named_function = "f";
  o.tools_json =
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {)"
      R"("a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "boolean"}, "d": {"type": "object"},)"
      R"("e": {"type": "string"}, "g": {"type": ["array", "null"]}}}}}])";
  const size_t chunk = 1 + (data[1] >> 3);
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);

  OutputParser p(o);
  std::string reasoning, content;
  std::vector<std::string> names, args;
  auto take = [&](const OutputDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    for (const auto& c : d.calls) {
      if (c.is_new) {
        if (c.index != names.size()) std::abort();
        names.push_back(c.name);
        args.emplace_back();
      } else if (c.index >= names.size()) {
        std::abort();
      }
      args[c.index] += c.arguments;
    }
  };
  for (size_t pos = 0; pos < text.size(); pos += chunk) take(p.feed(text.substr(pos, chunk)));
  take(p.finish());
  const OutputParser::Result whole = OutputParser::parse(o, text);
  const OutputParser::Result& r = p.result();
  // The stream's own totals equal the whole parse of the same text.
  if (r.content != whole.content || r.reasoning != whole.reasoning ||
      r.tool_calls.size() != whole.tool_calls.size())
    std::abort();
  for (size_t i = 0; i < r.tool_calls.size(); ++i)
    if (r.tool_calls[i].name != whole.tool_calls[i].name ||
        r.tool_calls[i].arguments != whole.tool_calls[i].arguments)
      std::abort();
  // What was sent is a prefix of the totals (nothing is taken back) ...
  if (whole.reasoning.compare(0, reasoning.size(), reasoning) != 0) std::abort();
  if (whole.content.compare(0, content.size(), content) != 0) std::abort();
  // ... and, when the calls the stream announced are the final ones, equal to them.
  if (names.size() == whole.tool_calls.size()) {
    bool same = true;
    for (size_t i = 0; i < names.size(); ++i)
      same = same && names[i] == whole.tool_calls[i].name && args[i] == whole.tool_calls[i].arguments;
    if (same && (reasoning != whole.reasoning || content != whole.content)) std::abort();
  }
  return 0;
}
