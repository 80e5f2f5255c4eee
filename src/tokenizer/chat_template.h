// tokenizer/chat_template.h: Hugging Face chat templates (Jinja) compiled once and rendered per request.
// Owns: ChatTemplateInputs (messages, tools, generation prompt, special tokens, extra kwargs, a pinned date)
// and ChatTemplate, which renders with HF's environment (trim_blocks, lstrip_blocks, loop controls,
// raise_exception, strftime_now, tojson as json.dumps(ensure_ascii=False)).
// Must not: tokenize, or know about requests beyond the JSON values it is given. JSON objects must be
// nlohmann::ordered_json so key order (which tojson prints) is the client's order.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/jinja_value.h"

namespace polylora {

namespace jinja {
struct Template;
struct RenderLimits;
}  // namespace jinja

// raise_exception(msg) in a template (a polylora::Error): what() is exactly the template's message.
using TemplateRaisedError = jinja::TemplateRaisedError;

// How a template wants message content (vLLM's --chat-template-content-format): kString, the text parts
// joined with "\n"; kOpenai, a list of {"type": "text", "text": ...} parts (a string content becomes one).
enum class ChatContentFormat { kString, kOpenai };

// vLLM's automatic choice (chat_template_format.cc): kOpenai when the template loops over a message's
// content, else kString.
ChatContentFormat detect_content_format(const jinja::Template& tree);

struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null when absent (the template sees None)
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // extra variables, e.g. reasoning_effort
  std::optional<std::string> date;  // "YYYY-MM-DD" seen by strftime_now; the current date when absent
};

class ChatTemplate {
 public:
  // Throws polylora::Error ("template syntax error at line N: ...") when the source is not valid Jinja.
  static ChatTemplate compile(std::string source);

  // Thread-safe. Throws TemplateRaisedError (message verbatim) for raise_exception, and
  // polylora::Error ("template error at line N: ...") for any other failure.
  std::string render(const ChatTemplateInputs& inputs) const;
  // The same, within explicit step/depth/size limits (the defaults suit a server).
  std::string render(const ChatTemplateInputs& inputs, const jinja::RenderLimits& limits) const;

  const std::string& source() const { return source_; }
  // detect_content_format of this template, found once at compile().
  ChatContentFormat content_format() const { return content_format_; }

 private:
  std::string source_;
  ChatContentFormat content_format_ = ChatContentFormat::kString;
  std::shared_ptr<const jinja::Template> tree_;
};

}  // namespace polylora
