// kernels/cuda_context.h: what every CUDA kernel entry point takes besides its argument struct: the
// stream, the cuBLAS handle and a workspace (device scratch) sized by the caller. void* keeps CUDA headers
// out of host code; kernels/*_cuda.cu cast them to cudaStream_t / cublasHandle_t.
// Must not: include CUDA headers; depend on anything above common/.
#pragma once

#include <cstddef>

namespace polylora::kernels {

struct CudaContext {
  void* stream = nullptr;     // cudaStream_t every launch of the call is queued on
  void* cublas = nullptr;     // cublasHandle_t bound to `stream`
  void* workspace = nullptr;  // device scratch of workspace_bytes, 256-byte aligned; not kept across calls
  size_t workspace_bytes = 0;
  // Products with BF16 weights: true feeds each f32 activation to the tensor cores as a pair of bf16
  // (hi = bf16(x), lo = bf16(x − hi); W·x = W·hi + W·lo with f32 accumulation), so the only rounding left is
  // the weights' own (activations keep ~16 mantissa bits instead of 8); false rounds activations to one
  // bf16 as Hugging Face's bf16 forward does. See docs/design-changes.md ("bf16 numerics").
  bool bf16_split = true;
};

}  // namespace polylora::kernels
