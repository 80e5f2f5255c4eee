// tests/engine/engine_sampling_test.cc: sampling settings and stop conditions through Engine::add_request
// and step() on a fixture model with its tokenizer: stop strings that span several tokens (found, cut or
// kept with include_stop_str_in_output, and never partly emitted while being matched), logit_bias forcing
// or forbidding a token, stop_token_ids and EOS held back by min_tokens (and left out of the text), the
// StopReason variant (a token id or a string, also for a digit string), n > 1 with stop strings, and that
// all of this survives the request being moved into the engine.
#include <gtest/gtest.h>

#include <variant>

#include "engine/engine.h"
#include "golden/golden_fixture.h"
#include "tokenizer/tokenizer.h"

namespace polylora::golden {
namespace {

struct SeqRun {
  std::vector<int32_t> tokens;
  std::vector<std::string> pieces;   // new_text of every output, in order
  std::vector<size_t> token_counts;  // tokens so far at every output
  std::string text;                  // the pieces joined
  std::optional<FinishReason> finish;
  std::optional<StopReason> stop_reason;
  int64_t num_output_tokens = 0;
  int finish_reports = 0;
};

// Every test runs twice: steps synchronous, and queued one ahead (asynchronous scheduling).
class EngineSamplingTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() {
    fixture_ = new Fixture("qwen3-moe-tiny");
    model_ = new std::shared_ptr<Model>(std::move(fixture_->model));
    tokenizer_ = new std::shared_ptr<const tokenizer::Tokenizer>(
        std::make_shared<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(fixture_->dir)));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    delete fixture_;
  }
  void SetUp() override {
    EngineConfig ec;
    ec.cache.block_size = 4;
    ec.cache.num_kv_blocks = 512;
    ec.execution.async_scheduling = GetParam();
    engine_ = std::make_unique<Engine>(*model_, ec, *tokenizer_);
    // Its greedy continuation starts with some 60 bytes of ASCII (".Header can can ..."), then byte
    // fragments (U+FFFD): room for stop strings inside and across tokens.
    prompt_ = tok().encode("Hello world, this is", false);
  }
  const tokenizer::Tokenizer& tok() const { return **tokenizer_; }

  SamplingParams greedy(int64_t max_tokens) const {
    SamplingParams sp;
    sp.temperature = 0;
    sp.max_tokens = max_tokens;
    sp.ignore_eos = true;
    return sp;
  }
  // Runs one request to the end; one SeqRun per sequence index. Checks that the text never shrinks, that
  // each sequence reports its finish once and that nothing comes after it.
  std::vector<SeqRun> run(const SamplingParams& sp, std::vector<int32_t> prompt = {}) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(next_++);
    r.prompt_ids = prompt.empty() ? prompt_ : std::move(prompt);
    r.sampling = sp;
    engine_->add_request(std::move(r));  // moved: the engine must keep its own copy of everything
    std::vector<SeqRun> out(static_cast<size_t>(sp.n));
    for (int guard = 0; engine_->has_unfinished(); ++guard) {
      EXPECT_LT(guard, 10000);
      if (guard >= 10000) break;
      for (auto& o : engine_->step())
        for (auto& s : o.sequences) {
          SeqRun& q = out.at(static_cast<size_t>(s.index));
          EXPECT_EQ(q.finish_reports, 0) << "output after the finish of sequence " << s.index;
          q.tokens.insert(q.tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
          q.pieces.push_back(s.new_text);
          q.token_counts.push_back(q.tokens.size());
          q.text += s.new_text;
          q.num_output_tokens = s.num_output_tokens;
          if (s.finish_reason) {
            ++q.finish_reports;
            q.finish = s.finish_reason;
            q.stop_reason = s.stop_reason;
          }
        }
    }
    EXPECT_EQ(engine_->check_invariants(), "");
    for (const auto& q : out) {
      EXPECT_EQ(q.finish_reports, 1);
      EXPECT_EQ(q.num_output_tokens, static_cast<int64_t>(q.tokens.size()));
    }
    return out;
  }
  // Byte length of the text of the first k output tokens.
  size_t text_len(const std::vector<int32_t>& ids, size_t k) const {
    return tok().decode(std::span<const int32_t>(ids.data(), k), true).size();
  }
  static bool ascii(const std::string& s) {
    for (unsigned char c : s)
      if (c < 0x20 || c >= 0x7f) return false;
    return true;
  }

  static Fixture* fixture_;
  static std::shared_ptr<Model>* model_;
  static std::shared_ptr<const tokenizer::Tokenizer>* tokenizer_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> prompt_;
  int next_ = 0;
};

Fixture* EngineSamplingTest::fixture_ = nullptr;
std::shared_ptr<Model>* EngineSamplingTest::model_ = nullptr;
std::shared_ptr<const tokenizer::Tokenizer>* EngineSamplingTest::tokenizer_ = nullptr;

// A stop string that starts inside one token and ends inside another, several tokens later, at its first
// occurrence in the greedy text; ASCII so that every byte offset is a character boundary.
struct StopPick {
  std::string stop;
  size_t at = 0;          // byte offset of the match in the full text
  size_t last_token = 0;  // index of the token whose text completes it
};

TEST_P(EngineSamplingTest, GreedyTextEqualsDecodeOfTokens) {
  auto full = run(greedy(40));
  ASSERT_EQ(full[0].tokens.size(), 40u);
  EXPECT_EQ(full[0].text, tok().decode(full[0].tokens, true));
  EXPECT_EQ(full[0].finish, FinishReason::kLength);
  EXPECT_FALSE(full[0].stop_reason.has_value());
}

TEST_P(EngineSamplingTest, MultiTokenStopStringIsCutAndNeverPartlyEmitted) {
  const int64_t kMax = 48;
  auto full = run(greedy(kMax))[0];
  const std::string& text = full.text;
  // Tokens i..j (j >= i + 2) whose texts are ASCII and at least 2 bytes at the ends; the latest such pick
  // (so that text before it streams out in several pieces despite the hold-back).
  std::optional<StopPick> pick;
  for (size_t i = 1; i + 3 < full.tokens.size(); ++i) {
    for (size_t j = i + 2; j < std::min(full.tokens.size(), i + 5); ++j) {
      size_t a = text_len(full.tokens, i), a_end = text_len(full.tokens, i + 1);
      size_t b = text_len(full.tokens, j), b_end = text_len(full.tokens, j + 1);
      if (a_end - a < 2 || b_end - b < 2) continue;
      std::string stop = text.substr(a + 1, b_end - 1 - (a + 1));
      if (!ascii(text.substr(0, b_end)) || text.find(stop) != a + 1) continue;
      if (!pick || a + 1 > pick->at + 8) pick = StopPick{stop, a + 1, j};
    }
  }
  ASSERT_TRUE(pick) << "no stop string candidate in " << text;
  SCOPED_TRACE("stop string '" + pick->stop + "' in '" + text + "'");
  ASSERT_GE(tok().encode(pick->stop, false).size(), 2u);

  for (bool include : {false, true}) {
    SamplingParams sp = greedy(kMax);
    sp.stop = {"never in this text \x01", pick->stop};
    sp.include_stop_str_in_output = include;
    auto r = run(sp)[0];
    std::string want = text.substr(0, pick->at + (include ? pick->stop.size() : 0));
    EXPECT_EQ(r.text, want) << "include_stop_str_in_output " << include;
    EXPECT_EQ(r.finish, FinishReason::kStop);
    ASSERT_TRUE(r.stop_reason.has_value());
    ASSERT_TRUE(std::holds_alternative<std::string>(*r.stop_reason));
    EXPECT_EQ(std::get<std::string>(*r.stop_reason), pick->stop);
    // Generation ran exactly until the token that completed the stop string.
    EXPECT_EQ(r.tokens,
              std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + pick->last_token + 1));
    // Streaming: the emitted text is a prefix of the answer at every output, so no part of the stop
    // string (without include) ever went out; and it came in several pieces.
    std::string sofar;
    for (const auto& p : r.pieces) {
      sofar += p;
      EXPECT_EQ(want.compare(0, sofar.size(), sofar), 0) << "emitted past the answer: '" << sofar << "'";
    }
    EXPECT_GT(std::count_if(r.pieces.begin(), r.pieces.end(), [](auto& p) { return !p.empty(); }), 1);
  }
}

TEST_P(EngineSamplingTest, UnmatchedStopStringsHoldBackButLoseNothing) {
  auto full = run(greedy(40))[0];
  SamplingParams sp = greedy(40);
  sp.stop = {"\x01\x02\x03 a long stop string that never occurs"};
  auto r = run(sp)[0];
  EXPECT_EQ(r.text, full.text);  // what was held back arrives with the finish
  EXPECT_EQ(r.tokens, full.tokens);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_FALSE(r.stop_reason.has_value());
  // Held back until the end: before the finish, the last len(stop) - 1 bytes of the text so far (they could
  // still begin the stop string) have not gone out.
  const size_t hold = sp.stop[0].size() - 1;
  std::string sofar;
  for (size_t i = 0; i + 1 < r.pieces.size(); ++i) {
    sofar += r.pieces[i];
    size_t decoded = text_len(r.tokens, r.token_counts[i]);
    EXPECT_LE(sofar.size(), decoded > hold ? decoded - hold : 0) << "output " << i;
  }
}

TEST_P(EngineSamplingTest, EarliestStopStringWinsAndNSequencesStopIndependently) {
  auto full = run(greedy(40))[0];
  ASSERT_TRUE(ascii(full.text.substr(0, 12))) << full.text;
  std::string late = full.text.substr(8, 3), early = full.text.substr(2, 2);
  size_t at = std::min(full.text.find(early), full.text.find(late));
  SamplingParams sp = greedy(40);
  sp.stop = {late, early};
  sp.n = 3;
  auto r = run(sp);
  for (const auto& s : r) {
    EXPECT_EQ(s.text, full.text.substr(0, at));
    ASSERT_TRUE(s.stop_reason && std::holds_alternative<std::string>(*s.stop_reason));
    EXPECT_EQ(std::get<std::string>(*s.stop_reason), full.text.find(early) == at ? early : late);
  }
  // Sampled, seeded: each sequence stops at its own first match (or runs to max_tokens).
  SamplingParams sampled;
  sampled.temperature = 1.0;
  sampled.seed = 11;
  sampled.n = 4;
  sampled.max_tokens = 24;
  sampled.ignore_eos = true;
  auto plain = run(sampled);
  sampled.stop = {" "};
  auto stopped = run(sampled);
  for (size_t i = 0; i < plain.size(); ++i) {
    size_t sp_at = plain[i].text.find(' ');
    if (sp_at == std::string::npos) {
      EXPECT_EQ(stopped[i].text, plain[i].text);
      EXPECT_EQ(stopped[i].finish, FinishReason::kLength);
    } else {
      EXPECT_EQ(stopped[i].text, plain[i].text.substr(0, sp_at)) << "sequence " << i;
      EXPECT_EQ(stopped[i].finish, FinishReason::kStop);
      ASSERT_TRUE(stopped[i].stop_reason.has_value());
      EXPECT_EQ(std::get<std::string>(*stopped[i].stop_reason), " ");
    }
  }
}

TEST_P(EngineSamplingTest, LogitBiasForcesAndForbidsTokens) {
  auto full = run(greedy(16))[0];
  int32_t forced = -1;
  for (int32_t id = 100; id < 1000; ++id)
    if (std::find(full.tokens.begin(), full.tokens.end(), id) == full.tokens.end() && !tok().is_special(id)) {
      forced = id;
      break;
    }
  ASSERT_GE(forced, 0);
  SamplingParams sp = greedy(16);
  sp.logit_bias = {{forced, 100.0}};
  auto r = run(sp)[0];
  EXPECT_EQ(r.tokens, std::vector<int32_t>(16, forced));
  EXPECT_EQ(r.text, tok().decode(r.tokens, true));

  // -100 on the greedy first token: it is never picked.
  SamplingParams ban = greedy(16);
  ban.logit_bias = {{full.tokens[0], -100.0}};
  auto b = run(ban)[0];
  EXPECT_NE(b.tokens[0], full.tokens[0]);
  EXPECT_EQ(std::count(b.tokens.begin(), b.tokens.end(), full.tokens[0]), 0);

  // Sampled too, with a seed: the bias dominates whatever the draw.
  SamplingParams sampled = sp;
  sampled.temperature = 1.0;
  sampled.seed = 5;
  sampled.n = 2;
  for (const auto& s : run(sampled)) EXPECT_EQ(s.tokens, std::vector<int32_t>(16, forced));
}

TEST_P(EngineSamplingTest, MinTokensHoldsBackStopTokenIdsAndEos) {
  auto full = run(greedy(16))[0];
  int32_t stop = -1;
  for (int32_t id = 200; id < 1000; ++id)
    if (std::find(full.tokens.begin(), full.tokens.end(), id) == full.tokens.end() && !tok().is_special(id)) {
      stop = id;
      break;
    }
  ASSERT_GE(stop, 0);
  for (int64_t k : {0, 1, 3, 7}) {
    SCOPED_TRACE("min_tokens " + std::to_string(k));
    SamplingParams sp = greedy(16);
    sp.stop_token_ids = {stop};
    sp.logit_bias = {{stop, 100.0}};  // picked at once unless masked
    sp.min_tokens = k;
    auto r = run(sp)[0];
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(k + 1));
    EXPECT_EQ(r.tokens.back(), stop);
    // Until then, the greedy tokens (the bias does not touch the others).
    EXPECT_EQ(std::vector<int32_t>(r.tokens.begin(), r.tokens.end() - 1),
              std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + k));
    EXPECT_EQ(r.finish, FinishReason::kStop);
    ASSERT_TRUE(r.stop_reason.has_value());
    ASSERT_TRUE(std::holds_alternative<int32_t>(*r.stop_reason));
    EXPECT_EQ(std::get<int32_t>(*r.stop_reason), stop);
    // The stop token's own text is not output (vLLM), unless include_stop_str_in_output.
    EXPECT_EQ(r.text, tok().decode(std::span<const int32_t>(r.tokens.data(), r.tokens.size() - 1), true));
    sp.include_stop_str_in_output = true;
    EXPECT_EQ(run(sp)[0].text, tok().decode(r.tokens, true));
  }
  // EOS (config eos_token_id 2) the same way; ignore_eos turns it off. Its stop_reason: none for the
  // tokenizer's own EOS, else its id (vLLM moves the model's other EOS ids into stop_token_ids).
  const int32_t eos = 2;
  const bool primary = tok().eos_id() == eos;
  for (int64_t k : {0, 5}) {
    SamplingParams sp = greedy(16);
    sp.ignore_eos = false;
    sp.logit_bias = {{eos, 100.0}};
    sp.min_tokens = k;
    auto r = run(sp)[0];
    ASSERT_EQ(r.tokens.size(), static_cast<size_t>(k + 1));
    EXPECT_EQ(r.tokens.back(), eos);
    EXPECT_EQ(r.finish, FinishReason::kStop);
    const std::optional<StopReason> expected =
        primary ? std::nullopt : std::optional<StopReason>(StopReason(eos));
    EXPECT_EQ(r.stop_reason, expected);
    // An EOS id also listed in stop_token_ids stops the same way (the tokenizer's own: no stop_reason).
    sp.stop_token_ids = {eos};
    auto both = run(sp)[0];
    EXPECT_EQ(both.tokens.size(), static_cast<size_t>(k + 1));
    EXPECT_EQ(both.stop_reason, expected);
    sp.stop_token_ids.clear();
    sp.ignore_eos = true;
    auto ignored = run(sp)[0];
    EXPECT_EQ(ignored.tokens, std::vector<int32_t>(16, eos));
    EXPECT_EQ(ignored.finish, FinishReason::kLength);
  }
}

TEST_P(EngineSamplingTest, MinTokensAndStopStrings) {
  auto full = run(greedy(40))[0];
  ASSERT_TRUE(ascii(full.text.substr(0, 20))) << full.text;
  // A one-byte stop string: a space; its first occurrence that ends after the first k tokens' text.
  std::string stop = " ";
  for (int64_t k : {0, 1, 2, 4, 7}) {
    SCOPED_TRACE("min_tokens " + std::to_string(k));
    size_t boundary = text_len(full.tokens, static_cast<size_t>(k));
    size_t at = full.text.find(stop, boundary);
    SamplingParams sp = greedy(40);
    sp.stop = {stop};
    sp.min_tokens = k;
    auto r = run(sp)[0];
    if (at == std::string::npos) {
      EXPECT_EQ(r.finish, FinishReason::kLength);
      continue;
    }
    EXPECT_EQ(r.text, full.text.substr(0, at));
    EXPECT_GT(static_cast<int64_t>(r.tokens.size()), k);
    EXPECT_EQ(r.finish, FinishReason::kStop);
  }
}

TEST_P(EngineSamplingTest, StopReasonVariantHoldsStringsForDigits) {
  // Force the token of "3" (logit_bias), then stop on the string "3": a string, not the number 3.
  std::vector<int32_t> three = tok().encode("3", false);
  ASSERT_EQ(three.size(), 1u);
  SamplingParams sp = greedy(8);
  sp.logit_bias = {{three[0], 100.0}};
  sp.stop = {"3"};
  auto r = run(sp)[0];
  EXPECT_EQ(r.tokens, std::vector<int32_t>{three[0]});
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.finish, FinishReason::kStop);
  ASSERT_TRUE(r.stop_reason.has_value());
  EXPECT_EQ(r.stop_reason->index(), 1u);
  EXPECT_EQ(std::get<std::string>(*r.stop_reason), "3");
  // The same token as a stop token id: the number (its id, not 3).
  sp.stop.clear();
  sp.stop_token_ids = {three[0]};
  auto t = run(sp)[0];
  ASSERT_TRUE(t.stop_reason.has_value());
  EXPECT_EQ(t.stop_reason->index(), 0u);
  EXPECT_EQ(std::get<int32_t>(*t.stop_reason), three[0]);
  EXPECT_EQ(t.text, "");
  // A stop string and a stop token completing on the same token: the token wins (checked first).
  sp.stop = {"3"};
  auto both = run(sp)[0];
  ASSERT_TRUE(both.stop_reason.has_value());
  EXPECT_TRUE(std::holds_alternative<int32_t>(*both.stop_reason));
  // Length: none.
  auto len = run(greedy(3))[0];
  EXPECT_EQ(len.finish, FinishReason::kLength);
  EXPECT_FALSE(len.stop_reason.has_value());
}

TEST_P(EngineSamplingTest, SettingsSurviveTheMoveForEverySequence) {
  // n = 3 seeded: every sequence gets the request's logit_bias, stop_token_ids and min_tokens.
  auto full = run(greedy(12))[0];
  int32_t stop = full.tokens[5];
  SamplingParams sp;
  sp.n = 3;
  sp.temperature = 0.8;
  sp.seed = 42;
  sp.max_tokens = 12;
  sp.ignore_eos = true;
  sp.min_tokens = 2;
  sp.stop_token_ids = {stop};
  sp.logit_bias = {{stop, 100.0}};
  for (const auto& s : run(sp)) {
    ASSERT_EQ(s.tokens.size(), 3u);
    EXPECT_EQ(s.tokens[2], stop);
    EXPECT_NE(s.tokens[0], stop);
    EXPECT_NE(s.tokens[1], stop);
    ASSERT_TRUE(s.stop_reason && std::holds_alternative<int32_t>(*s.stop_reason));
  }
}

INSTANTIATE_TEST_SUITE_P(Scheduling, EngineSamplingTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

}  // namespace
}  // namespace polylora::golden
