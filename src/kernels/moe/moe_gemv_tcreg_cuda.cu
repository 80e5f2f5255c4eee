// kernels/moe/moe_gemv_tcreg_cuda.cu: the register-streaming tensor-core MoE GEMV (moe_gemv_mma.cuh;
// POLYLORA_MOE_GEMV_PIPE=0), both phases (moe_gemv_launch.cuh; compiled apart, moe_launch.h). Must not:
// depend on anything above common/.
#include "kernels/moe/moe_gemv_launch.cuh"

namespace polylora::kernels::cuda::moe_detail {

template void launch_gemv_tc_reg<Phase::kGateUp>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_tc_reg<Phase::kDown>(dim3, const GemvTcParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
