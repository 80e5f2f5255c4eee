// kernels/moe/moe_gemv_mxfp4_cuda.cu: the tensor-core MoE GEMV for MXFP4 experts (moe_gemv_mxfp4.cuh),
// passes of 8 or 16 routed rows, 1 or 2 activation copies, both phases (moe_gemv_launch.cuh; compiled
// apart, moe_launch.h). Must not: depend on anything above common/.
#include "kernels/moe/moe_gemv_launch.cuh"

namespace polylora::kernels::cuda::moe_detail {

template void launch_gemv_mxfp4<Phase::kGateUp, 1, 1, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kGateUp, 1, 2, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kGateUp, 2, 1, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kGateUp, 2, 2, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 1, 1, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 1, 2, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 2, 1, 2>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 2, 2, 2>(dim3, const GemvTcParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
