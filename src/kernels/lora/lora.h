// kernels/lora/lora.h: unmerged LoRA on selected rows: y[row] += scale · B · (A · x[row]).
// shrink (x·Aᵀ, [rows, rank]) then expand (·Bᵀ added into y). The rows are those tokens of the batch
// whose sequence uses this adapter (tokens of other adapters, or none, cost nothing here).
// Must not: know about adapters, files or models; depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"

namespace polylora::kernels {

struct LoraView {
  const float* a = nullptr;  // [rank, in]
  const float* b = nullptr;  // [out, rank]
  int64_t rank = 0;
  int64_t in = 0;
  int64_t out = 0;
  float scale = 1.0f;
  bool empty() const { return a == nullptr; }
};

struct LoraApplyArgs {
  const float* x = nullptr;  // [*, in], row stride ldx
  int64_t ldx = 0;
  float* y = nullptr;  // [*, out], row stride ldy (added into)
  int64_t ldy = 0;
  const int32_t* rows = nullptr;  // [num_rows] row indices into x and y; nullptr: rows 0..num_rows−1
  int64_t num_rows = 0;
  LoraView lora;
};

namespace ref {
void lora_apply(const LoraApplyArgs& args);
}
namespace cpu {
void lora_apply(const LoraApplyArgs& args);
}
namespace cuda {
// Views (a, b) and rows in device memory; any rank.
void lora_apply(const LoraApplyArgs& args, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
