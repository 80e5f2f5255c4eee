// tests/unit/sched/fair_scheduler_test.cc: --scheduling-policy fair (the virtual token counter of Sheng et
// al., "Fairness in Serving Large Language Models", OSDI 2024; w_p = 1 per prompt token, w_q = 2 per
// generated token) driven by fake requests. One adapter floods the server (400 requests at once) while
// three light tenants (the base model and two adapters) each keep three requests outstanding (a little
// more than an equal share of the 8 sequences, so they are backlogged too): under fair
// every light tenant gets close to its equal share (1/4) of the generated tokens and its requests start
// within a few request lengths, which fcfs, run on the same traffic, violates. Also: a tenant arriving
// after others were backlogged for long is lifted (it gets a share, not the whole server), and a
// randomized run with preemption under fair keeps the invariants and finishes everything.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "sched/scheduler.h"

namespace polylora {
namespace {

constexpr int64_t kPrompt = 32, kOutput = 32;
// Flood test: output lengths vary over [kMinOutput, kMaxOutput] (mean kOutput), so tenants do not move in
// lockstep.
constexpr int64_t kMinOutput = 16, kMaxOutput = 48;
constexpr int kOutstanding = 3;  // per light tenant

std::unique_ptr<SchedRequest> make_request(RequestId id, AdapterId adapter, int64_t prompt = kPrompt,
                                           int64_t output = kOutput) {
  auto r = std::make_unique<SchedRequest>();
  r->id = id;
  for (int64_t i = 0; i < prompt; ++i) r->tokens.push_back(static_cast<int32_t>(1 + (id * 7 + i) % 90));
  r->max_total_tokens = prompt + output;
  r->adapter = adapter;
  r->cache_key.adapter = adapter;
  return r;
}

// One step with fake sampling (every request that reaches the end of its tokens gets one); finishes the
// requests at their token limit. Returns the ids that sampled a token this step.
std::vector<RequestId> step(Scheduler& s, std::vector<RequestId>* finished) {
  StepPlan plan = s.schedule();
  std::unordered_map<RequestId, int32_t> sampled;
  auto consider = [&](RequestId id, int64_t num_computed, int64_t num) {
    if (num_computed + num == static_cast<int64_t>(s.get(id)->tokens.size())) sampled[id] = 5;
  };
  for (const auto& n : plan.new_requests) consider(n.id, n.num_computed_tokens, n.num_scheduled_tokens);
  for (const auto& r : plan.running) consider(r.id, r.num_computed_tokens, r.num_scheduled_tokens);
  s.update(plan, sampled);
  std::vector<RequestId> out;
  for (const auto& [id, tok] : sampled) {
    out.push_back(id);
    const SchedRequest* r = s.get(id);
    if (static_cast<int64_t>(r->tokens.size()) >= r->max_total_tokens) finished->push_back(id);
  }
  for (RequestId id : *finished) s.finish(id);
  return out;
}

struct FloodResult {
  std::map<AdapterId, int64_t> generated;  // tokens per tenant over the window
  std::map<AdapterId, int64_t> max_ttft;   // steps from arrival to the first token, light tenants
  int64_t max_backlogged_spread = 0;       // largest counter gap between backlogged tenants (fair)
  std::string invariant_error;
};

const AdapterId kHeavy{1};
const std::vector<AdapterId> kLight = {AdapterId{}, AdapterId{2}, AdapterId{3}};

// The heavy tenant submits 400 requests at step 0 (first in the queue); each light tenant keeps
// kOutstanding outstanding, submitting the next as one finishes. Runs `window` steps, during which the heavy
// tenant stays backlogged under either policy (it needs about 400 x 32 = 12,800 decode slots, 8 per step at
// most).
FloodResult run_flood(SchedulingPolicy policy, int window) {
  SchedulerConfig sc;
  sc.policy = policy;
  sc.max_num_seqs = 8;
  sc.max_num_batched_tokens = 512;
  LoraConfig lc;
  lc.max_loras = 4;
  Scheduler s(sc, lc, std::make_unique<KvCacheManager>(1024, 16, false));
  RequestId next = 1;
  std::map<RequestId, AdapterId> tenant;
  std::map<RequestId, int64_t> arrival_step;
  std::set<RequestId> got_first;
  auto submit = [&](AdapterId a, int64_t at) {
    tenant[next] = a;
    arrival_step[next] = at;
    const int64_t output =
        kMinOutput + static_cast<int64_t>((next * 2654435761u) % (kMaxOutput - kMinOutput + 1));
    s.add(make_request(next, a, kPrompt, output));
    ++next;
  };
  for (int i = 0; i < 400; ++i) submit(kHeavy, 0);
  for (AdapterId a : kLight)
    for (int k = 0; k < kOutstanding; ++k) submit(a, 0);
  FloodResult res;
  for (int64_t t = 0; t < window; ++t) {
    std::vector<RequestId> finished;
    for (RequestId id : step(s, &finished)) {
      AdapterId a = tenant.at(id);
      ++res.generated[a];
      if (a != kHeavy && got_first.insert(id).second)
        res.max_ttft[a] = std::max(res.max_ttft[a], t - arrival_step.at(id));
    }
    for (RequestId id : finished)
      if (tenant.at(id) != kHeavy) submit(tenant.at(id), t + 1);  // closed loop: the next one at once
    std::string problem = s.check_invariants();
    if (!problem.empty() && res.invariant_error.empty()) res.invariant_error = problem;
    // Light requests that never started count with the time they have waited so far.
    for (const auto& [id, a] : tenant)
      if (a != kHeavy && !got_first.count(id) && s.get(id))
        res.max_ttft[a] = std::max(res.max_ttft[a], t - arrival_step.at(id));
    // The counters of the tenants with waiting requests.
    std::vector<int64_t> backlogged;
    std::set<AdapterId> waiting_tenants;
    for (const auto& [id, a] : tenant)
      if (const SchedRequest* r = s.get(id); r && !r->running) waiting_tenants.insert(a);
    for (AdapterId a : waiting_tenants) backlogged.push_back(s.fair_counter(a));
    if (backlogged.size() > 1)
      res.max_backlogged_spread =
          std::max(res.max_backlogged_spread, *std::max_element(backlogged.begin(), backlogged.end()) -
                                                  *std::min_element(backlogged.begin(), backlogged.end()));
  }
  return res;
}

double share(const FloodResult& r, AdapterId a) {
  int64_t total = 0;
  for (const auto& [t, n] : r.generated) total += n;
  auto it = r.generated.find(a);
  return total == 0 || it == r.generated.end() ? 0.0
                                               : static_cast<double>(it->second) / static_cast<double>(total);
}

// The bounds: with 8 sequences, four tenants, equal request shapes and every tenant able to fill two
// sequences, the fair share is 1/4 of the tokens each; we require at least 0.2 of them per light tenant.
// A light request waits at most until a sequence of its tenant's share frees up (one request length,
// 32 decode steps, when requests are staggered); we require its first token within 2 x (prompt + output)
// = 128 steps. The VTC bound on the gap between backlogged tenants' counters is
// 2 x (w_p x prompt + w_q x longest output) = 2 x (32 + 96) = 256.
constexpr double kMinLightShare = 0.2;
constexpr int64_t kMaxLightTtftSteps = 2 * (kPrompt + kOutput);
constexpr int64_t kMaxCounterSpread = 2 * (1 * kPrompt + 2 * kMaxOutput);

TEST(FairScheduler, LightTenantsKeepTheirShareAndTtftWhileOneFloods) {
  constexpr int kWindow = 600;
  FloodResult fair = run_flood(SchedulingPolicy::kFair, kWindow);
  ASSERT_EQ(fair.invariant_error, "");
  int64_t total = 0;
  for (const auto& [t, n] : fair.generated) total += n;
  EXPECT_GT(total, kWindow * 7) << "the server should stay saturated (8 sequences per step)";
  for (AdapterId a : kLight) {
    EXPECT_GE(share(fair, a), kMinLightShare) << "tenant " << a.version;
    EXPECT_LE(fair.max_ttft.at(a), kMaxLightTtftSteps) << "tenant " << a.version;
  }
  EXPECT_LE(share(fair, kHeavy), 0.3);
  auto report = [](const char* policy, const FloodResult& r) {
    std::printf(
        "%s: shares heavy %.3f base %.3f a2 %.3f a3 %.3f; light TTFT max (steps) %lld %lld %lld; counter "
        "spread %lld\n",
        policy, share(r, kHeavy), share(r, kLight[0]), share(r, kLight[1]), share(r, kLight[2]),
        static_cast<long long>(r.max_ttft.at(kLight[0])), static_cast<long long>(r.max_ttft.at(kLight[1])),
        static_cast<long long>(r.max_ttft.at(kLight[2])), static_cast<long long>(r.max_backlogged_spread));
  };
  report("fair", fair);
  EXPECT_LE(fair.max_backlogged_spread, kMaxCounterSpread);

  // The same traffic under fcfs: the light tenants wait behind the flood, so the bounds fail.
  FloodResult fcfs = run_flood(SchedulingPolicy::kFcfs, kWindow);
  ASSERT_EQ(fcfs.invariant_error, "");
  for (AdapterId a : kLight) {
    EXPECT_LT(share(fcfs, a), kMinLightShare) << "tenant " << a.version;
    EXPECT_GT(fcfs.max_ttft.at(a), kMaxLightTtftSteps) << "tenant " << a.version;
  }
  EXPECT_GT(share(fcfs, kHeavy), 0.9);
  report("fcfs", fcfs);
}

// Two tenants backlogged for 300 steps, then a third arrives with a burst: lifted to their counters, it
// gets about a third of the tokens from then on, not the whole server while it "catches up".
TEST(FairScheduler, LateTenantIsLiftedToTheBackloggedCounters) {
  SchedulerConfig sc;
  sc.policy = SchedulingPolicy::kFair;
  sc.max_num_seqs = 6;
  sc.max_num_batched_tokens = 512;
  LoraConfig lc;
  lc.max_loras = 4;
  Scheduler s(sc, lc, std::make_unique<KvCacheManager>(1024, 16, false));
  const AdapterId a{1}, b{2}, late{3};
  std::map<RequestId, AdapterId> tenant;
  RequestId next = 1;
  auto submit = [&](AdapterId t) {
    tenant[next] = t;
    s.add(make_request(next++, t));
  };
  for (int i = 0; i < 200; ++i) {
    submit(a);
    submit(b);
  }
  std::vector<RequestId> finished;
  for (int t = 0; t < 300; ++t) {
    finished.clear();
    step(s, &finished);
  }
  EXPECT_GT(s.fair_counter(a), 1000);
  for (int i = 0; i < 100; ++i) submit(late);
  EXPECT_GE(s.fair_counter(late), std::min(s.fair_counter(a), s.fair_counter(b)));
  std::map<AdapterId, int64_t> generated;
  for (int t = 0; t < 200; ++t) {
    finished.clear();
    for (RequestId id : step(s, &finished)) ++generated[tenant.at(id)];
    ASSERT_EQ(s.check_invariants(), "");
  }
  const double total = static_cast<double>(generated[a] + generated[b] + generated[late]);
  std::printf("after the late tenant arrived: shares a %.3f b %.3f late %.3f\n", generated[a] / total,
              generated[b] / total, generated[late] / total);
  EXPECT_GE(generated[late] / total, 0.2);
  EXPECT_LE(generated[late] / total, 0.45);
  EXPECT_GE(generated[a] / total, 0.2);
  EXPECT_GE(generated[b] / total, 0.2);
}

// A small KV cache forces preemption; mixed tenants and lengths, aborts: invariants after every step and
// nothing starves.
TEST(FairScheduler, RandomizedRunsWithPreemptionFinishEverything) {
  for (uint64_t seed : {11u, 12u}) {
    std::mt19937_64 rng(seed);
    SchedulerConfig sc;
    sc.policy = SchedulingPolicy::kFair;
    sc.max_num_batched_tokens = 48;
    sc.max_num_seqs = 12;
    LoraConfig lc;
    lc.max_loras = 2;
    Scheduler s(sc, lc, std::make_unique<KvCacheManager>(40, 4, true));
    std::set<RequestId> live;
    RequestId next = 1;
    for (int t = 0; t < 3000; ++t) {
      if (next <= 300 && rng() % 3 == 0) {
        AdapterId a = rng() % 3 == 0 ? AdapterId{} : AdapterId{1 + rng() % 4};
        s.add(make_request(next, a, 4 + static_cast<int64_t>(rng() % 30),
                           1 + static_cast<int64_t>(rng() % 20)));
        live.insert(next++);
      }
      if (!live.empty() && rng() % 60 == 0) {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        s.finish(*it);
        live.erase(it);
      }
      std::vector<RequestId> finished;
      step(s, &finished);
      for (RequestId id : finished) live.erase(id);
      ASSERT_EQ(s.check_invariants(), "") << "seed " << seed << " step " << t;
    }
    for (int t = 0; t < 20000 && s.has_unfinished(); ++t) {
      std::vector<RequestId> finished;
      step(s, &finished);
      ASSERT_EQ(s.check_invariants(), "");
    }
    EXPECT_FALSE(s.has_unfinished()) << "requests starved under the fair policy";
    EXPECT_GT(s.stats().num_preemptions, 0) << "the small cache should force preemption";
  }
}

}  // namespace
}  // namespace polylora
