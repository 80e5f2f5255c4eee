// kernels/moe/moe_gemv_launch.cuh: the definitions of the small-batch MoE launchers declared in moe_launch.h
// whose kernels are compiled one group per file (moe_gemv_tm{1,2,4,8}_cuda.cu, moe_gemv_pipe{1,2}_cuda.cu,
// moe_gemv_tcreg_cuda.cu, moe_gemv_mxfp4_cuda.cu), each file instantiating its own. Included only by those.
// Must not: depend on anything above common/.
#pragma once

#include "kernels/moe/moe_launch.h"

namespace polylora::kernels::cuda::moe_detail {

template <Phase P, int TM>
void launch_gemv_tm(dim3 grid, const GemvParams& gp, cudaStream_t st) {
  if (!gp.base) {
    // LoRA shrink items alone, which may run beside a tensor-core product (moe_experts): the SMs' carveout
    // as that product's, so its CTAs (48 KiB of shared memory each) can join the SMs holding these (the
    // attribute is the kernel's: base launches of this instantiation get it too; they use no shared memory).
    static const bool carveout = [] {
      CUDA_CHECK(cudaFuncSetAttribute(moe_gemv_kernel<P, TM>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared));
      return true;
    }();
    (void)carveout;
  }
  cuda_util::launch_pdl(moe_gemv_kernel<P, TM>, grid, kGemvThreads, 0, st, gp);
  CUDA_CHECK_LAUNCH();
}

template <Phase P, int C>
void launch_gemv_pipe(dim3 grid, const GemvTcParams& tp, cudaStream_t st) {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(moe_gemv_pipe_kernel<P, C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    PipeCfg<C>::kSmemBytes));
    return true;
  }();
  (void)configured;
  cuda_util::launch_pdl(moe_gemv_pipe_kernel<P, C>, grid, kPipeThreads, PipeCfg<C>::kSmemBytes, st, tp);
  CUDA_CHECK_LAUNCH();
}

template <Phase P>
void launch_gemv_tc_reg(dim3 grid, const GemvTcParams& tp, cudaStream_t st) {
  cuda_util::launch_pdl(moe_gemv_tc_kernel<P>, grid, kTcThreads, 0, st, tp);
  CUDA_CHECK_LAUNCH();
}

template <Phase P, int NT, int C, int S>
void launch_gemv_mxfp4(dim3 grid, const GemvTcParams& tp, cudaStream_t st) {
  using Cfg = MxGemvCfg<NT, C, S>;
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(moe_gemv_mxfp4_kernel<P, NT, C, S>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    return true;
  }();
  (void)configured;
  cuda_util::launch_pdl(moe_gemv_mxfp4_kernel<P, NT, C, S>, grid, kMxThreads, Cfg::kSmemBytes, st, tp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda::moe_detail
