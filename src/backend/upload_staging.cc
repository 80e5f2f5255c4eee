// backend/upload_staging.cc: the host implementation of UploadStaging (Backend's default, used by the CPU
// backend): plain buffers, and each upload converted (and transposed) on the calling thread at once.
// Must not: know about checkpoints or models (blocks of values only).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"

namespace polylora {
namespace {

bool supported(DType src, DType dst) {
  if (src == dst) return true;
  auto is_float = [](DType d) {
    switch (d) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
        return true;
      case DType::kI32:
      case DType::kI64:
      case DType::kU8:
      case DType::kI8:
        return false;
    }
    return false;
  };
  return is_float(src) && (dst == DType::kF32 || dst == DType::kBF16);
}

// Stores n f32 values as `dtype` (F32 or BF16).
void store_f32(const float* v, size_t n, DType dtype, std::byte* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, v, n * sizeof(float));
    return;
  }
  auto* d = reinterpret_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(v[i]);
}

void host_upload(const std::byte* src, const UploadBlock& b) {
  const size_t ssize = dtype_size(b.src_dtype), dsize = dtype_size(b.dst_dtype);
  auto* dst = static_cast<std::byte*>(b.dst);
  const auto rows = static_cast<size_t>(b.rows), cols = static_cast<size_t>(b.cols);
  const auto ld = static_cast<size_t>(b.dst_ld);
  if (!b.transpose) {
    std::vector<float> row(b.src_dtype == b.dst_dtype ? 0 : cols);
    for (size_t i = 0; i < rows; ++i) {
      const std::byte* s = src + i * cols * ssize;
      std::byte* d = dst + i * ld * dsize;
      if (b.src_dtype == b.dst_dtype) {
        std::memcpy(d, s, cols * ssize);
      } else {
        convert_to_f32(s, b.src_dtype, cols, row.data());
        store_f32(row.data(), cols, b.dst_dtype, d);
      }
    }
    return;
  }
  // Transposed: source row i becomes destination column i.
  std::vector<float> row(cols);
  for (size_t i = 0; i < rows; ++i) {
    const std::byte* s = src + i * cols * ssize;
    if (b.src_dtype == b.dst_dtype) {
      for (size_t j = 0; j < cols; ++j) std::memcpy(dst + (j * ld + i) * dsize, s + j * ssize, ssize);
      continue;
    }
    convert_to_f32(s, b.src_dtype, cols, row.data());
    for (size_t j = 0; j < cols; ++j) store_f32(&row[j], 1, b.dst_dtype, dst + (j * ld + i) * dsize);
  }
}

class HostUploadStaging final : public UploadStaging {
 public:
  HostUploadStaging(int num_buffers, size_t buffer_bytes) : bytes_(buffer_bytes) {
    for (int i = 0; i < num_buffers; ++i) buffers_.emplace_back(new std::byte[buffer_bytes]);
  }
  int num_buffers() const override { return static_cast<int>(buffers_.size()); }
  size_t buffer_bytes() const override { return bytes_; }
  std::byte* buffer(int i) override { return buffers_.at(static_cast<size_t>(i)).get(); }
  void wait(int) override {}
  void upload(int i, const UploadBlock& block) override {
    check_upload_block(block, bytes_);
    host_upload(buffer(i), block);
  }
  void finish() override {}

 private:
  size_t bytes_;
  std::vector<std::unique_ptr<std::byte[]>> buffers_;
};

}  // namespace

void check_upload_block(const UploadBlock& b, size_t buffer_bytes) {
  CHECK_MSG(b.rows >= 0 && b.cols >= 0, "upload block [{}, {}]", b.rows, b.cols);
  CHECK_MSG(supported(b.src_dtype, b.dst_dtype), "upload from {} to {} is not supported",
            dtype_name(b.src_dtype), dtype_name(b.dst_dtype));
  CHECK_MSG(static_cast<size_t>(b.rows * b.cols) * dtype_size(b.src_dtype) <= buffer_bytes,
            "upload block [{}, {}] of {} does not fit a {}-byte staging buffer", b.rows, b.cols,
            dtype_name(b.src_dtype), buffer_bytes);
  CHECK_MSG(b.dst_ld >= (b.transpose ? b.rows : b.cols), "upload block [{}, {}]: dst_ld {} is too small",
            b.rows, b.cols, b.dst_ld);
  CHECK(b.dst != nullptr || b.rows * b.cols == 0);
}

std::unique_ptr<UploadStaging> Backend::make_upload_staging(int num_buffers, size_t buffer_bytes) {
  CHECK(num_buffers > 0 && buffer_bytes > 0);
  return std::make_unique<HostUploadStaging>(num_buffers, buffer_bytes);
}

}  // namespace polylora
