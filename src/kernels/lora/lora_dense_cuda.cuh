// kernels/lora/lora_dense_cuda.cuh: the slot-stacked dense LoRA kernels' parameters (lora_batch, a group of
// up to 3 modules over one input) shared by lora_cuda.cu (the CUDA-core shrinks and expand, the launches)
// and lora_dense_mma_cuda.cu (the BF16 shrink and expand on tensor cores, for prefill-sized steps). Only
// included from .cu files. Must not: depend on anything above common/.
#pragma once

#include <cstdint>

#include "kernels/cuda_util.cuh"
#include "kernels/lora/lora.h"

namespace polylora::kernels::cuda::lora_dense {

template <typename TW>
struct DenseParams {
  const float* x = nullptr;
  int64_t ldx = 0, m = 0, in = 0, slots = 0;
  const int32_t* token_slots = nullptr;
  int num = 1;
  const TW* a[kMaxLoraGroup] = {};
  const TW* b[kMaxLoraGroup] = {};
  const float* scale[kMaxLoraGroup] = {};
  int64_t rank[kMaxLoraGroup] = {}, out[kMaxLoraGroup] = {};
  float* y[kMaxLoraGroup] = {};
  int64_t ldy[kMaxLoraGroup] = {};
  int64_t first[kMaxLoraGroup + 1] = {};  // tmp column of each module's ranks; first[num]: the row width
  float* tmp = nullptr;                   // [splits][m][first[num]] partial sums
  int splits = 1;
  // Optional: x already rounded to bf16 (rows ldxb apart), which the tensor-core shrink then reads as its
  // one part instead of splitting x exactly into three (lora_shrink_partials' x_bf16).
  const __nv_bfloat16* xb = nullptr;
  int64_t ldxb = 0;
};

// The token's slot when any module has LoRA for it, else −1.
template <typename TW>
__device__ __forceinline__ int32_t dense_key(const DenseParams<TW>& p, int64_t t, int module) {
  if (t >= p.m) return -1;
  const int32_t s = p.token_slots[t];
  if (s < 0 || s >= p.slots) return -1;
  if (module >= 0) return p.scale[module][s] != 0.0f ? s : -1;
  for (int i = 0; i < p.num; ++i)
    if (p.scale[i][s] != 0.0f) return s;
  return -1;
}

// The tensor-core shrink's grid: token tiles × rank chunks × splits of the input, per_kt slices each.
struct DenseMmaShape {
  int splits = 1, chunks = 1, per_kt = 1;
};
DenseMmaShape dense_mma_shape(int64_t m, int64_t ranks, int64_t in);

// tmp[split][t][j] for the group's concatenated rank space (lora_dense_mma_cuda.cu dense_shrink_mma_kernel).
void launch_dense_shrink_mma(const DenseParams<__nv_bfloat16>& p, const DenseMmaShape& ms, cudaStream_t st);
// y[module][t] += scale · B · Σ_split tmp (lora_dense_mma_cuda.cu dense_expand_mma_kernel).
void launch_dense_expand_mma(const DenseParams<__nv_bfloat16>& p, cudaStream_t st);

}  // namespace polylora::kernels::cuda::lora_dense
