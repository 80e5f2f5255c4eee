// bench/sched_bench.cc: `polylora_bench sched`: host time per engine step spent outside the model:
// scheduling (KV-cache accounting, prefix lookups), the scheduler's update, and the runner's input
// preparation (plan deltas, packed token/position/slot/block-table arrays), with N running decode
// requests and a stub model (no forward pass is run). The goal is under 100 µs per step at N = 256.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_command.h"
#include "config/model_config.h"
#include "lora/adapter_registry.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "worker/model_runner.h"

namespace polylora::bench {
namespace {

int run_sched_bench(int argc, char** argv) {
  CLI::App app{"Scheduler + input preparation time per step", "polylora_bench sched"};
  int64_t num_requests = 256, prompt_len = 128, steps = 2000, adapters = 8;
  bool json_out = false;
  app.add_option("--requests", num_requests, "Running decode requests");
  app.add_option("--prompt-len", prompt_len, "Prompt tokens per request");
  app.add_option("--steps", steps, "Decode steps timed");
  app.add_option("--adapters", adapters, "Distinct adapters among the requests (0: base only)");
  app.add_flag("--json", json_out);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // A stub model: the smallest llama (its weights are never used; only the runner's bookkeeping runs).
  ModelConfig mc = ModelConfig::from_json(R"({"model_type":"llama","vocab_size":32,"hidden_size":8,
      "intermediate_size":8,"num_hidden_layers":1,"num_attention_heads":1,"head_dim":8,"max_position_embeddings":1000000})",
                                          "stub");
  ModelLoadOptions lo;
  lo.load_format = LoadFormat::kDummy;
  auto model = Model::from_config(mc, nullptr, lo, nullptr);
  const int64_t block_size = 16;
  int64_t blocks = num_requests * ((prompt_len + steps + 64) / block_size + 2);
  SchedulerConfig sc;
  sc.max_num_seqs = num_requests;
  sc.max_num_batched_tokens = std::max<int64_t>(8192, num_requests);
  LoraConfig lc;
  lc.max_loras = std::max<int64_t>(adapters, 1);
  Scheduler sched(sc, lc, std::make_unique<KvCacheManager>(blocks, block_size, true));
  ModelRunner runner(*model, 1, block_size);  // KV storage unused: no forward pass
  AdapterRegistry::Options ropts;
  ropts.max_loras = std::max<int64_t>(adapters, 1);
  ropts.max_cpu_loras = std::max<int64_t>(adapters, 1);
  ropts.load_thread = false;
  AdapterRegistry registry(ropts, nullptr);
  std::vector<AdapterId> fake_ids;
  for (int64_t a = 0; a < adapters; ++a) {
    auto fake = std::make_shared<LoraAdapter>();
    fake->name = std::string("#") + static_cast<char>('a' + a);
    fake_ids.push_back(registry.add(std::move(fake)));
  }
  auto greedy = std::make_shared<RequestSampling>();
  greedy->params.temperature = 0;
  for (int64_t i = 0; i < num_requests; ++i) {
    auto r = std::make_unique<SchedRequest>();
    r->id = static_cast<RequestId>(i + 1);
    for (int64_t t = 0; t < prompt_len; ++t) r->tokens.push_back(static_cast<int32_t>((t * 31 + i * 7) % 32));
    r->max_total_tokens = prompt_len + steps + 8;
    r->sampling = greedy;
    if (adapters > 0) {
      r->adapter = fake_ids[static_cast<size_t>(i % adapters)];
      r->cache_key.adapter = r->adapter;
    }
    sched.add(std::move(r));
  }
  BatchBuilder& builder = runner.builder();
  BatchBuilder::Step prepared;
  std::unordered_map<RequestId, int32_t> sampled;
  auto one_step = [&]() {
    StepPlan plan = sched.schedule();
    builder.apply(plan);
    builder.build(plan, &registry, nullptr, prepared);
    sampled.clear();
    for (const auto& row : prepared.rows)
      if (row.sample) sampled[row.id] = 5;
    sched.update(plan, sampled);
    builder.advance(prepared);
    for (const auto& row : prepared.rows)
      if (row.sample) builder.fill(row.id, row.position + 1, 5);
    return plan.num_scheduled_tokens;
  };
  // Prefill everything first (not timed), then time decode steps with all requests running.
  for (int64_t scheduled = one_step(); sched.stats().num_waiting > 0 || scheduled > num_requests;)
    scheduled = one_step();
  std::vector<double> times;
  times.reserve(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    StepPlan plan = sched.schedule();
    auto t1 = std::chrono::steady_clock::now();
    builder.apply(plan);
    builder.build(plan, &registry, nullptr, prepared);
    auto t2 = std::chrono::steady_clock::now();
    sampled.clear();
    for (const auto& row : prepared.rows)
      if (row.sample) sampled[row.id] = 5;
    sched.update(plan, sampled);
    builder.advance(prepared);
    for (const auto& row : prepared.rows)
      if (row.sample) builder.fill(row.id, row.position + 1, 5);
    auto t3 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::micro>(t3 - t0).count());
    (void)t1;
    (void)t2;
  }
  std::sort(times.begin(), times.end());
  double mean = 0;
  for (double t : times) mean += t;
  mean /= static_cast<double>(times.size());
  double median = times[times.size() / 2], p99 = times[times.size() * 99 / 100];
  nlohmann::json j = {{"running_requests", num_requests},
                      {"adapters", adapters},
                      {"steps", steps},
                      {"mean_us", mean},
                      {"median_us", median},
                      {"p99_us", p99}};
  if (json_out)
    std::printf("%s\n", j.dump(2).c_str());
  else
    std::printf(
        "scheduler + input preparation with %ld running requests (%ld adapters): mean %.1f us, median "
        "%.1f us, p99 %.1f us per step\n",
        static_cast<long>(num_requests), static_cast<long>(adapters), mean, median, p99);
  return 0;
}

BenchRegistrar reg("sched", "Scheduler + input preparation time per step (stub model)", run_sched_bench);

}  // namespace
}  // namespace polylora::bench
