// worker/model_runner.h: executes StepPlans on the model: the BatchBuilder packs each step, the model runs
// it, the step's rows are sampled (on the device where the logits are, when every row allows it; else on
// the host with the CPU sampler) and a StepResult comes back. Steps can be queued ahead (launch() then,
// later, collect()): a step's sampled ids stay on the device and feed the next step's inputs there, so
// the engine plans and queues step N+1 while the GPU runs step N. Rows with a structured-output grammar
// get their allowed-token bitmask from their matcher while the forward pass runs (on a worker thread, or,
// when the previous token is still being sampled, in finish_launch() after the engine completed that
// step); the sampler (device or CPU) applies it.
// Must not: make scheduling decisions (what runs, and when, comes from the plan).
#pragma once

#include <cstdint>
#include <array>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/request.h"
#include "api/sampling_params.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "sched/step_plan.h"
#include "worker/batch_builder.h"
#include "worker/device_sampler.h"
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
  // max_step_tokens: the most tokens one step computes (--max-num-batched-tokens). With a device sampler
  // every step it can take is sampled there (the sampled ids also feed the next step); without one only
  // plain greedy steps are (an argmax on the backend) and the rest use the CPU sampler.
  // kv_dtype: the KV cache's element type (F32, or BF16 on CUDA backends: --kv-cache-dtype bfloat16).
  ModelRunner(Model& model, int64_t num_blocks, int64_t block_size, int64_t max_step_tokens = 8192,
              std::unique_ptr<DeviceSampler> device_sampler = nullptr, DType kv_dtype = DType::kF32);
  ~ModelRunner();

  // One step, synchronously: launch() then collect().
  StepResult execute(const StepPlan& plan, const AdapterRegistry* adapters = nullptr);
  // Queues a step (at most two are in flight). Tokens that the previous step is still sampling are fed
  // from its device-side ids. A step whose rows need the host (the CPU sampler: penalties whose history
  // is not all known yet, prompt logprobs, or settings the device path does not cover) keeps its logits
  // for collect(); the next launch then has to wait for that collect() (needs_collect_before_launch()).
  void launch(const StepPlan& plan, const AdapterRegistry* adapters = nullptr);
  // Waits for the oldest queued step and returns its result.
  StepResult collect();
  bool in_flight() const { return !inflight_.empty() || deferred_; }
  bool needs_collect_before_launch() const { return !inflight_.empty() && inflight_.back().on_host; }
  // Structured output with a step queued ahead: when a constrained row's previous token is still being
  // sampled by the step in flight, launch() queues only the forward pass; the caller then collect()s and
  // completes the step in flight (advancing the row's matcher by that token) and calls finish_launch(),
  // which computes the masks (while the GPU runs the forward pass) and queues the sampling. A no-op
  // otherwise.
  void finish_launch();
  bool launch_deferred() const { return deferred_; }

  const KvStorage& kv() const { return kv_; }
  // Captures the model's decode graphs over this runner's KV cache (see Model::prepare_graphs).
  void prepare_graphs(const GraphOptions& options) { model_.prepare_graphs(kv_.views(), options); }
  BatchBuilder& builder() { return builder_; }

 private:
  enum class Sampling { kArgmax, kDevice, kHost };
  struct InFlight {
    std::vector<BatchBuilder::Row> rows;
    bool on_host = false;  // sampled at collect() from the logits on the device
    bool device_sampler = false;
    int ticket = 0;        // of the device sampler's launch
    std::vector<char> want_logprobs;  // per row (the request's state may be gone by collect())
    int slot = 0;          // pinned ids buffer and event
    // Structured output, host sampling: each row's allowed-token bitmask (empty: none), computed at
    // launch while the forward pass ran.
    std::vector<std::vector<uint32_t>> masks;
  };
  Sampling choose_sampling(const BatchBuilder::Step& step) const;
  void launch_device_sampler(const BatchBuilder::Step& step, InFlight& f,
                             const std::vector<std::vector<uint32_t>>& masks);
  // step_'s sampling (masks: per row, empty = none), end of step, and its InFlight entry.
  void queue_sampling(std::vector<std::vector<uint32_t>> masks);
  // Copies the step's logits to the host: prompt logprobs, then the CPU sampler on the sampled rows
  // (masks: per row, as InFlight::masks).
  void sample_on_host(const std::vector<BatchBuilder::Row>& rows, const std::vector<std::vector<uint32_t>>& masks,
                      StepResult& result);

  Model& model_;
  KvStorage kv_;
  Sampler sampler_;
  BatchBuilder builder_;
  BatchBuilder::Step step_;
  int64_t max_rows_;
  int32_t* d_ids_ = nullptr;  // [max_rows_] sampled ids of the last step, in backend memory
  std::array<int32_t*, 2> h_ids_{};  // page-locked copies, one per in-flight step
  std::array<void*, 2> done_{};      // events after each copy
  int next_slot_ = 0;
  std::deque<InFlight> inflight_;
  std::vector<float> logits_;
  std::unique_ptr<DeviceSampler> device_sampler_;
  std::vector<DeviceSampleRow> sample_rows_;
  // Structured output: a thread that fills the step's grammar masks while the forward pass runs.
  class MaskWorker;
  std::unique_ptr<MaskWorker> mask_worker_;
  bool deferred_ = false;  // step_'s forward pass is queued, its sampling waits for finish_launch()
};

}  // namespace polylora
