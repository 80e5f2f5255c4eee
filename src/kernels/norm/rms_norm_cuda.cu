// kernels/norm/rms_norm_cuda.cu: CUDA RMSNorm, fp32 sum of squares (in place allowed: every thread reads
// its elements before it writes them). Rows of up to kWarpRowMax elements (Qwen3's per-head q/k norms,
// [tokens·heads, head_dim]) take one warp each, eight rows per block; longer rows (the residual stream)
// one block each. Both read and write 16 bytes at a time when n, the strides and the pointers allow.
#include <algorithm>

#include "kernels/cuda_util.cuh"
#include "kernels/norm/rms_norm.h"

namespace polylora::kernels::cuda {
namespace {

constexpr int64_t kWarpRowMax = 1024;
constexpr int kRowsPerBlock = 8;

// Sum of squares of row xr over the indices this thread owns (first, first + step, ...); VEC: float4.
template <bool VEC>
__device__ __forceinline__ float row_sumsq(const float* xr, int64_t n, int64_t first, int64_t step) {
  float sum = 0.0f;
  if (VEC) {
    for (int64_t j = first * 4; j < n; j += step * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + j);
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t j = first; j < n; j += step) sum += xr[j] * xr[j];
  }
  return sum;
}

template <bool VEC>
__device__ __forceinline__ void row_scale(const float* xr, float* yr, const float* w, int64_t n, float inv,
                                          int64_t first, int64_t step) {
  if (VEC) {
    for (int64_t j = first * 4; j < n; j += step * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + j);
      const float4 g = *reinterpret_cast<const float4*>(w + j);
      *reinterpret_cast<float4*>(yr + j) =
          make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
  } else {
    for (int64_t j = first; j < n; j += step) yr[j] = w[j] * (xr[j] * inv);
  }
}

template <bool VEC>
__global__ void rms_norm_block_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n,
                                      const float* w, float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * ldx;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * ldy;
  float sum = cuda_util::block_sum(row_sumsq<VEC>(xr, n, threadIdx.x, blockDim.x));
  float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  row_scale<VEC>(xr, yr, w, n, inv, threadIdx.x, blockDim.x);
}

template <bool VEC>
__global__ void rms_norm_warp_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m, int64_t n,
                                     const float* w, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= m) return;  // whole warps exit together
  const int lane = threadIdx.x & 31;
  const float* xr = x + row * ldx;
  float* yr = y + row * ldy;
  float sum = cuda_util::warp_sum(row_sumsq<VEC>(xr, n, lane, 32));
  float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  row_scale<VEC>(xr, yr, w, n, inv, lane, 32);
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

}  // namespace

void rms_norm(const RmsNormArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  cudaStream_t st = cuda_util::stream(ctx);
  const bool vec =
      a.n % 4 == 0 && a.ldx % 4 == 0 && a.ldy % 4 == 0 && aligned16(a.x) && aligned16(a.y) && aligned16(a.w);
  if (a.n <= kWarpRowMax) {
    for (int64_t r0 = 0; r0 < a.m; r0 += 65535LL * 32 * kRowsPerBlock) {  // far below grid.x's limit
      int64_t rows = std::min<int64_t>(a.m - r0, 65535LL * 32 * kRowsPerBlock);
      unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
      if (vec)
        rms_norm_warp_kernel<true><<<blocks, 32 * kRowsPerBlock, 0, st>>>(
            a.x + r0 * a.ldx, a.ldx, a.y + r0 * a.ldy, a.ldy, rows, a.n, a.w, a.eps);
      else
        rms_norm_warp_kernel<false><<<blocks, 32 * kRowsPerBlock, 0, st>>>(
            a.x + r0 * a.ldx, a.ldx, a.y + r0 * a.ldy, a.ldy, rows, a.n, a.w, a.eps);
      CUDA_CHECK_LAUNCH();
    }
    return;
  }
  const int64_t per_thread_units = vec ? a.n / 4 : a.n;
  int threads = per_thread_units >= 512 ? 512 : static_cast<int>((per_thread_units + 31) / 32 * 32);
  if (threads < 32) threads = 32;
  for (int64_t r0 = 0; r0 < a.m; r0 += 65535LL * 32) {  // grid.x limit is 2^31−1; chunk to stay far below
    int64_t rows = a.m - r0 < 65535LL * 32 ? a.m - r0 : 65535LL * 32;
    if (vec)
      rms_norm_block_kernel<true><<<static_cast<unsigned>(rows), threads, 0, st>>>(
          a.x + r0 * a.ldx, a.ldx, a.y + r0 * a.ldy, a.ldy, a.n, a.w, a.eps);
    else
      rms_norm_block_kernel<false><<<static_cast<unsigned>(rows), threads, 0, st>>>(
          a.x + r0 * a.ldx, a.ldx, a.y + r0 * a.ldy, a.ldy, a.n, a.w, a.eps);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace polylora::kernels::cuda
