// tests/unit/config/cli_values_test.cc: vLLM's human-readable integers, the flat YAML of --config files
// and their expansion into flags, and argv normalisation (-tp, underscores).
#include "config/cli_values.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace polylora {
namespace {

TEST(HumanInt, PlainAndSuffixes) {
  EXPECT_EQ(parse_human_int("4096", "--max-model-len"), 4096);
  EXPECT_EQ(parse_human_int(" 17 ", "--x"), 17);
  EXPECT_EQ(parse_human_int("-1", "--x"), -1);
  EXPECT_EQ(parse_human_int("1k", "--x"), 1000);
  EXPECT_EQ(parse_human_int("1K", "--x"), 1024);
  EXPECT_EQ(parse_human_int("32k", "--x"), 32000);
  EXPECT_EQ(parse_human_int("32K", "--x"), 32768);
  EXPECT_EQ(parse_human_int("1.5k", "--x"), 1500);
  EXPECT_EQ(parse_human_int("25.6k", "--x"), 25600);
  EXPECT_EQ(parse_human_int("1m", "--x"), 1000000);
  EXPECT_EQ(parse_human_int("1M", "--x"), 1 << 20);
  EXPECT_EQ(parse_human_int("2g", "--x"), 2000000000);
  EXPECT_EQ(parse_human_int("2G", "--x"), int64_t{2} << 30);
  EXPECT_EQ(parse_human_int("1T", "--x"), int64_t{1} << 40);
}

TEST(HumanInt, Errors) {
  for (const char* bad : {"", "k", "1.5K", "abc", "1x", "1 k", "1kk", "--1", "1e3", "99999999999999999999"}) {
    try {
      parse_human_int(bad, "--max-model-len");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--max-model-len"), std::string::npos) << e.what();
    }
  }
  try {
    parse_human_int("1.5K", "--max-model-len");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1.5k"), std::string::npos) << e.what();  // suggests the decimal form
  }
}

TEST(FlatYaml, ScalarsListsCommentsQuotes) {
  const char* text =
      "# vLLM config\n"
      "model: org/name\n"
      "max_model_len: 32k   # a comment\n"
      "port: 8001\n"
      "enable-lora: true\n"
      "enable-prefix-caching: false\n"
      "served-model-name: [a, \"b c\"]\n"
      "lora-modules:\n"
      "  - x=/p/x\n"
      "  - 'y=/p/y'\n"
      "\n"
      "chat-template: \"{{ messages }}\"\n"
      "override-generation-config: {\"temperature\": 0.5}\n";
  auto e = parse_flat_yaml(text, "c.yaml");
  ASSERT_EQ(e.size(), 9u);
  EXPECT_EQ(e[0].key, "model");
  EXPECT_EQ(e[0].values, std::vector<std::string>{"org/name"});
  EXPECT_EQ(e[1].values, std::vector<std::string>{"32k"});
  EXPECT_TRUE(e[3].is_bool());
  EXPECT_EQ(e[5].values, (std::vector<std::string>{"a", "b c"}));
  EXPECT_TRUE(e[6].is_list);
  EXPECT_EQ(e[6].values, (std::vector<std::string>{"x=/p/x", "y=/p/y"}));
  EXPECT_EQ(e[7].values, std::vector<std::string>{"{{ messages }}"});
  EXPECT_EQ(e[8].values, std::vector<std::string>{"{\"temperature\": 0.5}"});

  auto args = config_to_args(
      e, [](const std::string& k) { return k == "port"; },
      [](const std::string& k) { return k == "enable-prefix-caching"; });
  std::vector<std::string> want = {"--model", "org/name", "--max-model-len", "32k", "--enable-lora",
                                   "--no-enable-prefix-caching", "--served-model-name", "a",
                                   "--served-model-name", "b c", "--lora-modules", "x=/p/x", "--lora-modules",
                                   "y=/p/y", "--chat-template", "{{ messages }}",
                                   "--override-generation-config", "{\"temperature\": 0.5}"};
  EXPECT_EQ(args, want);
}

TEST(FlatYaml, RejectsNesting) {
  EXPECT_THROW(parse_flat_yaml("a:\n  b: 1\n", "c.yaml"), Error);
  EXPECT_THROW(parse_flat_yaml("- x\n", "c.yaml"), Error);
  EXPECT_THROW(parse_flat_yaml("just text\n", "c.yaml"), Error);
  EXPECT_THROW(parse_flat_yaml("a: |\n  x\n", "c.yaml"), Error);
  try {
    parse_flat_yaml("a: 1\nb:\n  c: 2\n", "c.yaml");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml:3"), std::string::npos) << e.what();
  }
}

TEST(NormalizeArgs, VllmForms) {
  auto out = normalize_vllm_args({"--max_model_len", "1k", "-tp", "1", "-pp=1", "-dp", "1", "-q", "mxfp4",
                                  "--override_generation_config={\"max_new_tokens\": 3}", "-O3", "org/a_b"});
  std::vector<std::string> want = {"--max-model-len", "1k", "--tensor-parallel-size", "1",
                                   "--pipeline-parallel-size=1", "--data-parallel-size", "1", "--quantization",
                                   "mxfp4", "--override-generation-config={\"max_new_tokens\": 3}",
                                   "--compilation-config=3", "org/a_b"};
  EXPECT_EQ(out, want);
}

TEST(NormalizeArgs, LongerShortForms) {
  // -dp must not swallow -dpl / -dpr, and values that merely start with a short form stay as they are.
  auto out = normalize_vllm_args({"-dcp", "2", "-dpl=1", "-dpr", "0", "-dpa", "h", "-dpp", "9", "-dpb", "mp",
                                  "-asc", "1", "-ep", "-tpx", "-dp", "1"});
  std::vector<std::string> want = {"--decode-context-parallel-size", "2", "--data-parallel-size-local=1",
                                   "--data-parallel-rank", "0", "--data-parallel-address", "h",
                                   "--data-parallel-rpc-port", "9", "--data-parallel-backend", "mp",
                                   "--api-server-count", "1", "--enable-expert-parallel", "-tpx",
                                   "--data-parallel-size", "1"};
  EXPECT_EQ(out, want);
}

}  // namespace
}  // namespace polylora
