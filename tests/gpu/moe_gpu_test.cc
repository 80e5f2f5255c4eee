// tests/gpu/moe_gpu_test.cc: the CUDA route and moe_experts against the references: an expert with no
// token and one with every token, top_k 1 and E, one token and many (300), adapter slots −1 mixed with two
// adapters of different ranks (gate_up/gate/up/down LoRA, some views empty), both activations, fused
// gate_up vs separate gate/up, biases on and off, F32 (fp32 FMA GEMM) and BF16 (tensor-core GEMM) backends.
// Tolerances: route 1e-6 + 1e-5·|ref| with identical ids; experts per gpu_test_util.h (F32 1e-4 + 1e-4·|ref|,
// BF16 hi+lo 5e-4 and BF16 rounded 2e-2, each ·max(1, rms(ref)) + ·|ref|, the reference seeing the same
// bf16 weights).
#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "gpu_test_util.h"
#include "kernels/tuning.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;

struct MoeCase {
  int64_t m = 1, hidden = 64, inter = 48, num_experts = 6, top_k = 2;
  Mode mode = kF32Mode;  // the backend configuration (weight dtype, hi + lo split)
  bool fused = true;
  bool biases = false;
  k::ExpertAct act = k::ExpertAct::kSiluGate;
  bool lora = false;
  bool every_token_to_expert_2 = false;
  bool other_ranks = false;   // every third pair routed to another rank's expert (id < 0 or >= E): skipped
  float weight_scale = 0.2f;  // weights uniform in ±weight_scale (smaller keeps long-K F32 sums in tolerance)
};

void run_moe(const MoeCase& c) {
  Arena ar(backend(c.mode));
  int64_t H = c.hidden, I = c.inter, E = c.num_experts, K = c.top_k, m = c.m;
  std::vector<k::test::TestWeight> weights;
  weights.reserve(static_cast<size_t>(4 * E));
  std::vector<std::vector<float>> biases;
  std::vector<k::ExpertView> experts(static_cast<size_t>(E)), dexperts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    uint32_t seed = static_cast<uint32_t>(100 + e * 10);
    k::ExpertView& ex = experts[e];
    k::ExpertView& dx = dexperts[e];
    float s = c.weight_scale;
    if (c.fused) {
      weights.push_back(k::test::make_weight(2 * I, H, c.mode.dtype, seed, s));
      ex.gate_up = weights.back().view;
      dx.gate_up = ar.weight(ex.gate_up);
    } else {
      weights.push_back(k::test::make_weight(I, H, c.mode.dtype, seed + 1, s));
      ex.gate = weights.back().view;
      dx.gate = ar.weight(ex.gate);
      weights.push_back(k::test::make_weight(I, H, c.mode.dtype, seed + 2, s));
      ex.up = weights.back().view;
      dx.up = ar.weight(ex.up);
    }
    weights.push_back(k::test::make_weight(H, I, c.mode.dtype, seed + 3, s));
    ex.down = weights.back().view;
    dx.down = ar.weight(ex.down);
    if (c.biases) {
      biases.push_back(k::test::random_vec(static_cast<size_t>(2 * I), seed + 4));
      ex.gate_up_bias = biases.back().data();
      if (c.fused) dx.gate_up_bias = ar.up(biases.back());
      biases.push_back(k::test::random_vec(static_cast<size_t>(H), seed + 5));
      ex.down_bias = biases.back().data();
      dx.down_bias = ar.up(biases.back());
    }
  }
  std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * (H + 2)), 1, -2.0f, 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> w = k::test::random_vec(static_cast<size_t>(m * K), 2, 0.0f, 1.0f);
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
    for (int64_t kk = 0; kk < K; ++kk) ids[t * K + kk] = order[kk];
  }
  if (c.other_ranks)  // expert parallelism: ids in this rank's numbering, others' below 0 or from E on
    for (size_t p = 1; p < ids.size(); p += 3)
      ids[p] = p % 2 ? -1 - ids[p] : static_cast<int32_t>(E) + ids[p];
  // Two adapter slots: slot 0 rank 1 on gate_up (fused) or gate, and down on even experts; slot 1 rank 5
  // on up (silu only, not expert 3) and down.
  std::vector<std::vector<float>> mats;
  mats.reserve(static_cast<size_t>(8 * E));
  std::vector<k::ExpertLoraView> lviews(static_cast<size_t>(2 * E)), dlviews(static_cast<size_t>(2 * E));
  std::vector<int32_t> slots(static_cast<size_t>(m), -1);
  auto make = [&](k::LoraView& host, k::LoraView& dev, int64_t rank, int64_t in, int64_t out, uint32_t seed) {
    mats.push_back(k::test::random_vec(static_cast<size_t>(rank * in), seed));
    const std::vector<float>& a = mats.back();
    mats.push_back(k::test::random_vec(static_cast<size_t>(out * rank), seed + 1));
    const std::vector<float>& b = mats.back();
    host = {.a = a.data(), .b = b.data(), .rank = rank, .in = in, .out = out, .scale = 0.5f};
    dev = host;
    dev.a = ar.up(a);
    dev.b = ar.up(b);
  };
  if (c.lora) {
    for (int64_t e = 0; e < E; ++e) {
      uint32_t seed = static_cast<uint32_t>(500 + 7 * e);
      if (c.fused) {
        make(lviews[e].gate_up, dlviews[e].gate_up, 1, H, 2 * I, seed);
      } else {
        make(lviews[e].gate, dlviews[e].gate, 1, H, I, seed);
      }
      if (e % 2 == 0) make(lviews[e].down, dlviews[e].down, 1, I, H, seed + 2);
      if (c.act == k::ExpertAct::kSiluGate && e != 3)
        make(lviews[E + e].up, dlviews[E + e].up, 5, H, I, seed + 4);
      make(lviews[E + e].down, dlviews[E + e].down, 5, I, H, seed + 6);
    }
    for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>(t % 3) - 1;  // −1, 0, 1, −1, ...
  }
  int64_t ldo = H + 1;
  k::MoeExpertsArgs a{.x = x.data(),
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
  k::ref::moe_experts(a);
  std::string what = "m=" + std::to_string(m) + " E=" + std::to_string(E) + " K=" + std::to_string(K) + " " +
                     k::test::dtype_str(c.mode.dtype) + (c.fused ? " fused" : " separate") +
                     (c.biases ? " bias" : "") + (c.act == k::ExpertAct::kSiluGate ? " silu" : " swiglu") +
                     (c.lora ? " lora" : "") + (c.every_token_to_expert_2 ? " all->2" : "") +
                     (c.other_ranks ? " other ranks' experts" : "");
  std::vector<float> init(ref.size(), 3.0f);
  float* out = ar.up(init);
  a.x = ar.up(x);
  a.ids = ar.up(ids);
  a.weights = ar.up(w);
  a.experts = ar.up(dexperts);
  a.token_slots = c.lora ? ar.up(slots) : nullptr;
  a.lora = c.lora ? ar.up(dlviews) : nullptr;
  a.out = out;
  ar.be().moe_experts(a);
  expect_close_for(c.mode, ar.down(out, init.size()), ref, what);  // incl. the untouched padding column
}

// Expert parallelism by masking: pairs routed to other ranks' experts (ids outside [0, E)) are skipped by
// every path (small batches' weight streaming, tiles, LoRA), as the reference skips them.
TEST(GpuMoe, OtherRanksExpertsAreSkipped) {
  SKIP_WITHOUT_GPU();
  for (int64_t m : {1, 5, 64, 300})
    for (bool lora : {false, true})
      run_moe({.m = m, .num_experts = 8, .top_k = 4, .lora = lora, .other_ranks = true});
}

TEST(GpuMoe, ExpertsAwkwardRouting) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    for (int64_t m : {1, 13, 40}) {
      for (k::ExpertAct act : {k::ExpertAct::kSiluGate, k::ExpertAct::kGptOssSwiglu}) {
        for (bool fused : {true, false}) {
          for (bool lora : {false, true}) {
            run_moe({.m = m,
                     .mode = md,
                     .fused = fused,
                     .biases = (m % 2) == 1,
                     .act = act,
                     .lora = lora,
                     .every_token_to_expert_2 = m == 13});
          }
        }
      }
    }
  }
}

TEST(GpuMoe, TopKOneAndTopKAll) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    for (int64_t kk : {1, 6}) {
      for (int64_t m : {1, 9, 20}) {
        run_moe({.m = m, .hidden = 33, .inter = 17, .num_experts = 6, .top_k = kk, .mode = md, .lora = true});
      }
    }
  }
}

TEST(GpuMoe, LargeBatchManyTiles) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    run_moe({.m = 300,
             .hidden = 136,
             .inter = 72,
             .num_experts = 8,
             .top_k = 3,
             .mode = md,
             .fused = true,
             .biases = true,
             .lora = true,
             .every_token_to_expert_2 = true});
    run_moe({.m = 150,
             .hidden = 130,
             .inter = 40,
             .num_experts = 5,
             .top_k = 2,
             .mode = md,
             .fused = false,
             .act = k::ExpertAct::kGptOssSwiglu,
             .lora = true});
    run_moe({.m = 70,
             .hidden = 256,
             .inter = 192,
             .num_experts = 32,
             .top_k = 4,
             .mode = md,
             .fused = true,
             .act = k::ExpertAct::kGptOssSwiglu,
             .lora = true});
  }
}

// The large-batch path (more than 512 token-expert pairs) with 128-row tiles (pairs >= 256·E), once with
// 16-byte weight rows and once with odd K (element-wise weight loads); the small-batch GEMV path with K
// past one shared-memory chunk (1024) and experts with more than 8 routed rows. (Every case above also runs
// through the other path with POLYLORA_MOE_SMALL_PAIRS=0 or a large value, see moe_cuda.cu.)
TEST(GpuMoe, PathsAndTiles) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    run_moe({.m = 700,
             .hidden = 64,
             .inter = 40,
             .num_experts = 4,
             .top_k = 2,
             .mode = md,
             .fused = false,
             .biases = false});
    run_moe({.m = 400,
             .hidden = 33,
             .inter = 17,
             .num_experts = 3,
             .top_k = 2,
             .mode = md,
             .fused = true,
             .biases = true,
             .act = k::ExpertAct::kGptOssSwiglu});
    run_moe({.m = 5,
             .hidden = 1544,
             .inter = 96,
             .num_experts = 8,
             .top_k = 2,
             .mode = md,
             .fused = true,
             .biases = true,
             .weight_scale = 0.05f});
    run_moe({.m = 100,
             .hidden = 128,
             .inter = 64,
             .num_experts = 8,
             .top_k = 4,
             .mode = md,
             .fused = false,
             .every_token_to_expert_2 = true});
  }
}

// The tensor-core weight-streaming path (moe_gemv_mma.cuh, BF16 modes at >= 4 pairs per expert; F32 runs
// the fp32 GEMV): experts with
// more than one pass of 64 routed rows, K with a partial 32-block (136) and odd K (33: element loads), and a
// many-expert shape at 12.5 pairs per expert (400 pairs over 32 experts).
TEST(GpuMoe, WeightStreamingPasses) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    run_moe({.m = 200, .hidden = 136, .inter = 72, .num_experts = 4, .top_k = 2, .mode = md, .fused = true,
             .biases = true, .act = k::ExpertAct::kGptOssSwiglu, .lora = true});
    run_moe({.m = 9, .hidden = 33, .inter = 17, .num_experts = 3, .top_k = 2, .mode = md, .fused = false,
             .biases = false});
    run_moe({.m = 100, .hidden = 512, .inter = 384, .num_experts = 32, .top_k = 4, .mode = md, .fused = true,
             .biases = true, .act = k::ExpertAct::kGptOssSwiglu, .weight_scale = 0.1f});
  }
}

// The same path with GPT-OSS's activation in the gate/up product's epilogue (moe_gemv_fused_act): no LoRA
// views (they read gu), both BF16 modes (hi + lo: the activation's lo copy too), an odd intermediate size
// (17 and 72: activation rows with padding columns the epilogue zeroes), several passes per expert, biases
// on and off.
TEST(GpuMoe, WeightStreamingFusedActivation) {
  SKIP_WITHOUT_GPU();
  k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
  t.moe_gemv_fused_act = 1;
  k::override_kernel_tuning(t);
  for (const Mode& md : {kBf16Mode, kBf16RoundMode}) {
    run_moe({.m = 200,
             .hidden = 136,
             .inter = 72,
             .num_experts = 4,
             .top_k = 2,
             .mode = md,
             .fused = true,
             .biases = true,
             .act = k::ExpertAct::kGptOssSwiglu});
    run_moe({.m = 9,
             .hidden = 64,
             .inter = 17,
             .num_experts = 3,
             .top_k = 2,
             .mode = md,
             .fused = true,
             .biases = false,
             .act = k::ExpertAct::kGptOssSwiglu,
             .every_token_to_expert_2 = true});
    run_moe({.m = 100,
             .hidden = 512,
             .inter = 384,
             .num_experts = 32,
             .top_k = 4,
             .mode = md,
             .fused = true,
             .biases = true,
             .act = k::ExpertAct::kGptOssSwiglu,
             .weight_scale = 0.1f});
  }
  k::override_kernel_tuning(std::nullopt);
}

// The Hopper warpgroup-MMA grouped GEMM (moe_gemm_wgmma.cuh; tuning moe_wgmma_per_expert, off by default
// until measured), every call sent to the grouped GEMMs (moe_small_pairs 0): both column widths (256, 128)
// and CTA groups of 1 and 3 row tiles, both BF16 modes (hi + lo: the K loop over both copies while B's slice
// wraps; rounded), fused and separate gate/up, both activations, biases, an expert with no token and one
// with every token, K not a multiple of 64 (136: zero-padded columns), rows that are not 16-byte multiples
// (130: element loads into the swizzled tiles), N not a multiple of the column width (144, 384), many
// experts with a few rows each (a partial last CTA group), a long K (1,024: the stages reused many times),
// and the per-adapter LoRA views (applied outside the GEMM); with CTA groups of 3, GPT-OSS's activation fused
// into the gate/up epilogue (moe_wgmma_fused_act: the swiglu cases without LoRA views, one with padding
// columns). On GPUs other than compute capability 9.0 the same cases run the mma.sync GEMM (use_wgmma).
TEST(GpuMoe, WarpgroupMmaGroupedGemm) {
  SKIP_WITHOUT_GPU();
  for (int64_t bn : {256, 128}) {
    for (int64_t group : {1, 3}) {
      k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
      t.moe_small_pairs = 0;
      t.moe_wgmma_per_expert = 1;
      t.moe_wgmma_bn = bn;
      t.moe_wgmma_group = group;
      t.moe_wgmma_fused_act = group == 3 ? 1 : 0;  // GPT-OSS's activation in the gate/up epilogue
      k::override_kernel_tuning(t);
      for (const Mode& md : {kBf16Mode, kBf16RoundMode}) {
        run_moe({.m = 300,
                 .hidden = 136,
                 .inter = 72,
                 .num_experts = 8,
                 .top_k = 3,
                 .mode = md,
                 .fused = true,
                 .biases = true,
                 .lora = true,
                 .every_token_to_expert_2 = true});
        run_moe({.m = 150,
                 .hidden = 130,
                 .inter = 40,
                 .num_experts = 5,
                 .top_k = 2,
                 .mode = md,
                 .fused = false,
                 .act = k::ExpertAct::kGptOssSwiglu,
                 .lora = true});
        run_moe({.m = 700,
                 .hidden = 256,
                 .inter = 192,
                 .num_experts = 8,
                 .top_k = 4,
                 .mode = md,
                 .fused = true,
                 .biases = true,
                 .act = k::ExpertAct::kGptOssSwiglu});
        run_moe({.m = 40, .hidden = 64, .inter = 64, .num_experts = 32, .top_k = 4, .mode = md});
        run_moe({.m = 500,  // I = 40: the activation rows' padding columns (fused: zeroed by the epilogue)
                 .hidden = 128,
                 .inter = 40,
                 .num_experts = 4,
                 .top_k = 2,
                 .mode = md,
                 .fused = true,
                 .biases = true,
                 .act = k::ExpertAct::kGptOssSwiglu});
        run_moe({.m = 64,
                 .hidden = 1024,
                 .inter = 512,
                 .num_experts = 4,
                 .top_k = 2,
                 .mode = md,
                 .fused = false,
                 .biases = true,
                 .weight_scale = 0.05f});
      }
    }
  }
  k::override_kernel_tuning(std::nullopt);
}

TEST(GpuMoe, RouteBothScorings) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  for (k::RouterScoring scoring : {k::RouterScoring::kSoftmaxTopK, k::RouterScoring::kTopKSoftmax}) {
    for (bool renorm : {false, true}) {
      for (auto [E, K] : {std::pair<int64_t, int64_t>{1, 1}, {8, 1}, {8, 8}, {32, 4}, {128, 8}, {40, 40}}) {
        int64_t m = 37;
        std::vector<float> logits = k::test::random_vec(static_cast<size_t>(m * E), 9, -4.0f, 4.0f);
        for (int64_t e = 0; e < E; e += 3) logits[e] = logits[0];  // ties in the first token
        std::vector<int32_t> ids_ref(static_cast<size_t>(m * K));
        std::vector<float> w_ref(ids_ref.size());
        k::RouteArgs a{.logits = logits.data(),
                       .m = m,
                       .num_experts = E,
                       .top_k = K,
                       .scoring = scoring,
                       .renormalize = renorm,
                       .ids = ids_ref.data(),
                       .weights = w_ref.data()};
        k::ref::route(a);
        int32_t* ids = ar.zeros<int32_t>(ids_ref.size());
        float* wts = ar.zeros<float>(w_ref.size());
        a.logits = ar.up(logits);
        a.ids = ids;
        a.weights = wts;
        ar.be().route(a);
        std::string what = "route E=" + std::to_string(E) + " K=" + std::to_string(K);
        EXPECT_EQ(ar.down(ids, ids_ref.size()), ids_ref) << what;
        k::test::expect_close(ar.down(wts, w_ref.size()), w_ref, 1e-6f, 1e-5f, what);
      }
    }
  }
}

// moe_experts with its routing (MoeExpertsArgs::route) and the residual add + norm after it (then_norm):
// small batches route, sort and cast in one launch (moe_route_fused_max_tokens), and the plain combine runs
// the add and norm in its launch (cuda::add_rms_norm_combined). Against route(), moe_experts, add_rms_norm
// on the same device arrays with the fused launch off: the same ids, weights, outputs, residual and normed
// rows, bit for bit (within an expert the pairs' order may differ; each pair is computed on its own and the
// combine sums in k order), on both weight-streaming paths (the tensor-core one with its bf16 cast, hi + lo
// and rounded; the fp32 GEMV) and the grouped GEMM, both scorings, ties in the logits, 1 to 17 tokens (past
// the bound of 16: the separate route), per-adapter LoRA (slot buckets in the sort), ids in another rank's
// numbering (id_begin), rows of up to 1,024 (a warp per row) and longer (a block), 16-byte and odd rows.
struct RouteNormCase {
  Mode md = kBf16Mode;
  int64_t m = 1, E = 32, K = 4, H = 96;
  k::RouterScoring scoring = k::RouterScoring::kTopKSoftmax;
  bool renorm = false;
  int path = 0;  // 0: tensor-core weight streaming, 1: fp32 GEMV, 2: grouped GEMM
  bool lora = false;
  int64_t id_begin = 0;
  bool norm = true;
};

void run_route_norm(const RouteNormCase& c) {
  Arena ar(backend(c.md));
  const int64_t m = c.m, E = c.E, K = c.K, H = c.H, I = 40;
  std::vector<k::test::TestWeight> weights;
  weights.reserve(static_cast<size_t>(2 * E));
  std::vector<k::ExpertView> dexperts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    weights.push_back(k::test::make_weight(2 * I, H, c.md.dtype, static_cast<uint32_t>(700 + e), 0.2f));
    dexperts[e].gate_up = ar.weight(weights.back().view);
    weights.push_back(k::test::make_weight(H, I, c.md.dtype, static_cast<uint32_t>(900 + e), 0.2f));
    dexperts[e].down = ar.weight(weights.back().view);
  }
  std::vector<float> logits = k::test::random_vec(static_cast<size_t>(m * E), 31, -3.0f, 3.0f);
  for (int64_t e = 1; e < E; e += 4) logits[e] = logits[0];  // ties in the first token
  std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * H), 32, -2.0f, 2.0f);
  std::vector<float> resid = k::test::random_vec(static_cast<size_t>(m * H), 33, -1.0f, 1.0f);
  std::vector<float> norm_w = k::test::random_vec(static_cast<size_t>(H), 34, 0.5f, 1.5f);
  std::vector<int32_t> slots(static_cast<size_t>(m));
  for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>(t % 3) - 1;
  std::vector<std::vector<float>> mats;
  std::vector<k::ExpertLoraView> dl(static_cast<size_t>(2 * E));
  if (c.lora)
    for (int64_t se = 0; se < 2 * E; ++se) {
      mats.push_back(k::test::random_vec(static_cast<size_t>(2 * H), static_cast<uint32_t>(40 + se)));
      mats.push_back(k::test::random_vec(static_cast<size_t>(2 * 2 * I), static_cast<uint32_t>(90 + se)));
      dl[se].gate_up = {.a = ar.up(mats[mats.size() - 2]),
                        .b = ar.up(mats.back()),
                        .rank = 2,
                        .in = H,
                        .out = 2 * I,
                        .scale = 0.5f};
    }
  const float* d_logits = ar.up(logits);
  const float* d_x = ar.up(x);
  const float* d_norm_w = ar.up(norm_w);
  const k::ExpertView* d_experts = ar.up(dexperts);
  const int32_t* d_slots = c.lora ? ar.up(slots) : nullptr;
  const k::ExpertLoraView* d_lora = c.lora ? ar.up(dl) : nullptr;
  struct Out {
    std::vector<int32_t> ids;
    std::vector<float> w, y, resid, h;
  };
  auto run = [&](bool fused) {
    k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
    t.moe_route_fused_max_tokens = fused ? 16 : 0;
    t.moe_combine_norm = fused ? 1 : 0;
    t.moe_tc_min_per_expert = c.path == 0 ? 0 : 1 << 20;
    t.moe_tc_max_per_expert = 1 << 20;
    t.moe_small_pairs = c.path == 2 ? 0 : 1 << 20;
    k::override_kernel_tuning(t);
    int32_t* ids = ar.zeros<int32_t>(static_cast<size_t>(m * K));
    float* wts = ar.zeros<float>(static_cast<size_t>(m * K));
    float* y = ar.zeros<float>(static_cast<size_t>(m * H));
    float* res = ar.up(resid);
    float* h = ar.zeros<float>(static_cast<size_t>(m * H));
    const k::RouteArgs r{.logits = d_logits,
                         .m = m,
                         .num_experts = E,
                         .top_k = K,
                         .scoring = c.scoring,
                         .renormalize = c.renorm,
                         .ids = ids,
                         .weights = wts,
                         .id_begin = c.id_begin};
    const k::AddRmsNormArgs norm{
        .x = res, .ldx = H, .delta = y, .ld_delta = H, .y = h, .ldy = H, .m = m, .n = H, .w = d_norm_w};
    k::MoeExpertsArgs a{.x = d_x,
                        .ldx = H,
                        .m = m,
                        .hidden = H,
                        .inter = I,
                        .num_experts = E - c.id_begin,  // this rank's: the router's from id_begin on
                        .top_k = K,
                        .ids = ids,
                        .weights = wts,
                        .experts = d_experts,
                        .act = k::ExpertAct::kGptOssSwiglu,
                        .token_slots = d_slots,
                        .lora = d_lora,
                        .num_slots = c.lora ? 2 : 0,
                        .out = y,
                        .ldo = H,
                        .route = {},
                        .then_norm = {}};
    if (fused) {
      a.route = r;
      if (c.norm) a.then_norm = norm;
      ar.be().moe_experts(a);
    } else {
      ar.be().route(r);
      ar.be().moe_experts(a);
      if (c.norm) ar.be().add_rms_norm(norm);
    }
    Out o{ar.down(ids, static_cast<size_t>(m * K)), ar.down(wts, static_cast<size_t>(m * K)),
          ar.down(y, static_cast<size_t>(m * H)), ar.down(res, static_cast<size_t>(m * H)),
          ar.down(h, static_cast<size_t>(m * H))};
    k::override_kernel_tuning(std::nullopt);
    return o;
  };
  const Out sep = run(false), fused = run(true);
  const std::string what = std::string(c.md.name) + " path " + std::to_string(c.path) +
                           " m=" + std::to_string(m) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                           " H=" + std::to_string(H) +
                           (c.scoring == k::RouterScoring::kTopKSoftmax ? " topk-softmax" : " softmax-topk") +
                           (c.renorm ? " renorm" : "") + (c.lora ? " lora" : "") +
                           " id_begin=" + std::to_string(c.id_begin) + (c.norm ? " norm" : "");
  EXPECT_EQ(fused.ids, sep.ids) << what;
  EXPECT_EQ(fused.w, sep.w) << what;
  EXPECT_EQ(fused.y, sep.y) << what;
  EXPECT_EQ(fused.resid, sep.resid) << what;
  EXPECT_EQ(fused.h, sep.h) << what;
  // The routing and the norm really ran: K distinct ids per token, the residual moved, h is not zero.
  for (int64_t t = 0; t < m; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i + 1; j < K; ++j) ASSERT_NE(fused.ids[t * K + i], fused.ids[t * K + j]) << what;
  if (c.norm) {
    EXPECT_NE(fused.resid, resid) << what;
    EXPECT_NE(fused.h, std::vector<float>(fused.h.size(), 0.0f)) << what;
  }
}

TEST(GpuMoe, RouteAndNormFusedEqualSeparate) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : {kBf16Mode, kBf16RoundMode})
    for (int path : {0, 1})
      for (int64_t m : {1, 3, 16, 17}) {
        run_route_norm({.md = md, .m = m, .path = path});
        run_route_norm({.md = md,
                        .m = m,
                        .E = 8,
                        .K = 2,
                        .scoring = k::RouterScoring::kSoftmaxTopK,
                        .renorm = true,
                        .path = path,
                        .lora = m % 2 == 1,
                        .norm = m != 3});
      }
  run_route_norm({.md = kBf16Mode, .m = 5, .E = 8, .K = 2, .id_begin = 3});
  run_route_norm({.md = kF32Mode, .m = 4, .E = 16, .K = 3, .path = 1, .lora = true});
  run_route_norm({.md = kBf16Mode, .m = 6, .H = 1100, .path = 0});  // a block per row
  run_route_norm({.md = kBf16Mode, .m = 6, .H = 1101, .path = 1});  // element loads
  run_route_norm({.md = kBf16Mode, .m = 40, .E = 8, .K = 2, .H = 97, .path = 2, .lora = true});
}

}  // namespace
}  // namespace polylora::gpu_test
