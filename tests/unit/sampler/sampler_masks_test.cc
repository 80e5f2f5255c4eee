// tests/unit/sampler/sampler_masks_test.cc: the logit masks of allowed_token_ids and bad_words (vLLM's
// semantics): exactly the right logits become -inf, in vLLM's order (after min_tokens and logit_bias),
// and sampling (greedy and random) never picks a masked token.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "worker/sampler.h"

namespace polylora {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> ramp(int64_t vocab) {
  std::vector<float> l(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) l[static_cast<size_t>(i)] = 0.1f * static_cast<float>(i);
  return l;
}

TEST(SamplerMasks, AllowedTokenIdsKeepOnlyTheListedLogits) {
  SamplingParams p;
  p.allowed_token_ids = {3, 7};
  std::vector<float> l = ramp(10);
  apply_allowed_token_ids(l.data(), 10, p);
  for (int i = 0; i < 10; ++i) {
    if (i == 3 || i == 7)
      EXPECT_FLOAT_EQ(l[i], 0.1f * i) << i;
    else
      EXPECT_EQ(l[i], -kInf) << i;
  }
}

TEST(SamplerMasks, EmptyAllowedListChangesNothing) {
  SamplingParams p;
  std::vector<float> l = ramp(10), before = l;
  apply_allowed_token_ids(l.data(), 10, p);
  EXPECT_EQ(l, before);
}

TEST(SamplerMasks, SingleTokenBadWordIsAlwaysBanned) {
  SamplingParams p;
  p.bad_words_token_ids = {{9}};
  std::vector<float> l = ramp(10);
  apply_bad_words(l.data(), 10, p, {});
  EXPECT_EQ(l[9], -kInf);
  for (int i = 0; i < 9; ++i) EXPECT_FLOAT_EQ(l[i], 0.1f * i);
}

TEST(SamplerMasks, MultiTokenBadWordBansItsLastTokenOnlyAfterItsPrefix) {
  SamplingParams p;
  p.bad_words_token_ids = {{4, 5, 9}};
  std::vector<int32_t> none;
  std::vector<int32_t> half = {1, 4};         // prefix not complete
  std::vector<int32_t> prefix = {2, 4, 5};    // ends with the prefix
  std::vector<int32_t> wrong = {4, 5, 1};     // had it, but not at the end
  std::vector<int32_t> short_out = {5};       // shorter than the prefix
  for (const auto* out : {&none, &half, &wrong, &short_out}) {
    std::vector<float> l = ramp(10);
    apply_bad_words(l.data(), 10, p, *out);
    EXPECT_FLOAT_EQ(l[9], 0.9f);
  }
  std::vector<float> l = ramp(10);
  apply_bad_words(l.data(), 10, p, prefix);
  EXPECT_EQ(l[9], -kInf);
  for (int i = 0; i < 9; ++i) EXPECT_FLOAT_EQ(l[i], 0.1f * i);
}

TEST(SamplerMasks, TwoTokenWordAtTheStartOfTheOutput) {
  SamplingParams p;
  p.bad_words_token_ids = {{6, 8}};
  std::vector<int32_t> out = {6};
  std::vector<float> l = ramp(10);
  apply_bad_words(l.data(), 10, p, out);
  EXPECT_EQ(l[8], -kInf);
}

TEST(SamplerMasks, GreedyAndRandomSamplingNeverPickAMaskedToken) {
  Sampler sampler(16);
  for (double temperature : {0.0, 1.0}) {
    SamplingParams p;
    p.temperature = temperature;
    p.allowed_token_ids = {2, 5, 15};
    p.bad_words_token_ids = {{15}};  // the best allowed token is also a bad word
    for (uint64_t seed = 0; seed < 200; ++seed) {
      std::vector<float> l = ramp(16);
      SamplerRow row;
      row.logits = l.data();
      row.params = &p;
      row.seed = seed;
      int32_t t = sampler.sample_row(row).token;
      EXPECT_TRUE(t == 2 || t == 5) << "temperature " << temperature << " seed " << seed << " -> " << t;
      if (temperature == 0.0) {
        EXPECT_EQ(t, 5);
        break;
      }
    }
  }
}

TEST(SamplerMasks, AppliedAfterLogitBias) {
  // A bias cannot bring back a token outside allowed_token_ids (vLLM masks after logit_bias).
  Sampler sampler(8);
  SamplingParams p;
  p.temperature = 0.0;
  p.allowed_token_ids = {1, 2};
  p.logit_bias = {{7, 100.0}};
  std::vector<float> l = ramp(8);
  SamplerRow row;
  row.logits = l.data();
  row.params = &p;
  EXPECT_EQ(sampler.sample_row(row).token, 2);
}

TEST(SamplerMasks, RawLogprobsAreOfTheUnmaskedLogits) {
  Sampler sampler(8);
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = 1;
  p.allowed_token_ids = {0};
  std::vector<float> l = ramp(8);
  std::vector<float> raw = l;
  SamplerRow row;
  row.logits = l.data();
  row.params = &p;
  SampleResult r = sampler.sample_row(row);
  EXPECT_EQ(r.token, 0);
  EXPECT_EQ(r.rank, 8);  // the worst raw logit
  ASSERT_EQ(r.top.size(), 1u);
  EXPECT_EQ(r.top[0].id, 7);
}

TEST(SamplerMasks, ValidateRefusesOutOfVocabularyIds) {
  SamplingParams p;
  p.allowed_token_ids = {3, 99};
  EXPECT_THROW(p.validate(10), std::exception);
  SamplingParams q;
  q.bad_words_token_ids = {{1, 10}};
  EXPECT_THROW(q.validate(10), std::exception);
  SamplingParams ok;
  ok.allowed_token_ids = {9};
  ok.bad_words_token_ids = {{0, 9}};
  EXPECT_NO_THROW(ok.validate(10));
}

// --max-logprobs: logprobs and prompt_logprobs up to the server's cap pass, above it vLLM's message names
// the count and the cap; -1 (the whole vocabulary) is checked as the vocabulary's size.
TEST(SamplerMasks, ValidateCapsLogprobsAtMaxLogprobs) {
  auto message = [](const SamplingParams& p, int64_t vocab, int64_t cap) -> std::string {
    try {
      p.validate(vocab, cap);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  SamplingParams p;
  p.logprobs = 20;
  EXPECT_EQ(message(p, 1000, 20), "");
  EXPECT_NE(
      message(p, 1000, 19).find("Requested sample logprobs of 20, which is greater than max allowed: 19"),
      std::string::npos);
  p.logprobs = 300;
  EXPECT_EQ(message(p, 1000, 300), "");
  p.logprobs = -1;
  EXPECT_NE(message(p, 1000, 300).find("Requested sample logprobs of 1000 (-1: the whole vocabulary)"),
            std::string::npos);
  p.logprobs = -2;
  EXPECT_NE(message(p, 1000, 300).find("logprobs must be >= 0, got -2"), std::string::npos);
  SamplingParams q;
  q.prompt_logprobs = 6;
  EXPECT_EQ(message(q, 1000, 6), "");
  EXPECT_NE(message(q, 1000, 5).find("Requested prompt logprobs of 6, which is greater than max allowed: 5"),
            std::string::npos);
  // The default cap is vLLM's 20.
  SamplingParams d;
  d.logprobs = 21;
  EXPECT_THROW(d.validate(1000), std::exception);
}

}  // namespace
}  // namespace polylora
