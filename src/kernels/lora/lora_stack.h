// kernels/lora/lora_stack.h: host-side helpers over slot-stacked LoRA tensors (lora.h, moe.h) shared by
// the reference and CPU kernels: element access in the stack's dtype, and a slot's matrices as a plain
// LoraView when the stack is F32 (no copy).
// Must not: depend on anything above common/.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/lora/lora.h"

namespace polylora::kernels {

// Element i of an F32 or BF16 stack tensor as f32.
inline float stack_at(const void* base, DType dtype, int64_t i) {
  return dtype == DType::kBF16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[i])
                               : static_cast<const float*>(base)[i];
}

// Slot s of an F32 dense stack as a view (empty when the slot has no LoRA there).
inline LoraView stack_view(const LoraStack& w, int32_t s) {
  if (w.empty() || s < 0 || s >= w.slots || w.scale[s] == 0.0f || w.rank == 0) return {};
  return {static_cast<const float*>(w.a) + s * w.rank * w.in, static_cast<const float*>(w.b) + s * w.out * w.rank,
          w.rank, w.in, w.out, w.scale[s]};
}

}  // namespace polylora::kernels
