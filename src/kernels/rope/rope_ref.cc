// kernels/rope/rope_ref.cc: reference RoPE. The angle is the fp32 product pos·inv_freq, as torch computes it.
#include <cmath>

#include "kernels/rope/rope.h"

namespace polylora::kernels::ref {

void rope(const RopeArgs& a) {
  int64_t half = a.head_dim / 2;
  for (int64_t t = 0; t < a.m; ++t) {
    float pos = static_cast<float>(a.positions[t]);
    for (int64_t h = 0; h < a.num_heads; ++h) {
      float* x = a.x + t * a.ldx + h * a.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float angle = pos * a.inv_freq[i];
        float c = static_cast<float>(std::cos(static_cast<double>(angle))) * a.attention_scaling;
        float s = static_cast<float>(std::sin(static_cast<double>(angle))) * a.attention_scaling;
        float x1 = x[i];
        float x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

}  // namespace polylora::kernels::ref
