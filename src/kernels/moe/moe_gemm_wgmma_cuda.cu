// kernels/moe/moe_gemm_wgmma_cuda.cu: the launchers of the Hopper warpgroup-MMA grouped GEMM
// (moe_gemm_wgmma.cuh; moe_launch.h), compiled apart from moe_cuda.cu and moe_gemm_cuda.cu.
// Must not: depend on anything above common/.
#include <climits>

#include "kernels/moe/moe_launch.h"

namespace polylora::kernels::cuda::moe_detail {
namespace {

template <Phase P, int BN, int LORA, bool MX = false>
void launch_wg(const WgmmaParams& wp, cudaStream_t st) {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(moe_gemm_wgmma<P, BN, LORA, MX>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, WgCfg<BN, MX>::kSmemBytes));
    return true;
  }();
  (void)configured;
  // The column tiles in this kernel's BN (the caller's bn is a preference: LoRA and MXFP4 take 128).
  WgmmaParams w = wp;
  const int64_t N = P == Phase::kGateUp ? 2 * wp.mp.inter : wp.mp.hidden;
  w.col_tiles = (N + BN - 1) / BN;
  const int64_t ctas = w.max_tiles * w.col_tiles;
  KERNEL_CHECK(ctas > 0 && ctas <= INT_MAX, "moe_experts: grouped GEMM grid too large");
  moe_gemm_wgmma<P, BN, LORA, MX>
      <<<static_cast<unsigned>(ctas), kWgThreads, WgCfg<BN, MX>::kSmemBytes, st>>>(w);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool wgmma_supported() {
  static const bool v = [] {
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
           major == 9 && minor == 0;
  }();
  return v;
}

template <Phase P>
void launch_wgmma_tile(int bn, const WgmmaParams& wp, cudaStream_t st) {
  KERNEL_CHECK(wp.mp.kb_tiles % 2 == 0 && wp.mp.lda % kWgBK == 0,
               "moe_experts: the warpgroup-MMA GEMM needs activation rows padded to 64 columns");
  KERNEL_CHECK(wp.mp.lda / kWgBK <= wp.mp.kb_tiles,
               "moe_experts: the warpgroup-MMA GEMM takes at most two copies of the activations' K");
  const bool lora = wp.mp.lora.b != nullptr, ext = lora && wp.lora_ext != nullptr;
  if (ext)
    KERNEL_CHECK(
        wp.ext_w > 0 && wp.ext_w % kWgBK == 0 && wp.ext_w >= 2 * wp.mp.lora.GR && wp.mp.lora.R % 8 == 0 &&
            (reinterpret_cast<uintptr_t>(wp.mp.lora.b) & 15) == 0,
        "moe_experts: the LoRA K-extension needs ranks that are multiples of 8 and aligned B stacks");
  if (wp.mp.mx_nb > 0) {  // MXFP4 weights: 128 columns
    if (ext) {
      launch_wg<P, 128, 2, true>(wp, st);
    } else if (lora) {
      launch_wg<P, 128, 1, true>(wp, st);
    } else {
      launch_wg<P, 128, 0, true>(wp, st);
    }
  } else if (ext) {
    launch_wg<P, 128, 2>(wp, st);  // (128 columns: the compiled LoRA variants)
  } else if (lora) {
    launch_wg<P, 128, 1>(wp, st);  // the LoRA epilogue's per-column pointers: 128 columns
  } else if (bn == 128) {
    launch_wg<P, 128, 0>(wp, st);
  } else {
    launch_wg<P, 256, 0>(wp, st);
  }
}

template void launch_wgmma_tile<Phase::kGateUp>(int, const WgmmaParams&, cudaStream_t);
template void launch_wgmma_tile<Phase::kDown>(int, const WgmmaParams&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_detail
