// kernels/norm/rms_norm_cuda.cu: CUDA RMSNorm: one block per row, fp32 sum of squares (in place allowed:
// every thread reads its elements before it writes them).
#include "kernels/cuda_util.cuh"
#include "kernels/norm/rms_norm.h"

namespace polylora::kernels::cuda {
namespace {

__global__ void rms_norm_kernel(const float* x, int64_t ldx, float* y, int64_t ldy, int64_t n, const float* w,
                                float eps) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * ldx;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * ldy;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += xr[j] * xr[j];
  sum = cuda_util::block_sum(sum);
  float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) yr[j] = w[j] * (xr[j] * inv);
}

}  // namespace

void rms_norm(const RmsNormArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  int threads = a.n >= 512 ? 512 : static_cast<int>((a.n + 31) / 32 * 32);
  if (threads < 32) threads = 32;
  for (int64_t r0 = 0; r0 < a.m; r0 += 65535LL * 32) {  // grid.x limit is 2^31−1; chunk to stay far below
    int64_t rows = a.m - r0 < 65535LL * 32 ? a.m - r0 : 65535LL * 32;
    rms_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, cuda_util::stream(ctx)>>>(
        a.x + r0 * a.ldx, a.ldx, a.y + r0 * a.ldy, a.ldy, a.n, a.w, a.eps);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace polylora::kernels::cuda
