// kernels/moe/moe_cuda_common.cuh: what moe_cuda.cu's GEMM and GEMV kernels share: the phase (gate_up or
// down) and, per phase, an expert's weight row pointer, weight dtype, row scale (INT8) and bias. Only
// included from moe_cuda.cu, moe_launch.h and the kernel headers. Must not: depend on anything above common/.
#pragma once

#include "kernels/cuda_util.cuh"
#include "kernels/moe/moe.h"

namespace polylora::kernels::cuda::moe_detail {

enum class Phase { kGateUp, kDown };

// Row n of the phase's weight ([2I, H] gate_up, or gate rows then up rows; [H, I] down), K = row length.
template <Phase P>
__device__ __forceinline__ const char* weight_row(const ExpertView& ex, int64_t n, int64_t K, int64_t I) {
  if (P == Phase::kDown) return static_cast<const char*>(ex.down.data) + n * K * dtype_size(ex.down.dtype);
  if (ex.gate_up.data != nullptr)
    return static_cast<const char*>(ex.gate_up.data) + n * K * dtype_size(ex.gate_up.dtype);
  if (n < I) return static_cast<const char*>(ex.gate.data) + n * K * dtype_size(ex.gate.dtype);
  return static_cast<const char*>(ex.up.data) + (n - I) * K * dtype_size(ex.up.dtype);
}

// MXFP4 (dtype kU8, tensor_view.h): row n of the phase's weight as its codes (K / 2 bytes) and scales
// (K / 32 bytes).
template <Phase P>
__device__ __forceinline__ void mxfp4_row(const ExpertView& ex, int64_t n, int64_t K, int64_t I,
                                          const uint8_t*& codes, const uint8_t*& scales) {
  const bool split = P == Phase::kGateUp && ex.gate_up.data == nullptr;  // gate rows then up rows
  const WeightView& w = P == Phase::kDown ? ex.down : (!split ? ex.gate_up : (n < I ? ex.gate : ex.up));
  const int64_t r = split && n >= I ? n - I : n;
  codes = static_cast<const uint8_t*>(w.data) + r * (K / 2);
  scales = w.scales + r * (K / kMxfp4BlockSize);
}

template <Phase P>
__device__ __forceinline__ DType weight_dtype(const ExpertView& ex) {
  return P == Phase::kDown ? ex.down.dtype : (ex.gate_up.data != nullptr ? ex.gate_up.dtype : ex.gate.dtype);
}

// The scale of row n of the phase's weight: INT8 views' row_scales (tensor_view.h), 1 otherwise.
template <Phase P>
__device__ __forceinline__ float weight_row_scale(const ExpertView& ex, int64_t n, int64_t I) {
  const bool split = P == Phase::kGateUp && ex.gate_up.data == nullptr;  // gate rows then up rows
  const WeightView& w = P == Phase::kDown ? ex.down : (!split ? ex.gate_up : (n < I ? ex.gate : ex.up));
  if (w.dtype != DType::kI8) return 1.0f;
  return w.row_scales[split && n >= I ? n - I : n];
}

// Are all of the phase's weight matrices `bytes`-aligned (a power of two) with rows of a multiple of
// `bytes`? (weight_rows_aligned16 below is the 16-byte case.)
template <Phase P>
__device__ __forceinline__ bool weight_rows_aligned(const ExpertView& ex, int64_t K, int64_t bytes) {
  const auto mask = static_cast<uintptr_t>(bytes - 1);
  auto ok = [&](const WeightView& w) {
    return w.data == nullptr || ((reinterpret_cast<uintptr_t>(w.data) & mask) == 0 &&
                                 (K * static_cast<int64_t>(dtype_size(w.dtype))) % bytes == 0);
  };
  if (P == Phase::kDown) return ok(ex.down);
  return ok(ex.gate_up) && ok(ex.gate) && ok(ex.up);
}

template <Phase P>
__device__ __forceinline__ const float* weight_bias(const ExpertView& ex) {
  return P == Phase::kDown ? ex.down_bias : (ex.gate_up.data != nullptr ? ex.gate_up_bias : nullptr);
}

// Are all of the phase's weight matrices 16-byte aligned with rows of a multiple of 16 bytes?
template <Phase P>
__device__ __forceinline__ bool weight_rows_aligned16(const ExpertView& ex, int64_t K) {
  auto ok = [&](const WeightView& w) {
    return w.data == nullptr ||
           ((reinterpret_cast<uintptr_t>(w.data) & 15) == 0 && (K * dtype_size(w.dtype)) % 16 == 0);
  };
  if (P == Phase::kDown) return ok(ex.down);
  return ok(ex.gate_up) && ok(ex.gate) && ok(ex.up);
}

// The weights' K slice of activation slice kt when the activation rows hold one or two copies of K (the bf16
// hi + lo split) of kb slices each: kt % kb for kt < 2 · kb (the launchers check that bound) without an
// integer division by a runtime value in every slice of a K loop (measured: +17% MXFP4 prefill, session 55).
__device__ __forceinline__ int weight_k_slice(int kt, int kb) {
  return kt < kb ? kt : kt - kb;
}

// Columns n and n + 1 (n even) of an f32 output row of N columns, plus the bias when there is one (only n
// when n + 1 == N; a float2 store when N is even).
__device__ __forceinline__ void store_out_pair(float* orow, int64_t n, int64_t N, float v0, float v1,
                                               const float* bias) {
  if (n + 1 < N) {
    if (bias != nullptr) {
      v0 += bias[n];
      v1 += bias[n + 1];
    }
    if ((N & 1) == 0) {
      *reinterpret_cast<float2*>(orow + n) = make_float2(v0, v1);
    } else {
      orow[n] = v0;
      orow[n + 1] = v1;
    }
  } else if (n < N) {
    orow[n] = v0 + (bias != nullptr ? bias[n] : 0.0f);
  }
}

// The expert activation of one output from its gate and up values (gate/up rows are interleaved for
// GPT-OSS's clamped SwiGLU, gate rows then up rows otherwise: the caller picks them).
__device__ __forceinline__ float expert_act(ExpertAct kind, float gate, float up, float alpha, float limit) {
  if (kind == ExpertAct::kSiluGate) return gate / (1.0f + expf(-gate)) * up;
  const float x = fminf(gate, limit);
  const float u = fminf(fmaxf(up, -limit), limit);
  return (u + 1.0f) * (x * (1.0f / (1.0f + expf(-x * alpha))));
}

}  // namespace polylora::kernels::cuda::moe_detail
