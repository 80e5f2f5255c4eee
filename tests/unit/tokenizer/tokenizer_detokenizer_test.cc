// tests/unit/tokenizer/tokenizer_detokenizer_test.cc: IncrementalDetokenizer streams every reference case
// (and random id sequences) one id at a time: each piece is valid UTF-8 and the pieces concatenate to
// exactly Tokenizer::decode.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {
namespace {

const std::string kDataDir = std::string(POLYLORA_TEST_DATA) + "/tokenizers";
const std::vector<std::string> kTokenizers = {"tiny-bytelevel", "tiny-sentencepiece", "o200k", "cl100k"};

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, Tokenizer::load(kDataDir + "/" + name)).first;
  return it->second;
}

// Streams ids; returns "" on success, else a description of the first problem.
std::string check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = detok.push(ids[i]);
    if (!is_valid_utf8(piece)) return "invalid UTF-8 piece after id #" + std::to_string(i);
    streamed += piece;
  }
  std::string rest = detok.flush();
  if (!is_valid_utf8(rest)) return "invalid UTF-8 in flush";
  streamed += rest;
  std::string full = tok.decode(ids, skip_special);
  if (streamed != full) {
    auto dump = [](const std::string& s) {
      return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    };
    return "streamed " + dump(streamed) + " != decoded " + dump(full);
  }
  return {};
}

class StreamingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamingTest, EveryCaseStreamsToTheFullDecode) {
  const auto& tok = tokenizer(GetParam());
  std::ifstream in(kDataDir + "/cases.json");
  auto cases = nlohmann::json::parse(in);
  size_t ok = 0, total = 0;
  for (const auto& encoding : cases["encodings"][GetParam()]) {
    auto ids = encoding.get<std::vector<int32_t>>();
    for (bool skip : {false, true}) {
      ++total;
      std::string problem = check_stream(tok, ids, skip);
      EXPECT_EQ(problem, "") << GetParam() << " case " << total / 2;
      ok += problem.empty();
    }
  }
  std::printf("[ stream ] %s: %zu/%zu streams match\n", GetParam().c_str(), ok, total);
}

TEST_P(StreamingTest, RandomIdsStreamToTheFullDecode) {
  const auto& tok = tokenizer(GetParam());
  std::mt19937 rng(7);
  // Mix random ids with ids of multi-byte text so partial characters are common.
  auto pool = tok.encode("🤖🚀👍🏽 こんにちは ü ñ 𝔘𝔫𝔦 <0xE4> ▁ a  b\n", false);
  for (int round = 0; round < 300; ++round) {
    std::vector<int32_t> ids;
    int n = 1 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) {
      ids.push_back(rng() % 3 ? pool[rng() % pool.size()] : static_cast<int32_t>(rng() % tok.vocab_size()));
    }
    std::string problem = check_stream(tok, ids, round % 2 == 1);
    ASSERT_EQ(problem, "") << GetParam() << " round " << round;
  }
}

TEST(Streaming, MultiTokenEmojiIsHeldUntilComplete) {
  const auto& tok = tokenizer("tiny-bytelevel");
  auto ids = tok.encode("🤖", false);
  ASSERT_GT(ids.size(), 1u);
  IncrementalDetokenizer detok(tok);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(detok.push(ids[i]), "");
  EXPECT_EQ(detok.push(ids.back()), "🤖");
  EXPECT_EQ(detok.flush(), "");
}

TEST(Streaming, SentencePieceLeadingSpaceStrippedOnlyAtStart) {
  const auto& tok = tokenizer("tiny-sentencepiece");
  auto ids = tok.encode("a b  c", false);
  IncrementalDetokenizer detok(tok);
  std::string out;
  for (int32_t id : ids) out += detok.push(id);
  out += detok.flush();
  EXPECT_EQ(out, "a b  c");
}

INSTANTIATE_TEST_SUITE_P(AllTokenizers, StreamingTest, ::testing::ValuesIn(kTokenizers),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (auto& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

}  // namespace
}  // namespace polylora::tokenizer
