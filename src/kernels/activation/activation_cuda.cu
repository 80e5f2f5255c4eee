// kernels/activation/activation_cuda.cu: CUDA gated activations (elementwise, grid-stride; expf, not
// the fast approximate exp, to stay close to the reference).
#include "kernels/activation/activation.h"
#include "kernels/cuda_util.cuh"

namespace polylora::kernels::cuda {
namespace {

__global__ void silu_and_mul_kernel(SiluAndMulArgs a) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  int64_t total = a.m * a.n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = idx / a.n, j = idx % a.n;
    float g = a.gate[i * a.ld_gate + j];
    a.out[i * a.ld_out + j] = g / (1.0f + expf(-g)) * a.up[i * a.ld_up + j];
  }
}

__global__ void gpt_oss_swiglu_kernel(GptOssSwigluArgs a) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  int64_t total = a.m * a.n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = idx / a.n, j = idx % a.n;
    const float* in = a.gate_up + i * a.ld_in;
    float g = fminf(in[2 * j], a.limit);
    float u = fminf(fmaxf(in[2 * j + 1], -a.limit), a.limit);
    float glu = g * (1.0f / (1.0f + expf(-g * a.alpha)));
    a.out[i * a.ld_out + j] = (u + 1.0f) * glu;
  }
}

}  // namespace

void silu_and_mul(const SiluAndMulArgs& a, const CudaContext& ctx) {
  if (a.m * a.n == 0) return;
  cuda_util::launch_pdl(silu_and_mul_kernel, cuda_util::blocks_for(a.m * a.n, 256), 256, 0,
                        cuda_util::stream(ctx), a);
  CUDA_CHECK_LAUNCH();
}

void gpt_oss_swiglu(const GptOssSwigluArgs& a, const CudaContext& ctx) {
  if (a.m * a.n == 0) return;
  cuda_util::launch_pdl(gpt_oss_swiglu_kernel, cuda_util::blocks_for(a.m * a.n, 256), 256, 0,
                        cuda_util::stream(ctx), a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
