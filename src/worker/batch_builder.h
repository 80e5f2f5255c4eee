// worker/batch_builder.h: the one place a StepPlan becomes a forward pass's inputs. Keeps what the runner
// needs of each request between steps (tokens, block table, adapter, prompt-logprob flag and the sampling
// settings that arrive in the plan), applies the plan's deltas (new requests in full, running ones as new
// blocks; finished and preempted ones dropped), and packs the step: the ForwardBatch (its vectors keep
// their storage from step to step), the logits rows and who owns them, the step's adapters, and the token
// feed for tokens that an earlier step is still sampling on the device (asynchronous scheduling).
// Must not: make scheduling decisions, sample, or touch device memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/sampling_params.h"
#include "lora/adapter.h"
#include "lora/adapter_registry.h"
#include "model/forward_batch.h"
#include "model/model.h"
#include "sched/step_plan.h"

namespace polylora {

class BatchBuilder {
 public:
  explicit BatchBuilder(int64_t block_size) : block_size_(block_size) {}

  struct RequestState {
    std::vector<int32_t> tokens;  // prompt + generated; a token still being sampled holds 0
    int64_t num_prompt_tokens = 0;
    std::vector<int32_t> blocks;
    int64_t num_computed_tokens = 0;
    AdapterId adapter;
    bool prompt_logprobs = false;
    std::shared_ptr<const RequestSampling> sampling;  // from the plan; never null
    // The last token is being sampled by the most recent step, in its logits row `pending_row`
    // (-1: every token is known).
    int32_t pending_row = -1;
    int64_t num_output() const { return static_cast<int64_t>(tokens.size()) - num_prompt_tokens; }
  };
  struct Row {
    RequestId id;
    int64_t position;  // token position whose next-token logits this row holds
    bool sample;       // the request's next token comes from this row (else: a prompt-logprob row)
  };
  struct Step {
    ForwardBatch batch;
    std::vector<Row> rows;  // one per batch.logits_rows entry
    std::vector<const LoraAdapter*> adapters;  // by device slot (null: a slot this step does not use)
    std::vector<std::pair<RequestId, int64_t>> order;  // (request, tokens computed this step)
    TokenFeed feed;
  };

  // Applies the plan's deltas to the request states.
  void apply(const StepPlan& plan);
  // Packs the plan's step (after apply()). Tokens being sampled by the previous step are fed on the
  // device from `feed_src` (that step's sampled ids by logits row; may be null when none are pending).
  // Every adapter of the plan is in a device slot of `adapters` (AdapterRegistry::ensure()); may be
  // null when the plan uses none.
  void build(const StepPlan& plan, const AdapterRegistry* adapters, const int32_t* feed_src, Step& out);
  // After the step is queued: computed counts advance and each sampling request gets its next token as
  // pending (value 0 until fill()), owned by its row in this step.
  void advance(const Step& step);
  // The value of a pending token came back: `position` of `id` (ignored when the request is gone).
  void fill(RequestId id, int64_t position, int32_t token);

  const RequestState* find(RequestId id) const;
  RequestState& at(RequestId id) { return states_.at(id); }

 private:
  int64_t block_size_;
  std::unordered_map<RequestId, RequestState> states_;
};

}  // namespace polylora
