// kernels/moe/moe_lora_stack_impl.cuh: what the slot-stacked expert LoRA's kernel files share (internal to
// moe_lora_stack_cuda.cu, the dispatcher with the expand-fused activation and combine;
// moe_lora_shrink_cuda.cu, the shrinks; moe_lora_delta_cuda.cu, delta mode): the kernels' parameters
// (StackParams), the row key and slice helpers, and each file's launcher of one step. moe_lora_stack.cuh is
// the interface the expert paths call. Must not: allocate; synchronize; be included outside those three
// files.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/lora/lora_stack_cuda.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/moe/moe_lora_stack.cuh"

namespace polylora::kernels::cuda::moe_stack {

using moe_detail::gemv_shrink;
using moe_detail::kMaxTopKLora;
using moe_detail::moe_gemv_blocks;
using moe_detail::Phase;
using moe_detail::shrink_items;
using moe_detail::shrink_params;
using moe_detail::StackBuffers;
using moe_detail::StackStep;
using moe_detail::tuning_of;

namespace ls = lora_stack;

template <typename TW>
struct StackParams {
  const int32_t* sorted = nullptr;
  const int32_t* num_tiles = nullptr;
  int tile_m = 1;
  int64_t max_rows = 0;
  const int32_t* ids = nullptr;
  const int32_t* token_slots = nullptr;
  int64_t top_k = 0, E = 0, H = 0, I = 0, slots = 0, R = 0;
  int gu_slices = 1;
  bool interleaved = false;
  const TW* a_gu = nullptr;
  const TW* b_gu = nullptr;
  const TW* a_down = nullptr;
  const TW* b_down = nullptr;
  const float* scale = nullptr;        // [slots, E, 3]
  int gu_splits = 1, down_splits = 1;  // partial sums of the shrinks (split-K)
  int64_t gu_stride = 0, down_stride = 0;
};

// Sorted rows below the device-side count.
template <typename TW>
__device__ __forceinline__ int64_t stack_rows(const StackParams<TW>& p) {
  const int64_t rows = static_cast<int64_t>(*p.num_tiles) * p.tile_m;
  return rows < p.max_rows ? rows : p.max_rows;
}

// The key (slot · E + expert) of a pair when its token has an adapter with LoRA on this expert in one of
// the scale columns [c0, c1), else −1.
template <typename TW>
__device__ __forceinline__ int32_t stack_key(const StackParams<TW>& p, int32_t pair, int c0, int c1) {
  const int32_t e = p.ids[pair];
  if (e < 0 || e >= p.E) return -1;
  return moe_detail::lora_row_key(pair, e, p.token_slots, p.top_k, p.slots, p.E, p.scale, c0, c1 - c0);
}

// The LoRA slice of output column n of a phase: 0 on down and with one gate/up slice; else the gate (0) or
// up (1) slice, interleaved (GPT-OSS: n & 1) or gate rows then up rows.
template <typename TW>
__device__ __forceinline__ int lora_slice(const StackParams<TW>& p, int64_t n, bool down) {
  return down || p.gu_slices == 1 ? 0 : (p.interleaved ? static_cast<int>(n & 1) : (n >= p.I ? 1 : 0));
}

// The (slot, expert) key of sorted row r for a phase (gate/up: scale columns [0, gu_slices), down: 2), −1
// without LoRA there, −2 where the row holds no pair (delta mode's and the group kernels' groups).
template <typename TW>
__device__ __forceinline__ int32_t delta_key(const StackParams<TW>& p, int64_t r, bool down) {
  const int32_t pair = p.sorted[r];
  if (pair < 0) return -2;
  return down ? stack_key(p, pair, 2, 3) : stack_key(p, pair, 0, p.gu_slices);
}

// The SMs' shared-memory carveout preference of a kernel that may run beside a tensor-core product (the
// expert LoRA's delta kernel and shrinks: moe_experts), set once: the product's.
template <typename Kernel>
void prefer_max_shared(Kernel kernel) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
}

// The most rows a group kernel's CTA takes (the group shrink, moe_lora_shrink_cuda.cu, and the group
// activation, moe_lora_stack_cuda.cu).
constexpr int kSgMaxGroup = 8;

// Do the shrinks run by sorted row (moe_lora_shrink_cuda.cu)? Also decides the split-K of the tiled ones.
bool row_shrink(const KernelTuning& t, const StackBuffers& b);

// StackStep::kShrinkGateUp / kShrinkDown (down): the shrink in the kernel the path and size call for
// (moe_lora_shrink_cuda.cu).
template <typename TW>
void launch_shrink_step(bool down, const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                        const KernelTuning& t, cudaStream_t st);

// StackStep::kDeltaGateUp / kDeltaDown (down): the phase's whole LoRA beside its base product
// (moe_lora_delta_cuda.cu).
template <typename TW>
void launch_delta_step(bool down, const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                       const KernelTuning& t, cudaStream_t st);

}  // namespace polylora::kernels::cuda::moe_stack
