// tests/kernels/lora_stack_test.cc: the slot-stacked LoRA kernels (ref:: and cpu::lora_batch, ref:: and
// cpu::moe_experts with MoeExpertsArgs::lora_stack) against the old per-adapter path on the same values:
// ref::lora_apply on each slot's rows with a LoraView per slot, and moe_experts with the ExpertLoraView
// table. Random adapters per slot with different ranks (1 .. the stack rank, zero-padded into the stack),
// slots with scale 0 on a module (no LoRA there), tokens of slot −1, a slot with no tokens, one to three
// modules sharing x, contiguous runs of a slot and interleaved slots, F32 and BF16 stacks (the old path gets
// the same bf16-rounded values in f32). MoE: gu_slices 1 (GPT-OSS: fused interleaved gate_up with biases,
// kGptOssSwiglu; and a fused non-interleaved one) and gu_slices 2 (separate gate and up LoRAs: kSiluGate with
// separate or fused weights; kGptOssSwiglu interleaved, whose old form is one gate_up LoRA of rank r0 + r1,
// see lora_stack_util.h), an expert without LoRA for one slot (scale 0 at [s, e, *]), an adapter without
// expert LoRA (attention only), a token whose experts have no LoRA, F32 and BF16 base weights.
// Tolerances (atol + rtol·|ref|): stacked ref vs old ref 1e-5 + 1e-5 (the same products, maybe another
// order); cpu::lora_batch 1e-5 + 1e-4; cpu::moe_experts with the stack vs ref with the views as
// tests/kernels/moe_test.cc (1e-4 + 1e-3: another base summation order and the activation's exp), and vs
// cpu::moe_experts with the views 2e-5 + 2e-5 (the same base computation; only the LoRA differs). Tokens
// without LoRA must equal the base output (1e-6), tokens with LoRA must differ from it (the largest
// difference > 0.1, far above the tolerances).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <tuple>

#include "kernel_test_util.h"
#include "kernels/lora_stack_util.h"

namespace polylora::kernels {
namespace {

// ---------------------------------------------------------------- dense ----

struct DenseCase {
  int64_t m = 1;
  int num = 1;  // modules sharing x
  int64_t rank = 8;
  DType dtype = DType::kF32;
};

void run_dense(const DenseCase& c) {
  const int64_t S = 5, R = c.rank, in = 37, ldx = in + 3, m = c.m;
  const int64_t outs[3] = {29, 50, 13};
  // Per module: ranks per slot (0: no LoRA on this module for that slot). Slot 3 has LoRA but no tokens.
  auto clamp = [&](int64_t r) { return r == 0 ? 0 : std::clamp<int64_t>(r, 1, R); };
  const std::vector<std::vector<int64_t>> ranks = {{clamp(1), clamp(R), clamp(3), clamp(5), 0},
                                                   {clamp(R), 0, clamp(2), clamp(5), clamp(R - 1)},
                                                   {clamp(4), clamp(R / 2), 0, clamp(1), clamp(R)}};
  const std::vector<float> scales = {0.5f, 1.25f, -0.75f, 2.0f, 0.3f};
  std::vector<std::unique_ptr<test::DenseStack>> stacks;
  std::vector<const test::DenseStack*> sp;
  for (int i = 0; i < c.num; ++i) {
    stacks.push_back(std::make_unique<test::DenseStack>(S, R, in, outs[i], ranks[i], scales, c.dtype,
                                                        static_cast<uint32_t>(40 + i)));
    sp.push_back(stacks.back().get());
  }
  std::vector<float> x = test::random_vec(static_cast<size_t>(m * ldx), 7);
  std::vector<int32_t> slots = test::slot_pattern(m, {0, -1, 2, 1, 4}, 3);
  std::vector<std::vector<float>> y0(3);
  LoraBatchArgs a;
  a.x = x.data();
  a.ldx = ldx;
  a.m = m;
  a.token_slots = slots.data();
  a.num = c.num;
  for (int i = 0; i < c.num; ++i) {
    a.w[i] = stacks[i]->stack();
    a.ldy[i] = outs[i] + 2;
    y0[i] = test::random_vec(static_cast<size_t>(m * a.ldy[i]), static_cast<uint32_t>(60 + i));
  }
  std::string what = "lora_batch m=" + std::to_string(m) + " modules=" + std::to_string(c.num) +
                     " rank=" + std::to_string(R) + " " + test::dtype_str(c.dtype);
  // The old path.
  std::vector<std::vector<float>> expect = y0;
  for (int i = 0; i < c.num; ++i) a.y[i] = expect[i].data();
  test::old_lora_batch(a, sp);
  // Every token of a slot with LoRA on a module changed there (by far more than the tolerance over the
  // module); every other token did not.
  for (int i = 0; i < c.num; ++i) {
    float module_diff = 0;
    for (int64_t t = 0; t < m; ++t) {
      float diff = 0;
      for (int64_t o = 0; o < outs[i]; ++o)
        diff = std::max(diff, std::fabs(expect[i][t * a.ldy[i] + o] - y0[i][t * a.ldy[i] + o]));
      module_diff = std::max(module_diff, diff);
      bool has = slots[t] >= 0 && ranks[i][slots[t]] > 0;
      if (has)
        EXPECT_GT(diff, 0.0f) << what << " module " << i << " token " << t << ": no LoRA effect";
      else
        EXPECT_EQ(diff, 0.0f) << what << " module " << i << " token " << t;
    }
    EXPECT_GT(module_diff, 0.1f) << what << " module " << i << ": LoRA effect too small to test";
  }
  auto check = [&](const char* impl, auto&& fn, float rtol) {
    std::vector<std::vector<float>> got = y0;
    LoraBatchArgs f = a;
    for (int i = 0; i < c.num; ++i) f.y[i] = got[i].data();
    fn(f);
    for (int i = 0; i < c.num; ++i) {
      test::expect_close(got[i], expect[i], 1e-5f, rtol,
                         std::string(impl) + " " + what + " module " + std::to_string(i));
      // Rows of tokens without LoRA on module i, and the padding columns, are untouched (exactly).
      for (int64_t t = 0; t < m; ++t) {
        bool has = slots[t] >= 0 && ranks[i][slots[t]] > 0;
        for (int64_t o = has ? outs[i] : 0; o < a.ldy[i]; ++o)
          ASSERT_EQ(got[i][t * a.ldy[i] + o], y0[i][t * a.ldy[i] + o])
              << impl << " " << what << " module " << i << " token " << t << " column " << o;
      }
    }
  };
  check(
      "ref", [](const LoraBatchArgs& f) { ref::lora_batch(f); }, 1e-5f);
  test::for_each_isa([&](const char* isa) {
    check((std::string("cpu ") + isa).c_str(), [](const LoraBatchArgs& f) { cpu::lora_batch(f); }, 1e-4f);
  });
}

TEST(LoraStack, DenseBatchMatchesPerSlotViews) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {1, 2, 7, 64, 300}) {
      for (int num : {1, 3}) {
        run_dense({.m = m, .num = num, .rank = 8, .dtype = dtype});
      }
    }
    for (int64_t rank : {1, 16, 64}) run_dense({.m = 40, .num = 2, .rank = rank, .dtype = dtype});
  }
}

TEST(LoraStack, DenseBatchNoAdapterTokensAndNoRowsAreNoOps) {
  test::DenseStack st(3, 4, 16, 8, {4, 2, 1}, {1.0f, 1.0f, 1.0f}, DType::kBF16, 5);
  std::vector<float> x = test::random_vec(16 * 6, 1);
  std::vector<int32_t> slots(6, -1);
  std::vector<float> y = test::random_vec(8 * 6, 2), y0 = y;
  LoraBatchArgs a;
  a.x = x.data();
  a.ldx = 16;
  a.m = 6;
  a.token_slots = slots.data();
  a.w[0] = st.stack();
  a.y[0] = y.data();
  a.ldy[0] = 8;
  ref::lora_batch(a);
  EXPECT_EQ(y, y0);
  cpu::lora_batch(a);
  EXPECT_EQ(y, y0);
  a.m = 0;
  slots.assign(6, 0);
  ref::lora_batch(a);
  cpu::lora_batch(a);
  EXPECT_EQ(y, y0);
}

// ---------------------------------------------------------------- MoE ----

void run_stack_moe(const test::StackMoeCase& c) {
  const int64_t H = c.hidden, E = c.num_experts, K = c.top_k, m = c.m, R = c.rank;
  test::MoeFixture f;
  test::make_fixture(c, f);
  std::unique_ptr<test::MoeStack> stp = test::make_moe_stack(c);
  const test::MoeStack& st = *stp;
  MoeExpertsArgs base;
  base.x = f.x.data();
  base.ldx = f.ldx;
  base.m = m;
  base.hidden = H;
  base.inter = c.inter;
  base.num_experts = E;
  base.top_k = K;
  base.ids = f.ids.data();
  base.weights = f.w.data();
  base.experts = f.experts.data();
  base.act = c.act;
  base.ldo = f.ldo;
  MoeExpertsArgs old = base;
  old.token_slots = f.slots.data();
  old.lora = st.views.data();
  old.num_slots = c.slots;
  MoeExpertsArgs stacked = base;
  stacked.token_slots = f.slots.data();
  stacked.lora_stack = st.stack();
  std::string what = "m=" + std::to_string(m) + " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                     " rank=" + std::to_string(R) + " weights " + test::dtype_str(c.weight_dtype) +
                     " stack " + test::dtype_str(c.stack_dtype) +
                     " gu_slices=" + std::to_string(c.gu_slices) + (c.fused ? " fused" : " separate") +
                     (c.biases ? " bias" : "") + (c.act == ExpertAct::kSiluGate ? " silu" : " swiglu");
  auto run = [&](MoeExpertsArgs a, auto&& fn) {
    std::vector<float> out(static_cast<size_t>(m * f.ldo), 3.0f);
    a.out = out.data();
    fn(a);
    for (int64_t t = 0; t < m; ++t) out[t * f.ldo + H] = 0.0f;  // padding column is not written
    return out;
  };
  auto ref_fn = [](const MoeExpertsArgs& a) { ref::moe_experts(a); };
  auto cpu_fn = [](const MoeExpertsArgs& a) { cpu::moe_experts(a); };
  const std::vector<float> ref_base = run(base, ref_fn);
  const std::vector<float> expect = run(old, ref_fn);
  // The test can see LoRA: tokens with LoRA differ from the base, the others do not.
  int with_lora = 0;
  float max_diff = 0;
  for (int64_t t = 0; t < m; ++t) {
    float diff = 0;
    for (int64_t i = 0; i < H; ++i)
      diff = std::max(diff, std::fabs(expect[t * f.ldo + i] - ref_base[t * f.ldo + i]));
    max_diff = std::max(max_diff, diff);
    if (test::token_has_lora(f, st, t, K)) {
      ++with_lora;
      EXPECT_GT(diff, 0.0f) << what << " token " << t << ": the old path shows no LoRA effect";
    } else {
      EXPECT_EQ(diff, 0.0f) << what << " token " << t;
    }
  }
  EXPECT_GT(with_lora, 0) << what;
  EXPECT_GT(max_diff, 0.1f) << what << ": LoRA effect too small to test";
  auto check_no_lora_tokens = [&](const std::vector<float>& got, const std::vector<float>& base_out,
                                  const std::string& impl) {
    for (int64_t t = 0; t < m; ++t) {
      if (test::token_has_lora(f, st, t, K)) continue;
      for (int64_t i = 0; i < H; ++i) {
        // Only rounding may differ (the base product is summed in another order by each path, and
        // OpenBLAS's kernel depends on the CPU); a LoRA delta here would be ~0.1 (asserted above).
        ASSERT_NEAR(got[t * f.ldo + i], base_out[t * f.ldo + i],
                    1e-5f * std::max(1.0f, std::fabs(base_out[t * f.ldo + i])))
            << impl << " " << what << " token " << t << " (slot " << f.slots[t]
            << ", no LoRA on its experts)";
      }
    }
  };
  const std::vector<float> ref_stack = run(stacked, ref_fn);
  test::expect_close(ref_stack, expect, 1e-5f, 1e-5f, "ref stack vs ref views " + what);
  check_no_lora_tokens(ref_stack, ref_base, "ref stack");
  test::for_each_isa([&](const char* isa) {
    std::string impl = std::string("cpu ") + isa;
    const std::vector<float> cpu_stack = run(stacked, cpu_fn);
    test::expect_close(cpu_stack, expect, 1e-4f, 1e-3f, impl + " stack vs ref views " + what);
    const std::vector<float> cpu_views = run(old, cpu_fn);
    test::expect_close(cpu_stack, cpu_views, 2e-5f, 2e-5f, impl + " stack vs " + impl + " views " + what);
    check_no_lora_tokens(cpu_stack, run(base, cpu_fn), impl + " stack");
  });
}

// GPT-OSS: one gate_up LoRA over the fused, interleaved gate_up (with biases), kGptOssSwiglu.
TEST(LoraStack, MoeOneGateUpSliceGptOss) {
  for (DType sd : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {1, 13, 40, 300}) {
      run_stack_moe({.m = m,
                     .weight_dtype = m % 2 ? DType::kBF16 : DType::kF32,
                     .stack_dtype = sd,
                     .gu_slices = 1,
                     .act = ExpertAct::kGptOssSwiglu,
                     .fused = true,
                     .biases = true});
    }
    // A fused non-interleaved gate_up (gate rows then up rows) with one LoRA over both halves.
    run_stack_moe({.m = 21, .stack_dtype = sd, .gu_slices = 1, .act = ExpertAct::kSiluGate, .biases = false});
  }
}

// Separate gate and up LoRAs (Mixtral / Qwen3-MoE; and what vLLM's w13 does with two slices).
TEST(LoraStack, MoeTwoGateUpSlices) {
  for (DType sd : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {1, 13, 40, 300}) {
      run_stack_moe({.m = m,
                     .weight_dtype = m % 2 ? DType::kF32 : DType::kBF16,
                     .stack_dtype = sd,
                     .gu_slices = 2,
                     .act = ExpertAct::kSiluGate,
                     .fused = false,
                     .biases = false});
    }
    // Fused non-interleaved weights (gate rows then up rows: slice n >= I).
    run_stack_moe({.m = 17, .stack_dtype = sd, .gu_slices = 2, .act = ExpertAct::kSiluGate, .fused = true});
    // GPT-OSS's interleaved gate_up with separate gate and up LoRAs (slice n & 1).
    for (int64_t m : {1, 40}) {
      run_stack_moe({.m = m,
                     .weight_dtype = DType::kBF16,
                     .stack_dtype = sd,
                     .gu_slices = 2,
                     .act = ExpertAct::kGptOssSwiglu,
                     .fused = true,
                     .biases = true});
    }
  }
}

TEST(LoraStack, MoeRanksTopKAndExpertCounts) {
  // Stack rank 1 (every adapter rank 1), a large rank, top_k 1, and every expert routed (top_k == E).
  for (int64_t rank : {1, 16}) {
    run_stack_moe({.m = 30,
                   .rank = rank,
                   .stack_dtype = DType::kBF16,
                   .gu_slices = 2,
                   .act = ExpertAct::kSiluGate,
                   .fused = false,
                   .biases = false});
    run_stack_moe({.m = 30, .rank = rank, .stack_dtype = DType::kF32, .gu_slices = 1});
  }
  run_stack_moe(
      {.m = 25, .hidden = 33, .inter = 17, .top_k = 1, .stack_dtype = DType::kBF16, .gu_slices = 1});
  run_stack_moe({.m = 9,
                 .hidden = 33,
                 .inter = 17,
                 .top_k = 6,
                 .stack_dtype = DType::kF32,
                 .gu_slices = 2,
                 .act = ExpertAct::kSiluGate,
                 .fused = false});
  // Eight slots (as the serving default and the benchmark), every one but 2 and 3 with tokens.
  run_stack_moe({.m = 64, .num_experts = 8, .stack_dtype = DType::kBF16, .gu_slices = 2, .slots = 8});
  run_stack_moe({.m = 64,
                 .num_experts = 8,
                 .weight_dtype = DType::kBF16,
                 .stack_dtype = DType::kBF16,
                 .gu_slices = 1,
                 .slots = 8});
}

// ref::linear_lora_ext (the dense LoRA as extra K columns: x, the weights and the scaled shrink sums rounded
// to bf16, the bias as bf16 hi + lo) against what the model computes without it (ref::linear of the
// unrounded x, the bias, the old per-slot LoRA): within 1e-2 of each token's rms, with LoRA terms of at
// least 0.1 of the rms for most tokens (a missing, misplaced or mis-scaled term fails); q/k/v stacked, a
// group without its middle module (its tails read zeros), and one module.
TEST(LoraStack, LinearLoraExtRefEqualsProductBiasAndLora) {
  for (auto [m, num, skip] : {std::tuple{40, 3, false}, std::tuple{40, 3, true}, std::tuple{17, 1, false}}) {
    const test::ExtCase c(m, num, skip);
    std::vector<float> got(static_cast<size_t>(m * c.n), std::nanf(""));
    ref::linear_lora_ext(c.args(got.data()));
    const auto rows = c.row_errors(got);
    int64_t with_lora = 0;
    for (int64_t t = 0; t < m; ++t) {
      ASSERT_LE(rows[t].err, 1e-2) << "m=" << m << " modules=" << c.group.size() << " token " << t;
      if (rows[t].effect > 0.1) ++with_lora;
    }
    EXPECT_GT(with_lora, m / 2) << "LoRA terms too small to test";
  }
}

}  // namespace
}  // namespace polylora::kernels
