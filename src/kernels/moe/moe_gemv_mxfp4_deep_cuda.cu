// kernels/moe/moe_gemv_mxfp4_deep_cuda.cu: the tensor-core MoE GEMV for MXFP4 experts (moe_gemv_mxfp4.cuh)
// with deeper cp.async pipelines (3 and 4 stages), passes of 8 routed rows (the decode sizes), 1 or 2
// activation copies, both phases (KernelTuning::moe_gemv_mxfp4_stages; compiled apart from the two-stage
// instances, moe_gemv_mxfp4_cuda.cu). Must not: depend on anything above common/.
#include "kernels/moe/moe_gemv_launch.cuh"

namespace polylora::kernels::cuda::moe_detail {

template void launch_gemv_mxfp4<Phase::kGateUp, 1, 1, 3>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kGateUp, 1, 2, 3>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 1, 1, 3>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 1, 2, 3>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kGateUp, 1, 1, 4>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kGateUp, 1, 2, 4>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 1, 1, 4>(dim3, const GemvTcParams&, cudaStream_t);
template void launch_gemv_mxfp4<Phase::kDown, 1, 2, 4>(dim3, const GemvTcParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
