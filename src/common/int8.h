// common/int8.h: the INT8 weight-only format of --quantization int8 (docs/quantization.md): a matrix
// [rows, cols] stored as int8 codes q [rows, cols] and one f32 scale per row (per output channel of a
// linear layer), symmetric: scale[r] = max_c |w[r, c]| / 127, q = round(w / scale) (halves away from zero)
// clamped to [-127, 127], value = q · scale[r]. A row of zeros has scale 0 (and codes 0). The CUDA
// quantizer (backend/cuda/device_ops.cu) follows the same f32 operations, so both give identical bytes.
// Must not: know about models or CUDA.
#pragma once

#include <cmath>
#include <cstdint>

namespace polylora {

inline constexpr float kInt8Max = 127.0f;

// The scale of a row whose largest magnitude is `amax`.
inline float int8_scale_of(float amax) {
  return amax / kInt8Max;
}

// The code of value v under `scale` (> 0).
inline int8_t int8_code_of(float v, float scale) {
  float q = std::round(v / scale);
  q = q > kInt8Max ? kInt8Max : (q < -kInt8Max ? -kInt8Max : q);
  return static_cast<int8_t>(q);
}

// Quantizes row w[n] into q[n]; returns its scale.
inline float int8_quantize_row(const float* w, int64_t n, int8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(w[i]));
  const float scale = int8_scale_of(amax);
  for (int64_t i = 0; i < n; ++i) q[i] = scale > 0.0f ? int8_code_of(w[i], scale) : int8_t{0};
  return scale;
}

}  // namespace polylora
