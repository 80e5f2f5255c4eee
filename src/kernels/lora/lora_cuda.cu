// kernels/lora/lora_cuda.cu: CUDA dense LoRA over the given rows: one block per row, shrink and expand
// fused (the rank-sized intermediate stays in shared memory).
#include "kernels/lora/lora_cuda.cuh"

namespace polylora::kernels::cuda {
namespace {

__global__ void lora_apply_kernel(LoraApplyArgs a) {
  __shared__ float s_mid[cuda_util::kLoraRankChunk];
  int64_t row = a.rows ? a.rows[blockIdx.x] : blockIdx.x;
  cuda_util::lora_row(a.lora, a.x + row * a.ldx, a.y + row * a.ldy, s_mid);
}

}  // namespace

void lora_apply(const LoraApplyArgs& a, const CudaContext& ctx) {
  if (a.num_rows == 0 || a.lora.empty() || a.lora.rank == 0) return;
  lora_apply_kernel<<<static_cast<unsigned>(a.num_rows), 256, 0, cuda_util::stream(ctx)>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
