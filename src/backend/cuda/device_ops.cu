// backend/cuda/device_ops.cu: elementwise device helpers of the CUDA backend (grid-stride kernels).
#include "backend/cuda/device_ops.h"
#include "kernels/cuda_util.cuh"

namespace polylora::cuda_backend {
namespace {

using kernels::cuda_util::blocks_for;

__global__ void convert_kernel(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float v = kernels::cuda_util::load_as_f32(src, src_dtype, static_cast<int64_t>(i));
    if (dst_dtype == DType::kBF16) {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(dst)[i] = v;
    }
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(void* dst, DType dtype, size_t n, float stddev, uint64_t seed) {
  const uint64_t key = splitmix64(seed * 0x2545f4914f6cdd1dull + 1);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint64_t h = splitmix64(key ^ static_cast<uint64_t>(i));
    float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    float v = (2.0f * u - 1.0f) * 1.7320508f * stddev;
    if (dtype == DType::kU8) {
      static_cast<uint8_t*>(dst)[i] = static_cast<uint8_t>(h);  // random bytes (MXFP4 codes)
    } else if (dtype == DType::kBF16) {
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
    } else {
      static_cast<float*>(dst)[i] = v;
    }
  }
}

// One block per row (grid-stride): common/int8.h's quantizer with the same f32 operations (IEEE division,
// round halves away from zero), so the bytes equal the CPU's.
__global__ void quantize_int8_kernel(const void* src, DType dtype, int64_t rows, int64_t cols, int8_t* codes,
                                     float* scales) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float amax = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      amax = fmaxf(amax, fabsf(polylora::kernels::cuda_util::load_as_f32(src, dtype, r * cols + c)));
    amax = polylora::kernels::cuda_util::warp_max(amax);
    __syncthreads();  // partial may still be read for the previous row
    if (lane == 0) partial[warp] = amax;
    __syncthreads();
    amax = polylora::kernels::cuda_util::warp_max(lane < warps ? partial[lane] : 0.0f);
    const float scale = __fdiv_rn(amax, 127.0f);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float q = 0.0f;
      if (scale > 0.0f) {
        q = roundf(__fdiv_rn(polylora::kernels::cuda_util::load_as_f32(src, dtype, r * cols + c), scale));
        q = fminf(fmaxf(q, -127.0f), 127.0f);
      }
      codes[r * cols + c] = static_cast<int8_t>(q);
    }
    if (threadIdx.x == 0) scales[r] = scale;
  }
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

__global__ void gather_kernel(const float* src, const int32_t* rows, int64_t cols, float* dst) {
  ::polylora::kernels::cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const float* s = src + static_cast<int64_t>(rows[blockIdx.x]) * cols;
  float* d = dst + static_cast<int64_t>(blockIdx.x) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n, void* stream) {
  if (n == 0) return;
  convert_kernel<<<blocks_for(static_cast<int64_t>(n), 256, 8192), 256, 0, as_stream(stream)>>>(
      src, src_dtype, dst, dst_dtype, n);
  CUDA_CHECK_LAUNCH();
}

void fill_random(void* dst, DType dtype, size_t n, float stddev, uint64_t seed, void* stream) {
  if (n == 0) return;
  fill_random_kernel<<<blocks_for(static_cast<int64_t>(n), 256, 8192), 256, 0, as_stream(stream)>>>(
      dst, dtype, n, stddev, seed);
  CUDA_CHECK_LAUNCH();
}

void quantize_int8(const void* src, DType src_dtype, int64_t rows, int64_t cols, int8_t* codes, float* scales,
                   void* stream) {
  if (rows == 0) return;
  quantize_int8_kernel<<<blocks_for(rows, 1, 65535), 256, 0, as_stream(stream)>>>(src, src_dtype, rows, cols,
                                                                                  codes, scales);
  CUDA_CHECK_LAUNCH();
}

void add_inplace(float* y, const float* x, int64_t n, void* stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256, 8192), 256, 0, as_stream(stream)>>>(y, x, n);
  CUDA_CHECK_LAUNCH();
}

// One block per row: each thread keeps the best (value, index) of its stride, then a shared-memory
// reduction; ties go to the lower index, as the CPU sampler's argmax.
__global__ void argmax_kernel(const float* x, int64_t cols, int32_t* ids) {
  ::polylora::kernels::cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  constexpr int kThreads = 512;
  __shared__ float best_v[kThreads];
  __shared__ int32_t best_i[kThreads];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float v = -INFINITY;
  int32_t idx = INT32_MAX;
  for (int64_t i = threadIdx.x; i < cols; i += kThreads) {
    float y = row[i];
    if (y > v || (idx == INT32_MAX && y == v)) {  // strictly larger; the first -inf counts too
      v = y;
      idx = static_cast<int32_t>(i);
    }
  }
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int step = kThreads / 2; step > 0; step /= 2) {
    if (threadIdx.x < step) {
      float ov = best_v[threadIdx.x + step];
      int32_t oi = best_i[threadIdx.x + step];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = best_i[0] == INT32_MAX ? 0 : best_i[0];
}

void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, void* stream) {
  if (rows == 0) return;
  ::polylora::kernels::cuda_util::launch_pdl(argmax_kernel, static_cast<unsigned>(rows), 512, 0,
                                             as_stream(stream), x, cols, ids);
  CUDA_CHECK_LAUNCH();
}

__global__ void feed_kernel(int32_t* dst, const int32_t* pairs, int64_t n, const int32_t* src) {
  ::polylora::kernels::cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
}

void feed_tokens(int32_t* dst, const int32_t* pairs, int64_t n, const int32_t* src, void* stream) {
  if (n == 0) return;
  ::polylora::kernels::cuda_util::launch_pdl(feed_kernel, blocks_for(n, 256, 64), 256, 0, as_stream(stream),
                                             dst, pairs, n, src);
  CUDA_CHECK_LAUNCH();
}

void gather_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols, float* dst,
                 void* stream) {
  if (num_rows == 0) return;
  ::polylora::kernels::cuda_util::launch_pdl(gather_kernel, static_cast<unsigned>(num_rows), 256, 0,
                                             as_stream(stream), src, rows, cols, dst);
  CUDA_CHECK_LAUNCH();
}

// Weight-upload blocks (the staged loader). Values pass through f32, which is exact for a dtype to itself.
namespace {

template <typename T>
__device__ __forceinline__ float upload_to_f32(T v);
template <>
__device__ __forceinline__ float upload_to_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float upload_to_f32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float upload_to_f32<__half>(__half v) {
  return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T upload_from_f32(float v);
template <>
__device__ __forceinline__ float upload_from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 upload_from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half upload_from_f32<__half>(float v) {
  return __float2half_rn(v);
}

constexpr int kTile = 32;
constexpr int kTileRows = 8;

// dst[j * ld + i] = src[i * cols + j] through a 32 x 32 shared tile (coalesced reads and writes); the grid
// strides over tile rows, so any number of rows fits.
template <typename S, typename D>
__global__ void upload_transpose_kernel(const S* src, int64_t rows, int64_t cols, D* dst, int64_t ld) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t tile_rows = (rows + kTile - 1) / kTile;
  for (int64_t by = blockIdx.y; by < tile_rows; by += gridDim.y) {
    const int64_t i0 = by * kTile;
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t i = i0 + r, j = j0 + threadIdx.x;
      if (i < rows && j < cols) tile[r][threadIdx.x] = upload_to_f32(src[i * cols + j]);
    }
    __syncthreads();
    for (int r = threadIdx.y; r < kTile; r += kTileRows) {
      const int64_t j = j0 + r, i = i0 + threadIdx.x;
      if (i < rows && j < cols) dst[j * ld + i] = upload_from_f32<D>(tile[threadIdx.x][r]);
    }
    __syncthreads();
  }
}

// dst[i * ld + j] = src[i * cols + j].
template <typename S, typename D>
__global__ void upload_rows_kernel(const S* src, int64_t rows, int64_t cols, D* dst, int64_t ld) {
  const int64_t n = rows * cols;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = k / cols, j = k - i * cols;
    dst[i * ld + j] = upload_from_f32<D>(upload_to_f32(src[k]));
  }
}

template <typename S, typename D>
void launch_upload(const void* src, int64_t rows, int64_t cols, void* dst, int64_t ld, bool transpose,
                   cudaStream_t stream) {
  const auto* s = static_cast<const S*>(src);
  auto* d = static_cast<D*>(dst);
  if (transpose) {
    // A block fits a staging buffer, so cols / 32 is far below the grid's 2^31 - 1 columns; rows may
    // exceed 65535 tiles: the kernel strides over them.
    const int64_t tiles_x = (cols + kTile - 1) / kTile, tiles_y = (rows + kTile - 1) / kTile;
    dim3 grid(static_cast<unsigned>(tiles_x), static_cast<unsigned>(std::min<int64_t>(tiles_y, 65535)));
    upload_transpose_kernel<S, D><<<grid, dim3(kTile, kTileRows), 0, stream>>>(s, rows, cols, d, ld);
  } else {
    upload_rows_kernel<S, D><<<blocks_for(rows * cols, 256, 8192), 256, 0, stream>>>(s, rows, cols, d, ld);
  }
}

template <typename S>
void launch_upload_from(const void* src, int64_t rows, int64_t cols, void* dst, DType dst_dtype, int64_t ld,
                        bool transpose, cudaStream_t stream) {
  switch (dst_dtype) {
    case DType::kF32:
      return launch_upload<S, float>(src, rows, cols, dst, ld, transpose, stream);
    case DType::kBF16:
      return launch_upload<S, __nv_bfloat16>(src, rows, cols, dst, ld, transpose, stream);
    case DType::kF16:
      return launch_upload<S, __half>(src, rows, cols, dst, ld, transpose, stream);
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      break;
  }
}

}  // namespace

void upload_block(const void* src, DType src_dtype, int64_t rows, int64_t cols, void* dst, DType dst_dtype,
                  int64_t dst_ld, bool transpose, void* stream) {
  if (rows <= 0 || cols <= 0) return;
  cudaStream_t st = as_stream(stream);
  if (!transpose && dst_ld == cols && (dst_dtype == DType::kF32 || dst_dtype == DType::kBF16) &&
      src_dtype != dst_dtype) {
    convert(src, src_dtype, dst, dst_dtype, static_cast<size_t>(rows * cols), stream);
    return;
  }
  switch (src_dtype) {
    case DType::kF32:
      launch_upload_from<float>(src, rows, cols, dst, dst_dtype, dst_ld, transpose, st);
      break;
    case DType::kBF16:
      launch_upload_from<__nv_bfloat16>(src, rows, cols, dst, dst_dtype, dst_ld, transpose, st);
      break;
    case DType::kF16:
      launch_upload_from<__half>(src, rows, cols, dst, dst_dtype, dst_ld, transpose, st);
      break;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::cuda_backend
