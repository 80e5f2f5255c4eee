// tests/unit/tokenizer/tokenizer_test.cc: Tokenizer against Hugging Face reference encodings and decodings
// (tests/data/tokenizers/cases.json) for every test tokenizer, plus loading, config and error cases.
#include "tokenizer/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace polylora::tokenizer {
namespace {

const std::string kDataDir = std::string(POLYLORA_TEST_DATA) + "/tokenizers";
const std::vector<std::string> kTokenizers = {"tiny-bytelevel", "tiny-sentencepiece", "o200k", "cl100k"};

const nlohmann::json& cases() {
  static const nlohmann::json c = [] {
    std::ifstream in(kDataDir + "/cases.json");
    return nlohmann::json::parse(in);
  }();
  return c;
}

// Loaded once per process: o200k and cl100k take a moment.
const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, Tokenizer::load(kDataDir + "/" + name)).first;
  return it->second;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, EncodesEveryCaseExactly) {
  const auto& tok = tokenizer(GetParam());
  const auto& texts = cases()["texts"];
  const auto& expected = cases()["encodings"][GetParam()];
  ASSERT_EQ(texts.size(), expected.size());
  size_t matched = 0;
  std::string report;
  for (size_t i = 0; i < texts.size(); ++i) {
    auto want = expected[i].get<std::vector<int32_t>>();
    auto got = tok.encode(texts[i].get<std::string>(), false);
    if (got == want) {
      ++matched;
    } else if (report.size() < 4000) {
      report += "  case " + std::to_string(i) + " " + texts[i].dump() + "\n    want " + ids_string(want) +
                "\n    got  " + ids_string(got) + "\n";
    }
  }
  std::printf("[ encode ] %s: %zu/%zu cases match\n", GetParam().c_str(), matched, texts.size());
  EXPECT_EQ(matched, texts.size()) << GetParam() << " encode mismatches:\n" << report;
}

TEST_P(ReferenceTest, DecodesEveryCaseExactly) {
  const auto& tok = tokenizer(GetParam());
  const auto& encodings = cases()["encodings"][GetParam()];
  const auto& expected = cases()["decodings"][GetParam()];
  size_t matched = 0;
  std::string report;
  for (size_t i = 0; i < encodings.size(); ++i) {
    auto ids = encodings[i].get<std::vector<int32_t>>();
    std::string got = tok.decode(ids);
    if (got == expected[i].get<std::string>()) {
      ++matched;
    } else if (report.size() < 4000) {
      report += "  case " + std::to_string(i) + "\n    want " + expected[i].dump() + "\n    got  " +
                nlohmann::json(got).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
  }
  std::printf("[ decode ] %s: %zu/%zu cases match\n", GetParam().c_str(), matched, encodings.size());
  EXPECT_EQ(matched, encodings.size()) << GetParam() << " decode mismatches:\n" << report;
}

TEST_P(ReferenceTest, SpecialTokensAreFoundInText) {
  const auto& tok = tokenizer(GetParam());
  auto eos = tok.eos_id();
  ASSERT_TRUE(eos.has_value());
  std::string text = "hi" + tok.eos_token() + "there" + tok.eos_token();
  auto ids = tok.encode(text, false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.back(), *eos);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *eos), 2);
  EXPECT_TRUE(tok.is_special(*eos));
  std::string decoded = tok.decode(ids);
  EXPECT_NE(decoded.find(tok.eos_token()), std::string::npos);
  EXPECT_EQ(tok.decode(ids, /*skip_special_tokens=*/true).find(tok.eos_token()), std::string::npos);
  EXPECT_FALSE(tok.chat_template().empty());
  EXPECT_EQ(tok.id_to_token(*eos), tok.eos_token());
  EXPECT_EQ(tok.token_to_id(tok.eos_token()), eos);
  EXPECT_GT(tok.vocab_size(), *eos);
}

TEST_P(ReferenceTest, InvalidUtf8IsRepairedNotRejected) {
  const auto& tok = tokenizer(GetParam());
  std::string bad = "ab\xff\xc3(\xe2\x82 \xf0\x9f\x98";
  auto ids = tok.encode(bad, false);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(tok.decode(ids), "ab\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD \xEF\xBF\xBD");
}

INSTANTIATE_TEST_SUITE_P(AllTokenizers, ReferenceTest, ::testing::ValuesIn(kTokenizers),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (auto& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(TokenizerLoad, O200kLoadsQuickly) {
  auto start = std::chrono::steady_clock::now();
  Tokenizer tok = Tokenizer::load(kDataDir + "/o200k");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ load ] o200k loaded in %.3f s (vocab %d)\n", seconds, tok.vocab_size());
  EXPECT_EQ(tok.vocab_size(), 200007);
  EXPECT_LT(seconds, 5.0);  // generous for sanitizer builds; about 0.5 s in Release
}

TEST(TokenizerConfig, ReadsSpecialTokensAndTemplate) {
  const auto& tiny = tokenizer("tiny-bytelevel");
  EXPECT_EQ(tiny.bos_token(), "<|endoftext|>");
  EXPECT_EQ(tiny.eos_id(), 2);
  EXPECT_EQ(tiny.pad_id(), 3);
  EXPECT_FALSE(tiny.add_bos_token());
  const auto& sp = tokenizer("tiny-sentencepiece");
  EXPECT_EQ(sp.bos_id(), 1);
  EXPECT_EQ(sp.eos_id(), 2);
  EXPECT_FALSE(sp.pad_id().has_value());
  EXPECT_NE(sp.chat_template().find("[INST]"), std::string::npos);
}

TEST(TokenizerConfig, AddBosTokenFlagAddsBos) {
  std::ifstream in(kDataDir + "/tiny-sentencepiece/tokenizer.json");
  std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Tokenizer tok = Tokenizer::from_json(
      json, R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "add_bos_token": true,
               "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_TRUE(tok.add_bos_token());
  auto with = tok.encode("hello", true);
  auto without = tok.encode("hello", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], 1);
  EXPECT_EQ(tok.chat_template(), "D");
  // As HF: after an added token the normalizer still prepends "▁" to the next segment.
  auto ids = tok.encode("<s>hello", false);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + 1, ids.end()), without);
}

TEST(TokenizerAddedTokens, FlagsAndLongestMatch) {
  std::string json = R"({
    "added_tokens": [
      {"id": 5, "content": "<a>", "special": true},
      {"id": 6, "content": "<a><b>", "special": true},
      {"id": 7, "content": "tok", "special": false, "single_word": true},
      {"id": 8, "content": "<r>", "special": true, "rstrip": true, "lstrip": true}
    ],
    "normalizer": null,
    "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": false},
    "decoder": {"type": "Fuse"},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, " ": 2, "t": 3, "o": 4, "k": 9}, "merges": [],
              "unk_token": null}
  })";
  Tokenizer tok = Tokenizer::from_json(json);
  EXPECT_EQ(tok.encode("a<a><b>b", false), (std::vector<int32_t>{0, 6, 1}));
  EXPECT_EQ(tok.encode("<a>b", false), (std::vector<int32_t>{5, 1}));
  EXPECT_EQ(tok.encode("tok a", false), (std::vector<int32_t>{7, 2, 0}));
  EXPECT_EQ(tok.encode("atok", false), (std::vector<int32_t>{0, 3, 4, 9}));  // not a single word
  EXPECT_EQ(tok.encode("a  <r>  b", false), (std::vector<int32_t>{0, 8, 1}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{0, 8, 1}), "a<r>b");
}

TEST(TokenizerBpe, MergesInBothSpellingsAndByteFallback) {
  std::string vocab = R"({"<unk>": 0, "<0x41>": 1, "<0xC3>": 2, "<0xA9>": 3, "h": 4, "e": 5, "he": 6, "l": 7,
                          "hel": 8, "▁": 9})";
  auto make = [&](const std::string& merges) {
    return Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": )" + vocab + R"(, "merges": )" +
                                merges +
                                R"(, "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true},
      "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}})");
  };
  for (const char* merges : {R"(["h e", "he l"])", R"([["h", "e"], ["he", "l"]])"}) {
    Tokenizer tok = make(merges);
    EXPECT_EQ(tok.encode("hel", false), (std::vector<int32_t>{8}));
    EXPECT_EQ(tok.encode("Ahé", false), (std::vector<int32_t>{1, 4, 2, 3}));
    EXPECT_EQ(tok.encode("xyzh", false), (std::vector<int32_t>{0, 4}));  // fuse_unk
    EXPECT_EQ(tok.decode(std::vector<int32_t>{1, 4, 2, 3}), "Ahé");
    EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 4}), "\xEF\xBF\xBDh");
    EXPECT_EQ(tok.decode(std::vector<int32_t>{2, 1, 4}), "\xEF\xBF\xBD\xEF\xBF\xBDh");  // one U+FFFD per byte
  }
}

TEST(TokenizerErrors, ClearMessages) {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const polylora::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { Tokenizer::load("/nonexistent/dir"); }).find("does not exist"), std::string::npos);
  EXPECT_NE(message([] { Tokenizer::load(kDataDir); }).find("no tokenizer.json"), std::string::npos);
  EXPECT_NE(message([] { Tokenizer::from_json("{not json"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(message([] {
              Tokenizer::from_json(R"({"model": {"type": "Unigram", "vocab": []}})");
            }).find("'Unigram' is not supported"),
            std::string::npos);
  EXPECT_NE(message([] {
              Tokenizer::from_json(R"({"model": {"type": "WordPiece", "vocab": {}}})");
            }).find("'WordPiece' is not supported"),
            std::string::npos);
  EXPECT_NE(message([] {
              Tokenizer::from_json(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})");
            }).find("not in the vocabulary"),
            std::string::npos);
}

}  // namespace
}  // namespace polylora::tokenizer
