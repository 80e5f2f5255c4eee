// bench/greedy_run.h: drives an Engine through its public API with one batch of greedy requests and
// times it, for the throughput benchmarks (`polylora_bench device`, `polylora_bench model`): the steps
// until every request has its first token (prefill), then a fixed number of decode steps in which every
// request is still running. Only sums over steps are relied on (host wall time / steps, GPU time summed),
// so an engine that returns a step's outputs one step later times the same way.
// Must not: reach below the Engine (no runner, scheduler or forward calls).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"

namespace polylora::bench {

struct GreedyRunTiming {
  double prefill_seconds = 0;  // host clock: first step until every request has returned a token
  int64_t prefill_steps = 0;
  double decode_seconds = 0;  // host clock over the timed decode steps
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;      // tokens returned during them
  double decode_gap_seconds = 0;  // Model::last_step_gap_seconds() summed: the GPU idle between steps
  double decode_gpu_seconds = 0;  // Model::last_step_gpu_seconds() summed after each (timing must be on)
};

// max_tokens of each request of a batch: the timed decode steps plus the steps the batch's prefill can
// take (requests prefilled first decode meanwhile), so none finishes inside the timed window.
int64_t greedy_run_max_tokens(int64_t batch, int64_t prompt_len, int64_t max_num_batched_tokens,
                              int64_t decode_steps);

// Submits one greedy request (temperature 0, ignore_eos) per prompt, with max_tokens from
// greedy_run_max_tokens (the engine's max_model_len must allow prompt + that); steps until each has a
// token, then times `decode_steps` steps; then aborts the rest and steps the engine empty (untimed).
// adapters: request i names adapters[i % size] (empty: the base model).
// host_sampling: ask for logprobs 0, so every row's logits come to the host and the CPU sampler picks
// the token (the device-argmax path is taken only for plain greedy rows without logprobs).
GreedyRunTiming run_greedy_batch(Engine& engine, const Model& model,
                                 const std::vector<std::vector<int32_t>>& prompts, int64_t decode_steps,
                                 bool host_sampling, const std::vector<std::string>& adapters = {});

}  // namespace polylora::bench
