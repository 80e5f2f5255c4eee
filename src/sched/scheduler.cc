// sched/scheduler.cc: continuous batching with chunked prefill, prefix-cache admission, preemption by
// recompute, fcfs/priority order, the fair policy's virtual token counters and the per-step adapter cap.
#include "sched/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>

#include "common/error.h"

namespace polylora {

Scheduler::Scheduler(const SchedulerConfig& config, const LoraConfig& lora,
                     std::unique_ptr<KvCacheManager> kv)
    : config_(config), lora_(lora), kv_(std::move(kv)) {}

bool Scheduler::before(const SchedRequest& a, const SchedRequest& b) const {
  switch (config_.policy) {
    case SchedulingPolicy::kFcfs:
    case SchedulingPolicy::kFair:  // arrival order within an adapter; fairness across them in schedule()
      return a.arrival < b.arrival;
    case SchedulingPolicy::kPriority:
      return a.priority != b.priority ? a.priority < b.priority : a.arrival < b.arrival;
  }
  return false;
}

void Scheduler::insert_waiting(RequestId id, bool front) {
  ++num_waiting_of_[requests_.at(id)->adapter];
  if (config_.policy != SchedulingPolicy::kPriority) {
    if (front)
      waiting_.push_front(id);
    else
      waiting_.push_back(id);
    return;
  }
  const SchedRequest& r = *requests_.at(id);
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](RequestId other) { return before(r, *requests_.at(other)); });
  waiting_.insert(it, id);
}

void Scheduler::erase_waiting(std::deque<RequestId>::iterator it) {
  AdapterId tenant = requests_.at(*it)->adapter;
  waiting_.erase(it);
  auto n = num_waiting_of_.find(tenant);
  CHECK(n != num_waiting_of_.end() && n->second > 0);
  if (--n->second == 0) {
    num_waiting_of_.erase(n);
    if (fair()) fair_last_left_ = fair_counter(tenant);
  }
}

int64_t Scheduler::fair_counter(AdapterId tenant) const {
  auto it = fair_counters_.find(tenant);
  return it == fair_counters_.end() ? 0 : it->second;
}

void Scheduler::charge(const SchedRequest& r, int64_t num_new) {
  const int64_t begin = r.num_computed_tokens, end = begin + num_new;
  const int64_t prompt = std::max<int64_t>(0, std::min(end, r.num_prompt_tokens) - begin);
  const bool samples = end >= static_cast<int64_t>(r.tokens.size()) + r.num_pending;
  fair_counters_[r.adapter] += config_.fair_prefill_weight * prompt + (samples ? config_.fair_decode_weight : 0);
}

void Scheduler::add(std::unique_ptr<SchedRequest> request) {
  CHECK(!request->tokens.empty());
  request->arrival = next_arrival_++;
  request->num_prompt_tokens = static_cast<int64_t>(request->tokens.size());
  RequestId id = request->id;
  CHECK_MSG(!requests_.count(id), "duplicate request id {}", id);
  request->waiting_since = step_number_;
  // Fair policy: a tenant that becomes backlogged starts from the smallest counter of those already
  // backlogged (or, with none, from the counter of the last one that left), so idle time is not banked.
  if (fair() && !num_waiting_of_.count(request->adapter)) {
    std::optional<int64_t> lowest;
    for (const auto& [tenant, n] : num_waiting_of_)
      if (!lowest || fair_counter(tenant) < *lowest) lowest = fair_counter(tenant);
    int64_t& c = fair_counters_[request->adapter];
    c = std::max(c, lowest.value_or(fair_last_left_));
  }
  requests_.emplace(id, std::move(request));
  insert_waiting(id, false);
}

void Scheduler::finish(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second->running) {
    running_.erase(std::find(running_.begin(), running_.end(), id));
    finished_since_plan_.push_back(id);
  } else {
    auto w = std::find(waiting_.begin(), waiting_.end(), id);
    if (w != waiting_.end()) erase_waiting(w);
  }
  kv_->free(id);
  // Siblings waiting on this one no longer need to.
  for (auto& [other_id, other] : requests_)
    if (other->wait_for == id) other->wait_for.reset();
  requests_.erase(it);
}

void Scheduler::preempt(SchedRequest& r) {
  kv_->free(r.id);
  r.num_computed_tokens = 0;
  r.running = false;
  r.needs_fresh_plan = true;
  ++r.num_preemptions;
  ++num_preemptions_;
  running_.erase(std::find(running_.begin(), running_.end(), r.id));
  preempted_since_plan_.push_back(r.id);
  r.waiting_since = step_number_;
  insert_waiting(r.id, true);
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.finished_ids = std::move(finished_since_plan_);
  finished_since_plan_.clear();
  int64_t budget = config_.max_num_batched_tokens;
  ++step_number_;
  std::set<AdapterId> step_adapters;
  bool preempted_this_step = false;

  auto emit = [&](SchedRequest& r, int64_t num_new, size_t blocks_before) {
    const auto& table = kv_->block_table(r.id);
    if (r.needs_fresh_plan) {
      ScheduledNew n;
      n.id = r.id;
      n.token_ids = r.tokens;
      n.num_prompt_tokens = r.num_prompt_tokens;
      n.block_ids = table;
      n.num_computed_tokens = r.num_computed_tokens;
      n.num_scheduled_tokens = num_new;
      n.adapter = r.adapter;
      n.prompt_logprobs = r.prompt_logprobs;
      n.sampling = r.sampling;
      plan.new_requests.push_back(std::move(n));
      r.needs_fresh_plan = false;
    } else {
      ScheduledRunning s;
      s.id = r.id;
      s.new_block_ids.assign(table.begin() + static_cast<long>(blocks_before), table.end());
      s.num_computed_tokens = r.num_computed_tokens;
      s.num_scheduled_tokens = num_new;
      plan.running.push_back(std::move(s));
    }
    if (fair()) charge(r, num_new);
    plan.num_scheduled_tokens += num_new;
    budget -= num_new;
    r.scheduled_step = step_number_;
    if (!r.adapter.base()) step_adapters.insert(r.adapter);
  };

  // 1. Running requests, in order: decodes and the next chunks of unfinished prefills.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    SchedRequest& r = *requests_.at(running_[i]);
    const int64_t num_tokens = static_cast<int64_t>(r.tokens.size()) + r.num_pending;
    int64_t num_new = std::min<int64_t>(num_tokens - r.num_computed_tokens, budget);
    // A pending token that reaches the limit ends the request (by length) once it is back.
    if (r.num_pending > 0 && num_tokens >= r.max_total_tokens) num_new = 0;
    if (num_new <= 0) {
      ++i;
      continue;
    }
    size_t blocks_before = kv_->block_table(r.id).size();
    bool self_preempted = false;
    while (!kv_->allocate(r.id, r.tokens, r.num_computed_tokens, num_new, r.cache_key)) {
      // Out of blocks: preempt a request not yet scheduled this step (the lowest-priority one, the most
      // recently admitted under fcfs, the one of the tenant with the most service under fair); possibly
      // this one.
      SchedRequest* victim = nullptr;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        if (requests_.at(*it)->scheduled_step == step_number_) continue;
        SchedRequest& cand = *requests_.at(*it);
        if (!victim)
          victim = &cand;
        else if (config_.policy == SchedulingPolicy::kPriority && before(*victim, cand))
          victim = &cand;
        else if (fair() && fair_counter(cand.adapter) > fair_counter(victim->adapter))
          victim = &cand;
        if (config_.policy == SchedulingPolicy::kFcfs) break;
      }
      CHECK(victim != nullptr);
      preempted_this_step = true;
      bool is_self = victim == &r;
      preempt(*victim);
      if (is_self) {
        self_preempted = true;
        break;
      }
    }
    if (self_preempted) continue;  // running_[i] now holds the next request
    emit(r, num_new, r.needs_fresh_plan ? 0 : blocks_before);
    ++i;
  }

  // 2. Waiting requests, unless this step already had to preempt: those whose adapter is resident on the
  // device first (or that waited max_wait_steps), then those whose adapter is in host memory; those whose
  // adapter is still loading are passed over. Under the fair policy the order is instead the tenants'
  // virtual token counters (the backlogged tenant with the least service first, each admission charged
  // at once), arrival order within a tenant and between equal counters.
  if (!preempted_this_step && !waiting_.empty()) {
    std::set<AdapterId> held_adapters = step_adapters;
    for (RequestId id : running_)
      if (!requests_.at(id)->adapter.base()) held_adapters.insert(requests_.at(id)->adapter);
    // A request whose adapter is in host memory waits for the copy into a device slot (the engine starts
    // it); one that waited max_wait_steps for it while every slot is held makes the slots drain.
    std::vector<RequestId> first;
    bool overdue_upload = false;
    for (RequestId id : waiting_) {
      const SchedRequest& r = *requests_.at(id);
      AdapterReadiness ready = r.adapter.base() || !readiness_ ? AdapterReadiness::kOnDevice : readiness_(r.adapter);
      if (ready == AdapterReadiness::kNotReady) continue;
      const bool overdue = step_number_ - r.waiting_since >= static_cast<uint64_t>(lora_.max_wait_steps);
      if (ready == AdapterReadiness::kInHost) {
        overdue_upload = overdue_upload || (overdue && !held_adapters.count(r.adapter));
        continue;
      }
      first.push_back(id);
    }
    // The fair policy picks, each time, the front request of the tenant with the smallest counter.
    std::map<AdapterId, std::deque<RequestId>> by_tenant;
    if (fair()) {
      std::stable_sort(first.begin(), first.end(), [&](RequestId a, RequestId b) {
        return requests_.at(a)->arrival < requests_.at(b)->arrival;
      });
      for (RequestId id : first) by_tenant[requests_.at(id)->adapter].push_back(id);
    }
    size_t next_idx = 0;
    auto next_candidate = [&]() -> std::optional<RequestId> {
      if (!fair()) return next_idx < first.size() ? std::optional<RequestId>(first[next_idx++]) : std::nullopt;
      std::deque<RequestId>* best = nullptr;
      auto key = [&](const std::deque<RequestId>& q) {
        const SchedRequest& r = *requests_.at(q.front());
        return std::make_pair(fair_counter(r.adapter), r.arrival);
      };
      for (auto& [tenant, q] : by_tenant)
        if (!q.empty() && (!best || key(q) < key(*best))) best = &q;
      if (!best) return std::nullopt;
      RequestId id = best->front();
      best->pop_front();
      return id;
    };
    // An overdue request that finds every slot held stops the admission of other adapters' requests
    // until the running ones free a slot, so a cold adapter cannot starve behind busy ones.
    bool hold_slots = overdue_upload && static_cast<int64_t>(held_adapters.size()) >= lora_.max_loras;
    uint64_t latest_admitted = 0;
    bool admitted_any = false;
    while (std::optional<RequestId> next = next_candidate()) {
      const RequestId id = *next;
      if (budget <= 0 || static_cast<int64_t>(running_.size()) >= config_.max_num_seqs) break;
      SchedRequest& r = *requests_.at(id);
      // (A request preempted while one of its tokens was being sampled waits for that token.)
      if (r.wait_for || r.num_pending > 0) continue;  // waits for a sibling's prompt or its token
      if (hold_slots && !r.adapter.base()) continue;  // the slots drain for an overdue request
      if (!r.adapter.base() && !held_adapters.count(r.adapter)) {
        // A request overdue for its adapter's copy keeps the last slot from being taken by others.
        if (static_cast<int64_t>(held_adapters.size()) >= lora_.max_loras) {
          // Waits for an adapter slot.
          if (step_number_ - r.waiting_since >= static_cast<uint64_t>(lora_.max_wait_steps)) hold_slots = true;
          continue;
        }
      }
      KvCacheManager::CachedPrefix prefix;
      bool first_admission = r.num_preemptions == 0;
      if (!r.prompt_logprobs) prefix = kv_->find_cached_prefix(r.tokens, r.cache_key);
      int64_t remaining = static_cast<int64_t>(r.tokens.size()) - prefix.num_tokens;
      if (!config_.enable_chunked_prefill && remaining > budget) break;
      int64_t num_new = std::min(remaining, budget);
      if (!kv_->allocate(r.id, r.tokens, prefix.num_tokens, num_new, r.cache_key, &prefix)) break;
      r.num_computed_tokens = prefix.num_tokens;
      if (first_admission) r.num_cached_tokens = prefix.num_tokens;
      r.running = true;
      running_.push_back(r.id);
      if (!r.adapter.base()) held_adapters.insert(r.adapter);
      erase_waiting(std::find(waiting_.begin(), waiting_.end(), id));
      emit(r, num_new, 0);
      latest_admitted = std::max(latest_admitted, r.arrival);
      admitted_any = true;
    }
    // Requests passed over: ready, still waiting, and a later arrival got in.
    if (admitted_any)
      for (RequestId id : waiting_) {
        SchedRequest& r = *requests_.at(id);
        bool ready = r.adapter.base() || !readiness_ || readiness_(r.adapter) != AdapterReadiness::kNotReady;
        if (ready && !r.wait_for && r.num_pending == 0 && r.arrival < latest_admitted &&
            config_.policy == SchedulingPolicy::kFcfs)
          max_passed_over_ = std::max(max_passed_over_, ++r.passed_over);
      }
  }
  plan.preempted_ids = std::move(preempted_since_plan_);
  preempted_since_plan_.clear();
  return plan;
}

void Scheduler::update(const StepPlan& plan, const std::unordered_map<RequestId, int32_t>& sampled) {
  launched(plan);
  completed(plan, sampled);
}

void Scheduler::launched(const StepPlan& plan) {
  auto advance = [&](RequestId id, int64_t num_scheduled) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    SchedRequest& r = *it->second;
    r.num_computed_tokens += num_scheduled;
    if (r.num_computed_tokens >= static_cast<int64_t>(r.tokens.size()) + r.num_pending) ++r.num_pending;
    // A sibling waiting on this request's prompt may start once the prompt is in the cache (any later
    // step runs after this one on the device).
    bool prompt_done_now = r.num_computed_tokens >= r.num_prompt_tokens &&
                           r.num_computed_tokens - num_scheduled < r.num_prompt_tokens;
    if (prompt_done_now && any_waiting_for_sibling())
      for (auto& [other_id, other] : requests_)
        if (other->wait_for == id) other->wait_for.reset();
  };
  for (const auto& n : plan.new_requests) advance(n.id, n.num_scheduled_tokens);
  for (const auto& s : plan.running) advance(s.id, s.num_scheduled_tokens);
}

void Scheduler::completed(const StepPlan& plan, const std::unordered_map<RequestId, int32_t>& sampled) {
  auto fill = [&](RequestId id) {
    auto it = requests_.find(id);
    auto s = sampled.find(id);
    if (it == requests_.end() || s == sampled.end()) return;
    SchedRequest& r = *it->second;
    CHECK_MSG(r.num_pending > 0, "request {} got a token it was not waiting for", id);
    --r.num_pending;
    r.tokens.push_back(s->second);
  };
  for (const auto& n : plan.new_requests) fill(n.id);
  for (const auto& s : plan.running) fill(s.id);
}

bool Scheduler::any_waiting_for_sibling() const {
  for (RequestId id : waiting_)
    if (requests_.at(id)->wait_for) return true;
  return false;
}

std::vector<AdapterId> Scheduler::waiting_adapters(bool overdue_only) const {
  std::vector<AdapterId> out;
  std::set<AdapterId> seen;
  for (RequestId id : waiting_) {
    const SchedRequest& r = *requests_.at(id);
    if (overdue_only && step_number_ - r.waiting_since < static_cast<uint64_t>(lora_.max_wait_steps)) continue;
    if (!r.adapter.base() && seen.insert(r.adapter).second) out.push_back(r.adapter);
  }
  return out;
}

std::vector<AdapterId> Scheduler::running_adapters() const {
  std::set<AdapterId> seen;
  for (RequestId id : running_)
    if (!requests_.at(id)->adapter.base()) seen.insert(requests_.at(id)->adapter);
  return {seen.begin(), seen.end()};
}

const SchedRequest* Scheduler::get(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = static_cast<int64_t>(running_.size());
  s.num_waiting = static_cast<int64_t>(waiting_.size());
  s.num_preemptions = num_preemptions_;
  s.kv_usage = kv_->usage();
  s.prefix = kv_->stats();
  return s;
}

std::string Scheduler::check_invariants() const {
  std::string kv_problem = kv_->check_invariants();
  if (!kv_problem.empty()) return kv_problem;
  std::set<RequestId> seen;
  for (RequestId id : running_) {
    if (!seen.insert(id).second) return "request " + std::to_string(id) + " is running twice";
    const SchedRequest& r = *requests_.at(id);
    if (!r.running) return "request " + std::to_string(id) + " in the running list is not marked running";
    int64_t capacity = static_cast<int64_t>(kv_->block_table(id).size()) * kv_->block_size();
    if (capacity < r.num_computed_tokens)
      return "request " + std::to_string(id) + " has computed tokens beyond its block table";
  }
  for (RequestId id : waiting_) {
    if (!seen.insert(id).second) return "request " + std::to_string(id) + " is both waiting and running";
    const SchedRequest& r = *requests_.at(id);
    if (r.running) return "waiting request " + std::to_string(id) + " is marked running";
    if (kv_->has_request(id) && !kv_->block_table(id).empty())
      return "waiting request " + std::to_string(id) + " holds blocks";
  }
  if (seen.size() != requests_.size()) return "a request is neither waiting nor running";
  std::unordered_map<AdapterId, int64_t> num_waiting;
  for (RequestId id : waiting_) ++num_waiting[requests_.at(id)->adapter];
  if (num_waiting != num_waiting_of_) return "the per-adapter waiting counts disagree with the waiting queue";
  return "";
}

}  // namespace polylora
