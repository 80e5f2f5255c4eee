// tests/kernels/linear_test.cc: cpu::linear against ref::linear over awkward shapes, strides and dtypes.
// Tolerance: atol 1e-5·√k + rtol 1e-4 (f32 accumulation in a different order; inputs in [-1, 1]).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "kernel_test_util.h"
#include "kernels/linear/linear.h"

namespace polylora::kernels {
namespace {

void check_linear(int64_t m, int64_t n, int64_t k, DType dtype, bool bias, int64_t pad) {
  test::TestWeight w = test::make_weight(n, k, dtype, static_cast<uint32_t>(m * 131 + n * 7 + k));
  int64_t ldx = k + pad, ldy = n + pad;
  std::vector<float> x = test::random_vec(static_cast<size_t>(m * ldx), 11);
  std::vector<float> b = test::random_vec(static_cast<size_t>(n), 12);
  std::vector<float> y_ref(static_cast<size_t>(m * ldy), 7.0f);
  LinearArgs a{.x = x.data(),
               .m = m,
               .ldx = ldx,
               .w = w.view,
               .bias = bias ? b.data() : nullptr,
               .y = y_ref.data(),
               .ldy = ldy};
  ref::linear(a);
  test::for_each_isa([&](const char* isa) {
    std::vector<float> y(static_cast<size_t>(m * ldy), 7.0f);
    LinearArgs f = a;
    f.y = y.data();
    cpu::linear(f);
    float atol = 1e-5f * std::sqrt(static_cast<float>(k)) + 1e-6f;
    test::expect_close(y, y_ref, atol, 1e-4f,
                       std::string(isa) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
                           " k=" + std::to_string(k) + " " + test::dtype_str(dtype) + (bias ? " bias" : "") +
                           " pad=" + std::to_string(pad));
  });
}

TEST(LinearCpu, AwkwardShapesAllDtypes) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 33}) {
      for (int64_t n : {1, 7, 255}) {
        for (int64_t k : {1, 3, 17, 129})
          check_linear(m, n, k, dtype, (m + n) % 2 == 0, (k % 3 == 0) ? 5 : 0);
      }
    }
  }
}

TEST(LinearCpu, DecodeAndPrefillSizes) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    check_linear(1, 1024, 512, dtype, true, 0);
    check_linear(6, 300, 1000, dtype, false, 3);
    check_linear(70, 1000, 256, dtype, true, 1);
    check_linear(128, 513, 384, dtype, false, 0);
  }
}

TEST(LinearCpu, ZeroInnerDimensionGivesBias) {
  std::vector<float> b = {1.0f, -2.0f, 3.0f};
  std::vector<float> y(6, 9.0f);
  float dummy = 0.0f;
  LinearArgs a{.x = &dummy,
               .m = 2,
               .ldx = 0,
               .w = {.data = &dummy, .dtype = DType::kF32, .rows = 3, .cols = 0},
               .bias = b.data(),
               .y = y.data(),
               .ldy = 3};
  cpu::linear(a);
  EXPECT_EQ(y, (std::vector<float>{1, -2, 3, 1, -2, 3}));
}

}  // namespace
}  // namespace polylora::kernels
