// kernels/cuda_context.h: what every CUDA kernel entry point takes besides its argument struct: the
// stream, the cuBLAS handle and a workspace (device scratch) sized by the caller. void* keeps CUDA headers
// out of host code; kernels/*_cuda.cu cast them to cudaStream_t / cublasHandle_t.
// Must not: include CUDA headers; depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace polylora::kernels {

struct CudaContext {
  void* stream = nullptr;     // cudaStream_t every launch of the call is queued on
  void* cublas = nullptr;     // cublasHandle_t bound to `stream`
  void* workspace = nullptr;  // device scratch of workspace_bytes, 256-byte aligned; not kept across calls
  size_t workspace_bytes = 0;
  // Products with BF16 weights of at most this many token rows feed each f32 activation to the tensor
  // cores as a pair of bf16 (hi = bf16(x), lo = bf16(x − hi); W·x = W·hi + W·lo with f32 accumulation),
  // so the only rounding left is the weights' own (activations keep ~16 mantissa bits instead of 8);
  // larger products round activations to one bf16 as Hugging Face's bf16 forward does. 0: never split.
  // See docs/design-changes.md ("Numerics of --dtype bfloat16").
  int64_t bf16_split_max_rows = kBf16SplitMaxRowsDefault;
  static constexpr int64_t kBf16SplitMaxRowsDefault = 1024;
  bool bf16_split(int64_t rows) const { return rows <= bf16_split_max_rows; }
  // Zeroed counters kept across calls (each kernel that takes some leaves them zero again): decode
  // attention's splits count themselves there when the last one merges them (tuning
  // attention_decode_fused_combine). nullptr / 0: none.
  int32_t* counters = nullptr;
  int64_t num_counters = 0;
  // A second stream of the same device and two events (cudaStream_t / cudaEvent_t, timing off) for work
  // that runs beside `stream`'s inside one call, forked from it and joined back to it before the call
  // returns (cuda_util::run_beside: a dense LoRA shrink beside its projection's cuBLAS GEMM, tuning
  // lora_shrink_beside_product). Inside a graph capture the two become parallel branches. nullptr: none.
  void* side_stream = nullptr;
  void* side_fork = nullptr;
  void* side_join = nullptr;
};

// Set while the calling thread queues the ops of a step with LoRA kernels and those launches should not use
// programmatic dependent launch (cuda_util::launch_pdl reads it; Backend::set_lora_step sets it).
inline bool& programmatic_launch_off() {
  static thread_local bool off = false;
  return off;
}

// Keeps programmatic dependent launch on for the launches queued in its scope, even in a LoRA step (the
// expert LoRA's delta kernel and the product that runs beside it need it: moe_experts' delta mode).
struct ProgrammaticLaunchOn {
  bool saved = programmatic_launch_off();
  ProgrammaticLaunchOn() { programmatic_launch_off() = false; }
  ~ProgrammaticLaunchOn() { programmatic_launch_off() = saved; }
  ProgrammaticLaunchOn(const ProgrammaticLaunchOn&) = delete;
  ProgrammaticLaunchOn& operator=(const ProgrammaticLaunchOn&) = delete;
};

}  // namespace polylora::kernels
