// sched/step_plan.h: the scheduler's decision for one step, handed to the model runner (values only).
// New requests arrive in full; requests the runner already holds arrive as deltas (new block ids and the
// number of tokens to compute); finished and preempted ids tell the runner what to drop.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "api/sampling_params.h"
#include "cache/kv_cache_manager.h"
#include "lora/adapter_id.h"

namespace polylora {

struct ScheduledNew {
  RequestId id = 0;
  std::vector<int32_t> token_ids;  // prompt plus any tokens generated before a preemption
  int64_t num_prompt_tokens = 0;
  std::vector<int32_t> block_ids;   // the whole block table so far
  int64_t num_computed_tokens = 0;  // tokens already in the KV cache (prefix-cache hits)
  int64_t num_scheduled_tokens = 0;
  AdapterId adapter;                                // base model: version 0
  bool prompt_logprobs = false;                     // logits wanted at every prompt position
  std::shared_ptr<const RequestSampling> sampling;  // how to sample it (settings, seed, EOS ids)
};

struct ScheduledRunning {
  RequestId id = 0;
  std::vector<int32_t> new_block_ids;  // appended to its block table
  int64_t num_computed_tokens = 0;     // before this step
  int64_t num_scheduled_tokens = 0;
};

struct StepPlan {
  std::vector<ScheduledNew> new_requests;
  std::vector<ScheduledRunning> running;
  std::vector<RequestId> finished_ids;   // since the last step: drop their state
  std::vector<RequestId> preempted_ids;  // since the last step: drop their state (they come back as new)
  int64_t num_scheduled_tokens = 0;
  bool empty() const { return new_requests.empty() && running.empty(); }
};

}  // namespace polylora
