// tests/unit/tokenizer/jinja_chat_template_test.cc: every reference rendering of
// tests/data/chat_templates.json and tests/data/chat_templates_real.json (made with Hugging Face
// transformers) must be reproduced exactly, including the template's own raise_exception message where the
// reference failed.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tokenizer/chat_template.h"

namespace polylora {
namespace {

using Json = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "first difference at byte N: expected '...' got '...'" around the position where a and b diverge.
std::string describe_diff(const std::string& expected, const std::string& got) {
  size_t i = 0;
  while (i < expected.size() && i < got.size() && expected[i] == got[i]) ++i;
  size_t from = i > 40 ? i - 40 : 0;
  auto window = [&](const std::string& s) { return Json(s.substr(std::min(from, s.size()), 120)).dump(); };
  std::ostringstream out;
  out << "first difference at byte " << i << " (expected length " << expected.size() << ", got " << got.size()
      << ")\n  expected: ..." << window(expected) << "\n  got:      ..." << window(got);
  return out.str();
}

std::string strip_error_prefix(std::string message) {
  const std::string prefix = "TemplateError: ";
  if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  return message;
}

ChatTemplateInputs inputs_of(const Json& c) {
  ChatTemplateInputs in;
  in.messages = c.at("messages");
  in.tools = c.value("tools", Json());
  in.add_generation_prompt = c.value("add_generation_prompt", false);
  if (c.contains("bos_token") && c["bos_token"].is_string()) in.bos_token = c["bos_token"].get<std::string>();
  if (c.contains("eos_token") && c["eos_token"].is_string()) in.eos_token = c["eos_token"].get<std::string>();
  if (c.contains("kwargs") && c["kwargs"].is_object()) in.kwargs = c["kwargs"];
  if (c.contains("date") && c["date"].is_string()) in.date = c["date"].get<std::string>();
  return in;
}

// Renders one case; returns "" on a match, else a description of the mismatch.
std::string check_case(const ChatTemplate& tmpl, const Json& c) {
  ChatTemplateInputs in = inputs_of(c);
  bool expect_error = c.contains("error") && c["error"].is_string();
  try {
    std::string rendered = tmpl.render(in);
    if (expect_error) return "expected error '" + c["error"].get<std::string>() + "' but rendered";
    std::string expected = c.at("rendered").get<std::string>();
    if (rendered != expected) return describe_diff(expected, rendered);
  } catch (const TemplateRaisedError& e) {
    if (!expect_error) return std::string("unexpected raise_exception: ") + e.what();
    std::string expected = strip_error_prefix(c["error"].get<std::string>());
    if (e.what() != expected)
      return "error message differs: expected '" + expected + "' got '" + e.what() + "'";
  } catch (const Error& e) {
    return std::string(expect_error ? "expected a raise_exception, got: " : "unexpected error: ") + e.what();
  }
  return "";
}

TEST(JinjaChatTemplate, SmallReferenceCases) {
  Json cases = Json::parse(read_file(std::string(POLYLORA_TEST_DATA) + "/chat_templates.json"));
  ASSERT_FALSE(cases.empty());
  int matched = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Json& c = cases[i];
    ChatTemplate tmpl = ChatTemplate::compile(c.at("template").get<std::string>());
    std::string problem = check_case(tmpl, c);
    EXPECT_EQ(problem, "") << "chat_templates.json case " << i << " (tokenizer " << c.value("tokenizer", "?")
                           << ", add_generation_prompt=" << c.value("add_generation_prompt", false)
                           << "): " << problem;
    matched += problem.empty();
  }
  std::printf("chat_templates.json: %d/%zu cases match\n", matched, cases.size());
}

TEST(JinjaChatTemplate, RealTemplates) {
  Json cases = Json::parse(read_file(std::string(POLYLORA_TEST_DATA) + "/chat_templates_real.json"));
  ASSERT_FALSE(cases.empty());
  std::map<std::string, ChatTemplate> compiled;
  int matched = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Json& c = cases[i];
    std::string name = c.at("template_file").get<std::string>();
    auto it = compiled.find(name);
    if (it == compiled.end()) {
      std::string source = read_file(std::string(POLYLORA_TEST_DATA) + "/chat_templates/" + name);
      it = compiled.emplace(name, ChatTemplate::compile(source)).first;
    }
    std::string problem = check_case(it->second, c);
    EXPECT_EQ(problem, "") << name << " case " << i << " (conversation '" << c.value("conversation", "?")
                           << "', add_generation_prompt=" << c.value("add_generation_prompt", false)
                           << "): " << problem;
    matched += problem.empty();
  }
  std::printf("chat_templates_real.json: %d/%zu cases match\n", matched, cases.size());
}

}  // namespace
}  // namespace polylora
