// tests/unit/sched/scheduler_test.cc: the scheduler driven by fake requests (no model): randomized runs
// over thousands of steps with invariants checked after every step, chunked prefill within the token
// budget, preemption that loses nothing, fcfs without starvation, priority order, and the adapter cap.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "sched/scheduler.h"

namespace polylora {
namespace {

std::unique_ptr<SchedRequest> make_request(RequestId id, std::vector<int32_t> prompt, int64_t max_new,
                                           AdapterId adapter = {}, int64_t priority = 0) {
  auto r = std::make_unique<SchedRequest>();
  r->id = id;
  r->tokens = std::move(prompt);
  r->max_total_tokens = static_cast<int64_t>(r->tokens.size()) + max_new;
  r->adapter = adapter;
  r->cache_key.adapter = adapter;
  r->priority = priority;
  return r;
}

// Runs one step with fake sampling: every request that reached the end of its tokens gets token 7 + id.
// Finishes requests at their max_total_tokens. Returns the ids that finished.
std::vector<RequestId> run_step(Scheduler& s, StepPlan& plan, std::map<RequestId, int64_t>& budget_check,
                                int64_t budget) {
  plan = s.schedule();
  EXPECT_LE(plan.num_scheduled_tokens, budget);
  std::unordered_map<RequestId, int32_t> sampled;
  auto consider = [&](RequestId id, int64_t num_computed, int64_t num) {
    const SchedRequest* r = s.get(id);
    if (num_computed + num == static_cast<int64_t>(r->tokens.size()))
      sampled[id] = static_cast<int32_t>(7 + id % 50);
    budget_check[id] += num;
  };
  for (const auto& n : plan.new_requests) consider(n.id, n.num_computed_tokens, n.num_scheduled_tokens);
  for (const auto& r : plan.running) consider(r.id, r.num_computed_tokens, r.num_scheduled_tokens);
  s.update(plan, sampled);
  std::vector<RequestId> done;
  for (const auto& [id, tok] : sampled) {
    const SchedRequest* r = s.get(id);
    if (static_cast<int64_t>(r->tokens.size()) >= r->max_total_tokens) done.push_back(id);
  }
  for (RequestId id : done) s.finish(id);
  return done;
}

TEST(Scheduler, RandomizedRunsKeepInvariantsAndFinishEverything) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    SchedulerConfig sc;
    sc.max_num_batched_tokens = 64;
    sc.max_num_seqs = 16;
    LoraConfig lc;
    lc.max_loras = 2;
    Scheduler s(sc, lc, std::make_unique<KvCacheManager>(48, 4, true));
    std::vector<std::vector<int32_t>> prefixes;
    for (int p = 0; p < 4; ++p) {
      std::vector<int32_t> v;
      for (int t = 0; t < 12; ++t) v.push_back(static_cast<int32_t>(rng() % 100));
      prefixes.push_back(v);
    }
    std::set<RequestId> live;
    std::map<RequestId, AdapterId> adapter_of;
    std::map<RequestId, int64_t> computed;
    RequestId next = 1;
    int64_t finished = 0;
    StepPlan plan;
    for (int step = 0; step < 3000; ++step) {
      if (next <= 400 && rng() % 3 == 0) {
        auto prompt = prefixes[rng() % prefixes.size()];
        int extra = static_cast<int>(rng() % 30);
        for (int t = 0; t < extra; ++t) prompt.push_back(static_cast<int32_t>(rng() % 100));
        AdapterId adapter = rng() % 2 ? AdapterId{} : AdapterId{1 + rng() % 4};
        adapter_of[next] = adapter;
        s.add(make_request(next, prompt, 1 + static_cast<int64_t>(rng() % 20), adapter));
        live.insert(next++);
      }
      if (!live.empty() && rng() % 50 == 0) {  // abort a random live request
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        s.finish(*it);
        live.erase(it);
      }
      for (RequestId id : run_step(s, plan, computed, sc.max_num_batched_tokens)) {
        live.erase(id);
        ++finished;
      }
      // At most max_loras distinct adapters in a step.
      std::set<AdapterId> adapters;
      for (const auto& n : plan.new_requests)
        if (!n.adapter.base()) adapters.insert(n.adapter);
      for (const auto& r : plan.running)
        if (!adapter_of[r.id].base()) adapters.insert(adapter_of[r.id]);
      ASSERT_LE(static_cast<int64_t>(adapters.size()), lc.max_loras);
      ASSERT_EQ(s.check_invariants(), "") << "seed " << seed << " step " << step;
    }
    for (int step = 0; step < 20000 && s.has_unfinished(); ++step) {
      for (RequestId id : run_step(s, plan, computed, sc.max_num_batched_tokens)) {
        live.erase(id);
        ++finished;
      }
      ASSERT_EQ(s.check_invariants(), "");
    }
    EXPECT_FALSE(s.has_unfinished()) << "requests starved";
    EXPECT_GT(s.stats().num_preemptions, 0) << "the small cache should force preemption";
    EXPECT_GT(s.stats().prefix.hits, 0);
    EXPECT_GT(finished, 300);
  }
}

TEST(Scheduler, ChunkedPrefillWithinBudget) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 10;
  Scheduler s(sc, {}, std::make_unique<KvCacheManager>(64, 4, false));
  std::vector<int32_t> prompt(35, 3);
  s.add(make_request(1, prompt, 3));
  std::map<RequestId, int64_t> computed;
  StepPlan plan;
  std::vector<int64_t> chunks;
  for (int i = 0; i < 10 && s.has_unfinished(); ++i) {
    run_step(s, plan, computed, 10);
    chunks.push_back(plan.num_scheduled_tokens);
  }
  EXPECT_EQ(chunks, (std::vector<int64_t>{10, 10, 10, 5, 1, 1}));
}

TEST(Scheduler, PreemptionLosesNothingAndKeepsItsPlace) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 100;
  Scheduler s(sc, {}, std::make_unique<KvCacheManager>(6, 4, false));  // 24 tokens in all
  s.add(make_request(1, std::vector<int32_t>(8, 1), 12));
  s.add(make_request(2, std::vector<int32_t>(8, 2), 12));
  std::map<RequestId, int64_t> computed;
  StepPlan plan;
  std::vector<RequestId> finish_order;
  for (int i = 0; i < 200 && s.has_unfinished(); ++i) {
    for (RequestId id : run_step(s, plan, computed, 100)) finish_order.push_back(id);
    ASSERT_EQ(s.check_invariants(), "");
  }
  EXPECT_FALSE(s.has_unfinished());
  EXPECT_GT(s.stats().num_preemptions, 0);
  EXPECT_EQ(finish_order, (std::vector<RequestId>{1, 2}));  // fcfs: the first request is never overtaken
}

TEST(Scheduler, FcfsAdmitsInArrivalOrderAndPriorityByPriority) {
  for (SchedulingPolicy policy : {SchedulingPolicy::kFcfs, SchedulingPolicy::kPriority}) {
    SchedulerConfig sc;
    sc.max_num_seqs = 1;
    sc.policy = policy;
    Scheduler s(sc, {}, std::make_unique<KvCacheManager>(64, 4, false));
    s.add(make_request(1, {1, 2, 3}, 1, {}, 5));
    s.add(make_request(2, {1, 2, 3}, 1, {}, 1));
    s.add(make_request(3, {1, 2, 3}, 1, {}, 3));
    std::map<RequestId, int64_t> computed;
    StepPlan plan;
    std::vector<RequestId> order;
    for (int i = 0; i < 20 && s.has_unfinished(); ++i)
      for (RequestId id : run_step(s, plan, computed, 8192)) order.push_back(id);
    if (policy == SchedulingPolicy::kFcfs)
      EXPECT_EQ(order, (std::vector<RequestId>{1, 2, 3}));
    else
      EXPECT_EQ(order, (std::vector<RequestId>{2, 3, 1}));
  }
}

TEST(Scheduler, MaxLorasCapsDistinctAdaptersPerStep) {
  LoraConfig lc;
  lc.max_loras = 1;
  Scheduler s({}, lc, std::make_unique<KvCacheManager>(64, 4, false));
  s.add(make_request(1, {1, 2}, 2, AdapterId{1}));
  s.add(make_request(2, {1, 2}, 2, AdapterId{2}));
  s.add(make_request(3, {1, 2}, 2, AdapterId{1}));
  StepPlan plan = s.schedule();
  std::set<RequestId> ids;
  for (const auto& n : plan.new_requests) ids.insert(n.id);
  EXPECT_EQ(ids, (std::set<RequestId>{1, 3}));
}

}  // namespace
}  // namespace polylora
