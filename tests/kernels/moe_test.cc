// tests/kernels/moe_test.cc: cpu::route and cpu::moe_experts against the references: an expert with no
// token and one with every token, top_k 1 and E, one token and many, adapter slots −1 mixed with two
// adapters of different ranks (gate_up/gate/up/down LoRA, some views empty), both activations, fused
// gate_up vs separate gate/up, biases on and off, F32/F16/BF16 weights.
// Tolerances: route atol 1e-6 + rtol 1e-5 with identical ids; experts atol 1e-4 + rtol 1e-3 (two chained
// products of length 64..96 plus LoRA, summed over top_k, in a different order; the activation's exp).
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <random>
#include <string>

#include "kernel_test_util.h"
#include "kernels/moe/moe.h"

namespace polylora::kernels {
namespace {

struct Lora {
  std::vector<float> a, b;
  LoraView view(int64_t rank, int64_t in, int64_t out) {
    return {.a = a.data(), .b = b.data(), .rank = rank, .in = in, .out = out, .scale = 0.5f};
  }
};

struct MoeCase {
  int64_t m = 1, hidden = 64, inter = 48, num_experts = 6, top_k = 2;
  DType dtype = DType::kF32;
  bool fused = true;
  bool biases = false;
  ExpertAct act = ExpertAct::kSiluGate;
  bool lora = false;
  // Routing: "spread" (random distinct experts, expert 0 never used), "all" (expert 2 first for every token).
  bool every_token_to_expert_2 = false;
};

void run_moe(const MoeCase& c) {
  int64_t H = c.hidden, I = c.inter, E = c.num_experts, K = c.top_k, m = c.m;
  std::vector<test::TestWeight> weights;
  weights.reserve(static_cast<size_t>(4 * E));
  std::vector<std::vector<float>> biases;
  std::vector<ExpertView> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    uint32_t seed = static_cast<uint32_t>(100 + e * 10);
    ExpertView& ex = experts[e];
    float s = 0.2f;
    if (c.fused) {
      weights.push_back(test::make_weight(2 * I, H, c.dtype, seed, s));
      ex.gate_up = weights.back().view;
    } else {
      weights.push_back(test::make_weight(I, H, c.dtype, seed + 1, s));
      ex.gate = weights.back().view;
      weights.push_back(test::make_weight(I, H, c.dtype, seed + 2, s));
      ex.up = weights.back().view;
    }
    weights.push_back(test::make_weight(H, I, c.dtype, seed + 3, s));
    ex.down = weights.back().view;
    if (c.biases) {
      biases.push_back(test::random_vec(static_cast<size_t>(2 * I), seed + 4));
      ex.gate_up_bias = biases.back().data();
      biases.push_back(test::random_vec(static_cast<size_t>(H), seed + 5));
      ex.down_bias = biases.back().data();
    }
  }
  std::vector<float> x = test::random_vec(static_cast<size_t>(m * (H + 2)), 1, -2.0f, 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> w = test::random_vec(static_cast<size_t>(m * K), 2, 0.0f, 1.0f);
  std::mt19937 rng(3);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    if (K < E) order.erase(std::find(order.begin(), order.end(), 0));  // expert 0 gets no token
    if (c.every_token_to_expert_2) {
      order.erase(std::find(order.begin(), order.end(), 2));
      order.insert(order.begin(), 2);
    }
    for (int64_t k = 0; k < K; ++k) ids[t * K + k] = order[k];
  }
  // Two adapter slots: slot 0 rank 1 on gate_up/down (fused) or gate/down; slot 1 rank 5 on up only.
  std::vector<Lora> loras;
  loras.reserve(static_cast<size_t>(4 * E));
  std::vector<ExpertLoraView> lviews(static_cast<size_t>(2 * E));
  std::vector<int32_t> slots(static_cast<size_t>(m));
  auto make = [&](int64_t rank, int64_t in, int64_t out, uint32_t seed) {
    loras.push_back({test::random_vec(static_cast<size_t>(rank * in), seed),
                     test::random_vec(static_cast<size_t>(out * rank), seed + 1)});
    return loras.back().view(rank, in, out);
  };
  if (c.lora) {
    for (int64_t e = 0; e < E; ++e) {
      uint32_t seed = static_cast<uint32_t>(500 + 7 * e);
      if (c.fused) {
        lviews[e].gate_up = make(1, H, 2 * I, seed);
      } else {
        lviews[e].gate = make(1, H, I, seed);
      }
      if (e % 2 == 0) lviews[e].down = make(1, I, H, seed + 2);
      if (c.act == ExpertAct::kSiluGate && e != 3) lviews[E + e].up = make(5, H, I, seed + 4);
      lviews[E + e].down = make(5, I, H, seed + 6);
    }
    for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>(t % 3) - 1;  // −1, 0, 1, −1, ...
  }
  int64_t ldo = H + 1;
  MoeExpertsArgs a{.x = x.data(),
                   .ldx = H + 2,
                   .m = m,
                   .hidden = H,
                   .inter = I,
                   .num_experts = E,
                   .top_k = K,
                   .ids = ids.data(),
                   .weights = w.data(),
                   .experts = experts.data(),
                   .act = c.act,
                   .token_slots = c.lora ? slots.data() : nullptr,
                   .lora = c.lora ? lviews.data() : nullptr,
                   .num_slots = c.lora ? 2 : 0,
                   .out = nullptr,
                   .ldo = ldo};
  std::vector<float> ref(static_cast<size_t>(m * ldo), 3.0f);
  a.out = ref.data();
  ref::moe_experts(a);
  for (int64_t t = 0; t < m; ++t) ref[t * ldo + H] = 0.0f;
  std::string what = "m=" + std::to_string(m) + " E=" + std::to_string(E) + " K=" + std::to_string(K) + " " +
                     test::dtype_str(c.dtype) + (c.fused ? " fused" : " separate") +
                     (c.biases ? " bias" : "") + (c.act == ExpertAct::kSiluGate ? " silu" : " swiglu") +
                     (c.lora ? " lora" : "") + (c.every_token_to_expert_2 ? " all->2" : "");
  test::for_each_isa([&](const char* isa) {
    std::vector<float> out(ref.size(), 3.0f);
    MoeExpertsArgs f = a;
    f.out = out.data();
    cpu::moe_experts(f);
    for (int64_t t = 0; t < m; ++t) out[t * ldo + H] = 0.0f;  // padding column is not written
    test::expect_close(out, ref, 1e-4f, 1e-3f, std::string(isa) + " " + what);
  });
}

TEST(MoeCpu, ExpertsAwkwardRouting) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t m : {1, 13, 40}) {
      for (ExpertAct act : {ExpertAct::kSiluGate, ExpertAct::kGptOssSwiglu}) {
        for (bool fused : {true, false}) {
          for (bool lora : {false, true}) {
            MoeCase c{.m = m,
                      .dtype = dtype,
                      .fused = fused,
                      .biases = (m % 2) == 1,
                      .act = act,
                      .lora = lora,
                      .every_token_to_expert_2 = m == 13};
            run_moe(c);
          }
        }
      }
    }
  }
}

TEST(MoeCpu, TopKOneAndTopKAll) {
  for (int64_t k : {1, 6}) {
    for (int64_t m : {1, 9, 20}) {
      run_moe({.m = m,
               .hidden = 33,
               .inter = 17,
               .num_experts = 6,
               .top_k = k,
               .dtype = DType::kBF16,
               .lora = true});
    }
  }
}

TEST(MoeCpu, LargeBatchRunsParallelPhases) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    run_moe({.m = 300,
             .hidden = 136,
             .inter = 72,
             .num_experts = 8,
             .top_k = 3,
             .dtype = dtype,
             .fused = true,
             .biases = true,
             .lora = true});
    run_moe({.m = 150,
             .hidden = 130,
             .inter = 40,
             .num_experts = 5,
             .top_k = 2,
             .dtype = dtype,
             .fused = false,
             .act = ExpertAct::kGptOssSwiglu,
             .lora = true});
  }
}

TEST(MoeCpu, RouteBothScorings) {
  for (RouterScoring scoring : {RouterScoring::kSoftmaxTopK, RouterScoring::kTopKSoftmax}) {
    for (bool renorm : {false, true}) {
      for (auto [E, K] : {std::pair<int64_t, int64_t>{1, 1}, {8, 1}, {8, 8}, {32, 4}, {128, 8}}) {
        int64_t m = 37;
        std::vector<float> logits = test::random_vec(static_cast<size_t>(m * E), 9, -4.0f, 4.0f);
        for (int64_t e = 0; e < E; e += 3) logits[e] = logits[0];  // ties in the first token
        std::vector<int32_t> ids_ref(static_cast<size_t>(m * K)), ids(ids_ref.size());
        std::vector<float> w_ref(ids_ref.size()), w(ids_ref.size());
        RouteArgs a{.logits = logits.data(),
                    .m = m,
                    .num_experts = E,
                    .top_k = K,
                    .scoring = scoring,
                    .renormalize = renorm,
                    .ids = ids_ref.data(),
                    .weights = w_ref.data()};
        ref::route(a);
        a.ids = ids.data();
        a.weights = w.data();
        cpu::route(a);
        EXPECT_EQ(ids, ids_ref) << "E=" << E << " K=" << K;
        test::expect_close(w, w_ref, 1e-6f, 1e-5f,
                           "route E=" + std::to_string(E) + " K=" + std::to_string(K));
      }
    }
  }
}

// Expert parallelism by masking: route with id_begin writes ids in a rank's numbering (the weights
// unchanged), and moe_experts skips the pairs of other ranks' experts, so the ranks' outputs over every
// token (each with its own block of experts) sum to the whole layer's; on the reference and the fast path.
TEST(MoeCpu, ExpertParallelRanksSkipOtherRanksExperts) {
  const int64_t m = 11, H = 40, I = 24, E = 6, K = 2, ranks = 2, local = E / ranks;
  std::vector<test::TestWeight> weights;
  weights.reserve(static_cast<size_t>(2 * E));
  std::vector<ExpertView> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    weights.push_back(test::make_weight(2 * I, H, DType::kF32, static_cast<uint32_t>(10 + e), 0.2f));
    experts[e].gate_up = weights.back().view;
    weights.push_back(test::make_weight(H, I, DType::kF32, static_cast<uint32_t>(50 + e), 0.2f));
    experts[e].down = weights.back().view;
  }
  const std::vector<float> x = test::random_vec(static_cast<size_t>(m * H), 1, -2.0f, 2.0f);
  const std::vector<float> logits = test::random_vec(static_cast<size_t>(m * E), 2, -3.0f, 3.0f);
  RouteArgs route{.logits = logits.data(), .m = m, .num_experts = E, .top_k = K, .renormalize = true};
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> w(ids.size());
  route.ids = ids.data();
  route.weights = w.data();
  ref::route(route);
  MoeExpertsArgs whole{.x = x.data(),
                       .ldx = H,
                       .m = m,
                       .hidden = H,
                       .inter = I,
                       .num_experts = E,
                       .top_k = K,
                       .ids = ids.data(),
                       .weights = w.data(),
                       .experts = experts.data(),
                       .ldo = H};
  std::vector<float> expect(static_cast<size_t>(m * H));
  whole.out = expect.data();
  ref::moe_experts(whole);
  for (bool fast : {false, true}) {
    std::vector<float> sum(expect.size(), 0.0f);
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<int32_t> rank_ids(ids.size());
      std::vector<float> rank_w(ids.size());
      RouteArgs rr = route;
      rr.ids = rank_ids.data();
      rr.weights = rank_w.data();
      rr.id_begin = r * local;
      fast ? cpu::route(rr) : ref::route(rr);
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(rank_ids[i], ids[i] - r * local) << i;
        ASSERT_EQ(rank_w[i], w[i]) << i;
      }
      MoeExpertsArgs a = whole;
      a.num_experts = local;
      a.experts = experts.data() + r * local;
      a.ids = rank_ids.data();
      std::vector<float> out(expect.size(), 5.0f);
      a.out = out.data();
      fast ? cpu::moe_experts(a) : ref::moe_experts(a);
      for (size_t i = 0; i < out.size(); ++i) sum[i] += out[i];
    }
    test::expect_close(sum, expect, 1e-5f, 1e-4f, fast ? "cpu ranks" : "ref ranks");
  }
}

// moe_experts with its routing and the residual add + norm after it (MoeExpertsArgs::route, then_norm): the
// same as route(), moe_experts, add_rms_norm, in the reference and in the CPU kernels (row sizes of 16 and
// 19: the vector and scalar norms).
TEST(MoeCpu, MoeExpertsWithRoutingAndNormEqualsSeparateOps) {
  namespace k = polylora::kernels;
  for (const int64_t H : {16, 19}) {
    const int64_t m = 5, E = 8, K = 2, I = 8;
    std::vector<k::test::TestWeight> weights;
    std::vector<k::ExpertView> experts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      weights.push_back(k::test::make_weight(2 * I, H, DType::kF32, static_cast<uint32_t>(10 + e), 0.3f));
      experts[e].gate_up = weights.back().view;
      weights.push_back(k::test::make_weight(H, I, DType::kF32, static_cast<uint32_t>(30 + e), 0.3f));
      experts[e].down = weights.back().view;
    }
    const std::vector<float> logits = k::test::random_vec(static_cast<size_t>(m * E), 5, -2.0f, 2.0f);
    const std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * H), 6);
    const std::vector<float> resid0 = k::test::random_vec(static_cast<size_t>(m * H), 7);
    const std::vector<float> norm_w = k::test::random_vec(static_cast<size_t>(H), 8, 0.5f, 1.5f);
    struct Out {
      std::vector<float> y, resid, h;
    };
    auto run = [&](bool in_one_call, bool reference) {
      std::vector<int32_t> ids(static_cast<size_t>(m * K));
      std::vector<float> w(ids.size()), y(static_cast<size_t>(m * H)), resid = resid0,
                                                                       h(static_cast<size_t>(m * H));
      const k::RouteArgs r{.logits = logits.data(),
                           .m = m,
                           .num_experts = E,
                           .top_k = K,
                           .scoring = k::RouterScoring::kSoftmaxTopK,
                           .renormalize = true,
                           .ids = ids.data(),
                           .weights = w.data()};
      const k::AddRmsNormArgs norm{.x = resid.data(),
                                   .ldx = H,
                                   .delta = y.data(),
                                   .ld_delta = H,
                                   .y = h.data(),
                                   .ldy = H,
                                   .m = m,
                                   .n = H,
                                   .w = norm_w.data()};
      k::MoeExpertsArgs a{.x = x.data(),
                          .ldx = H,
                          .m = m,
                          .hidden = H,
                          .inter = I,
                          .num_experts = E,
                          .top_k = K,
                          .ids = ids.data(),
                          .weights = w.data(),
                          .experts = experts.data(),
                          .out = y.data(),
                          .ldo = H,
                          .route = {},
                          .then_norm = {}};
      if (in_one_call) {
        a.route = r;
        a.then_norm = norm;
        a.then_norm.delta = nullptr;  // ignored: out is the delta
      } else {
        reference ? k::ref::route(r) : k::cpu::route(r);
      }
      reference ? k::ref::moe_experts(a) : k::cpu::moe_experts(a);
      if (!in_one_call) reference ? k::ref::add_rms_norm(norm) : k::cpu::add_rms_norm(norm);
      return Out{y, resid, h};
    };
    for (const bool reference : {true, false}) {
      const std::string what = std::string(reference ? "ref" : "cpu") + " H=" + std::to_string(H);
      const Out sep = run(false, reference), one = run(true, reference);
      EXPECT_EQ(one.y, sep.y) << what;
      EXPECT_EQ(one.resid, sep.resid) << what;
      EXPECT_EQ(one.h, sep.h) << what;
      EXPECT_NE(one.resid, resid0) << what;
    }
  }
}

}  // namespace
}  // namespace polylora::kernels
