// tests/kernels/mxfp4_linear_test.cc: the CPU fast path of y = x·Wᵀ + b over MXFP4 weights (the AVX2 decode
// of 32-value blocks in registers, the scalar fallback, and the sgemm panels of decoded rows) against the
// reference (WeightView::row_to_f32, common/mxfp4.h), over awkward shapes: batch 1 to many rows, output
// counts that are not multiples of the row tiles, every code and extreme scales. Tolerance 1e-6 + 1e-6·Σ|x·w| (the reference sums in another order).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu_simd.h"
#include "kernels/linear/linear.h"

namespace polylora::kernels {
namespace {

struct Mxfp4Matrix {
  std::vector<uint8_t> codes, scales;
  WeightView view(int64_t rows, int64_t cols) const { return {codes.data(), DType::kU8, rows, cols, scales.data()}; }
};

Mxfp4Matrix random_mxfp4(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Mxfp4Matrix m;
  m.codes.resize(static_cast<size_t>(rows * cols / 2));
  m.scales.resize(static_cast<size_t>(rows * cols / 32));
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng());
  for (auto& s : m.scales) s = static_cast<uint8_t>(118 + rng() % 14);  // 2^-9 .. 2^4
  return m;
}

TEST(Mxfp4Decode, EveryCodeAndScaleAsHuggingFace) {
  // One row of 64 values: bytes 0..15 hold codes (2i, 2i+1) -> every pair of codes once in the first block.
  std::vector<uint8_t> codes(32), scales = {127, 0};
  for (int i = 0; i < 32; ++i) codes[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  scales[1] = 130;
  WeightView w{codes.data(), DType::kU8, 1, 64, scales.data()};
  static const float kTable[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 64; ++c) {
    const int byte = c / 2, code = c % 2 == 0 ? (byte % 16) : 15 - byte % 16;
    EXPECT_EQ(w.at(0, c), kTable[code] * (c < 32 ? 1.0f : 8.0f)) << c;
  }
  EXPECT_EQ(mxfp4_scale(0), std::ldexp(1.0f, -127));  // subnormal, as torch.ldexp
  EXPECT_TRUE(std::isinf(mxfp4_scale(255)));
  EXPECT_EQ(w.num_bytes(), 32u + 2u);
}

class Mxfp4Linear : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { simd::force_scalar_for_testing(GetParam()); }
  void TearDown() override { simd::force_scalar_for_testing(false); }
};

TEST_P(Mxfp4Linear, MatchesReferenceOverAwkwardShapes) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{1, 1, 32}, Shape{1, 7, 64}, Shape{2, 13, 96}, Shape{3, 33, 128}, Shape{4, 64, 2880 / 10},
                  Shape{5, 17, 256}, Shape{9, 40, 160}, Shape{33, 70, 192}}) {
    Mxfp4Matrix w = random_mxfp4(s.n, s.k, static_cast<uint32_t>(s.m * 1000 + s.n));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t ldx = s.k + 3, ldy = s.n + 5;
    std::vector<float> x(static_cast<size_t>(s.m * ldx)), bias(static_cast<size_t>(s.n));
    for (auto& v : x) v = u(rng);
    for (auto& v : bias) v = u(rng);
    std::vector<float> ref(static_cast<size_t>(s.m * ldy), -7), got(ref);
    LinearArgs a{.x = x.data(), .m = s.m, .ldx = ldx, .w = w.view(s.n, s.k), .bias = bias.data(), .y = ref.data(), .ldy = ldy};
    ref::linear(a);
    a.y = got.data();
    cpu::linear(a);
    std::vector<float> row(static_cast<size_t>(s.k));
    for (int64_t j = 0; j < s.n; ++j) {
      a.w.row_to_f32(j, row.data());
      for (int64_t i = 0; i < s.m; ++i) {
        double mag = std::fabs(bias[j]);  // Σ|x·w|: the scale of the rounding differences of any order
        for (int64_t c = 0; c < s.k; ++c) mag += std::fabs(double(x[i * ldx + c]) * row[c]);
        const float r = ref[i * ldy + j];
        ASSERT_NEAR(got[i * ldy + j], r, 1e-6 + 1e-6 * mag) << s.m << "x" << s.n << "x" << s.k << " at " << i << "," << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Mxfp4Linear, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "scalar" : "simd"; });

}  // namespace
}  // namespace polylora::kernels
