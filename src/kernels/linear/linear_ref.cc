// kernels/linear/linear_ref.cc: reference dense matrix product (the executable spec).
#include <cstddef>
#include <vector>

#include "kernels/linear/linear.h"

namespace polylora::kernels::ref {

void linear(const LinearArgs& a) {
  std::vector<float> row(static_cast<size_t>(a.w.cols));
  for (int64_t n = 0; n < a.w.rows; ++n) {
    a.w.row_to_f32(n, row.data());
    for (int64_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.ldx;
      float acc = 0.0f;
      for (int64_t k = 0; k < a.w.cols; ++k) acc += x[k] * row[k];
      a.y[i * a.ldy + n] = acc + (a.bias ? a.bias[n] : 0.0f);
    }
  }
  if (a.lora_shrink != nullptr) lora_shrink(*a.lora_shrink, a.lora_tmp, a.lora_ld_tmp);
}

}  // namespace polylora::kernels::ref
