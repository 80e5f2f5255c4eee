// tests/engine/engine_prefix_test.cc: prefix caching through the engine: a request sharing a prefix with
// an earlier one reuses its blocks (counted) and produces identical output; different adapters or
// cache_salt never share; a reloaded adapter never hits its old blocks. Also n > 1 and seeded sampling.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "golden/golden_fixture.h"

namespace polylora::golden {
namespace {

struct RunResult {
  std::vector<int32_t> tokens;
  int64_t cached = 0;
};

// Every test runs twice: steps synchronous, and queued one ahead (asynchronous scheduling).
class EnginePrefixTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    fixture_ = std::make_unique<Fixture>("qwen3-moe-tiny");
    model_ = std::shared_ptr<Model>(std::move(fixture_->model));
    EngineConfig ec;
    ec.cache.block_size = 4;
    ec.cache.num_kv_blocks = 256;
    ec.execution.async_scheduling = GetParam();
    engine_ = std::make_unique<Engine>(model_, ec, nullptr);
    for (const auto& a : fixture_->adapters) engine_->add_adapter(a);
    prompt_ = fixture_->prompt(2);  // 40 tokens
  }
  RunResult run(const std::vector<int32_t>& prompt, const std::string& adapter = "",
                const std::string& salt = "") {
    EngineRequest r;
    r.request_id = std::to_string(next_++);
    r.prompt_ids = prompt;
    r.adapter = adapter;
    r.cache_salt = salt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 8;
    r.sampling.ignore_eos = true;
    engine_->add_request(r);
    RunResult out;
    while (engine_->has_unfinished())
      for (auto& o : engine_->step()) {
        out.cached = o.num_cached_tokens;
        for (auto& s : o.sequences)
          out.tokens.insert(out.tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
      }
    return out;
  }
  std::unique_ptr<Fixture> fixture_;
  std::shared_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> prompt_;
  int next_ = 0;
};

TEST_P(EnginePrefixTest, SharedPrefixIsReusedAndOutputIdentical) {
  RunResult first = run(prompt_);
  EXPECT_EQ(first.cached, 0);
  int64_t hits_before = engine_->stats().prefix_hits;
  RunResult second = run(prompt_);
  EXPECT_EQ(second.cached, 36);  // 9 full blocks of 4; the last token is always computed
  EXPECT_EQ(engine_->stats().prefix_hits - hits_before, 36);
  EXPECT_EQ(second.tokens, first.tokens);
  // A longer prompt with the same start reuses the shared part and matches a cold run.
  std::vector<int32_t> longer = prompt_;
  longer.insert(longer.end(), {5, 6, 7, 8, 9});
  RunResult warm = run(longer);
  EXPECT_GE(warm.cached, 36);
  EngineConfig ec;
  ec.cache.block_size = 4;
  ec.cache.num_kv_blocks = 256;
  ec.cache.enable_prefix_caching = false;
  Engine cold(model_, ec, nullptr);
  EngineRequest r;
  r.request_id = "cold";
  r.prompt_ids = longer;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 8;
  r.sampling.ignore_eos = true;
  cold.add_request(r);
  std::vector<int32_t> cold_tokens;
  while (cold.has_unfinished())
    for (auto& o : cold.step())
      for (auto& s : o.sequences)
        cold_tokens.insert(cold_tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
  EXPECT_EQ(warm.tokens, cold_tokens);
  EXPECT_EQ(cold.stats().prefix_hits, 0);
}

TEST_P(EnginePrefixTest, DifferentAdaptersAndSaltsNeverShare) {
  run(prompt_);
  EXPECT_EQ(run(prompt_, "experts-attn-r8").cached, 0);
  EXPECT_EQ(run(prompt_, "attn-only-r16").cached, 0);
  EXPECT_EQ(run(prompt_, "experts-attn-r8").cached, 36);  // same adapter again: shared
  EXPECT_EQ(run(prompt_, "", "tenant-a").cached, 0);
  EXPECT_EQ(run(prompt_, "", "tenant-b").cached, 0);
  EXPECT_EQ(run(prompt_, "", "tenant-a").cached, 36);
}

TEST_P(EnginePrefixTest, ReloadedAdapterNeverHitsOldBlocks) {
  RunResult before = run(prompt_, "attn-only-r16");
  ASSERT_TRUE(engine_->remove_adapter("attn-only-r16"));
  auto reloaded =
      load_peft_adapter(fixture_->dir + "/adapters/attn-only-r16", "attn-only-r16", model_->config(), {64});
  engine_->add_adapter(reloaded);
  RunResult after = run(prompt_, "attn-only-r16");
  EXPECT_EQ(after.cached, 0);
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(run(prompt_, "attn-only-r16").cached, 36);
}

TEST_P(EnginePrefixTest, ParallelSamplingSharesThePromptAndIsSeeded) {
  auto sample = [&](uint64_t seed, int64_t n) {
    EngineRequest r;
    r.request_id = std::to_string(next_++);
    r.prompt_ids = prompt_;
    r.sampling.n = n;
    r.sampling.temperature = 1.0;
    r.sampling.seed = seed;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    engine_->add_request(r);
    std::map<int64_t, std::vector<int32_t>> seqs;
    int64_t cached = 0;
    while (engine_->has_unfinished())
      for (auto& o : engine_->step()) {
        cached = std::max(cached, o.num_cached_tokens);
        for (auto& s : o.sequences)
          seqs[s.index].insert(seqs[s.index].end(), s.new_token_ids.begin(), s.new_token_ids.end());
      }
    return seqs;
  };
  int64_t hits_before = engine_->stats().prefix_hits;
  auto a = sample(7, 3);
  EXPECT_EQ(a.size(), 3u);
  for (auto& [i, toks] : a) EXPECT_EQ(toks.size(), 6u);
  EXPECT_GE(engine_->stats().prefix_hits - hits_before, 2 * 36)
      << "siblings should reuse the prompt's blocks";
  auto b = sample(7, 3);
  EXPECT_EQ(a, b) << "same seed, same outputs";
  EXPECT_NE(a[0], a[1]) << "siblings use different seeds";
}

INSTANTIATE_TEST_SUITE_P(Scheduling, EnginePrefixTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Async" : "Sync"; });

}  // namespace
}  // namespace polylora::golden
