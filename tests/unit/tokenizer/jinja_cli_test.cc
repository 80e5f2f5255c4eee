// tests/unit/tokenizer/jinja_cli_test.cc: `polylora chat-template` on JSON lines: one output line per input,
// {"rendered": ...} or {"error": ...}, with processing continuing after a bad line.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace polylora {
namespace {

std::vector<nlohmann::json> run_cli(const std::string& args, const std::string& input) {
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("jinja_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "in.jsonl") << input;
  std::string cmd =
      std::string(POLYLORA_BINARY) + " chat-template " + args + " < " + (dir / "in.jsonl").string();
  std::vector<nlohmann::json> lines;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  if (!pipe) return lines;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  EXPECT_EQ(::pclose(pipe), 0) << cmd;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    lines.push_back(nlohmann::json::parse(out.substr(pos, nl - pos)));
    pos = nl == std::string::npos ? out.size() : nl + 1;
  }
  std::filesystem::remove_all(dir);
  return lines;
}

TEST(ChatTemplateCli, RendersEachLine) {
  if (!std::filesystem::exists(POLYLORA_BINARY)) GTEST_SKIP() << "build the polylora binary first";
  std::string tmpl = std::string(POLYLORA_TEST_DATA) + "/chat_templates/llama-2-chat.jinja";
  std::string input =
      R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true})"
      "\nthis is not json\n"
      R"({"messages": [{"role": "assistant", "content": "first"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}]})"
      "\n";
  auto lines = run_cli("--template " + tmpl + " --bos-token '<s>' --eos-token '</s>'", input);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0].value("rendered", "?"), "\n\n\n        <s>[INST] Hi [/INST]\n");
  EXPECT_TRUE(lines[1].contains("error"));
  EXPECT_EQ(lines[2].value("error", "?"),
            "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_EQ(lines[3].value("rendered", "?"), "\n\n\n        <s>[INST] A [/INST]\n\n\n         B </s>\n");
}

TEST(ChatTemplateCli, PinnedDateAndKwargs) {
  if (!std::filesystem::exists(POLYLORA_BINARY)) GTEST_SKIP() << "build the polylora binary first";
  std::string tmpl = std::string(POLYLORA_TEST_DATA) + "/chat_templates/gpt-oss.jinja";
  auto lines =
      run_cli("--template " + tmpl + " --date 2026-01-01",
              R"({"messages": [{"role": "user", "content": "Hi"}], "kwargs": {"reasoning_effort": "low"}})"
              "\n");
  ASSERT_EQ(lines.size(), 1u);
  std::string rendered = lines[0].value("rendered", "");
  EXPECT_NE(rendered.find("Current date: 2026-01-01"), std::string::npos) << lines[0].dump();
  EXPECT_NE(rendered.find("Reasoning: low"), std::string::npos) << lines[0].dump();
}

}  // namespace
}  // namespace polylora
