// kernels/tensor_view.h: the plain views every kernel takes (pointer, shape, dtype); no ownership.
// Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace polylora::kernels {

// A row-major weight matrix [rows, cols] in its checkpoint dtype (F32, F16 or BF16).
// For a linear layer rows = out_features, cols = in_features (y = x · Wᵀ).
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;

  bool empty() const { return data == nullptr; }
  // Element (r, c) as f32.
  float at(int64_t r, int64_t c) const;
  // Row r converted to f32 into dst[cols].
  void row_to_f32(int64_t r, float* dst) const;
};

inline float WeightView::at(int64_t r, int64_t c) const {
  int64_t i = r * cols + c;
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      break;
  }
  return 0.0f;
}

inline void WeightView::row_to_f32(int64_t r, float* dst) const {
  const auto* base = static_cast<const char*>(data) + static_cast<size_t>(r * cols) * dtype_size(dtype);
  convert_to_f32(base, dtype, static_cast<size_t>(cols), dst);
}

}  // namespace polylora::kernels
