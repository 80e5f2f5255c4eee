// kernels/moe/moe_lora_stack.cuh: the interface between moe_cuda.cu (the expert paths: sorting, the
// products, the plain activation and combine) and moe_lora_stack_cuda.cu (the slot-stacked expert LoRA over
// a path's sorted rows). Included from those two files only. Must not: depend on anything above common/.
#pragma once

#include "kernels/moe/moe_launch.h"
#include "kernels/tuning.h"

namespace polylora::kernels::cuda::moe_detail {

// The tuned bounds of a call's expert shape (kernels/tuning.h: data files per device, env overrides).
inline KernelTuning tuning_of(const MoeExpertsArgs& a) {
  return kernel_tuning({.hidden = a.hidden, .inter = a.inter, .experts = a.num_experts});
}

// The largest top_k the slot-stacked expert LoRA takes (the combine stages a token's pairs in shared memory).
constexpr int kMaxTopKLora = 32;

// Slot-stacked expert LoRA (MoeLoraStack) over a path's sorted rows, defined in moe_lora_stack_cuda.cu and
// used by every expert path of moe_cuda.cu: shrink of gate/up, the activation with the gate/up
// expand fused in, shrink of down, and the combine with the down expand fused in. Or, on the tensor-core
// weight-streaming path at small batches (delta mode, tuning moe_lora_delta_rows), each phase's whole LoRA
// (shrink and expand) as one kernel launched just before the base product and running beside it
// (moe_lora_delta_kernel, GemvTcParams::defer_wait), its sums added by the plain activation and combine.
enum class StackStep { kShrinkGateUp, kActivation, kShrinkDown, kCombine, kDeltaGateUp, kDeltaDown };
struct StackBuffers {
  const int32_t* sorted = nullptr;     // [max_rows] pair of each sorted row, or −1
  const int32_t* num_tiles = nullptr;  // device: rows in use = num_tiles · tile_m (capped by max_rows)
  int tile_m = 1;
  int64_t max_rows = 0;
  const float* gu = nullptr;          // [max_rows, 2I] gate/up products by sorted row
  float* act = nullptr;               // [max_rows, I] activation (f32, written)
  __nv_bfloat16* act_bf16 = nullptr;  // [max_rows, copies·lda_bf16] or nullptr
  int64_t lda_bf16 = 0, copies = 1;
  const float* y = nullptr;    // [pairs, H] down products by pair
  float* lora_gu = nullptr;    // [gu splits][max_rows, gu_slices·rank] partial sums
  float* lora_down = nullptr;  // [down splits][pairs, rank]
  bool shrinks_fused = false;  // the path's products computed the shrinks (the steps skip them)
  // Delta mode: the phases' LoRA outputs (scale · B · A · in), written by kDeltaGateUp / kDeltaDown, added
  // by kActivation / kCombine (which then run the plain kernels); nullptr otherwise.
  float* dgu = nullptr;  // [max_rows, 2I] by sorted row
  float* dy = nullptr;   // [pairs, H] by pair
};
void stack_lora_step(StackStep step, const MoeExpertsArgs& a, const StackBuffers& b, cudaStream_t st);
// Split-K of the two shrinks for a path with `max_rows` sorted rows, and the floats of lora_gu and
// lora_down it takes.
struct StackSplits {
  int gu = 1, down = 1;
  size_t gu_floats = 0, down_floats = 0;
};
StackSplits stack_splits(const MoeExpertsArgs& a, int64_t max_rows);

// moe_lora_stack_cuda.cu. Do the shrinks of a tile_m 1 path with these rows ride as weight-streaming items
// (LoraShrinkItems, fused into the products or a launch of their own)? The items and the GEMV parameters of
// a shrink alone, for phase P (explicitly instantiated for both phases).
bool gemv_shrink(const MoeExpertsArgs& a, const StackBuffers& b);
template <Phase P>
LoraShrinkItems shrink_items(const MoeExpertsArgs& a, const StackBuffers& b);
template <Phase P>
GemvParams shrink_params(const MoeExpertsArgs& a, const StackBuffers& b);

// moe_steps_cuda.cu. The fp32 small-batch product's grid for max_items items; the plain activation over a
// path's sorted rows (gu_delta, or nullptr, added to gu first) and the plain weighted combine (y_delta, or
// nullptr, added to y first), which delta mode's steps run after its sums.
unsigned moe_gemv_blocks(int64_t max_items);
void launch_expert_act(const int32_t* sorted, const int32_t* num_tiles, int tile_m, int64_t max_rows,
                       const float* gu, const float* gu_delta, float* act, __nv_bfloat16* act_bf16,
                       int64_t lda_bf16, int64_t copies, const MoeExpertsArgs& a, cudaStream_t st);
void launch_expert_combine(const MoeExpertsArgs& a, const float* y, const float* y_delta, cudaStream_t st);

}  // namespace polylora::kernels::cuda::moe_detail
