// kernels/moe/moe_gemv_pipe2_cuda.cu: the pipelined tensor-core MoE GEMV (moe_gemv_pipe.cuh) with 2
// activation copies (hi + lo), both phases (moe_gemv_launch.cuh; compiled apart, moe_launch.h).
// Must not: depend on anything above common/.
#include "kernels/moe/moe_gemv_launch.cuh"

namespace polylora::kernels::cuda::moe_detail {

template void launch_gemv_pipe<Phase::kGateUp, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_pipe<Phase::kDown, 2>(dim3, const GemvTcParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
