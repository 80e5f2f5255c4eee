// kernels/activation/activation_ref.cc: reference gated activations.
#include <algorithm>
#include <cmath>

#include "kernels/activation/activation.h"

namespace polylora::kernels::ref {

void silu_and_mul(const SiluAndMulArgs& a) {
  for (int64_t i = 0; i < a.m; ++i) {
    for (int64_t j = 0; j < a.n; ++j) {
      float g = a.gate[i * a.ld_gate + j];
      float silu = g / (1.0f + std::exp(-g));
      a.out[i * a.ld_out + j] = silu * a.up[i * a.ld_up + j];
    }
  }
}

void gpt_oss_swiglu(const GptOssSwigluArgs& a) {
  for (int64_t i = 0; i < a.m; ++i) {
    const float* in = a.gate_up + i * a.ld_in;
    for (int64_t j = 0; j < a.n; ++j) {
      float g = std::min(in[2 * j], a.limit);
      float u = std::clamp(in[2 * j + 1], -a.limit, a.limit);
      float glu = g * (1.0f / (1.0f + std::exp(-g * a.alpha)));
      a.out[i * a.ld_out + j] = (u + 1.0f) * glu;
    }
  }
}

}  // namespace polylora::kernels::ref
