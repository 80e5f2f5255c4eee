// tests/unit/apps/generate_cli_test.cc: `polylora generate` end to end (the real binary): token-id prompts
// print the reference greedy ids; --requests JSONL gives one JSON line per request, in input order, with
// output_ids, text, finish_reason, logprobs when asked, and an error line for a bad request.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string run(const std::string& args, int* status) {
  std::string cmd = std::string(POLYLORA_BINARY) + " " + args + " 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  *status = pclose(p);
  return out;
}

const std::string kModel = std::string(POLYLORA_TEST_DATA) + "/models/llama-tiny";

// Reads an I32 tensor from reference.safetensors (8-byte header length, JSON header, data).
std::vector<int> read_i32(const std::string& path, const std::string& name) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  auto h = nlohmann::json::parse(header);
  auto offsets = h[name]["data_offsets"];
  size_t begin = offsets[0].get<size_t>(), end = offsets[1].get<size_t>();
  std::vector<int> out((end - begin) / 4);
  f.seekg(static_cast<std::streamoff>(8 + n + begin));
  f.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(end - begin));
  return out;
}

// Reference prompt 1 as --prompt-ids text.
std::string reference_prompt_ids(const std::string& model = kModel) {
  nlohmann::json ref;
  std::ifstream(model + "/reference.json") >> ref;
  std::string ids = std::to_string(ref["prompts"][1][0].get<int>());
  for (size_t i = 1; i < ref["prompts"][1].size(); ++i)
    ids += "," + std::to_string(ref["prompts"][1][i].get<int>());
  return ids;
}

// generate's comma-separated ids output against the reference's first 5 greedy ids for prompt 1.
void expect_greedy_prefix(const std::string& out, const std::string& model = kModel) {
  std::vector<int> got;
  std::stringstream ss(out);
  for (std::string item; std::getline(ss, item, ',');) got.push_back(std::stoi(item));
  std::vector<int> greedy = read_i32(model + "/reference.safetensors", "base.greedy.1");
  EXPECT_EQ(got, std::vector<int>(greedy.begin(), greedy.begin() + 5)) << out;
}

TEST(GenerateCli, PromptIdsPrintGreedyIds) {
  int status = 0;
  std::string out = run(
      "generate --model " + kModel + " --prompt-ids " + reference_prompt_ids() + " --max-tokens 5", &status);
  ASSERT_EQ(status, 0);
  expect_greedy_prefix(out);
}

// vLLM's short flags reach generate too: -tp 2 (two CPU ranks) prints the same greedy ids as the reference,
// and a size the model's heads do not allow is refused naming the long flag.
TEST(GenerateCli, ShortTensorParallelFlag) {
  int status = 0;
  std::string out = run("generate --model " + kModel + " --device cpu -tp 2 --prompt-ids " +
                            reference_prompt_ids() + " --max-tokens 5",
                        &status);
  ASSERT_EQ(status, 0) << out;
  expect_greedy_prefix(out);
  std::string cmd = std::string(POLYLORA_BINARY) + " generate --model " + kModel +
                    " --device cpu -tp 3 --prompt-ids 1 --max-tokens 1 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string err;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) err.append(buf.data(), n);
  EXPECT_NE(pclose(p), 0);
  EXPECT_NE(err.find("--tensor-parallel-size 3"), std::string::npos) << err;
}

// --enable-expert-parallel (and vLLM's -ep) with -tp on the CPU: a MoE model's experts spread over the
// ranks give the reference greedy ids; the log says how many whole experts each rank holds.
TEST(GenerateCli, ExpertParallelFlag) {
  const std::string moe = std::string(POLYLORA_TEST_DATA) + "/models/qwen3-moe-tiny";
  for (const std::string flags : {"-tp 2 --enable-expert-parallel", "-tp 4 -ep"}) {
    const std::string log_path = ::testing::TempDir() + "/generate_ep.log";
    const std::string cmd = std::string(POLYLORA_BINARY) + " generate --model " + moe + " --device cpu " +
                            flags + " --prompt-ids " + reference_prompt_ids(moe) + " --max-tokens 5 2>" +
                            log_path;
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    std::array<char, 4096> buf;
    while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    ASSERT_EQ(pclose(p), 0) << out;
    std::stringstream log;
    log << std::ifstream(log_path).rdbuf();
    const std::string experts = flags.find("-tp 2") == 0 ? "4 whole experts each" : "2 whole experts each";
    EXPECT_NE(log.str().find(experts + " (expert parallelism)"), std::string::npos) << log.str();
    expect_greedy_prefix(out, moe);
  }
}

TEST(GenerateCli, RequestsFile) {
  std::string path = ::testing::TempDir() + "/requests.jsonl";
  {
    std::ofstream f(path);
    f << R"({"prompt_ids": [1, 2, 3], "max_tokens": 4, "temperature": 0, "ignore_eos": true})"
      << "\n";
    f << R"({"prompt": "Hello world", "adapter": "rs", "max_tokens": 3, "temperature": 0, "logprobs": 2, "ignore_eos": true})"
      << "\n";
    f << R"({"prompt_ids": [1, 2], "temperature": -1})"
      << "\n";
    f << R"({"prompt_ids": [4, 5], "max_tokens": 2, "n": 2, "temperature": 1.0, "seed": 3, "ignore_eos": true})"
      << "\n";
    f << "not json\n";
  }
  int status = 0;
  std::string out =
      run("generate --model " + kModel + " --lora rs=" + kModel + "/adapters/qv-r4-rslora --requests " + path,
          &status);
  ASSERT_EQ(status, 0) << out;
  std::vector<nlohmann::json> lines;
  std::stringstream ss(out);
  for (std::string line; std::getline(ss, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 5u) << out;
  EXPECT_EQ(lines[0]["output_ids"].size(), 4u);
  EXPECT_EQ(lines[0]["finish_reason"], "length");
  EXPECT_TRUE(lines[0]["text"].is_string());
  EXPECT_EQ(lines[1]["output_ids"].size(), 3u);
  ASSERT_EQ(lines[1]["logprobs"].size(), 3u);
  EXPECT_EQ(lines[1]["logprobs"][0]["top"].size(), 2u);
  EXPECT_NE(lines[2]["error"].get<std::string>().find("temperature"), std::string::npos) << lines[2].dump();
  ASSERT_EQ(lines[3]["outputs"].size(), 2u);
  EXPECT_TRUE(lines[4].contains("error"));
}

TEST(GenerateCli, BadFlagsAreClearErrors) {
  int status = 0;
  run("generate --model /nonexistent --prompt-ids 1", &status);
  EXPECT_NE(status, 0);
  run("generate --model " + kModel + " --prompt-ids 1,x", &status);
  EXPECT_NE(status, 0);
  run("generate --model " + kModel + " --adapter nope --prompt-ids 1", &status);
  EXPECT_NE(status, 0);
}

}  // namespace
