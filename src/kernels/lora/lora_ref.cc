// kernels/lora/lora_ref.cc: reference LoRA shrink + expand.
#include <cstddef>
#include <vector>

#include "kernels/lora/lora.h"

namespace polylora::kernels::ref {

void lora_apply(const LoraApplyArgs& a) {
  const LoraView& l = a.lora;
  std::vector<float> mid(static_cast<size_t>(l.rank));
  for (int64_t i = 0; i < a.num_rows; ++i) {
    int64_t row = a.rows ? a.rows[i] : i;
    const float* x = a.x + row * a.ldx;
    for (int64_t r = 0; r < l.rank; ++r) {
      float acc = 0.0f;
      for (int64_t k = 0; k < l.in; ++k) acc += l.a[r * l.in + k] * x[k];
      mid[r] = acc;
    }
    float* y = a.y + row * a.ldy;
    for (int64_t o = 0; o < l.out; ++o) {
      float acc = 0.0f;
      for (int64_t r = 0; r < l.rank; ++r) acc += l.b[o * l.rank + r] * mid[r];
      y[o] += l.scale * acc;
    }
  }
}

}  // namespace polylora::kernels::ref
