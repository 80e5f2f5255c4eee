// tests/kernels/kernel_test_util.h: shared helpers of the kernel tests: seeded random data, weights in
// F32/F16/BF16, and the atol + rtol·|ref| comparison every fast-vs-reference test states.
// Must not: hold test logic of its own op.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu_simd.h"
#include "kernels/tensor_view.h"

namespace polylora::kernels::test {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight matrix stored in `dtype`, built from random f32 values.
struct TestWeight {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  WeightView view;
};

inline TestWeight make_weight(int64_t rows, int64_t cols, DType dtype, uint32_t seed, float scale = 1.0f) {
  TestWeight w;
  w.f32 = random_vec(static_cast<size_t>(rows * cols), seed, -scale, scale);
  w.view.dtype = dtype;
  w.view.rows = rows;
  w.view.cols = cols;
  switch (dtype) {
    case DType::kF32:
      w.view.data = w.f32.data();
      break;
    case DType::kBF16:
      for (float f : w.f32) w.half.push_back(f32_to_bf16(f));
      w.view.data = w.half.data();
      break;
    case DType::kF16:
      for (float f : w.f32) w.half.push_back(f32_to_f16(f));
      w.view.data = w.half.data();
      break;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      break;
  }
  return w;
}

// Expects |got[i] − ref[i]| <= atol + rtol·|ref[i]| everywhere; reports the first few violations.
inline void expect_close(const std::vector<float>& got, const std::vector<float>& ref, float atol, float rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    float tol = atol + rtol * std::fabs(ref[i]);
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << ": [" << i << "] got " << got[i] << " ref " << ref[i] << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements out of tolerance";
}

// Runs body once on the SIMD path and once on the forced scalar path.
template <typename Fn>
void for_each_isa(Fn&& body) {
  for (bool scalar : {false, true}) {
    simd::force_scalar_for_testing(scalar);
    body(scalar ? "scalar" : "simd");
  }
  simd::force_scalar_for_testing(false);
}

inline const char* dtype_str(DType d) {
  return dtype_name(d).data();
}

}  // namespace polylora::kernels::test
