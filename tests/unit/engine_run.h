// tests/unit/engine_run.h: helpers for tests that generate through the public Engine API: a small engine
// configuration, greedy requests, and running a set of requests to completion with what each gave back
// (tokens, per-token logprobs, prompt logprobs). Must not: reach below Engine (no runner or scheduler).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/engine.h"

namespace polylora::testing_util {

// An engine for tests: a fixed KV cache of `num_kv_blocks` blocks of 16 tokens (nothing sized from
// memory) and no prefix caching, so every request computes its whole prompt.
inline EngineConfig test_engine_config(int64_t num_kv_blocks = 256) {
  EngineConfig ec;
  ec.cache.block_size = 16;
  ec.cache.num_kv_blocks = num_kv_blocks;
  ec.cache.enable_prefix_caching = false;
  ec.scheduler.max_num_seqs = 64;
  ec.scheduler.max_num_batched_tokens = 2048;
  return ec;
}

// Greedy (temperature 0), no EOS stop, exactly max_tokens tokens.
inline EngineRequest greedy_request(std::vector<int32_t> prompt, int64_t max_tokens,
                                    const std::string& adapter = "") {
  EngineRequest r;
  r.prompt_ids = std::move(prompt);
  r.adapter = adapter;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

// What one request gave back.
struct EngineRun {
  std::vector<int32_t> output;                               // generated ids
  std::vector<LogprobEntry> logprobs;                        // one per generated id when asked
  std::vector<std::optional<LogprobEntry>> prompt_logprobs;  // [prompt len] when asked (first empty)
  std::optional<FinishReason> finish_reason;
};

// Submits every request (ids assigned here: their index), steps the engine until all have finished and
// returns their results in input order. Throws polylora::Error when a request fails.
inline std::vector<EngineRun> run_to_completion(Engine& engine, std::vector<EngineRequest> requests) {
  std::vector<EngineRun> runs(requests.size());
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].request_id = "r" + std::to_string(i);
    index[requests[i].request_id] = i;
    engine.add_request(std::move(requests[i]));
  }
  for (int64_t steps = 0; engine.has_unfinished(); ++steps) {
    if (steps > 100000) fail("the engine did not finish {} requests", requests.size());
    for (RequestOutput& out : engine.step()) {
      EngineRun& run = runs.at(index.at(out.request_id));
      if (out.error) fail("request {} failed: {}", out.request_id, *out.error);
      if (!out.prompt_logprobs.empty()) run.prompt_logprobs = std::move(out.prompt_logprobs);
      for (SequenceOutput& so : out.sequences) {
        run.output.insert(run.output.end(), so.new_token_ids.begin(), so.new_token_ids.end());
        run.logprobs.insert(run.logprobs.end(), so.new_logprobs.begin(), so.new_logprobs.end());
        if (so.finish_reason) run.finish_reason = so.finish_reason;
      }
    }
  }
  return runs;
}

inline EngineRun run_one(Engine& engine, EngineRequest request) {
  std::vector<EngineRequest> one;
  one.push_back(std::move(request));
  return run_to_completion(engine, std::move(one))[0];
}

}  // namespace polylora::testing_util
