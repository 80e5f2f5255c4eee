// kernels/rope/rope_cuda.cu: CUDA RoPE (rotate half), in place: token = blockIdx.x, its (head, pair) items
// over blockIdx.y and threads, one item per thread (a batch-1 step's 64 heads spread over 16 CTAs; one CTA
// per token took 8.5 us per call on the H200). The angle is the fp32 product pos·inv_freq and cos/sin are
// taken in double, as the reference does, so results match it to rounding.
#include <algorithm>

#include "kernels/cuda_util.cuh"
#include "kernels/rope/rope.h"

namespace polylora::kernels::cuda {
namespace {

__global__ void rope_kernel(float* x, int64_t ldx, int64_t num_heads, int64_t head_dim,
                            const int32_t* positions, const float* inv_freq, float scaling) {
  int64_t t = blockIdx.x;
  int64_t half = head_dim / 2;
  float pos = static_cast<float>(positions[t]);
  for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < num_heads * half;
       i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
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
  // Few tokens (decode): the items over up to ⌈items / 128⌉ CTAs per token, about 64 CTAs in all.
  const int64_t items = a.num_heads * (a.head_dim / 2);
  const int64_t per_token = a.m >= 64 ? 1 : std::min<int64_t>((items + 127) / 128, (64 + a.m - 1) / a.m);
  const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(std::max<int64_t>(1, per_token)));
  rope_kernel<<<grid, 128, 0, cuda_util::stream(ctx)>>>(a.x, a.ldx, a.num_heads, a.head_dim, a.positions,
                                                        a.inv_freq, a.attention_scaling);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
