// tests/gpu/lora_stack_gpu_util.h: what the slot-stacked LoRA GPU tests (lora_stack_gpu_test.cc, dense;
// moe_lora_stack_gpu_test.cc, experts) share: their stacks' bits copied to the device.
#pragma once

#include "gpu_test_util.h"
#include "kernels/lora_stack_util.h"

namespace polylora::gpu_test {

// A stack tensor's bits in device memory.
inline const void* up_stack(Arena& ar, const kernels::test::StackBuffer& b) {
  if (b.dtype == DType::kBF16) return ar.up(b.bf16);
  return ar.up(b.f32);
}

// A dense stack's view with its A, B and scales in device memory.
inline kernels::LoraStack up_dense_stack(Arena& ar, const kernels::test::DenseStack& s) {
  kernels::LoraStack w = s.stack();
  w.a = up_stack(ar, s.a);
  w.b = up_stack(ar, s.b);
  w.scale = ar.up(s.scale);
  return w;
}

}  // namespace polylora::gpu_test
