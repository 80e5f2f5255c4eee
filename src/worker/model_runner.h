// worker/model_runner.h: executes a StepPlan: keeps the persistent per-request state the runner needs
// (tokens, block table, adapter, and the sampling settings that arrive with the request in the plan), builds
// the packed ForwardBatch (prefill chunks and decode tokens of different requests with different adapters),
// runs the model, samples, and returns a StepResult. Must not: make scheduling decisions (what runs, and
// when, comes from the plan).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/request.h"
#include "api/sampling_params.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "sched/step_plan.h"
#include "worker/kv_storage.h"
#include "worker/sampler.h"

namespace polylora {

struct SampledToken {
  int32_t token = 0;
  std::optional<LogprobEntry> logprob;  // when sampling.logprobs is set
};

struct StepResult {
  std::unordered_map<RequestId, SampledToken> sampled;
  // Prompt logprobs computed this step: (prompt index ≥ 1, entry for the token at that index).
  std::unordered_map<RequestId, std::vector<std::pair<int64_t, LogprobEntry>>> prompt_logprobs;
};

class ModelRunner {
 public:
  ModelRunner(Model& model, int64_t num_blocks, int64_t block_size);

  // adapter_of(name) returns the loaded adapter (never nullptr for a name in the plan).
  StepResult execute(const StepPlan& plan,
                     const std::function<const LoraAdapter*(const std::string&)>& adapter_of);

  const KvStorage& kv() const { return kv_; }
  // Captures the model's decode graphs over this runner's KV cache (see Model::prepare_graphs).
  void prepare_graphs(const GraphOptions& options) { model_.prepare_graphs(kv_.views(), options); }

  // The two halves of execute() before the forward pass, public for the scheduler benchmark:
  // apply the plan's deltas to the runner's request states, then pack the step's inputs.
  struct RowOwner {
    RequestId id;
    int64_t position;  // token position whose next-token logits this row holds
    bool sample;
  };
  struct PreparedStep {
    ForwardBatch batch;
    std::vector<RowOwner> rows;
    std::vector<const LoraAdapter*> slots;
    std::vector<std::pair<RequestId, int64_t>> order;  // (request, tokens computed this step)
  };
  void apply_plan(const StepPlan& plan);
  void prepare(const StepPlan& plan, const std::function<const LoraAdapter*(const std::string&)>& adapter_of,
               PreparedStep& out);
  // Advances request states as execute() does after sampling (for benchmarks that skip the forward).
  void advance_for_benchmark(const PreparedStep& step, const std::unordered_map<RequestId, int32_t>& sampled);

 private:
  struct State {
    std::vector<int32_t> tokens;
    int64_t num_prompt_tokens = 0;
    std::vector<int32_t> blocks;
    int64_t num_computed_tokens = 0;
    std::string adapter;
    bool prompt_logprobs = false;
    std::shared_ptr<const RequestSampling> sampling;  // from the plan; never null
  };
  Model& model_;
  KvStorage kv_;
  Sampler sampler_;
  std::unordered_map<RequestId, State> states_;
  // Copies the step's logits to the host: prompt logprobs, then the CPU sampler on the sampled rows.
  void sample_on_host(const std::vector<RowOwner>& rows, const ForwardBatch& b,
                      const std::vector<const LoraAdapter*>& slots, StepResult& result);
  std::vector<float> logits_;
  std::vector<int32_t> ids_;
  PreparedStep step_;
};

}  // namespace polylora
