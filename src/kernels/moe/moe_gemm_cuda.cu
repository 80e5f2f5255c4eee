// kernels/moe/moe_gemm_cuda.cu: the launchers of the MoE tensor-core grouped GEMM (moe_gemm_mma.cuh) and of
// the expert LoRA's tensor-core shrink (moe_lora_mma.cuh) (moe_launch.h), compiled apart from moe_cuda.cu.
// Must not: depend on anything above common/.
#include <algorithm>

#include "kernels/moe/moe_launch.h"

namespace polylora::kernels::cuda::moe_detail {
namespace {

template <Phase P, int BM>
void launch_mma(dim3 grid, const MmaParams& mp, cudaStream_t st) {
  static const bool configured = [] {
    CUDA_CHECK(
        cudaFuncSetAttribute(moe_gemm_mma<P, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMmaMaxSmem));
    return true;
  }();
  (void)configured;
  const int64_t smem = MmaCfg<BM>::kSmemBytes + mma_mxfp4_smem_bytes(mp.mx_nb);
  KERNEL_CHECK(smem <= kMmaMaxSmem, "moe_experts: MXFP4 rows too long for the grouped GEMM's shared memory");
  KERNEL_CHECK(mp.kb_tiles > 0 && mp.lda / kMmaBK <= 2 * mp.kb_tiles,
               "moe_experts: the grouped GEMM takes at most two copies of the activations' K");
  moe_gemm_mma<P, BM><<<grid, kMmaThreads, static_cast<size_t>(smem), st>>>(mp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

template <Phase P>
void launch_mma_tile(int tile_m, dim3 grid, const MmaParams& mp, cudaStream_t st) {
  if (tile_m == 128) {
    launch_mma<P, 128>(grid, mp, st);
  } else {
    launch_mma<P, 64>(grid, mp, st);
  }
}

template void launch_mma_tile<Phase::kGateUp>(int, dim3, const MmaParams&, cudaStream_t);
template void launch_mma_tile<Phase::kDown>(int, dim3, const MmaParams&, cudaStream_t);

void launch_lora_shrink_mma_kernel(dim3 grid, const LoraShrinkMmaParams& lp, cudaStream_t st) {
  KERNEL_CHECK(lp.kb_tiles > 0 && lp.lda / mma::kBK <= 2 * lp.kb_tiles,
               "moe_experts: the LoRA shrink takes at most two copies of the activations' K");
  moe_lora_shrink_mma<><<<grid, kLsThreads, 0, st>>>(lp);
  CUDA_CHECK_LAUNCH();
}

void launch_lora_ext_pack_kernel(const LoraExtPackParams& pp, cudaStream_t st) {
  const int64_t rows_per_block = kExtPackThreads / 32;
  const auto blocks = static_cast<unsigned>(
      std::clamp<int64_t>((pp.max_rows + rows_per_block - 1) / rows_per_block, 1, 8 * cuda_util::num_sms()));
  moe_lora_ext_pack<><<<blocks, kExtPackThreads, 0, st>>>(pp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda::moe_detail
