// tests/gpu/moe_mxfp4_gpu_test.cc: the CUDA MXFP4 experts (kernels/moe/moe_cuda.cu's GEMV and grouped GEMM)
// against the reference (kernels::ref::moe_experts on the same MXFP4 views in host memory, decoded as Hugging
// Face does): one token and many (300: many passes of the GEMV's 2 routed rows per expert in f32 mode, the
// grouped GEMM in the bf16 modes; few pairs per expert in the bf16 modes take the tensor-core
// weight-streaming kernel), an expert with no token and one with every token, top_k 1 and all, biases,
// both activations, adapter slots −1 mixed with two adapters of different ranks on gate_up and down, under
// the f32, bf16 hi+lo and bf16-rounded backend modes (tolerances of gpu_test_util.h: the MXFP4 values are
// exact in bf16, so only the activations' rounding differs). Many pairs per expert in the bf16 modes take the
// tensor-core grouped GEMM (from mxfp4_mma_per_expert), whose K loop decodes the codes to bf16 (block scales
// above 2^1 take the decoder's two-multiply branch).
#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "gpu_test_util.h"
#include "kernels/tuning.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;

struct Mxfp4Case {
  int64_t m = 1, hidden = 64, inter = 96, num_experts = 6, top_k = 2;
  Mode mode = kF32Mode;
  bool biases = true;
  k::ExpertAct act = k::ExpertAct::kGptOssSwiglu;
  bool lora = false;
  bool every_token_to_expert_2 = false;
  float x_range = 2.0f;                // x uniform in [-x_range, x_range]
  int scale_lo = 120, scale_span = 5;  // block scale bytes uniform in [scale_lo, scale_lo + span)
};

struct HostMxfp4 {
  std::vector<uint8_t> codes, scales;
};

void run_mxfp4(const Mxfp4Case& c) {
  Arena ar(backend(c.mode));
  const int64_t H = c.hidden, I = c.inter, E = c.num_experts, K = c.top_k, m = c.m;
  std::mt19937 rng(11);
  std::vector<HostMxfp4> mats;
  mats.reserve(static_cast<size_t>(2 * E));
  std::vector<std::vector<float>> biases;
  std::vector<k::ExpertView> experts(static_cast<size_t>(E)), dexperts(static_cast<size_t>(E));
  auto make = [&](int64_t rows, int64_t cols, k::WeightView& host, k::WeightView& dev) {
    HostMxfp4 h;
    h.codes.resize(static_cast<size_t>(rows * cols / 2));
    h.scales.resize(static_cast<size_t>(rows * cols / 32));
    for (auto& b : h.codes) b = static_cast<uint8_t>(rng());
    for (auto& s : h.scales) s = static_cast<uint8_t>(c.scale_lo + rng() % c.scale_span);  // 2^(s - 127)
    mats.push_back(std::move(h));
    const HostMxfp4& hm = mats.back();
    host = {hm.codes.data(), DType::kU8, rows, cols, hm.scales.data()};
    dev = {ar.up(hm.codes), DType::kU8, rows, cols, ar.up(hm.scales)};
  };
  for (int64_t e = 0; e < E; ++e) {
    make(2 * I, H, experts[e].gate_up, dexperts[e].gate_up);
    make(H, I, experts[e].down, dexperts[e].down);
    if (c.biases) {
      biases.push_back(k::test::random_vec(static_cast<size_t>(2 * I), 40 + e));
      experts[e].gate_up_bias = biases.back().data();
      dexperts[e].gate_up_bias = ar.up(biases.back());
      biases.push_back(k::test::random_vec(static_cast<size_t>(H), 80 + e));
      experts[e].down_bias = biases.back().data();
      dexperts[e].down_bias = ar.up(biases.back());
    }
  }
  std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * (H + 2)), 1, -c.x_range, c.x_range);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> w = k::test::random_vec(static_cast<size_t>(m * K), 2, 0.0f, 1.0f);
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
  // Slot 0: rank 1 on gate_up and on down of even experts; slot 1: rank 5 on down only.
  std::vector<std::vector<float>> lmats;
  lmats.reserve(static_cast<size_t>(8 * E));
  std::vector<k::ExpertLoraView> lviews(static_cast<size_t>(2 * E)), dlviews(static_cast<size_t>(2 * E));
  std::vector<int32_t> slots(static_cast<size_t>(m), -1);
  auto lora = [&](k::LoraView& host, k::LoraView& dev, int64_t rank, int64_t in, int64_t out, uint32_t seed) {
    lmats.push_back(k::test::random_vec(static_cast<size_t>(rank * in), seed));
    const std::vector<float>& a = lmats.back();
    lmats.push_back(k::test::random_vec(static_cast<size_t>(out * rank), seed + 1));
    const std::vector<float>& b = lmats.back();
    host = {.a = a.data(), .b = b.data(), .rank = rank, .in = in, .out = out, .scale = 0.5f};
    dev = host;
    dev.a = ar.up(a);
    dev.b = ar.up(b);
  };
  if (c.lora) {
    for (int64_t e = 0; e < E; ++e) {
      const auto seed = static_cast<uint32_t>(500 + 7 * e);
      lora(lviews[e].gate_up, dlviews[e].gate_up, 1, H, 2 * I, seed);
      if (e % 2 == 0) lora(lviews[e].down, dlviews[e].down, 1, I, H, seed + 2);
      lora(lviews[E + e].down, dlviews[E + e].down, 5, I, H, seed + 4);
    }
    for (int64_t t = 0; t < m; ++t) slots[t] = static_cast<int32_t>(t % 3) - 1;
  }
  const int64_t ldo = H + 1;
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
                      .experts_mxfp4 = true,
                      .act = c.act,
                      .token_slots = c.lora ? slots.data() : nullptr,
                      .lora = c.lora ? lviews.data() : nullptr,
                      .num_slots = c.lora ? 2 : 0,
                      .out = nullptr,
                      .ldo = ldo};
  std::vector<float> ref(static_cast<size_t>(m * ldo), 3.0f);
  a.out = ref.data();
  k::ref::moe_experts(a);
  const std::string what = "mxfp4 m=" + std::to_string(m) + " E=" + std::to_string(E) +
                           " K=" + std::to_string(K) + " " + c.mode.name + (c.lora ? " lora" : "") +
                           (c.act == k::ExpertAct::kSiluGate ? " silu" : " swiglu");
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
  // MXFP4 expert products take bf16-rounded activations in every bf16 mode (moe_cuda.cu moe_split).
  Mode tol_mode = c.mode;
  tol_mode.split = false;
  expect_close_for(tol_mode, ar.down(out, init.size()), ref, what);  // incl. the untouched padding column
}

TEST(GpuMoeMxfp4, ExpertsMatchReference) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes)
    for (int64_t m : {1, 3, 13, 40})
      for (k::ExpertAct act : {k::ExpertAct::kSiluGate, k::ExpertAct::kGptOssSwiglu})
        for (bool lora : {false, true})
          run_mxfp4({.m = m,
                     .mode = md,
                     .biases = m % 2 == 1,
                     .act = act,
                     .lora = lora,
                     .every_token_to_expert_2 = m == 13});
}

TEST(GpuMoeMxfp4, TopKOneAndAllAndManyPasses) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    for (int64_t kk : {int64_t{1}, int64_t{6}}) run_mxfp4({.m = 9, .top_k = kk, .mode = md, .lora = true});
    // 300 tokens: experts see up to 300 routed rows (38 passes over their staged weights); K = 2880 spans
    // three activation chunks (as GPT-OSS-20B's hidden size). x is scaled by sqrt(64 / 2880) so the gate/up
    // sums have the spread of the 64-wide cases (rms ~1.4; a model's inputs are RMS-normalised): at +-2 over
    // 2880 columns they are ~9 (the clamp at 7 saturates) and the f32 summation order alone moves outputs
    // by ~2e-4 after the activation's x8 slope (measured on the H200: 678 of 864,300 past 1e-4).
    run_mxfp4({.m = 300,
               .hidden = 2880,
               .inter = 64,
               .num_experts = 8,
               .top_k = 3,
               .mode = md,
               .lora = true,
               .every_token_to_expert_2 = true,
               .x_range = 2.0f * 0.149f});
  }
}

// 100+ pairs per expert: the bf16 modes run the grouped GEMM (moe_gemm_mma.cuh's MXFP4 K loop), the f32
// mode the weight-streaming kernel; block scales 2^-9 .. 2^4 (bytes 118 .. 131, past 128 the decoder's
// second multiply; x within +-0.002 keeps the outputs O(1): at +-0.05 weights up to 96 made terms of
// ~2,000 whose f32 rounding alone exceeded the tolerance on the few outputs near 0), partial column tiles (2I
// = 192, H = 160), K = 160 and 96 (5 and 3 blocks), LoRA views of two ranks with slots −1 mixed in, an expert
// with every token.
void run_grouped_gemm_cases(std::initializer_list<Mode> modes) {
  for (const Mode& md : modes)
    for (bool lora : {false, true})
      for (k::ExpertAct act : {k::ExpertAct::kSiluGate, k::ExpertAct::kGptOssSwiglu})
        run_mxfp4({.m = 200,
                   .hidden = 160,
                   .inter = 96,
                   .num_experts = 5,
                   .top_k = 3,
                   .mode = md,
                   .act = act,
                   .lora = lora,
                   .every_token_to_expert_2 = true,
                   .x_range = 0.002f,
                   .scale_lo = 118,
                   .scale_span = 14});
}

TEST(GpuMoeMxfp4, GroupedGemmPathMatchesReference) {
  SKIP_WITHOUT_GPU();
  run_grouped_gemm_cases({kF32Mode, kBf16Mode, kBf16RoundMode});
}

// The same cases on the warpgroup-MMA grouped GEMM with MXFP4 B tiles (moe_wgmma_per_expert 1,
// moe_wgmma_mxfp4 1, on by default since session 42): K = 160 and 96 pad to slices of 64 whose last blocks
// are past K (zero codes); the mma.sync GEMM again on GPUs other than compute capability 9.0.
TEST(GpuMoeMxfp4, WarpgroupMmaGroupedGemm) {
  SKIP_WITHOUT_GPU();
  k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
  t.moe_wgmma_per_expert = 1;
  t.moe_wgmma_mxfp4 = 1;
  k::override_kernel_tuning(t);
  run_grouped_gemm_cases({kBf16Mode, kBf16RoundMode});
  k::override_kernel_tuning(std::nullopt);
}

// Few pairs per expert in the bf16 modes: the tensor-core weight-streaming kernel (moe_gemv_mxfp4.cuh; the
// f32 mode runs the fp32 GEMV). K = 1056 (33 blocks: 9 super-blocks over the 4 warps, the last holding one
// block), K = 224 and 96 on the down product (7 and 3 blocks: partial super-blocks), 2I = 448 and 192,
// H = 1056 (partial 64-row tiles); 1 to 37 tokens (passes of 8 and of 16 routed rows, one expert with
// every token: three passes); block scales 2^-5 .. 2^3 (past 2^1 the second multiply; larger ones made f32
// rounding of the fp32 GEMV's ~100-sized down terms exceed the f32 tolerance on outputs near 0.3, measured
// on the H200) and the default ones; biases, and LoRA views of two ranks with slots −1.
// Every pipeline depth (KernelTuning::moe_gemv_mxfp4_stages; the deeper ones apply to calls of up to 8
// tokens, so m = 1 and 6 run them, 16 and 37 the two-stage 16-row passes).
TEST(GpuMoeMxfp4, TensorCoreGemvMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (int64_t stages : {2, 3, 4})
    for (const Mode& md : kModes)
      for (int64_t m : {1, 6, 16, 37}) {
        if (stages != 2 && m > 8) continue;
        SCOPED_TRACE("moe_gemv_mxfp4_stages " + std::to_string(stages));
        k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
        t.moe_gemv_mxfp4_stages = stages;
        k::override_kernel_tuning(t);
        run_mxfp4({.m = m,
                   .hidden = 1056,
                   .inter = 96,
                   .num_experts = 8,
                   .top_k = 4,
                   .mode = md,
                   .biases = m % 2 == 0,
                   .lora = m != 16,
                   .every_token_to_expert_2 = m == 37,
                   .x_range = 0.002f,
                   .scale_lo = 122,
                   .scale_span = 9});
        run_mxfp4({.m = m,
                   .hidden = 1056,
                   .inter = 224,
                   .num_experts = 8,
                   .top_k = 4,
                   .mode = md,
                   .act = k::ExpertAct::kSiluGate,
                   .lora = m % 2 == 1,
                   .x_range = 0.1f});
        k::override_kernel_tuning(std::nullopt);
      }
}

// GPT-OSS's activation written by the gate/up product's epilogue (moe_gemv_fused_act; no expert LoRA, so
// the path applies): the same shapes as above, every pipeline depth at 8-token passes, biases on and off,
// one expert taking every token (three passes of 16), padded activation rows (I = 96, 224: lda a multiple
// of 32 above I only when the workspace pads; the zeroed columns are read by the down product).
TEST(GpuMoeMxfp4, TensorCoreGemvFusedActivation) {
  SKIP_WITHOUT_GPU();
  for (int64_t stages : {2, 4})
    for (const Mode& md : {kBf16Mode, kBf16RoundMode})
      for (int64_t m : {1, 6, 16, 37}) {
        if (stages != 2 && m > 8) continue;
        SCOPED_TRACE("fused activation, moe_gemv_mxfp4_stages " + std::to_string(stages));
        k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
        t.moe_gemv_mxfp4_stages = stages;
        t.moe_gemv_fused_act = 1;
        k::override_kernel_tuning(t);
        for (int64_t inter : {96, 224})
          run_mxfp4({.m = m,
                     .hidden = 1056,
                     .inter = inter,
                     .num_experts = 8,
                     .top_k = 4,
                     .mode = md,
                     .biases = (m + inter) % 2 == 0,
                     .every_token_to_expert_2 = m == 37,
                     .x_range = 0.002f,
                     .scale_lo = 122,
                     .scale_span = 9});
        k::override_kernel_tuning(std::nullopt);
      }
}

}  // namespace
}  // namespace polylora::gpu_test
