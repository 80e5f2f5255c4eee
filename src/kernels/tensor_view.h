// kernels/tensor_view.h: the plain views every kernel takes (pointer, shape, dtype); no ownership.
// Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "common/int8.h"
#include "common/mxfp4.h"

namespace polylora::kernels {

// A row-major weight matrix [rows, cols] in its checkpoint dtype (F32, F16 or BF16), or MXFP4 (dtype
// kU8, common/mxfp4.h): `data` the E2M1 codes [rows, cols / 2] bytes, `scales` the E8M0 scales
// [rows, cols / 32] bytes (cols a multiple of 32), or INT8 (dtype kI8, common/int8.h, --quantization
// int8): `data` the int8 codes [rows, cols], `row_scales` one f32 per row (element = code · row_scales[r]).
// For a linear layer rows = out_features, cols = in_features (y = x · Wᵀ).
struct WeightView {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* scales = nullptr;     // MXFP4 only: [rows, cols / 32]
  const float* row_scales = nullptr;  // INT8 only: [rows]

  bool empty() const { return data == nullptr; }
  bool mxfp4() const { return dtype == DType::kU8; }
  bool int8() const { return dtype == DType::kI8; }
  // Bytes of the matrix as stored (codes and scales for MXFP4 and INT8).
  size_t num_bytes() const {
    const auto n = static_cast<size_t>(rows * cols);
    if (mxfp4()) return n / 2 + n / kMxfp4BlockSize;
    if (int8()) return n + static_cast<size_t>(rows) * sizeof(float);
    return n * dtype_size(dtype);
  }
  // MXFP4: row r's codes and scales.
  const uint8_t* mxfp4_codes(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * (cols / 2);
  }
  const uint8_t* mxfp4_scales(int64_t r) const { return scales + r * (cols / kMxfp4BlockSize); }
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
    case DType::kU8:
      return mxfp4_at(mxfp4_codes(r), mxfp4_scales(r), c);
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(data)[i]) * row_scales[r];
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return 0.0f;
}

inline void WeightView::row_to_f32(int64_t r, float* dst) const {
  if (mxfp4()) {
    mxfp4_decode_row(mxfp4_codes(r), mxfp4_scales(r), cols, dst);
    return;
  }
  if (int8()) {
    const int8_t* q = static_cast<const int8_t*>(data) + r * cols;
    const float s = row_scales[r];
    for (int64_t c = 0; c < cols; ++c) dst[c] = static_cast<float>(q[c]) * s;
    return;
  }
  const auto* base = static_cast<const char*>(data) + static_cast<size_t>(r * cols) * dtype_size(dtype);
  convert_to_f32(base, dtype, static_cast<size_t>(cols), dst);
}

}  // namespace polylora::kernels
