// kernels/moe/moe_gemv_pipe1_cuda.cu: the pipelined tensor-core MoE GEMV (moe_gemv_pipe.cuh) with 1
// activation copy, both phases (moe_gemv_launch.cuh; compiled apart, moe_launch.h).
// Must not: depend on anything above common/.
#include "kernels/moe/moe_gemv_launch.cuh"

namespace polylora::kernels::cuda::moe_detail {

template void launch_gemv_pipe<Phase::kGateUp, 1>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_pipe<Phase::kDown, 1>(dim3, const GemvTcParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
