// tests/engine/engine_metrics_test.cc: the request-phase histograms (queue, prefill, decode, inference),
// tokens per engine step and the request-parameter histograms recorded by the engine thread, with
// synchronous and asynchronous steps; and the periodic stats line (StatsLogger) in vLLM's wording.
#include <gtest/gtest.h>

#include <regex>
#include <thread>

#include "engine/engine_thread.h"
#include "engine/stats_logger.h"
#include "golden/golden_fixture.h"

namespace polylora::golden {
namespace {

class EngineMetricsTest : public ::testing::TestWithParam<bool> {};

TEST_P(EngineMetricsTest, PhasesIterationTokensAndParams) {
  Fixture fixture("qwen3-moe-tiny");
  std::shared_ptr<Model> model(std::move(fixture.model));
  EngineConfig ec;
  ec.cache.block_size = 4;
  ec.cache.num_kv_blocks = 256;
  ec.scheduler.max_model_len = 64;  // the request without max_tokens generates up to here
  ec.execution.async_scheduling = GetParam();
  auto engine = std::make_unique<Engine>(model, ec, nullptr);
  EngineThreadOptions opts;
  opts.log_stats_interval = 0;  // none
  EngineThread et(std::move(engine), opts);
  // Four requests: one with n = 2, one without max_tokens (then max_model_len - prompt, as vLLM).
  std::vector<std::shared_ptr<OutputStream>> streams;
  int64_t sum_max_tokens = 0, sum_n = 0;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r;
    r.request_id = "r" + std::to_string(i);
    r.prompt_ids = fixture.prompt(i % 3);
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.n = i == 1 ? 2 : 1;
    if (i == 3) {
      r.sampling.max_tokens = std::nullopt;
      sum_max_tokens += et.max_model_len() - static_cast<int64_t>(r.prompt_ids.size());
    } else {
      r.sampling.max_tokens = 3 + i;
      sum_max_tokens += 3 + i;
    }
    sum_n += r.sampling.n;
    streams.push_back(et.add_request(std::move(r)));
  }
  for (auto& s : streams)
    while (!s->done()) s->next(std::chrono::milliseconds(100));
  EngineSnapshot snap = et.snapshot();
  const MetricsSnapshot& m = snap.metrics;
  EXPECT_EQ(m.params_n.count, 4u);
  EXPECT_DOUBLE_EQ(m.params_n.sum, static_cast<double>(sum_n));
  EXPECT_EQ(m.params_max_tokens.count, 4u);
  EXPECT_DOUBLE_EQ(m.params_max_tokens.sum, static_cast<double>(sum_max_tokens));
  for (const HistogramSnapshot* h : {&m.queue_time, &m.prefill_time, &m.decode_time, &m.inference_time}) {
    EXPECT_EQ(h->count, 4u);
    EXPECT_GE(h->sum, 0.0);
  }
  // inference = prefill + decode for every request; e2e covers them all.
  EXPECT_NEAR(m.inference_time.sum, m.prefill_time.sum + m.decode_time.sum, 1e-6);
  EXPECT_GE(m.e2e.sum + 1e-9, m.inference_time.sum + m.queue_time.sum);
  // Tokens per step add up to the prompt and generation tokens computed.
  EXPECT_DOUBLE_EQ(m.iteration_tokens.sum,
                   static_cast<double>(snap.stats.prompt_tokens + snap.stats.generation_tokens));
  EXPECT_GT(m.iteration_tokens.count, 1u);
  // The cache configuration labels.
  std::map<std::string, std::string> cc(snap.cache_config.begin(), snap.cache_config.end());
  EXPECT_EQ(cc["block_size"], "4");
  EXPECT_EQ(cc["num_gpu_blocks"], "256");
  EXPECT_EQ(cc["enable_prefix_caching"], "True");
  et.shutdown(std::chrono::milliseconds(0));
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, EngineMetricsTest, ::testing::Bool());

TEST(StatsLoggerTest, LineEveryIntervalInVllmWording) {
  using Clock = StatsLogger::Clock;
  const auto t0 = Clock::time_point{} + std::chrono::hours(1);
  StatsLogger logger(10.0, t0);
  EngineStats s;
  EXPECT_FALSE(logger.maybe_log(s, t0 + std::chrono::seconds(9)).has_value());
  s.prompt_tokens = 200;
  s.generation_tokens = 50;
  s.num_running = 2;
  s.num_waiting = 1;
  s.kv_usage = 0.125;
  s.prefix_queries = 100;
  s.prefix_hits = 25;
  auto line = logger.maybe_log(s, t0 + std::chrono::seconds(10));
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(line->text,
            "Engine 000: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
            "Running: 2 reqs, Waiting: 1 reqs, GPU KV cache usage: 12.5%, Prefix cache hit rate: 25.0%");
  EXPECT_FALSE(line->idle);
  // Next interval: no new tokens, but the previous line had throughput: still not idle.
  line = logger.maybe_log(s, t0 + std::chrono::seconds(20));
  ASSERT_TRUE(line.has_value());
  EXPECT_NE(line->text.find("Avg prompt throughput: 0.0 tokens/s"), std::string::npos);
  EXPECT_FALSE(line->idle);
  // Two quiet intervals in a row: idle (vLLM logs it at debug level).
  line = logger.maybe_log(s, t0 + std::chrono::seconds(30));
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(line->idle);
  // A long pause logs one line, not one per missed interval.
  EXPECT_TRUE(logger.maybe_log(s, t0 + std::chrono::seconds(75)).has_value());
  EXPECT_FALSE(logger.maybe_log(s, t0 + std::chrono::seconds(76)).has_value());
  EXPECT_TRUE(logger.maybe_log(s, t0 + std::chrono::seconds(85)).has_value());
}

TEST(StatsLoggerTest, DisabledNeverLogs) {
  StatsLogger logger(0, StatsLogger::Clock::now());
  EXPECT_FALSE(logger.enabled());
  EXPECT_FALSE(logger.maybe_log(EngineStats{}, StatsLogger::Clock::now() + std::chrono::hours(1)).has_value());
}

}  // namespace
}  // namespace polylora::golden
