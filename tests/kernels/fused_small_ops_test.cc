// tests/kernels/fused_small_ops_test.cc: the decode path's fused small ops on the CPU:
// cpu::add_rms_norm (residual add + RMSNorm) and cpu::rope_kv_write (q/k norm + RoPE + KV-cache write),
// each against the CPU op sequence it replaces and against its reference, on the SIMD and scalar paths.
// Tolerances: against the replaced CPU sequence, bit-identical (memcmp: the fused ops use the same row
// kernels in the same order, which is what keeps the CPU golden tests unchanged); the residual stream x
// and the cached v exactly equal to x + delta and v (f32 adds and copies); against the references
// atol 1e-6 + rtol 1e-5 (the AVX2 sums of squares and the FMA rotation round differently from the
// reference's plain loops, as in elementwise_test.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/attention/attention.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"
#include "rope_kv_test_util.h"

namespace polylora::kernels {
namespace {

using test::expect_bitwise;
using test::expect_cache_layout;
using test::RopeKvCase;
using test::RopeKvData;

TEST(AddRmsNormCpu, SameBitsAsAddThenNormAndCloseToReference) {
  for (int64_t m : {1, 7, 300}) {
    for (int64_t n : {1, 3, 17, 128, 1025, 2880}) {
      // Different odd strides for the three tensors, so a mixed-up stride shows.
      const int64_t ldx = n + 2, ldd = n + 3, ldy = n + 1;
      const std::vector<float> x0 = test::random_vec(static_cast<size_t>(m * ldx), 1, -3.0f, 3.0f);
      const std::vector<float> delta = test::random_vec(static_cast<size_t>(m * ldd), 2, -3.0f, 3.0f);
      const std::vector<float> w = test::random_vec(static_cast<size_t>(n), 3, 0.5f, 1.5f);
      const std::vector<float> y0(static_cast<size_t>(m * ldy), 7.0f);  // padding must stay 7
      const std::string what = "m=" + std::to_string(m) + " n=" + std::to_string(n);

      // x + delta, independently of every kernel (padding columns untouched).
      std::vector<float> x_sum = x0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) x_sum[i * ldx + j] = x0[i * ldx + j] + delta[i * ldd + j];

      std::vector<float> x_ref = x0, y_ref = y0;
      ref::add_rms_norm({.x = x_ref.data(),
                         .ldx = ldx,
                         .delta = delta.data(),
                         .ld_delta = ldd,
                         .y = y_ref.data(),
                         .ldy = ldy,
                         .m = m,
                         .n = n,
                         .w = w.data(),
                         .eps = 1e-5f});
      expect_bitwise(x_ref, x_sum, "ref x " + what);

      test::for_each_isa([&](const char* isa) {
        const std::string tag = std::string(isa) + " " + what;
        // The replaced sequence: the backend's add_inplace loop, then cpu::rms_norm.
        std::vector<float> x_two = x0, y_two = y0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) x_two[i * ldx + j] += delta[i * ldd + j];
        cpu::rms_norm({.x = x_two.data(),
                       .ldx = ldx,
                       .y = y_two.data(),
                       .ldy = ldy,
                       .m = m,
                       .n = n,
                       .w = w.data(),
                       .eps = 1e-5f});

        std::vector<float> x = x0, y = y0;
        cpu::add_rms_norm({.x = x.data(),
                           .ldx = ldx,
                           .delta = delta.data(),
                           .ld_delta = ldd,
                           .y = y.data(),
                           .ldy = ldy,
                           .m = m,
                           .n = n,
                           .w = w.data(),
                           .eps = 1e-5f});
        expect_bitwise(x, x_sum, "x " + tag);
        expect_bitwise(y, y_two, "y vs add + rms_norm " + tag);
        test::expect_close(y, y_ref, 1e-6f, 1e-5f, "y vs ref " + tag);

        // y may be delta itself (the decoder's h and tmp are distinct, but the contract allows it).
        std::vector<float> xa = x0;
        std::vector<float> da(static_cast<size_t>(m * ldy), 7.0f);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) da[i * ldy + j] = delta[i * ldd + j];
        cpu::add_rms_norm({.x = xa.data(),
                           .ldx = ldx,
                           .delta = da.data(),
                           .ld_delta = ldy,
                           .y = da.data(),
                           .ldy = ldy,
                           .m = m,
                           .n = n,
                           .w = w.data(),
                           .eps = 1e-5f});
        expect_bitwise(xa, x_sum, "x (y aliases delta) " + tag);
        expect_bitwise(da, y_two, "y aliasing delta " + tag);
      });
    }
  }
}

TEST(RopeKvWriteCpu, SameBitsAsNormRopeWriteAndCloseToReference) {
  std::vector<RopeKvCase> cases;
  for (int64_t m : {1, 5, 77})
    for (auto [h, kvh] : {std::pair<int64_t, int64_t>{1, 1}, {3, 1}, {8, 2}, {6, 3}})
      for (int64_t d : {2, 6, 7, 64, 128})
        for (bool norm : {false, true}) cases.push_back({m, h, kvh, d, norm, norm ? 1.0f : 1.25f});
  for (const RopeKvCase& c : cases) {
    const RopeKvData d(c);
    const int64_t D = c.head_dim;

    std::vector<float> q_ref = d.q, ck_ref = d.cache_k, cv_ref = d.cache_v;
    ref::rope_kv_write(d.args(c, q_ref.data(), ck_ref.data(), cv_ref.data()));
    expect_cache_layout(c, d, ck_ref, cv_ref, "ref " + c.name());

    test::for_each_isa([&](const char* isa) {
      const std::string tag = std::string(isa) + " " + c.name();
      // The replaced sequence of CPU kernels, as the decoder ran it: per-head norms in place on q and on a
      // copy of k, rope on both, write_kv.
      std::vector<float> q2 = d.q, k2 = d.k, ck2 = d.cache_k, cv2 = d.cache_v;
      if (c.qk_norm) {
        for (int64_t t = 0; t < c.m; ++t) {
          cpu::rms_norm({.x = q2.data() + t * d.ldq,
                         .ldx = D,
                         .y = q2.data() + t * d.ldq,
                         .ldy = D,
                         .m = c.num_heads,
                         .n = D,
                         .w = d.q_norm.data(),
                         .eps = 1e-6f});
          cpu::rms_norm({.x = k2.data() + t * d.ldk,
                         .ldx = D,
                         .y = k2.data() + t * d.ldk,
                         .ldy = D,
                         .m = c.num_kv_heads,
                         .n = D,
                         .w = d.k_norm.data(),
                         .eps = 1e-6f});
        }
      }
      cpu::rope({.x = q2.data(),
                 .ldx = d.ldq,
                 .m = c.m,
                 .num_heads = c.num_heads,
                 .head_dim = D,
                 .positions = d.pos.data(),
                 .inv_freq = d.inv_freq.data(),
                 .attention_scaling = c.scaling});
      cpu::rope({.x = k2.data(),
                 .ldx = d.ldk,
                 .m = c.m,
                 .num_heads = c.num_kv_heads,
                 .head_dim = D,
                 .positions = d.pos.data(),
                 .inv_freq = d.inv_freq.data(),
                 .attention_scaling = c.scaling});
      RopeKvWriteArgs two = d.args(c, q2.data(), ck2.data(), cv2.data());
      cpu::write_kv({.k = k2.data(),
                     .ldk = d.ldk,
                     .v = d.v.data(),
                     .ldv = d.ldv,
                     .m = c.m,
                     .slot_mapping = d.slots.data(),
                     .cache = two.cache});

      std::vector<float> q = d.q, ck = d.cache_k, cv = d.cache_v;
      cpu::rope_kv_write(d.args(c, q.data(), ck.data(), cv.data()));
      expect_bitwise(q, q2, "q vs the op sequence " + tag);
      expect_bitwise(ck, ck2, "cache k vs the op sequence " + tag);
      expect_bitwise(cv, cv2, "cache v vs the op sequence " + tag);
      test::expect_close(q, q_ref, 1e-6f, 1e-5f, "q vs ref " + tag);
      test::expect_close(ck, ck_ref, 1e-6f, 1e-5f, "cache k vs ref " + tag);
      expect_cache_layout(c, d, ck, cv, tag);
    });
  }
}

// Values worked out by hand: head_dim 2 (one pair), inv_freq 1, position 1 rotates by 1 radian; position 0
// leaves a vector as it is. Catches a sign flip, a swapped pair, v rotated or k stored unrotated.
TEST(RopeKvWriteCpu, KnownRotation) {
  std::vector<float> q = {1.0f, 0.0f, 1.0f, 0.0f};  // tokens 0 and 1, one head each
  const std::vector<float> k = {0.0f, 1.0f, 0.0f, 1.0f}, v = {3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<int32_t> pos = {0, 1};
  const std::vector<int64_t> slots = {5, 2};
  const std::vector<float> inv = {1.0f};
  std::vector<float> ck(16, -9.0f), cv(16, -9.0f);  // 2 blocks of 4 slots, one head of 2
  cpu::rope_kv_write({.q = q.data(),
                      .ldq = 2,
                      .k = k.data(),
                      .ldk = 2,
                      .v = v.data(),
                      .ldv = 2,
                      .m = 2,
                      .num_heads = 1,
                      .num_kv_heads = 1,
                      .head_dim = 2,
                      .positions = pos.data(),
                      .inv_freq = inv.data(),
                      .attention_scaling = 2.0f,
                      .slot_mapping = slots.data(),
                      .cache = {.k = ck.data(),
                                .v = cv.data(),
                                .num_blocks = 2,
                                .block_size = 4,
                                .num_kv_heads = 1,
                                .head_dim = 2}});
  const float c1 = 2.0f * static_cast<float>(std::cos(1.0)), s1 = 2.0f * static_cast<float>(std::sin(1.0));
  EXPECT_FLOAT_EQ(q[0], 2.0f);  // position 0: only the scaling
  EXPECT_FLOAT_EQ(q[1], 0.0f);
  EXPECT_FLOAT_EQ(q[2], c1);  // (1, 0) -> (cos, sin)
  EXPECT_FLOAT_EQ(q[3], s1);
  EXPECT_FLOAT_EQ(ck[10], 0.0f);  // token 0 at slot 5: (0, 1) · 2
  EXPECT_FLOAT_EQ(ck[11], 2.0f);
  EXPECT_FLOAT_EQ(ck[4], -s1);  // token 1 at slot 2: (0, 1) -> (−sin, cos)
  EXPECT_FLOAT_EQ(ck[5], c1);
  EXPECT_EQ(cv[10], 3.0f);
  EXPECT_EQ(cv[11], 4.0f);
  EXPECT_EQ(cv[4], 5.0f);
  EXPECT_EQ(cv[5], 6.0f);
  for (int s : {0, 1, 3, 4, 6, 7}) {
    EXPECT_EQ(ck[2 * s], -9.0f) << "slot " << s;
    EXPECT_EQ(cv[2 * s + 1], -9.0f) << "slot " << s;
  }
}

}  // namespace
}  // namespace polylora::kernels
