// fuzz-sources: src/tokenizer/jinja_*.cc src/tokenizer/chat_template.cc src/tokenizer/chat_template_format.cc
// tests/fuzz/jinja_fuzz.cc: fuzz target for the chat-template (Jinja) compiler and renderer: the bytes are a
// template, compiled and rendered with a small fixed conversation. polylora::Error (syntax, runtime or
// raise_exception) is the expected outcome for bad input; a crash, hang or sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja_renderer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const polylora::ChatTemplateInputs kInputs = [] {
    polylora::ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "  Hi \u00e9 \ud83d\ude00 "},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [true, null, 2.5]}}}]},
      {"role": "tool", "content": "{\"ok\": true}"},
      {"role": "assistant", "content": "Done.", "reasoning_content": "think"}
    ])");
    in.tools = nlohmann::ordered_json::parse(
        R"([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}])");
    in.add_generation_prompt = true;
    in.bos_token = "<s>";
    in.eos_token = "</s>";
    in.kwargs = {{"reasoning_effort", "high"}, {"enable_thinking", false}};
    in.date = "2026-01-01";
    return in;
  }();
  // Smaller budgets than a server's, so that every input finishes quickly under the sanitizers.
  static const polylora::jinja::RenderLimits kLimits = [] {
    polylora::jinja::RenderLimits limits;
    limits.max_steps = 200'000;
    limits.max_output_bytes = size_t{4} << 20;
    limits.max_built_bytes = size_t{64} << 20;
    limits.max_built_items = 500'000;
    return limits;
  }();
  std::string source(reinterpret_cast<const char*>(data), size);
  try {
    polylora::ChatTemplate tmpl = polylora::ChatTemplate::compile(source);
    tmpl.render(kInputs, kLimits);
  } catch (const polylora::Error&) {
  }
  return 0;
}
