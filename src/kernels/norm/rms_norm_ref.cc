// kernels/norm/rms_norm_ref.cc: reference RMSNorm (fp32 throughout, as HF computes it).
#include <cmath>

#include "kernels/norm/rms_norm.h"

namespace polylora::kernels::ref {

void rms_norm(const RmsNormArgs& a) {
  for (int64_t i = 0; i < a.m; ++i) {
    const float* x = a.x + i * a.ldx;
    float* y = a.y + i * a.ldy;
    float sum = 0.0f;
    for (int64_t j = 0; j < a.n; ++j) sum += x[j] * x[j];
    float inv = 1.0f / std::sqrt(sum / static_cast<float>(a.n) + a.eps);
    for (int64_t j = 0; j < a.n; ++j) y[j] = a.w[j] * (x[j] * inv);
  }
}

}  // namespace polylora::kernels::ref
