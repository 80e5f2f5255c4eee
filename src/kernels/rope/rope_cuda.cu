// kernels/rope/rope_cuda.cu: CUDA RoPE (rotate half), in place: one block per token, one thread per
// (head, pair). The angle is the fp32 product pos·inv_freq and cos/sin are taken in double, as the
// reference does, so results match it to rounding.
#include "kernels/cuda_util.cuh"
#include "kernels/rope/rope.h"

namespace polylora::kernels::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t ldx, int64_t num_heads, int64_t head_dim,
                            const int32_t* positions, const float* inv_freq, float scaling) {
  int64_t t = blockIdx.x;
  int64_t half = head_dim / 2;
  float pos = static_cast<float>(positions[t]);
  for (int64_t i = threadIdx.x; i < num_heads * half; i += blockDim.x) {
    int64_t h = i / half, j = i % half;
    float angle = pos * inv_freq[j];
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    float cf = static_cast<float>(c) * scaling, sf = static_cast<float>(s) * scaling;
    float* xh = x + t * ldx + h * head_dim;
    float x1 = xh[j], x2 = xh[j + half];
    xh[j] = x1 * cf - x2 * sf;
    xh[j + half] = x2 * cf + x1 * sf;
  }
}

}  // namespace

void rope(const RopeArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  rope_kernel<<<static_cast<unsigned>(a.m), 128, 0, cuda_util::stream(ctx)>>>(
      a.x, a.ldx, a.num_heads, a.head_dim, a.positions, a.inv_freq, a.attention_scaling);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
