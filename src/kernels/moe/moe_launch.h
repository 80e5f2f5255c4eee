// kernels/moe/moe_launch.h: the launchers of moe_cuda.cu's heavy kernel templates, each compiled in a file of
// its own so they build in parallel (moe_cuda.cu alone took ~9 minutes of nvcc on the 2-core machine and
// most of a GPU-machine build): moe_gemv_cuda.cu dispatches the small-batch products to the files below,
// moe_gemm_cuda.cu holds the tensor-core grouped GEMM and the expert LoRA's tensor-core shrink, and
// moe_gemm_wgmma_cuda.cu the Hopper warpgroup-MMA grouped GEMM.
// moe_cuda.cu chooses the path, sorts, sizes the grids and calls these. Included from .cu files only. Must
// not: depend on anything above common/.
#pragma once

#include "kernels/moe/moe_gemm_mma.cuh"
#include "kernels/moe/moe_gemm_wgmma.cuh"
#include "kernels/moe/moe_gemv.cuh"
#include "kernels/moe/moe_gemv_mma.cuh"
#include "kernels/moe/moe_gemv_mxfp4.cuh"
#include "kernels/moe/moe_gemv_pipe.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int64_t kMmaMaxSmem = 200 * 1024;  // the grouped GEMM's dynamic shared memory limit (MXFP4 scales)

// moe_gemv_cuda.cu. The fp32 small-batch product of one phase, built for passes of the fewest routed rows
// (1, 2, 4, 8) that hold the m tokens (an expert has at most m of them).
template <Phase P>
void launch_gemv(int64_t m, dim3 grid, const GemvParams& gp, cudaStream_t st);
// The tensor-core small-batch product of one phase: for MXFP4 experts the decoding kernel (passes of 8
// routed rows when no expert can have more, i.e. m <= 8, else 16); else the pipelined kernel (C = copies of
// each activation row), or the register-streaming one (POLYLORA_MOE_GEMV_PIPE=0).
template <Phase P>
void launch_gemv_tc(dim3 grid, const GemvTcParams& tp, bool mxfp4, int64_t m, cudaStream_t st);
// Whether launch_gemv_tc's kernel for these experts honours GemvTcParams::act_out (the pipelined ones;
// not the register-streaming one that POLYLORA_MOE_GEMV_PIPE=0 selects for BF16 experts).
bool gemv_tc_writes_act(bool mxfp4);

// Their parts, defined in moe_gemv_launch.cuh and compiled one group per file (these kernels were most of
// the MoE build time): the fp32 GEMV of one pass width (moe_gemv_tm<TM>_cuda.cu), the pipelined tensor-core
// GEMV (moe_gemv_pipe<C>_cuda.cu), the register-streaming one (moe_gemv_tcreg_cuda.cu), the MXFP4 one
// (moe_gemv_mxfp4_cuda.cu, deeper pipelines moe_gemv_mxfp4_deep_cuda.cu).
template <Phase P, int TM>
void launch_gemv_tm(dim3 grid, const GemvParams& gp, cudaStream_t st);
template <Phase P, int C>
void launch_gemv_pipe(dim3 grid, const GemvTcParams& tp, cudaStream_t st);
template <Phase P>
void launch_gemv_tc_reg(dim3 grid, const GemvTcParams& tp, cudaStream_t st);
template <Phase P, int NT, int C, int S>  // S: pipeline stages (3 and 4: moe_gemv_mxfp4_deep_cuda.cu)
void launch_gemv_mxfp4(dim3 grid, const GemvTcParams& tp, cudaStream_t st);

// moe_gemm_cuda.cu. The grouped GEMM of one phase with row tiles of tile_m (64 or 128).
template <Phase P>
void launch_mma_tile(int tile_m, dim3 grid, const MmaParams& mp, cudaStream_t st);
// moe_gemm_wgmma_cuda.cu. The Hopper warpgroup-MMA grouped GEMM of one phase (128-row tiles, bn 128 or 256
// output columns per CTA, 128 with the LoRA epilogue; BF16/F16 weights), and whether this device can run it
// (compute capability 9.0: the kernels are built for sm_90a).
template <Phase P>
void launch_wgmma_tile(int bn, const WgmmaParams& wp, cudaStream_t st);
bool wgmma_supported();
// The expert LoRA's tensor-core shrink (moe_lora_mma.cuh) on kLsThreads threads.
void launch_lora_shrink_mma_kernel(dim3 grid, const LoraShrinkMmaParams& lp, cudaStream_t st);
// The rows' K-extensions of the warpgroup-MMA GEMM's LoRA slices (moe_lora_mma.cuh moe_lora_ext_pack).
void launch_lora_ext_pack_kernel(const LoraExtPackParams& pp, cudaStream_t st);

}  // namespace polylora::kernels::cuda::moe_detail
