// tests/unit/tokenizer/chat_content_format_test.cc: the chat template content format detected from a
// template (ChatTemplate::content_format, vLLM's --chat-template-content-format auto). Expected values were
// computed with vLLM's detection rule on jinja2's own syntax tree for these sources: "openai" when a
// template loops over the content of a message it got from `messages` (directly, through set aliases,
// slices, filters and loop conditions), "string" otherwise, and "string" where vLLM's rule asserts (a
// namespace or tuple target on the way).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tokenizer/chat_template.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

ChatContentFormat detect(const std::string& source) {
  return ChatTemplate::compile(source).content_format();
}

TEST(ChatContentFormat, LoopsOverMessageContentAreOpenai) {
  const char* openai[] = {
      "{% for message in messages %}{% for c in message['content'] %}{{ c.text }}{% endfor %}{% endfor %}",
      "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for part in m.content | "
      "selectattr('type', 'equalto', 'text') %}{{ part.text }}{% endfor %}{% endfor %}",
      "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}"
      "{{ p.text }}{% endfor %}{% endif %}{% endfor %}",
      "{%- set first = messages | first %}{%- set rest = messages | reject('equalto', first) | list %}{% for "
      "turn in rest if turn.role != 'system' %}{% for item in turn[\"content\"] %}{{ item[\"text\"] }}{% "
      "endfor "
      "%}{% endfor %}",
  };
  for (const char* s : openai) EXPECT_EQ(detect(s), ChatContentFormat::kOpenai) << s;
}

TEST(ChatContentFormat, EverythingElseIsString) {
  const char* string_form[] = {
      "{% for message in messages %}{{ message.content }}{% endfor %}",
      // messages[0] is not a loop variable over messages
      "{% for c in messages[0]['content'] %}{{ c.text }}{% endfor %}{% for m in messages %}{{ m.content }}"
      "{% endfor %}",
      // a macro's parameter is not tracked
      "{% macro render(m) %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endmacro %}{% for message in "
      "messages %}{{ render(message) }}{% endfor %}",
      // vLLM's rule asserts on a namespace target bound to messages, and on a tuple loop target
      "{% set ns = namespace(m=none) %}{% set ns.m = messages %}{% for message in messages %}{% for c in "
      "message.content %}{{ c.text }}{% endfor %}{% endfor %}",
      "{% for message in messages %}{% for k, v in message.content %}{{ v }}{% endfor %}{% endfor %}",
      // an alias cycle ends (vLLM's rule would loop)
      "{% set a = messages %}{% set messages = a %}{% for m in a %}{{ m.content }}{% endfor %}",
  };
  for (const char* s : string_form) EXPECT_EQ(detect(s), ChatContentFormat::kString) << s;
}

TEST(ChatContentFormat, TheFixtureTemplatesAreString) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(testing_util::data_dir() + "/chat_templates")) {
    if (e.path().extension() != ".jinja") continue;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    EXPECT_EQ(detect(ss.str()), ChatContentFormat::kString) << e.path();
    ++n;
  }
  EXPECT_GE(n, 9);
}

}  // namespace
}  // namespace polylora
