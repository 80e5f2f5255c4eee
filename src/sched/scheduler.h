// sched/scheduler.h: continuous batching (host code only).
// Owns: request states (waiting / running), the KV-cache manager, the token budget per step, chunked
// prefill, preemption by recompute, the fcfs, priority and fair policies (fair: a virtual token counter
// per adapter, Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024), the cap on distinct
// adapters per step and the order of admission by adapter residency. Each step: running requests first
// (decodes and unfinished prefill chunks, in order), then waiting ones while the token budget,
// --max-num-seqs, --max-loras and free blocks allow. When blocks
// run out a running request is preempted (its blocks freed; it returns to the front of the waiting queue
// with every token it generated, and is recomputed later), never lost.
// Must not: include CUDA headers, touch tensors, or sample (it receives sampled tokens in update()).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/kv_cache_manager.h"
#include "config/engine_config.h"
#include "sched/step_plan.h"

namespace polylora {

struct SchedRequest {
  RequestId id = 0;
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;
  // Tokens sampled by launched steps whose ids have not come back yet (asynchronous scheduling: at most
  // two, while one step is being collected and the next is queued). They count as the request's tokens for scheduling; their KV is computed by feeding the ids on
  // the device.
  int64_t num_pending = 0;
  int64_t max_total_tokens = 0;  // prompt + max_tokens, capped by max_model_len
  CacheKeyExtra cache_key;
  AdapterId adapter;
  int64_t priority = 0;
  uint64_t arrival = 0;
  bool prompt_logprobs = false;
  std::shared_ptr<const RequestSampling> sampling;  // passed through to the runner in the plan
  std::optional<RequestId> wait_for;                // a sibling (n > 1) whose prompt must be computed first
  int64_t num_cached_tokens = 0;                    // prefix-cache hit at first admission
  int64_t num_preemptions = 0;
  bool running = false;
  bool needs_fresh_plan = true;  // the runner does not hold it (new or preempted)
  uint64_t scheduled_step = 0;   // the last step that scheduled it
  uint64_t waiting_since = 0;    // the step it (re)entered the waiting queue
  uint64_t passed_over = 0;      // steps it waited, ready, while requests behind it were admitted
};

struct SchedulerStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_preemptions = 0;  // total
  double kv_usage = 0;
  PrefixCacheStats prefix;
};

// Where a waiting request's adapter is (the engine asks the adapter registry).
enum class AdapterReadiness { kOnDevice, kInHost, kNotReady };

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const LoraConfig& lora, std::unique_ptr<KvCacheManager> kv);

  // Takes a new request (tokens = its prompt). The caller validated it.
  void add(std::unique_ptr<SchedRequest> request);
  // Removes a request wherever it is and frees its blocks (no-op if unknown).
  void finish(RequestId id);
  StepPlan schedule();
  // After the step ran: advance computed counts; appends each sampled token (requests whose prefill
  // is not complete sample nothing). sampled[id] = token. The same as launched() then completed().
  void update(const StepPlan& plan, const std::unordered_map<RequestId, int32_t>& sampled);
  // Asynchronous scheduling splits update(): launched() right after the plan is queued on the device
  // (computed counts advance, each request that samples gets a pending token, so the next schedule()
  // can plan its next token before this step's ids are back), completed() when the ids are back (the
  // pending tokens get their values). A request with a pending token that would reach its token limit
  // is not scheduled again (it finishes by length); one that stops on EOS or a stop string has one more
  // token computed, which the engine discards. Requests gone in between are skipped.
  void launched(const StepPlan& plan);
  void completed(const StepPlan& plan, const std::unordered_map<RequestId, int32_t>& sampled);

  // Adapter residency. Only requests whose adapter is on the device (or that use the base model) are
  // admitted; the others are passed over without blocking the rest: those whose adapter is being read
  // from disk, and those whose adapter is in host memory and is being copied into a device slot (the
  // engine starts the copies). A request that waited --lora-max-wait-steps steps or more for a slot while
  // every slot is held stops the admission of adapter requests until running ones free one (bounded
  // wait). Unset: every adapter is on the device.
  void set_adapter_readiness(std::function<AdapterReadiness(AdapterId)> fn) { readiness_ = std::move(fn); }
  // Distinct adapters of the waiting requests in queue order (for prefetching), and of running ones.
  // overdue_only: only those of requests waiting --lora-max-wait-steps steps or more.
  std::vector<AdapterId> waiting_adapters(bool overdue_only = false) const;
  std::vector<AdapterId> running_adapters() const;
  // The most steps a waiting request whose adapter was ready saw requests behind it admitted (bounded by
  // max_wait_steps plus the time the running requests holding the slots take to finish).
  uint64_t max_passed_over() const { return max_passed_over_; }
  // Steps planned so far.
  uint64_t step_number() const { return step_number_; }
  // --scheduling-policy fair: the service a tenant (an adapter; the base model is one too) has been
  // charged: fair_prefill_weight per prompt token computed plus fair_decode_weight per token generated,
  // lifted when the tenant becomes backlogged (see schedule()). 0 for a tenant never seen.
  int64_t fair_counter(AdapterId tenant) const;

  const SchedRequest* get(RequestId id) const;
  bool has_unfinished() const { return !requests_.empty(); }
  SchedulerStats stats() const;
  const KvCacheManager& kv() const { return *kv_; }
  KvCacheManager& kv() { return *kv_; }
  // Invariant checks for tests: the cache's own, plus each running request's table covering its computed
  // tokens and waiting/running sets being disjoint. Empty when all hold.
  std::string check_invariants() const;

 private:
  void preempt(SchedRequest& r);
  bool before(const SchedRequest& a, const SchedRequest& b) const;  // waiting-queue order
  void insert_waiting(RequestId id, bool front);
  void erase_waiting(std::deque<RequestId>::iterator it);
  bool any_waiting_for_sibling() const;
  bool fair() const { return config_.policy == SchedulingPolicy::kFair; }
  // Fair policy: the service of `num_new` tokens from `r.num_computed_tokens` on (prompt tokens and
  // the token it samples, if it reaches its end) is added to its tenant's counter.
  void charge(const SchedRequest& r, int64_t num_new);

  SchedulerConfig config_;
  LoraConfig lora_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unordered_map<RequestId, std::unique_ptr<SchedRequest>> requests_;
  std::vector<RequestId> running_;  // in scheduling order
  std::deque<RequestId> waiting_;
  std::vector<RequestId> finished_since_plan_, preempted_since_plan_;
  std::function<AdapterReadiness(AdapterId)> readiness_;
  uint64_t max_passed_over_ = 0;
  uint64_t next_arrival_ = 0;
  uint64_t step_number_ = 0;
  int64_t num_preemptions_ = 0;
  // Fair policy: the virtual token counter of each tenant, its requests in the waiting queue (a tenant
  // with any is backlogged), and the counter of the last tenant whose backlog emptied (the lift when no
  // tenant is backlogged).
  std::unordered_map<AdapterId, int64_t> fair_counters_;
  std::unordered_map<AdapterId, int64_t> num_waiting_of_;
  int64_t fair_last_left_ = 0;
};

}  // namespace polylora
