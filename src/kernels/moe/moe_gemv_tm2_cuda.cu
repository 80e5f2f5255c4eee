// kernels/moe/moe_gemv_tm2_cuda.cu: the fp32 MoE GEMV's kernels with passes of 2 routed row(s), both phases
// (moe_gemv_launch.cuh; a file per pass width so they compile in parallel). Must not: depend on anything
// above common/.
#include "kernels/moe/moe_gemv_launch.cuh"

namespace polylora::kernels::cuda::moe_detail {

template void launch_gemv_tm<Phase::kGateUp, 2>(dim3, const GemvParams&, cudaStream_t);
template void launch_gemv_tm<Phase::kDown, 2>(dim3, const GemvParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
