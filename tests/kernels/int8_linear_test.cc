// tests/kernels/int8_linear_test.cc: INT8 weight-only matrices (--quantization int8, common/int8.h): the
// quantization rule on hand-checked rows; the CPU fast path of y = x·Wᵀ + b (AVX2 codes widened in
// registers and the scalar fallback for few rows, sgemm panels of dequantized rows for many) against the
// reference (WeightView::row_to_f32) over awkward shapes (batch 1 to many rows, K = 1 and K not a multiple
// of 8 or 32, output counts off the row tiles); cpu::moe_experts over INT8 experts (fused gate_up and
// separate gate/up, one expert with every token, experts with none, one token) against ref::moe_experts.
// Tolerances: linear 1e-6 + 1e-6·Σ|x·w| (the same values summed in another order, the scale applied after
// the sum instead of per element); experts atol 1e-4 + rtol 1e-3 as tests/kernels/moe_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/int8.h"
#include "kernel_test_util.h"
#include "kernels/cpu_simd.h"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe.h"

namespace polylora::kernels {
namespace {

struct Int8Matrix {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  int64_t rows = 0, cols = 0;
  WeightView view() const {
    WeightView w{codes.data(), DType::kI8, rows, cols};
    w.row_scales = scales.data();
    return w;
  }
};

Int8Matrix quantize(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Int8Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(static_cast<size_t>(rows * cols));
  q.scales.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    q.scales[r] = int8_quantize_row(w.data() + r * cols, cols, q.codes.data() + r * cols);
  return q;
}

TEST(Int8Format, QuantizationRule) {
  // Row 0: max |w| = 1.27, scale 0.01; 0.005 is a half step (rounds away from zero), -2 clamps nothing
  // (it is not in this row). Row 1: all zero (scale 0, codes 0). Row 2: one value (its code ±127).
  std::vector<float> w = {0.5f, -1.27f, 0.0f, 1.27f, 0.015f, -0.6349f, 0.0f, 0.0f, 0.0f,
                          0.0f, 0.0f,   0.0f, 0.0f,  0.0f,   -3.5f,    0.0f, 0.0f, 0.0f};
  Int8Matrix q = quantize(w, 3, 6);
  EXPECT_FLOAT_EQ(q.scales[0], 1.27f / 127.0f);
  EXPECT_EQ(q.codes[0], 50);
  EXPECT_EQ(q.codes[1], -127);
  EXPECT_EQ(q.codes[2], 0);
  EXPECT_EQ(q.codes[3], 127);
  EXPECT_EQ(q.codes[4], static_cast<int8_t>(std::round(0.015f / q.scales[0])));  // 1.5 -> 2
  EXPECT_EQ(q.codes[4], 2);
  EXPECT_EQ(q.codes[5], -63);  // -63.49 -> -63
  EXPECT_EQ(q.scales[1], 0.0f);
  for (int c = 0; c < 6; ++c) EXPECT_EQ(q.codes[6 + c], 0);
  EXPECT_FLOAT_EQ(q.scales[2], 3.5f / 127.0f);
  EXPECT_EQ(q.codes[14], -127);
  WeightView v = q.view();
  EXPECT_EQ(v.num_bytes(), 18u + 3u * sizeof(float));
  EXPECT_FLOAT_EQ(v.at(0, 0), 50 * q.scales[0]);
  EXPECT_EQ(v.at(1, 3), 0.0f);
  // Random rows: every code within [-127, 127], the row's largest magnitude at ±127, and each value within
  // half a step of its dequantized code.
  std::vector<float> r = test::random_vec(64 * 100, 3, -0.2f, 0.2f);
  Int8Matrix rq = quantize(r, 64, 100);
  for (int64_t i = 0; i < 64; ++i) {
    int maxcode = 0;
    for (int64_t c = 0; c < 100; ++c) {
      const int code = rq.codes[i * 100 + c];
      ASSERT_LE(std::abs(code), 127);
      maxcode = std::max(maxcode, std::abs(code));
      ASSERT_LE(std::fabs(r[i * 100 + c] - code * rq.scales[i]), 0.5f * rq.scales[i] * (1 + 1e-5f));
    }
    EXPECT_EQ(maxcode, 127) << "row " << i;
  }
}

class Int8Linear : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { simd::force_scalar_for_testing(GetParam()); }
  void TearDown() override { simd::force_scalar_for_testing(false); }
};

TEST_P(Int8Linear, MatchesReferenceOverAwkwardShapes) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s :
       {Shape{1, 1, 1}, Shape{1, 7, 33}, Shape{2, 13, 96}, Shape{3, 33, 7}, Shape{4, 64, 288},
        Shape{5, 17, 100}, Shape{8, 9, 31}, Shape{9, 40, 160}, Shape{33, 70, 45}, Shape{64, 130, 256}}) {
    std::vector<float> wf = test::random_vec(static_cast<size_t>(s.n * s.k),
                                             static_cast<uint32_t>(s.m * 1000 + s.n), -0.3f, 0.3f);
    Int8Matrix w = quantize(wf, s.n, s.k);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t ldx = s.k + 3, ldy = s.n + 5;
    std::vector<float> x(static_cast<size_t>(s.m * ldx)), bias(static_cast<size_t>(s.n));
    for (auto& v : x) v = u(rng);
    for (auto& v : bias) v = u(rng);
    std::vector<float> ref(static_cast<size_t>(s.m * ldy), -7), got(ref);
    LinearArgs a{
        .x = x.data(), .m = s.m, .ldx = ldx, .w = w.view(), .bias = bias.data(), .y = ref.data(), .ldy = ldy};
    ref::linear(a);
    a.y = got.data();
    cpu::linear(a);
    std::vector<float> row(static_cast<size_t>(s.k));
    double max_quant_err = 0;
    for (int64_t j = 0; j < s.n; ++j) {
      a.w.row_to_f32(j, row.data());
      for (int64_t i = 0; i < s.m; ++i) {
        double mag = std::fabs(bias[j]), exact = bias[j];  // Σ|x·w|: the scale of any order's rounding
        for (int64_t c = 0; c < s.k; ++c) {
          mag += std::fabs(double(x[i * ldx + c]) * row[c]);
          exact += double(x[i * ldx + c]) * wf[j * s.k + c];
        }
        const float r = ref[i * ldy + j];
        ASSERT_NEAR(got[i * ldy + j], r, 1e-6 + 1e-6 * mag)
            << s.m << "x" << s.n << "x" << s.k << " at " << i << "," << j;
        max_quant_err = std::max(max_quant_err, std::fabs(r - exact));
      }
    }
    for (int64_t c = s.n; c < ldy; ++c) EXPECT_EQ(got[c], -7) << "y's padding written";
    // The quantized product is close to the unquantized one (a step of 0.3/127 per weight, errors of random
    // sign): far below the values themselves.
    EXPECT_LT(max_quant_err, 0.02 * std::sqrt(static_cast<double>(s.k)) + 1e-6)
        << s.m << "x" << s.n << "x" << s.k;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Int8Linear, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "scalar" : "simd"; });

// INT8 experts through cpu::moe_experts and ref::moe_experts (both read the views' format).
void run_int8_moe(int64_t m, bool fused, bool every_token_to_expert_2, ExpertAct act) {
  const int64_t H = 72, I = 40, E = 5, K = 2;  // H, I not multiples of 32
  std::vector<Int8Matrix> mats;
  mats.reserve(static_cast<size_t>(3 * E));
  std::vector<ExpertView> experts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const auto seed = static_cast<uint32_t>(100 + 10 * e);
    if (fused) {
      mats.push_back(quantize(test::random_vec(static_cast<size_t>(2 * I * H), seed, -0.2f, 0.2f), 2 * I, H));
      experts[e].gate_up = mats.back().view();
    } else {
      mats.push_back(quantize(test::random_vec(static_cast<size_t>(I * H), seed + 1, -0.2f, 0.2f), I, H));
      experts[e].gate = mats.back().view();
      mats.push_back(quantize(test::random_vec(static_cast<size_t>(I * H), seed + 2, -0.2f, 0.2f), I, H));
      experts[e].up = mats.back().view();
    }
    mats.push_back(quantize(test::random_vec(static_cast<size_t>(H * I), seed + 3, -0.2f, 0.2f), H, I));
    experts[e].down = mats.back().view();
  }
  std::vector<float> x = test::random_vec(static_cast<size_t>(m * H), 9);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> weights(static_cast<size_t>(m * K));
  std::mt19937 rng(5);
  for (int64_t t = 0; t < m; ++t) {
    // Expert 0 never chosen; with every_token_to_expert_2 expert 2 is every token's first.
    int32_t first = every_token_to_expert_2 ? 2 : static_cast<int32_t>(1 + rng() % (E - 1));
    int32_t second = static_cast<int32_t>(1 + rng() % (E - 1));
    if (second == first) second = first == 4 ? 1 : first + 1;
    ids[t * K] = first;
    ids[t * K + 1] = second;
    weights[t * K] = 0.7f;
    weights[t * K + 1] = 0.3f;
  }
  std::vector<float> ref(static_cast<size_t>(m * H)), got(ref.size());
  MoeExpertsArgs a{.x = x.data(),
                   .ldx = H,
                   .m = m,
                   .hidden = H,
                   .inter = I,
                   .num_experts = E,
                   .top_k = K,
                   .ids = ids.data(),
                   .weights = weights.data(),
                   .experts = experts.data(),
                   .experts_int8 = true,
                   .act = act,
                   .out = ref.data(),
                   .ldo = H};
  ref::moe_experts(a);
  a.out = got.data();
  cpu::moe_experts(a);
  test::expect_close(got, ref, 1e-4f, 1e-3f,
                     "int8 moe m=" + std::to_string(m) + (fused ? " fused" : " gate/up") +
                         (every_token_to_expert_2 ? " all->2" : ""));
  float mx = 0;
  for (float v : ref) mx = std::max(mx, std::fabs(v));
  EXPECT_GT(mx, 1e-3f) << "the experts produced nothing";
}

TEST(Int8Moe, MatchesReference) {
  for (int64_t m : {1, 3, 40})
    for (bool fused : {true, false})
      for (bool all : {false, true})
        run_int8_moe(m, fused, all, fused ? ExpertAct::kGptOssSwiglu : ExpertAct::kSiluGate);
}

}  // namespace
}  // namespace polylora::kernels
