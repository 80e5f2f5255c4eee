// tests/gpu/lora_stack_gpu_test.cc: the CUDA slot-stacked LoRA kernels against the references on the old
// per-adapter views (the same values): Backend::lora_batch (cuda::lora_batch) vs ref::lora_apply on each
// slot's rows, and Backend::moe_experts with MoeExpertsArgs::lora_stack (cuda::moe_experts) vs
// ref::moe_experts with the ExpertLoraView table (tests/kernels/lora_stack_util.h builds both from one set
// of random adapters). F32 and BF16 stacks; batches 1, 16, 64, 256 and a prefill-sized 300 (and 1100: the
// 128-row GEMM tile); 8 slots in contiguous runs and interleaved, −1 tokens, a slot without tokens, slots
// with scale 0 on a module, stack ranks 1..64 with adapters of every rank below (zero-padded); MoE:
// gu_slices 1 (GPT-OSS fused interleaved gate_up with biases) and 2 (separate gate and up LoRAs over
// separate, fused or interleaved gate/up weights), an expert without LoRA for a slot, an adapter without
// expert LoRA, a token whose experts have no LoRA, on every MoE path (moe_cuda.cu choose_path): F32 weights
// GEMV (pairs <= 512) and fp32 GEMM (more), BF16 weights fp32 GEMV (< 4 pairs per expert), tensor-core
// weight streaming (4..16 per expert) and the tensor-core grouped GEMM (more), each in the three backend
// modes of gpu_test_util.h.
// Tolerances: dense 1e-5 + 1e-4·|ref| (f32 products of exactly the stacked values in another order; BF16
// stacks hold values the reference sees converted exactly); tokens without LoRA untouched (bitwise). MoE
// per gpu_test_util.h's mode (F32 1e-4 + 1e-4·|ref|; BF16 hi+lo 5e-4, BF16 rounded 2e-2, atol ·max(1,
// rms(ref))), as moe_gpu_test.cc for the base path; and each case checks that its LoRA changes the output
// by far more than that tolerance (so a missing or misplaced LoRA fails).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "gpu_test_util.h"
#include "kernels/lora_stack_util.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;
namespace kt = kernels::test;

// A stack tensor's bits in device memory.
const void* up_stack(Arena& ar, const kt::StackBuffer& b) {
  if (b.dtype == DType::kBF16) return ar.up(b.bf16);
  return ar.up(b.f32);
}

// ---------------------------------------------------------------- dense ----

struct DenseCase {
  int64_t m = 1;
  int num = 3;
  int64_t rank = 16;
  int64_t in = 136;
  DType dtype = DType::kBF16;
};

void run_dense(const DenseCase& c) {
  Arena ar(backend());
  const int64_t S = 8, R = c.rank, in = c.in, ldx = in + 4, m = c.m;
  const int64_t outs[3] = {200, 64, 33};
  auto r = [&](int64_t v) { return v == 0 ? 0 : std::clamp<int64_t>(v, 1, R); };
  // Slot 3 has LoRA and no tokens; module 0 has none for slot 5, module 1 none for slot 2, module 2 none
  // for slot 7; ranks from 1 to R.
  const std::vector<std::vector<int64_t>> ranks = {{r(R), r(1), r(R / 2), r(R), r(3), 0, r(R - 1), r(7)},
                                                   {r(5), r(R), 0, r(2), r(R), r(1), r(R / 4), r(R)},
                                                   {r(1), r(R - 2), r(R), r(R), r(6), r(R), r(2), 0}};
  const std::vector<float> scales = {0.5f, 1.0f, -0.75f, 2.0f, 0.25f, 1.5f, -1.0f, 0.8f};
  // LoRA terms of about the size of y whatever in and rank are.
  const float ar_a = 0.5f * std::sqrt(37.0f / static_cast<float>(in));
  const float ar_b = 0.5f * std::sqrt(8.0f / static_cast<float>(R));
  std::vector<std::unique_ptr<kt::DenseStack>> stacks;
  std::vector<const kt::DenseStack*> sp;
  for (int i = 0; i < c.num; ++i) {
    stacks.push_back(std::make_unique<kt::DenseStack>(S, R, in, outs[i], ranks[i], scales, c.dtype,
                                                      static_cast<uint32_t>(90 + i), ar_a, ar_b));
    sp.push_back(stacks.back().get());
  }
  std::vector<float> x = kt::random_vec(static_cast<size_t>(m * ldx), 11);
  std::vector<int32_t> slots = kt::slot_pattern(m, {0, -1, 1, 2, 4, 5, 6, 7}, 5);
  k::LoraBatchArgs a;
  a.x = x.data();
  a.ldx = ldx;
  a.m = m;
  a.token_slots = slots.data();
  a.num = c.num;
  std::vector<std::vector<float>> y0(3), expect(3);
  for (int i = 0; i < c.num; ++i) {
    a.w[i] = stacks[i]->stack();
    a.ldy[i] = outs[i] + 3;
    y0[i] = kt::random_vec(static_cast<size_t>(m * a.ldy[i]), static_cast<uint32_t>(20 + i));
    expect[i] = y0[i];
    a.y[i] = expect[i].data();
  }
  kt::old_lora_batch(a, sp);
  std::string what = "lora_batch m=" + std::to_string(m) + " modules=" + std::to_string(c.num) +
                     " rank=" + std::to_string(R) + " in=" + std::to_string(in) + " " +
                     kt::dtype_str(c.dtype);
  k::LoraBatchArgs d = a;
  d.x = ar.up(x);
  d.token_slots = ar.up(slots);
  std::vector<float*> dy(3);
  for (int i = 0; i < c.num; ++i) {
    d.w[i].a = up_stack(ar, stacks[i]->a);
    d.w[i].b = up_stack(ar, stacks[i]->b);
    d.w[i].scale = ar.up(stacks[i]->scale);
    dy[i] = ar.up(y0[i]);
    d.y[i] = dy[i];
  }
  ar.be().lora_batch(d);
  for (int i = 0; i < c.num; ++i) {
    std::vector<float> got = ar.down(dy[i], y0[i].size());
    kt::expect_close(got, expect[i], 1e-5f, 1e-4f, what + " module " + std::to_string(i));
    float effect = 0;
    for (size_t j = 0; j < got.size(); ++j) effect = std::max(effect, std::fabs(expect[i][j] - y0[i][j]));
    EXPECT_GT(effect, 0.1f) << what << " module " << i << ": LoRA effect too small to test";
    for (int64_t t = 0; t < m; ++t) {
      bool has = slots[t] >= 0 && ranks[i][slots[t]] > 0;
      for (int64_t o = has ? outs[i] : 0; o < a.ldy[i]; ++o)
        ASSERT_EQ(got[t * a.ldy[i] + o], y0[i][t * a.ldy[i] + o])
            << what << " module " << i << " token " << t << " (slot " << slots[t] << ") column " << o;
    }
  }
}

TEST(GpuLoraStack, DenseBatchSizes) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t m : {1, 16, 64, 256, 300}) {
      for (int num : {1, 3}) run_dense({.m = m, .num = num, .rank = 16, .dtype = dtype});
    }
  }
}

TEST(GpuLoraStack, DenseRanksAndShapes) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t rank : {1, 5, 8, 32, 64}) run_dense({.m = 64, .num = 3, .rank = rank, .dtype = dtype});
    // Odd input sizes (element loads) and a GPT-OSS-sized input (2880).
    run_dense({.m = 17, .num = 2, .rank = 16, .in = 37, .dtype = dtype});
    run_dense({.m = 33, .num = 3, .rank = 16, .in = 2880, .dtype = dtype});
    run_dense({.m = 3, .num = 1, .rank = 64, .in = 1001, .dtype = dtype});
    // Tiled shrink (more than 64 tokens) with an input that ends mid-step of 8 and mid-chunk of 256, rank
    // rows that end mid-warp (3 x 5), and 2 rows of the last tile.
    run_dense({.m = 98, .num = 3, .rank = 5, .in = 1001, .dtype = dtype});
    run_dense({.m = 130, .num = 2, .rank = 64, .in = 37, .dtype = dtype});
  }
}

TEST(GpuLoraStack, DenseNoAdapterTokensAreNoOps) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  kt::DenseStack st(4, 8, 64, 40, {8, 2, 0, 5}, {1.0f, 1.0f, 1.0f, 1.0f}, DType::kBF16, 3);
  // Tokens of slot −1 and of slot 2 (no LoRA on the module) only.
  std::vector<int32_t> slots = {-1, 2, -1, 2, 2, -1};
  std::vector<float> x = kt::random_vec(64 * 6, 1), y0 = kt::random_vec(40 * 6, 2);
  k::LoraBatchArgs d;
  d.x = ar.up(x);
  d.ldx = 64;
  d.m = 6;
  d.token_slots = ar.up(slots);
  d.w[0] = st.stack();
  d.w[0].a = up_stack(ar, st.a);
  d.w[0].b = up_stack(ar, st.b);
  d.w[0].scale = ar.up(st.scale);
  float* dy = ar.up(y0);
  d.y[0] = dy;
  d.ldy[0] = 40;
  ar.be().lora_batch(d);
  EXPECT_EQ(ar.down(dy, y0.size()), y0);
}

// ---------------------------------------------------------------- MoE ----

struct GpuMoeCase {
  kt::StackMoeCase c;  // c.weight_dtype is set from mode
  Mode mode = kF32Mode;
};

void run_moe(GpuMoeCase gc) {
  kt::StackMoeCase& c = gc.c;
  c.weight_dtype = gc.mode.dtype;
  Arena ar(backend(gc.mode));
  const int64_t H = c.hidden, I = c.inter, E = c.num_experts, K = c.top_k, m = c.m;
  kt::MoeFixture f;
  kt::make_fixture(c, f);
  std::unique_ptr<kt::MoeStack> st = kt::make_moe_stack(c);
  k::MoeExpertsArgs base;
  base.x = f.x.data();
  base.ldx = f.ldx;
  base.m = m;
  base.hidden = H;
  base.inter = I;
  base.num_experts = E;
  base.top_k = K;
  base.ids = f.ids.data();
  base.weights = f.w.data();
  base.experts = f.experts.data();
  base.act = c.act;
  base.ldo = f.ldo;
  k::MoeExpertsArgs old = base;
  old.token_slots = f.slots.data();
  old.lora = st->views.data();
  old.num_slots = c.slots;
  std::vector<float> expect(static_cast<size_t>(m * f.ldo), 3.0f), no_lora = expect;
  old.out = expect.data();
  k::ref::moe_experts(old);
  base.out = no_lora.data();
  k::ref::moe_experts(base);
  for (int64_t t = 0; t < m; ++t) expect[t * f.ldo + H] = no_lora[t * f.ldo + H] = 3.0f;  // padding column
  std::string what = "m=" + std::to_string(m) + " H=" + std::to_string(H) + " I=" + std::to_string(I) +
                     " E=" + std::to_string(E) + " K=" + std::to_string(K) +
                     " rank=" + std::to_string(c.rank) + " stack " + kt::dtype_str(c.stack_dtype) +
                     " gu_slices=" + std::to_string(c.gu_slices) + (c.fused ? " fused" : " separate") +
                     (c.biases ? " bias" : "") + (c.act == k::ExpertAct::kSiluGate ? " silu" : " swiglu");
  // The LoRA must move the output by far more than the tolerance.
  {
    double sq = 0;
    float effect = 0;
    for (size_t j = 0; j < expect.size(); ++j) {
      sq += double(expect[j]) * expect[j];
      effect = std::max(effect, std::fabs(expect[j] - no_lora[j]));
    }
    float rms = static_cast<float>(std::sqrt(sq / expect.size()));
    Tol t = tol_for(gc.mode);
    float atol = gc.mode.dtype == DType::kF32 ? t.atol : t.atol * std::max(1.0f, rms);
    EXPECT_GT(effect, 10 * atol) << gc.mode.name << " " << what << ": LoRA effect too small to test";
  }
  // Device copies.
  std::vector<k::ExpertView> dexperts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const k::ExpertView& ex = f.experts[e];
    k::ExpertView& dx = dexperts[e];
    if (!ex.gate_up.empty()) dx.gate_up = ar.weight(ex.gate_up);
    if (!ex.gate.empty()) dx.gate = ar.weight(ex.gate);
    if (!ex.up.empty()) dx.up = ar.weight(ex.up);
    dx.down = ar.weight(ex.down);
    if (ex.gate_up_bias)
      dx.gate_up_bias = ar.up(std::vector<float>(ex.gate_up_bias, ex.gate_up_bias + 2 * I));
    if (ex.down_bias) dx.down_bias = ar.up(std::vector<float>(ex.down_bias, ex.down_bias + H));
  }
  k::MoeExpertsArgs d = base;
  d.x = ar.up(f.x);
  d.ids = ar.up(f.ids);
  d.weights = ar.up(f.w);
  d.experts = ar.up(dexperts);
  d.token_slots = ar.up(f.slots);
  d.lora_stack = st->stack();
  d.lora_stack.a_gu = up_stack(ar, st->a_gu);
  d.lora_stack.b_gu = up_stack(ar, st->b_gu);
  d.lora_stack.a_down = up_stack(ar, st->a_down);
  d.lora_stack.b_down = up_stack(ar, st->b_down);
  d.lora_stack.scale = ar.up(st->scale);
  std::vector<float> init(expect.size(), 3.0f);
  float* out = ar.up(init);
  d.out = out;
  ar.be().moe_experts(d);
  expect_close_for(gc.mode, ar.down(out, init.size()), expect, what);  // incl. the untouched padding column
}

// Every case in the three backend modes and with both stack dtypes.
void run_all(kt::StackMoeCase c) {
  for (const Mode& md : kModes) {
    for (DType sd : {DType::kF32, DType::kBF16}) {
      c.stack_dtype = sd;
      run_moe({c, md});
    }
  }
}

// GPT-OSS layout: fused interleaved gate_up with biases, kGptOssSwiglu, one gate_up LoRA (gu_slices 1) or
// separate gate and up LoRAs (gu_slices 2, slice n & 1), 8 experts top-2: batch 1 (GEMV), 16..256 (BF16:
// tensor-core weight streaming; F32: GEMV), 300 (grouped GEMMs).
TEST(GpuLoraStack, MoeGptOssLayoutBatchSizes) {
  SKIP_WITHOUT_GPU();
  for (int gu : {1, 2}) {
    for (int64_t m : {1, 16, 64, 256, 300}) {
      run_all({.m = m,
               .hidden = 64,
               .inter = 48,
               .num_experts = 8,
               .top_k = 2,
               .rank = 16,
               .gu_slices = gu,
               .act = k::ExpertAct::kGptOssSwiglu,
               .fused = true,
               .biases = true,
               .slots = 8});
    }
  }
}

// Mixtral / Qwen3-MoE layout: separate gate and up weights, kSiluGate, separate gate and up LoRAs; and a
// fused non-interleaved gate_up with either one or two LoRA slices.
TEST(GpuLoraStack, MoeSiluLayouts) {
  SKIP_WITHOUT_GPU();
  for (int64_t m : {1, 16, 64, 256, 300}) {
    run_all({.m = m,
             .hidden = 64,
             .inter = 48,
             .num_experts = 8,
             .top_k = 2,
             .rank = 16,
             .gu_slices = 2,
             .act = k::ExpertAct::kSiluGate,
             .fused = false,
             .biases = false,
             .slots = 8});
  }
  for (int gu : {1, 2}) {
    run_all({.m = 40,
             .hidden = 64,
             .inter = 48,
             .num_experts = 6,
             .top_k = 2,
             .rank = 8,
             .gu_slices = gu,
             .act = k::ExpertAct::kSiluGate,
             .fused = true,
             .biases = true});
  }
}

// GPT-OSS-like routing (32 experts, top 4) at the benchmark's batch sizes: 1 and 16 GEMV, 64 weight
// streaming (BF16), 256 grouped GEMM (BF16; F32 at > 512 pairs).
TEST(GpuLoraStack, MoeThirtyTwoExpertsTopFour) {
  SKIP_WITHOUT_GPU();
  for (int64_t m : {1, 16, 64, 256}) {
    run_all({.m = m,
             .hidden = 256,
             .inter = 192,
             .num_experts = 32,
             .top_k = 4,
             .rank = 16,
             .gu_slices = 2,
             .act = k::ExpertAct::kGptOssSwiglu,
             .fused = true,
             .biases = true,
             .slots = 8,
             .weight_scale = 0.1f,
             .lora_a = 0.15f,
             .lora_b = 0.3f});
  }
}

// Stack ranks 1 .. 64 (adapters of every rank up to the stack's, zero-padded).
TEST(GpuLoraStack, MoeRanks) {
  SKIP_WITHOUT_GPU();
  for (int64_t rank : {1, 5, 32, 64}) {
    run_all({.m = 64,
             .hidden = 64,
             .inter = 48,
             .num_experts = 8,
             .top_k = 2,
             .rank = rank,
             .gu_slices = 2,
             .act = k::ExpertAct::kGptOssSwiglu,
             .fused = true,
             .biases = true,
             .slots = 8,
             .lora_b = 0.3f * std::sqrt(6.0f / static_cast<float>(rank))});
  }
  run_all({.m = 13,
           .hidden = 64,
           .inter = 48,
           .num_experts = 6,
           .top_k = 2,
           .rank = 64,
           .gu_slices = 1,
           .act = k::ExpertAct::kGptOssSwiglu,
           .fused = true,
           .biases = true,
           .lora_b = 0.1f});
}

// Awkward shapes of the paths: odd K (element loads), a partial 32-block of K (136), K past one GEMV
// shared-memory chunk (1544), the 128-row GEMM tile (pairs >= 256·E), top_k 1, and every expert routed.
TEST(GpuLoraStack, MoeAwkwardShapes) {
  SKIP_WITHOUT_GPU();
  run_all({.m = 9,
           .hidden = 33,
           .inter = 17,
           .num_experts = 6,
           .top_k = 2,
           .rank = 4,
           .gu_slices = 2,
           .act = k::ExpertAct::kSiluGate,
           .fused = false,
           .biases = false});
  run_all({.m = 200,
           .hidden = 136,
           .inter = 72,
           .num_experts = 4,
           .top_k = 1,
           .rank = 8,
           .gu_slices = 1,
           .act = k::ExpertAct::kGptOssSwiglu,
           .fused = true,
           .biases = true,
           .lora_a = 0.2f});
  run_all({.m = 5,
           .hidden = 1544,
           .inter = 96,
           .num_experts = 8,
           .top_k = 2,
           .rank = 16,
           .gu_slices = 2,
           .act = k::ExpertAct::kGptOssSwiglu,
           .fused = true,
           .biases = true,
           .weight_scale = 0.05f,
           .lora_a = 0.06f,
           .lora_b = 0.2f});
  run_all({.m = 1100,
           .hidden = 64,
           .inter = 40,
           .num_experts = 4,
           .top_k = 2,
           .rank = 16,
           .gu_slices = 2,
           .act = k::ExpertAct::kSiluGate,
           .fused = false,
           .biases = false,
           .slots = 8});
  run_all({.m = 20,
           .hidden = 33,
           .inter = 17,
           .num_experts = 6,
           .top_k = 6,
           .rank = 6,
           .gu_slices = 1,
           .act = k::ExpertAct::kGptOssSwiglu,
           .fused = true,
           .biases = true});
}

// The grouped-GEMM path with BF16 stacks takes the tensor-core shrinks and the expands fused into the GEMMs'
// epilogues (moe_lora_mma.cuh): rank spaces of one and several k16 steps and of several 64-wide CTA chunks
// (gu_slices 2 at rank 72: 144 rank rows), ranks not a multiple of 8 or 16 (odd ones: B pairs straddling a
// slice), more slots than the shrink's grid.y (12: a CTA takes several runs), K not a multiple of 8 (the
// element-wise weight loads), and the 128-row tile; every case far above 512 pairs.
TEST(GpuLoraStack, MoeGroupedGemmTensorCoreLora) {
  SKIP_WITHOUT_GPU();
  for (int64_t rank : {5, 16, 24, 72}) {
    for (int gu : {1, 2}) {
      run_all({.m = 400,
               .hidden = 96,
               .inter = 64,
               .num_experts = 8,
               .top_k = 2,
               .rank = rank,
               .gu_slices = gu,
               .act = gu == 1 ? k::ExpertAct::kGptOssSwiglu : k::ExpertAct::kSiluGate,
               .fused = gu == 1,
               .biases = gu == 1,
               .slots = 12,
               .lora_b = 0.3f * std::sqrt(8.0f / static_cast<float>(rank))});
    }
  }
  run_all({.m = 700,
           .hidden = 45,
           .inter = 33,
           .num_experts = 4,
           .top_k = 2,
           .rank = 7,
           .gu_slices = 2,
           .act = k::ExpertAct::kGptOssSwiglu,
           .fused = true,
           .biases = true,
           .slots = 6});
  run_all({.m = 1200,  // 2,400 pairs over 4 experts: >= 256 per expert, the 128-row tile
           .hidden = 64,
           .inter = 48,
           .num_experts = 4,
           .top_k = 2,
           .rank = 16,
           .gu_slices = 1,
           .act = k::ExpertAct::kGptOssSwiglu,
           .fused = true,
           .biases = true,
           .slots = 8});
}

}  // namespace
}  // namespace polylora::gpu_test
