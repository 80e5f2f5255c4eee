// kernels/lora/lora_cuda.cuh: the block-level LoRA row update shared by lora_cuda.cu and moe_cuda.cu.
// Only included from .cu files. Must not: depend on anything above common/.
#pragma once

#include "kernels/cuda_util.cuh"
#include "kernels/lora/lora.h"

namespace polylora::kernels::cuda_util {

constexpr int kLoraRankChunk = 128;

// y[o] += l.scale · Σ_r l.b[o, r] · (Σ_k l.a[r, k] · x[k]) for one row, computed by the whole block
// (blockDim.x a multiple of 32): shrink with one warp per rank into s_mid (kLoraRankChunk floats of
// shared memory), then expand with one thread per output; any rank, in chunks. Ends with a barrier.
__device__ inline void lora_row(const LoraView& l, const float* x, float* y, float* s_mid) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int64_t r0 = 0; r0 < l.rank; r0 += kLoraRankChunk) {
    int64_t rc = l.rank - r0 < kLoraRankChunk ? l.rank - r0 : kLoraRankChunk;
    for (int64_t r = warp; r < rc; r += warps) {
      const float* a = l.a + (r0 + r) * l.in;
      float acc = 0.0f;
      for (int64_t k = lane; k < l.in; k += 32) acc += a[k] * x[k];
      acc = warp_sum(acc);
      if (lane == 0) s_mid[r] = acc;
    }
    __syncthreads();
    for (int64_t o = threadIdx.x; o < l.out; o += blockDim.x) {
      const float* b = l.b + o * l.rank + r0;
      float acc = 0.0f;
      for (int64_t r = 0; r < rc; ++r) acc += b[r] * s_mid[r];
      y[o] += l.scale * acc;
    }
    __syncthreads();
  }
}

}  // namespace polylora::kernels::cuda_util
