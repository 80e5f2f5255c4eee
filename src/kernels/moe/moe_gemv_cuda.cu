// kernels/moe/moe_gemv_cuda.cu: the dispatch of the MoE small-batch products (moe_launch.h) to their
// launchers, whose kernels compile in files of their own (moe_gemv_launch.cuh): the fp32 GEMV by pass width
// (moe_gemv_tm{1,2,4,8}_cuda.cu), the tensor-core GEMVs for bf16 (pipelined: moe_gemv_pipe{1,2}_cuda.cu,
// register-streaming: moe_gemv_tcreg_cuda.cu) and for MXFP4 experts (moe_gemv_mxfp4_cuda.cu). Must not:
// depend on anything above common/.
#include "kernels/moe/moe_launch.h"
#include "kernels/tuning.h"

namespace polylora::kernels::cuda::moe_detail {
namespace {

// KernelTuning::moe_gemv_pipe 0 (POLYLORA_MOE_GEMV_PIPE=0): the register-streaming moe_gemv_tc_kernel
// instead of the cp.async pipeline (moe_gemv_pipe.cuh), for A/B timing; on by default.
bool gemv_pipe_enabled() {
  return kernel_tuning(TuningShape{}).moe_gemv_pipe != 0;
}

}  // namespace

template <Phase P>
void launch_gemv(int64_t m, dim3 grid, const GemvParams& gp, cudaStream_t st) {
  if (m <= 1) {
    launch_gemv_tm<P, 1>(grid, gp, st);
  } else if (m == 2) {
    launch_gemv_tm<P, 2>(grid, gp, st);
  } else if (m <= 4) {
    launch_gemv_tm<P, 4>(grid, gp, st);
  } else {
    launch_gemv_tm<P, 8>(grid, gp, st);
  }
}

bool gemv_tc_writes_act(bool mxfp4) {
  return mxfp4 || gemv_pipe_enabled();
}

template <Phase P>
void launch_gemv_tc(dim3 grid, const GemvTcParams& tp, bool mxfp4, int64_t m, cudaStream_t st) {
  if (mxfp4) {
    if (m <= 8 && tp.mx_stages >= 4) {
      tp.split ? launch_gemv_mxfp4<P, 1, 2, 4>(grid, tp, st) : launch_gemv_mxfp4<P, 1, 1, 4>(grid, tp, st);
    } else if (m <= 8 && tp.mx_stages == 3) {
      tp.split ? launch_gemv_mxfp4<P, 1, 2, 3>(grid, tp, st) : launch_gemv_mxfp4<P, 1, 1, 3>(grid, tp, st);
    } else if (m <= 8) {
      tp.split ? launch_gemv_mxfp4<P, 1, 2, 2>(grid, tp, st) : launch_gemv_mxfp4<P, 1, 1, 2>(grid, tp, st);
    } else {
      tp.split ? launch_gemv_mxfp4<P, 2, 2, 2>(grid, tp, st) : launch_gemv_mxfp4<P, 2, 1, 2>(grid, tp, st);
    }
  } else if (!gemv_pipe_enabled()) {
    launch_gemv_tc_reg<P>(grid, tp, st);
  } else if (tp.split) {
    launch_gemv_pipe<P, 2>(grid, tp, st);
  } else {
    launch_gemv_pipe<P, 1>(grid, tp, st);
  }
}

template void launch_gemv<Phase::kGateUp>(int64_t, dim3, const GemvParams&, cudaStream_t);
template void launch_gemv<Phase::kDown>(int64_t, dim3, const GemvParams&, cudaStream_t);
template void launch_gemv_tc<Phase::kGateUp>(dim3, const GemvTcParams&, bool, int64_t, cudaStream_t);
template void launch_gemv_tc<Phase::kDown>(dim3, const GemvTcParams&, bool, int64_t, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
