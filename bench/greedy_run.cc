// bench/greedy_run.cc: one timed batch of greedy requests through the Engine.
#include "greedy_run.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <string>

#include "common/error.h"

namespace polylora::bench {

int64_t greedy_run_max_tokens(int64_t batch, int64_t prompt_len, int64_t max_num_batched_tokens,
                              int64_t decode_steps) {
  // Each prefill step admits at least the budget left after one decode token per running request.
  int64_t per_step = std::max<int64_t>(1, max_num_batched_tokens - batch);
  int64_t prefill_steps = (batch * prompt_len + per_step - 1) / per_step;
  return decode_steps + prefill_steps + 2;
}

GreedyRunTiming run_greedy_batch(Engine& engine, const Model& model,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t decode_steps,
                                 bool host_sampling, const std::vector<std::string>& adapters) {
  static int64_t run_index = 0;
  const std::string prefix = "bench" + std::to_string(run_index++) + "-";
  const auto batch = static_cast<int64_t>(prompts.size());
  int64_t prompt_len = 0;
  for (const auto& p : prompts) prompt_len = std::max<int64_t>(prompt_len, static_cast<int64_t>(p.size()));
  const int64_t max_tokens = greedy_run_max_tokens(
      batch, prompt_len, engine.config().scheduler.max_num_batched_tokens, decode_steps);
  std::vector<std::string> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.request_id = prefix + std::to_string(i);
    r.prompt_ids = prompts[i];
    if (!adapters.empty()) r.adapter = adapters[i % adapters.size()];
    r.sampling.temperature = 0;
    r.sampling.ignore_eos = true;
    r.sampling.max_tokens = max_tokens;
    if (host_sampling) r.sampling.logprobs = 0;
    ids.push_back(r.request_id);
    engine.add_request(std::move(r));
  }
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  GreedyRunTiming t;
  std::set<std::string> started;  // requests that have returned a token
  int64_t tokens = 0;
  auto collect = [&](const std::vector<RequestOutput>& outs) {
    for (const RequestOutput& o : outs) {
      if (o.error) fail("benchmark request {} failed: {}", o.request_id, *o.error);
      for (const SequenceOutput& so : o.sequences) {
        tokens += static_cast<int64_t>(so.new_token_ids.size());
        if (!so.new_token_ids.empty()) started.insert(o.request_id);
      }
    }
  };
  auto t0 = Clock::now();
  while (static_cast<int64_t>(started.size()) < batch) {
    if (!engine.has_unfinished()) fail("the benchmark's requests finished before all were prefilled");
    collect(engine.step());
    ++t.prefill_steps;
  }
  auto t1 = Clock::now();
  t.prefill_seconds = seconds(t0, t1);
  tokens = 0;
  for (int64_t s = 0; s < decode_steps && engine.has_unfinished(); ++s) {
    collect(engine.step());
    t.decode_gpu_seconds += model.last_step_gpu_seconds();
    if (s > 0) t.decode_gap_seconds += model.last_step_gap_seconds();  // the first follows a prefill
    ++t.decode_steps;
  }
  t.decode_seconds = seconds(t1, Clock::now());
  t.decode_tokens = tokens;
  for (const std::string& id : ids) engine.abort(id);
  while (engine.has_unfinished()) engine.step();
  return t;
}

}  // namespace polylora::bench
