// kernels/norm/rms_norm_ref.cc: reference RMSNorm (fp32 throughout, as HF computes it) and the residual add
// fused with it (spelled as the add, then the norm).
#include <cmath>

#include <vector>

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

// The spec of the fused op is the two-op sequence: the residual add, then rms_norm of the sum.
AddRmsNormNoLora apply_lora_term(const AddRmsNormArgs& a) {
  AddRmsNormNoLora r{.args = a, .delta = with_lora_term(a.lora_delta, a.delta, a.m, a.ld_delta)};
  r.args.delta = r.delta.data();
  r.args.ld_delta = a.lora_delta.w.out;
  r.args.lora_delta = {};
  return r;
}

void add_rms_norm(const AddRmsNormArgs& a) {
  if (a.lora_delta.active()) return add_rms_norm(ref::apply_lora_term(a).args);
  for (int64_t i = 0; i < a.m; ++i)
    for (int64_t j = 0; j < a.n; ++j) a.x[i * a.ldx + j] += a.delta[i * a.ld_delta + j];
  rms_norm({.x = a.x, .ldx = a.ldx, .y = a.y, .ldy = a.ldy, .m = a.m, .n = a.n, .w = a.w, .eps = a.eps});
}

}  // namespace polylora::kernels::ref
