// backend/cuda/device_ops.h: the CUDA backend's own device helpers (weight conversion, random fill,
// residual add, row gather), declared without CUDA headers so cuda_backend.cc stays plain C++.
// Must not: know about models; be used outside backend/cuda/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace polylora::cuda_backend {

// dst[i] = src[i] converted (F32/F16/BF16 -> F32/BF16, bf16 rounding to nearest even), i < n.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, void* stream);
// A weight-upload block (backend.h's UploadBlock): src [rows, cols] row-major of src_dtype, element (i, j)
// stored converted at dst[i * dst_ld + j], or at dst[j * dst_ld + i] when `transpose` (F32/F16/BF16 to
// F32/F16/BF16; a dtype to itself is exact).
void upload_block(const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst, DType dst_dtype,
                  int64_t dst_ld, bool transpose, void* stream);
// n values uniform in [−√3·stddev, √3·stddev] (standard deviation `stddev`) from a counter hash of (seed, i)
// (F32 or BF16); U8: n random bytes (stddev unused).
void fill_random(void* dst, DType dtype, size_t n, float stddev, uint64_t seed, void* stream);
// INT8 weight quantization (common/int8.h, the same bytes as the CPU's): src [rows, cols] of src_dtype
// (F32/F16/BF16) into codes [rows, cols] and scales [rows].
void quantize_int8(const void* src, DType src_dtype, int64_t rows, int64_t cols, int8_t* codes, float* scales,
                   void* stream);
void add_inplace(float* y, const float* x, int64_t n, void* stream);
void gather_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols, float* dst,
                 void* stream);
// ids[r] = the first index of the largest value of row r of x [rows, cols] (NaN never wins).
void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, void* stream);
// dst[pairs[2i]] = src[pairs[2i + 1]], i < n.
void feed_tokens(int32_t* dst, const int32_t* pairs, int64_t n, const int32_t* src, void* stream);

}  // namespace polylora::cuda_backend
