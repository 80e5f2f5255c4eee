// kernels/linear/linear.h: dense matrix product y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]).
// Reference: plain loops, fp32 accumulation. CPU fast path: blocked, multi-threaded (OpenMP),
// OpenBLAS sgemm on f32-converted weight panels for many rows, SIMD dot products for few.
// Must not: allocate per call beyond thread-local scratch; depend on anything above common/.
#pragma once

#include <cstdint>

#include "kernels/tensor_view.h"

namespace polylora::kernels {

// x: [m, w.cols] with row stride ldx (>= w.cols); y: [m, w.rows] with row stride ldy (>= w.rows).
// bias: [w.rows] f32 or nullptr. y is overwritten.
struct LinearArgs {
  const float* x = nullptr;
  int64_t m = 0;
  int64_t ldx = 0;
  WeightView w;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
};

namespace ref {
void linear(const LinearArgs& args);
}
namespace cpu {
void linear(const LinearArgs& args);
}

}  // namespace polylora::kernels
