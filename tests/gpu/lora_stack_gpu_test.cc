// tests/gpu/lora_stack_gpu_test.cc: the CUDA slot-stacked dense LoRA kernels against the references on the
// old per-adapter views (the same values): Backend::lora_batch (cuda::lora_batch) vs ref::lora_apply on each
// slot's rows (tests/kernels/lora_stack_util.h builds both from one set of random adapters), the shrink
// with the projection, and the expands fused into rope_kv_write and add_rms_norm. F32 and BF16 stacks;
// batches 1, 16, 64, 256 and a prefill-sized 300; 8 slots in contiguous runs and interleaved, −1 tokens, a
// slot without tokens, slots with scale 0 on a module, stack ranks 1..64 with adapters of every rank below
// (zero-padded). Tolerances: 1e-5 + 1e-4·|ref| (f32 products of exactly the stacked values in another
// order; BF16 stacks hold values the reference sees converted exactly); tokens without LoRA untouched
// (bitwise). The expert LoRA stacks: moe_lora_stack_gpu_test.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "gpu_test_util.h"
#include "kernels/lora_stack_util.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"
#include "kernels/tuning.h"
#include "lora_stack_gpu_util.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;
namespace kt = kernels::test;

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
    a.ldy[i] = outs[i] + (i == 0 ? 4 : 3);  // module 0: an even stride (the vectorized expand tiles)
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
    d.w[i] = up_dense_stack(ar, *stacks[i]);
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

// Pass 1: the shrinks of up to 64 tokens by adapter slot (lora_dense_slot_shrink_min_rows 1); pass 2: the
// BF16 shrinks of more tokens on tensor cores (lora_dense_shrink_mma_min_rows 1) and the expands of 256
// tokens and more by blocks of 4 tiles (lora_dense_expand_tiles 4); pass 3: the BF16 shrinks and expands
// of every size on tensor cores (lora_dense_expand_mma_min_rows 1). Passes 0 to 2 keep the expand on CUDA
// cores.
TEST(GpuLoraStack, DenseBatchSizes) {
  SKIP_WITHOUT_GPU();
  for (int pass : {0, 1, 2, 3}) {
    SCOPED_TRACE("pass " + std::to_string(pass));
    k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
    t.lora_dense_slot_shrink_min_rows = pass == 1 ? 1 : 0;
    t.lora_dense_shrink_mma_min_rows = pass >= 2 ? 1 : 0;
    t.lora_dense_expand_tiles = pass == 2 ? 4 : 1;
    t.lora_dense_expand_mma_min_rows = pass == 3 ? 1 : 0;
    k::override_kernel_tuning(t);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t m : {1, 16, 64, 256, 300}) {
        for (int num : {1, 3}) run_dense({.m = m, .num = num, .rank = 16, .dtype = dtype});
      }
    }
  }
  k::override_kernel_tuning(std::nullopt);
}

// Pass 1: the BF16 shrinks of more than 64 tokens on tensor cores (lora_dense_shrink_mma_min_rows 1): odd
// input sizes and row strides (element loads), ranks that leave rank chunks part-filled, tiles of many runs
// of several slots;
// and the expands of 256 tokens and more by blocks of 4 tiles (lora_dense_expand_tiles 4; m = 1,100: a
// last block of 1.5 tiles). Pass 2: those shrinks and every BF16 expand on tensor cores
// (lora_dense_expand_mma_min_rows 1): ranks that end mid-slice of 16 and 32, outputs that end mid-chunk of
// 128 and mid-pair (odd sizes: element loads and stores), runs of several slots in a 64-token tile. Pass 3:
// as pass 2 with 64 outputs per expand CTA (lora_dense_expand_mma_cols 64: outputs ending mid-chunk of 64).
TEST(GpuLoraStack, DenseRanksAndShapes) {
  SKIP_WITHOUT_GPU();
  for (int pass : {0, 1, 2, 3}) {
    SCOPED_TRACE("pass " + std::to_string(pass));
    k::KernelTuning tune = k::kernel_tuning(k::TuningShape{});
    tune.lora_dense_shrink_mma_min_rows = pass >= 1 ? 1 : 0;
    tune.lora_dense_expand_tiles = pass == 1 ? 4 : 1;
    tune.lora_dense_expand_mma_min_rows = pass >= 2 ? 1 : 0;
    tune.lora_dense_expand_mma_cols = pass == 3 ? 64 : 128;
    k::override_kernel_tuning(tune);
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int64_t rank : {1, 5, 8, 32, 64})
        run_dense({.m = pass == 0 ? 64 : 200, .num = 3, .rank = rank, .dtype = dtype});
      // Odd input sizes (element loads) and a GPT-OSS-sized input (2880).
      run_dense({.m = 17, .num = 2, .rank = 16, .in = 37, .dtype = dtype});
      run_dense({.m = 33, .num = 3, .rank = 16, .in = 2880, .dtype = dtype});
      run_dense({.m = 3, .num = 1, .rank = 64, .in = 1001, .dtype = dtype});
      // Tiled shrink (more than 64 tokens) with an input that ends mid-step of 8 and mid-chunk of 256, rank
      // rows that end mid-warp (3 x 5), and 2 rows of the last tile.
      run_dense({.m = 98, .num = 3, .rank = 5, .in = 1001, .dtype = dtype});
      run_dense({.m = 130, .num = 2, .rank = 64, .in = 37, .dtype = dtype});
      run_dense({.m = 1100, .num = 3, .rank = 16, .in = 2880, .dtype = dtype});
    }
  }
  k::override_kernel_tuning(std::nullopt);
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

// The dense shrink alone (lora.h lora_shrink) as extra items of a streamed BF16 projection over the same x
// (m <= 8 with the split) or as its own launch after the product (larger m): tmp equals
// ref::lora_shrink on the rows whose slot has LoRA in some module of the group, other rows are untouched
// (poisoned), and the product itself equals ref::linear. Also as the first of a group of two products over
// the same x (Backend::linear_group: one launch, or one cast for both cuBLAS products), and with the
// separate shrink beside the product on the side stream (lora_shrink_beside_product 1).
TEST(GpuLoraStack, DenseShrinkWithTheProjection) {
  SKIP_WITHOUT_GPU();
  // Pass 1 and 3: the separate shrinks by adapter slot (lora_dense_slot_shrink_min_rows 1; m = 100 and 256:
  // more than 8 tokens per slot, several tiles per block); passes 2 and 3 beside the product.
  for (int pass : {0, 1, 2, 3}) {
    SCOPED_TRACE("lora_dense_slot_shrink_min_rows " + std::to_string(pass & 1) +
                 " lora_shrink_beside_product " + std::to_string(pass >> 1));
    k::KernelTuning tune = k::kernel_tuning(k::TuningShape{});
    tune.lora_dense_slot_shrink_min_rows = pass & 1;
    tune.lora_shrink_beside_product = pass >> 1;
    k::override_kernel_tuning(tune);
    const DType wd = DType::kBF16;
    for (int64_t m : {1, 2, 5, 8, 13, 40, 100, 256}) {
      for (int64_t in : {136, 1000}) {
        Arena ar(backend(kBf16Mode));
        const int64_t S = 8, R = 16, ldx = in + 4, n = 300, ld_tmp = 48 + 3;
        const std::vector<float> scales = {0.5f, 1.0f, -0.75f, 2.0f, 0.25f, 1.5f, -1.0f, 0.8f};
        // Slot 2 has LoRA in no module of the group (its rows stay poisoned); module 1 has none for slot 5.
        const std::vector<std::vector<int64_t>> ranks = {
            {16, 3, 0, 16, 9, 16, 1, 16}, {5, 16, 0, 2, 16, 0, 4, 16}, {16, 7, 0, 16, 6, 16, 2, 1}};
        std::vector<std::unique_ptr<kt::DenseStack>> stacks;
        const int64_t outs[3] = {64, 32, 32};
        for (int i = 0; i < 3; ++i)
          stacks.push_back(std::make_unique<kt::DenseStack>(S, R, in, outs[i], ranks[i], scales, DType::kBF16,
                                                            static_cast<uint32_t>(60 + i), 0.2f, 0.3f));
        std::vector<float> x = kt::random_vec(static_cast<size_t>(m * ldx), 13);
        std::vector<int32_t> slots = kt::slot_pattern(m, {0, -1, 1, 2, 4, 5, 6, 7, 3}, 1);
        kt::TestWeight w = kt::make_weight(n, in, wd, 71, 0.1f);
        k::LoraBatchArgs la;
        la.x = x.data();
        la.ldx = ldx;
        la.m = m;
        la.token_slots = slots.data();
        la.num = 3;
        for (int i = 0; i < 3; ++i) la.w[i] = stacks[i]->stack();
        std::vector<float> tmp_expect(static_cast<size_t>(m * ld_tmp), -7.0f),
            y_expect(static_cast<size_t>(m * n));
        k::ref::lora_shrink(la, tmp_expect.data(), ld_tmp);
        k::ref::linear({.x = x.data(), .m = m, .ldx = ldx, .w = w.view, .y = y_expect.data(), .ldy = n});
        k::LoraBatchArgs d = la;
        d.x = ar.up(x);
        d.token_slots = ar.up(slots);
        for (int i = 0; i < 3; ++i) d.w[i] = up_dense_stack(ar, *stacks[i]);
        float* dtmp = ar.up(std::vector<float>(tmp_expect.size(), -7.0f));
        float* dy = ar.up(std::vector<float>(y_expect.size(), 0.0f));
        ar.be().linear({.x = d.x,
                        .m = m,
                        .ldx = ldx,
                        .w = ar.weight(w.view),
                        .y = dy,
                        .ldy = n,
                        .lora_shrink = &d,
                        .lora_tmp = dtmp,
                        .lora_ld_tmp = ld_tmp});
        const std::string what = "shrink with linear m=" + std::to_string(m) + " in=" + std::to_string(in) +
                                 " " + kt::dtype_str(wd) + " weights";
        const std::vector<float> got = ar.down(dtmp, tmp_expect.size());
        kt::expect_close(got, tmp_expect, 1e-5f, 1e-4f, what + ": tmp");
        for (int64_t t = 0; t < m; ++t)
          if (slots[t] < 0 || slots[t] == 2)
            for (int64_t j = 0; j < ld_tmp; ++j)
              ASSERT_EQ(got[t * ld_tmp + j], -7.0f) << what << " token " << t;
        kt::expect_close(ar.down(dy, y_expect.size()), y_expect, 1e-4f, 1e-3f, what + ": y");
        // The same as the first product of a group; the second (its own weight, no shrink) beside it.
        const int64_t n2 = 40;
        kt::TestWeight w2 = kt::make_weight(n2, in, wd, 72, 0.1f);
        std::vector<float> y2_expect(static_cast<size_t>(m * n2));
        k::ref::linear({.x = x.data(), .m = m, .ldx = ldx, .w = w2.view, .y = y2_expect.data(), .ldy = n2});
        float* dtmp_g = ar.up(std::vector<float>(tmp_expect.size(), -7.0f));
        float* dy_g = ar.up(std::vector<float>(y_expect.size(), 0.0f));
        float* dy2 = ar.up(std::vector<float>(y2_expect.size(), 0.0f));
        const k::LinearArgs group[2] = {
            {.x = d.x,
             .m = m,
             .ldx = ldx,
             .w = ar.weight(w.view),
             .y = dy_g,
             .ldy = n,
             .lora_shrink = &d,
             .lora_tmp = dtmp_g,
             .lora_ld_tmp = ld_tmp},
            {.x = d.x, .m = m, .ldx = ldx, .w = ar.weight(w2.view), .y = dy2, .ldy = n2}};
        ar.be().linear_group(group);
        EXPECT_EQ(ar.down(dtmp_g, tmp_expect.size()), got) << what << ": the group's tmp";
        kt::expect_close(ar.down(dy_g, y_expect.size()), y_expect, 1e-4f, 1e-3f, what + ": the group's y");
        kt::expect_close(ar.down(dy2, y2_expect.size()), y2_expect, 1e-4f, 1e-3f, what + ": the group's y2");
      }
    }
  }
  k::override_kernel_tuning(std::nullopt);
}

// rope_kv_write with each lane's B rows in registers (KernelTuning::rope_lora_b_regs; also with one CTA
// per token looping over its heads, rope_kv_write_loop_min_rows 1) against the same op reading them after
// the wait: bit for bit on q and on the cache's k and v, for head dims 64 and 128, stack
// ranks 8, 16 and 32 (rank 32 at head dim 128 does not fit the registers: the plain path), with and without
// q/k norms, tokens of every slot kind; and the LoRA terms change the result.
TEST(GpuLoraStack, RopeKvWriteBRowsInRegistersBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 4, H = 64, heads = 4, kv_heads = 2, m = 5, blocks = 2, bs = 16;
  const std::vector<float> scales = {0.5f, 1.0f, -0.75f, 2.0f};
  for (int64_t D : {64, 128})
    for (int64_t R : {8, 16, 32})
      for (bool qk_norm : {false, true}) {
        const int64_t qs = heads * D, kvs = kv_heads * D;
        const std::string what =
            "D=" + std::to_string(D) + " R=" + std::to_string(R) + (qk_norm ? " qk_norm" : "");
        std::vector<std::unique_ptr<kt::DenseStack>> st;
        const int64_t outs[3] = {qs, kvs, kvs};
        for (int i = 0; i < 3; ++i)
          st.push_back(std::make_unique<kt::DenseStack>(S, R, H, outs[i],
                                                        std::vector<int64_t>{R, R / 2, 0, R}, scales,
                                                        DType::kBF16, static_cast<uint32_t>(60 + i)));
        Arena ar(backend(kBf16Mode));
        const std::vector<int32_t> slots = {0, -1, 1, 2, 3};
        const int64_t ld_tmp = 3 * R;
        std::vector<float> tmp = kt::random_vec(static_cast<size_t>(m * ld_tmp), 61);
        std::vector<float> q = kt::random_vec(static_cast<size_t>(m * qs), 62),
                           kk = kt::random_vec(static_cast<size_t>(m * kvs), 63),
                           v = kt::random_vec(static_cast<size_t>(m * kvs), 64);
        std::vector<int32_t> pos = {3, 8, 13, 18, 23};
        std::vector<int64_t> slot_map = {0, 7, -1, 21, 30};
        std::vector<float> inv_freq(static_cast<size_t>(D / 2)), qn = kt::random_vec(D, 65, 0.5f, 1.5f),
                                                                 kn = kt::random_vec(D, 66, 0.5f, 1.5f);
        for (int64_t i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
        const size_t cache_n = static_cast<size_t>(blocks * bs * kvs);
        const int32_t* dslots = ar.up(slots);
        const float* dtmp = ar.up(tmp);
        std::vector<k::LoraStack> dw;
        for (int i = 0; i < 3; ++i) dw.push_back(up_dense_stack(ar, *st[i]));
        // [plain without LoRA, plain, registers, registers with a CTA per token looping over its heads][q, k,
        // v]
        std::vector<float> got[4][3];
        for (int variant = 0; variant < 4; ++variant) {
          k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
          t.rope_lora_b_regs = variant >= 2 ? 1 : 0;
          t.rope_kv_write_loop_min_rows = variant == 3 ? 1 : 0;
          k::override_kernel_tuning(t);
          float* dq = ar.up(q);
          float* dck = ar.up(std::vector<float>(cache_n, 0.0f));
          float* dcv = ar.up(std::vector<float>(cache_n, 0.0f));
          k::RopeKvWriteArgs da{.q = dq,
                                .ldq = qs,
                                .k = ar.up(kk),
                                .ldk = kvs,
                                .v = ar.up(v),
                                .ldv = kvs,
                                .m = m,
                                .num_heads = heads,
                                .num_kv_heads = kv_heads,
                                .head_dim = D,
                                .positions = ar.up(pos),
                                .inv_freq = ar.up(inv_freq),
                                .q_norm = qk_norm ? ar.up(qn) : nullptr,
                                .k_norm = qk_norm ? ar.up(kn) : nullptr,
                                .slot_mapping = ar.up(slot_map),
                                .cache = {dck, dcv, blocks, bs, kv_heads, D}};
          if (variant > 0) {
            for (int i = 0; i < 3; ++i) {
              k::LoraExpandIn l;
              l.token_slots = dslots;
              l.tmp = dtmp;
              l.ld_tmp = ld_tmp;
              l.first = i * R;
              l.w = dw[i];
              (i == 0 ? da.lora_q : i == 1 ? da.lora_k : da.lora_v) = l;
            }
          }
          ar.be().rope_kv_write(da);
          got[variant][0] = ar.down(dq, q.size());
          got[variant][1] = ar.down(dck, cache_n);
          got[variant][2] = ar.down(dcv, cache_n);
          k::override_kernel_tuning(std::nullopt);
        }
        for (int o = 0; o < 3; ++o) {
          EXPECT_EQ(got[2][o], got[1][o]) << what << " output " << o;
          EXPECT_EQ(got[3][o], got[1][o]) << what << " output " << o << " (a CTA per token)";
          float diff = 0.0f;
          for (size_t i = 0; i < got[1][o].size(); ++i)
            diff = std::max(diff, std::fabs(got[1][o][i] - got[0][o][i]));
          EXPECT_GT(diff, 0.01f) << what << " output " << o << ": the LoRA term changes nothing";
        }
      }
}

// The dense LoRA expand applied by the ops consuming the projections (lora.h LoraExpandIn): rope_kv_write
// adds the q/k/v terms before its norms, rotation and cache write, add_rms_norm the o_proj term with the
// residual add; against the references given the same tmp (ref::lora_shrink). Tokens of every slot kind (no
// adapter, a slot whose module has no LoRA, padding slots in the cache mapping), with and without q/k norms,
// and each term moving the result by far more than the tolerance.
TEST(GpuLoraStack, DenseExpandInRopeKvWriteAndAddRmsNorm) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 8, R = 16, H = 96, heads = 4, kv_heads = 2, D = 16, qs = heads * D, kvs = kv_heads * D;
  const std::vector<float> scales = {0.5f, 1.0f, -0.75f, 2.0f, 0.25f, 1.5f, -1.0f, 0.8f};
  const std::vector<std::vector<int64_t>> ranks = {{16, 3, 0, 16, 9, 16, 1, 16},
                                                   {5, 16, 4, 2, 16, 0, 4, 16},
                                                   {16, 7, 0, 16, 6, 16, 2, 1},
                                                   {8, 16, 0, 1, 16, 3, 16, 9}};
  const int64_t outs[4] = {qs, kvs, kvs, H};
  std::vector<std::unique_ptr<kt::DenseStack>> st;
  for (int i = 0; i < 4; ++i)
    st.push_back(std::make_unique<kt::DenseStack>(S, R, i < 3 ? H : qs, outs[i], ranks[i], scales,
                                                  DType::kBF16, static_cast<uint32_t>(30 + i), 0.3f, 0.4f));
  for (int64_t m : {1, 3, 8, 37}) {
    for (bool qk_norm : {false, true}) {
      Arena ar(backend(kBf16Mode));
      std::vector<int32_t> slots = kt::slot_pattern(m, {0, -1, 1, 2, 4, 5, 6, 7, 3}, 1);
      const int64_t ld_tmp = 3 * R + 2, ld_tmp_o = R + 1;
      // tmp from the reference shrinks of x (q/k/v, input H) and attn (o, input qs).
      std::vector<float> x = kt::random_vec(static_cast<size_t>(m * H), 41),
                         attn = kt::random_vec(static_cast<size_t>(m * qs), 42);
      k::LoraBatchArgs g;
      g.x = x.data();
      g.ldx = H;
      g.m = m;
      g.token_slots = slots.data();
      g.num = 3;
      for (int i = 0; i < 3; ++i) g.w[i] = st[i]->stack();
      std::vector<float> tmp(static_cast<size_t>(m * ld_tmp), 0.0f),
          tmp_o(static_cast<size_t>(m * ld_tmp_o), 0.0f);
      k::ref::lora_shrink(g, tmp.data(), ld_tmp);
      k::LoraBatchArgs go = g;
      go.x = attn.data();
      go.ldx = qs;
      go.num = 1;
      go.w[0] = st[3]->stack();
      k::ref::lora_shrink(go, tmp_o.data(), ld_tmp_o);
      auto expand = [&](int i, const int32_t* ts, const float* t, int64_t ld, int64_t first) {
        k::LoraExpandIn l;
        l.token_slots = ts;
        l.tmp = t;
        l.ld_tmp = ld;
        l.first = first;
        l.w = st[i]->stack();
        return l;
      };
      // Device copies of the stacks (b and scale are what the expand reads).
      std::vector<k::LoraStack> dw;
      for (int i = 0; i < 4; ++i) dw.push_back(up_dense_stack(ar, *st[i]));
      const int32_t* dslots = ar.up(slots);
      const float* dtmp = ar.up(tmp);
      const float* dtmp_o = ar.up(tmp_o);
      auto dexpand = [&](int i, const float* t, int64_t ld, int64_t first) {
        k::LoraExpandIn l = expand(i, dslots, t, ld, first);
        l.w = dw[i];
        return l;
      };
      const std::string what = "m=" + std::to_string(m) + (qk_norm ? " qk_norm" : "");
      // rope_kv_write: q [m, qs], k/v [m, kvs], cache of 4 blocks of 16; token 2 is padding (slot −1).
      {
        const int64_t blocks = 4, bs = 16;
        std::vector<float> q = kt::random_vec(static_cast<size_t>(m * qs), 43),
                           kk = kt::random_vec(static_cast<size_t>(m * kvs), 44),
                           v = kt::random_vec(static_cast<size_t>(m * kvs), 45);
        std::vector<int32_t> pos(static_cast<size_t>(m));
        std::vector<int64_t> slot_map(static_cast<size_t>(m));
        for (int64_t t = 0; t < m; ++t) {
          pos[t] = static_cast<int32_t>(3 + 5 * t);
          slot_map[t] = t == 2 ? -1 : (t * 7) % (blocks * bs);
        }
        std::vector<float> inv_freq(static_cast<size_t>(D / 2)), qn = kt::random_vec(D, 46, 0.5f, 1.5f),
                                                                 kn = kt::random_vec(D, 47, 0.5f, 1.5f);
        for (int64_t i = 0; i < D / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / D);
        const size_t cache_n = static_cast<size_t>(blocks * bs * kvs);
        std::vector<float> ck(cache_n, 0.0f), cv(cache_n, 0.0f), q_ref = q, ck_plain = ck, cv_plain = cv,
                                                                 q_plain = q;
        k::RopeKvWriteArgs ra{.q = q_ref.data(),
                              .ldq = qs,
                              .k = kk.data(),
                              .ldk = kvs,
                              .v = v.data(),
                              .ldv = kvs,
                              .m = m,
                              .num_heads = heads,
                              .num_kv_heads = kv_heads,
                              .head_dim = D,
                              .positions = pos.data(),
                              .inv_freq = inv_freq.data(),
                              .q_norm = qk_norm ? qn.data() : nullptr,
                              .k_norm = qk_norm ? kn.data() : nullptr,
                              .slot_mapping = slot_map.data(),
                              .cache = {ck.data(), cv.data(), blocks, bs, kv_heads, D}};
        k::RopeKvWriteArgs plain = ra;  // without LoRA: each term must matter
        plain.q = q_plain.data();
        plain.cache = {ck_plain.data(), cv_plain.data(), blocks, bs, kv_heads, D};
        k::ref::rope_kv_write(plain);
        ra.lora_q = expand(0, slots.data(), tmp.data(), ld_tmp, 0);
        ra.lora_k = expand(1, slots.data(), tmp.data(), ld_tmp, R);
        ra.lora_v = expand(2, slots.data(), tmp.data(), ld_tmp, 2 * R);
        k::ref::rope_kv_write(ra);
        k::RopeKvWriteArgs da = ra;
        float* dq = ar.up(q);
        float* dck = ar.up(std::vector<float>(cache_n, 0.0f));
        float* dcv = ar.up(std::vector<float>(cache_n, 0.0f));
        da.q = dq;
        da.k = ar.up(kk);
        da.v = ar.up(v);
        da.positions = ar.up(pos);
        da.inv_freq = ar.up(inv_freq);
        da.q_norm = qk_norm ? ar.up(qn) : nullptr;
        da.k_norm = qk_norm ? ar.up(kn) : nullptr;
        da.slot_mapping = ar.up(slot_map);
        da.cache = {dck, dcv, blocks, bs, kv_heads, D};
        da.lora_q = dexpand(0, dtmp, ld_tmp, 0);
        da.lora_k = dexpand(1, dtmp, ld_tmp, R);
        da.lora_v = dexpand(2, dtmp, ld_tmp, 2 * R);
        ar.be().rope_kv_write(da);
        kt::expect_close(ar.down(dq, q.size()), q_ref, 1e-5f, 1e-4f, "rope_kv_write q " + what);
        kt::expect_close(ar.down(dck, cache_n), ck, 1e-5f, 1e-4f, "rope_kv_write cache k " + what);
        kt::expect_close(ar.down(dcv, cache_n), cv, 1e-5f, 1e-4f, "rope_kv_write cache v " + what);
        float dq_max = 0, dk_max = 0, dv_max = 0;
        for (size_t i = 0; i < q.size(); ++i) dq_max = std::max(dq_max, std::fabs(q_ref[i] - q_plain[i]));
        for (size_t i = 0; i < cache_n; ++i) {
          dk_max = std::max(dk_max, std::fabs(ck[i] - ck_plain[i]));
          dv_max = std::max(dv_max, std::fabs(cv[i] - cv_plain[i]));
        }
        EXPECT_GT(std::min({dq_max, dk_max, dv_max}), 0.05f)
            << "rope_kv_write " << what << ": a LoRA term too small to test";
      }
      // add_rms_norm: x [m, H] += delta + the o term; y = rms_norm(x); one CTA per row and (tuning
      // add_norm_lora_cluster_rows) a cluster of CTAs per row.
      for (int64_t cluster_rows : {0, 64}) {
        const std::string what_norm = what + (cluster_rows > 0 ? ", cluster per row" : ", one CTA per row");
        k::KernelTuning tune = k::kernel_tuning(k::TuningShape{});
        tune.add_norm_lora_cluster_rows = cluster_rows;
        k::override_kernel_tuning(tune);
        std::vector<float> xr = kt::random_vec(static_cast<size_t>(m * H), 48),
                           delta = kt::random_vec(static_cast<size_t>(m * H), 49),
                           w = kt::random_vec(static_cast<size_t>(H), 50, 0.5f, 1.5f);
        std::vector<float> x_ref = xr, y_ref(static_cast<size_t>(m * H)), x_plain = xr, y_plain(y_ref.size());
        k::AddRmsNormArgs na{.x = x_plain.data(),
                             .ldx = H,
                             .delta = delta.data(),
                             .ld_delta = H,
                             .y = y_plain.data(),
                             .ldy = H,
                             .m = m,
                             .n = H,
                             .w = w.data(),
                             .eps = 1e-6f};
        k::ref::add_rms_norm(na);
        na.x = x_ref.data();
        na.y = y_ref.data();
        na.lora_delta = expand(3, slots.data(), tmp_o.data(), ld_tmp_o, 0);
        k::ref::add_rms_norm(na);
        float* dx = ar.up(xr);
        float* dy = ar.up(std::vector<float>(y_ref.size(), 0.0f));
        k::AddRmsNormArgs dn = na;
        dn.x = dx;
        dn.delta = ar.up(delta);
        dn.y = dy;
        dn.w = ar.up(w);
        dn.lora_delta = dexpand(3, dtmp_o, ld_tmp_o, 0);
        ar.be().add_rms_norm(dn);
        k::override_kernel_tuning(std::nullopt);
        kt::expect_close(ar.down(dx, xr.size()), x_ref, 1e-5f, 1e-4f, "add_rms_norm x " + what_norm);
        kt::expect_close(ar.down(dy, y_ref.size()), y_ref, 1e-5f, 1e-4f, "add_rms_norm y " + what_norm);
        float dmax = 0;
        for (size_t i = 0; i < x_ref.size(); ++i) dmax = std::max(dmax, std::fabs(x_ref[i] - x_plain[i]));
        EXPECT_GT(dmax, 0.05f) << "add_rms_norm " << what_norm << ": the LoRA term too small to test";
      }
    }
  }
}

// add_rms_norm with the o_proj LoRA term at model sizes: the one-CTA kernel and the cluster kernel
// (add_norm_lora_cluster_rows; rows of more than kWarpRowMax elements run by 512 threads) agree bit for bit,
// and rows without an adapter (slot -1) come out bit-identical to add_rms_norm without LoRA (a base-model
// request's output must not depend on the adapters in its batch: GraphGpuTest.ReplayWithAdaptersEqualsEager
// found the cluster kernel's first form summing the squares in another order). Rows of 2,880 (GPT-OSS,
// float4), 2,050 (scalar), 1,500 (384 threads: no cluster) and 600 elements (one warp per row).
TEST(GpuLoraStack, AddRmsNormLoraBaseRowsBitIdentical) {
  SKIP_WITHOUT_GPU();
  const int64_t S = 4, R = 16, in = 64;
  const std::vector<float> scales = {0.5f, 1.0f, -0.75f, 2.0f};
  for (int64_t H : {2880, 2050, 1500, 600}) {
    kt::DenseStack st(S, R, in, H, {16, 3, 16, 9}, scales, DType::kBF16, 77, 0.3f, 0.4f);
    for (int64_t m : {1, 3, 8}) {
      const std::string what = "H=" + std::to_string(H) + " m=" + std::to_string(m);
      Arena ar(backend(kBf16Mode));
      std::vector<int32_t> slots(static_cast<size_t>(m));
      for (int64_t t = 0; t < m; ++t) slots[t] = t % 3 == 0 ? -1 : static_cast<int32_t>(t % S);
      const int64_t ld_tmp = R + 1;
      const std::vector<float> tmp = kt::random_vec(static_cast<size_t>(m * ld_tmp), 51),
                               x0 = kt::random_vec(static_cast<size_t>(m * H), 52),
                               delta = kt::random_vec(static_cast<size_t>(m * H), 53),
                               w = kt::random_vec(static_cast<size_t>(H), 54, 0.5f, 1.5f);
      k::LoraExpandIn l;
      l.tmp = tmp.data();
      l.ld_tmp = ld_tmp;
      l.token_slots = slots.data();
      l.w = st.stack();
      std::vector<float> x_ref = x0, y_ref(x0.size());
      k::ref::add_rms_norm({.x = x_ref.data(),
                            .ldx = H,
                            .delta = delta.data(),
                            .ld_delta = H,
                            .y = y_ref.data(),
                            .ldy = H,
                            .m = m,
                            .n = H,
                            .w = w.data(),
                            .eps = 1e-6f,
                            .lora_delta = l});
      k::LoraExpandIn dl = l;
      dl.tmp = ar.up(tmp);
      dl.token_slots = ar.up(slots);
      dl.w.a = up_stack(ar, st.a);
      dl.w.b = up_stack(ar, st.b);
      dl.w.scale = ar.up(st.scale);
      const float* ddelta = ar.up(delta);
      const float* dw = ar.up(w);
      // Runs add_rms_norm on the device (with or without the term); x and y back.
      auto run = [&](bool lora) {
        float* dx = ar.up(x0);
        float* dy = ar.up(std::vector<float>(x0.size(), 0.0f));
        k::AddRmsNormArgs a{.x = dx,
                            .ldx = H,
                            .delta = ddelta,
                            .ld_delta = H,
                            .y = dy,
                            .ldy = H,
                            .m = m,
                            .n = H,
                            .w = dw,
                            .eps = 1e-6f};
        if (lora) a.lora_delta = dl;
        ar.be().add_rms_norm(a);
        return std::make_pair(ar.down(dx, x0.size()), ar.down(dy, x0.size()));
      };
      const auto plain = run(false);
      std::vector<std::pair<std::vector<float>, std::vector<float>>> with;
      for (int64_t cluster_rows : {0, 64}) {
        k::KernelTuning tune = k::kernel_tuning(k::TuningShape{});
        tune.add_norm_lora_cluster_rows = cluster_rows;
        k::override_kernel_tuning(tune);
        with.push_back(run(true));
        k::override_kernel_tuning(std::nullopt);
        const std::string wc = what + (cluster_rows > 0 ? " cluster" : " one CTA");
        kt::expect_close(with.back().first, x_ref, 1e-5f, 1e-4f, "add_rms_norm x " + wc);
        kt::expect_close(with.back().second, y_ref, 1e-5f, 1e-4f, "add_rms_norm y " + wc);
      }
      const size_t bytes = static_cast<size_t>(H) * sizeof(float);
      for (int64_t t = 0; t < m; ++t) {
        const size_t o = static_cast<size_t>(t * H);
        EXPECT_EQ(std::memcmp(&with[0].first[o], &with[1].first[o], bytes), 0)
            << what << " row " << t << " x: cluster vs one CTA";
        EXPECT_EQ(std::memcmp(&with[0].second[o], &with[1].second[o], bytes), 0)
            << what << " row " << t << " y: cluster vs one CTA";
        const auto& lw = with[1];
        if (slots[t] < 0) {
          EXPECT_EQ(std::memcmp(&lw.first[o], &plain.first[o], bytes), 0)
              << what << " row " << t << " (no adapter) x";
          EXPECT_EQ(std::memcmp(&lw.second[o], &plain.second[o], bytes), 0)
              << what << " row " << t << " (no adapter) y";
        } else {
          float dmax = 0;
          for (int64_t i = 0; i < H; ++i)
            dmax = std::max(dmax, std::fabs(lw.first[o + i] - plain.first[o + i]));
          EXPECT_GT(dmax, 0.05f) << what << " row " << t << ": the LoRA term too small to test";
        }
      }
    }
  }
}

// ------------------------------------------------- LoRA as extra K columns ----

// Backend::linear_lora_ext (kernels::LinearLoraExtArgs: one BF16 GEMM over [x | scaled shrink sums | 1 1]
// and [W | the slots' B | bias hi lo]) for q/k/v stacked (3 modules of 200, 64 and 33 outputs, k = 136;
// and the o shape, one module) and a group without its middle module (its tail columns then read zeros):
// (1) against ref::linear_lora_ext (the same rounded operands, f32 sums in another order): within
// 1e-3 · |ref| + 2e-2; (2) against what the model computed before, ref::linear (x unrounded) + bias +
// the old per-slot LoRA: within 1e-2 of the row's rms (bf16 inputs), with a LoRA term of at least 0.1 of
// the rms where a token has LoRA (a missing or misplaced term fails (2)). Tokens of slot −1, a slot
// without tokens, scale 0 on a module; m on the per-token shrink (40) and the tensor-core one (300).
void run_ext(int64_t m, int num, bool skip_middle) {
  Arena ar(backend());
  const kt::ExtCase c(m, num, skip_middle);
  std::vector<float> sem(static_cast<size_t>(m * c.n));
  k::ref::linear_lora_ext(c.args(sem.data()));
  // The device run.
  k::LinearLoraExtArgs d = c.args(nullptr);
  d.x = ar.up(c.x);
  d.w.data = ar.up(c.wext);
  d.shrink.x = d.x;
  d.shrink.token_slots = ar.up(c.slots);
  for (int j = 0; j < d.shrink.num; ++j) d.shrink.w[j] = up_dense_stack(ar, *c.stacks[c.group[j]]);
  float* dy = ar.up(std::vector<float>(sem.size(), std::nanf("")));
  d.y = dy;
  ar.be().linear_lora_ext(d);
  const std::vector<float> got = ar.down(dy, sem.size());
  const std::string what =
      "linear_lora_ext m=" + std::to_string(m) + " modules=" + std::to_string(c.group.size());
  // A shrink sum summed in another order may round to the neighbouring bf16 (a change of ~2^-8 of a tail
  // value, times B): hence 2e-2 absolute.
  kt::expect_close(got, sem, 2e-2f, 1e-3f, what + " vs ref::linear_lora_ext");
  int64_t with_lora = 0;
  const auto rows = c.row_errors(got);
  for (int64_t t = 0; t < m; ++t) {
    ASSERT_LE(rows[t].err, 1e-2) << what << " token " << t << " (slot " << c.slots[t] << ") vs the f32 path";
    if (rows[t].effect > 0.1) ++with_lora;
  }
  EXPECT_GT(with_lora, m / 2) << what << ": LoRA terms too small to test";
}

TEST(GpuLoraStack, LinearLoraExtEqualsProductBiasAndLora) {
  SKIP_WITHOUT_GPU();
  for (int64_t m : {40, 300}) {
    run_ext(m, 3, false);
    run_ext(m, 3, true);
    run_ext(m, 1, false);
  }
}

}  // namespace
}  // namespace polylora::gpu_test
