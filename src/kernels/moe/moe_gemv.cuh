// kernels/moe/moe_gemv.cuh: the small-batch MoE product (few token-expert pairs, e.g. decode at batch 1-8): a
// GEMV-style kernel built to run at the memory bandwidth. Persistent warps (moe_gemv_kernel) take (active
// expert, row pair) items of the device-side sort in turn; for each, the warp streams its kGemvR (2) weight
// rows once with 128-bit loads, gemv_u loads per row in flight per lane (no shared memory, no barrier),
// multiplying them with that expert's routed rows (up to 8 per pass), whose f32 values every lane reads
// itself through the read-only cache (every warp of the expert reads the same few rows; the loops are
// weight_stream.cuh's dot_rows_*). fp32 FMAs, a fixed-order warp reduction (deterministic).
// Weights BF16, F32 or INT8 (vector loads; INT8 sums times the row scale) with 16-byte rows, MXFP4 (one
// 128-bit load per 32-value block, decoded in registers, block sums times the scale), or anything else
// (element loads). round_bf16: the activations rounded to bf16 first (CudaContext::bf16_split(m) false).
// Why this shape (ncu on the H200, GPT-OSS-20B experts at M = 1, 2026-12-02): the tensor-core pipeline
// (moe_gemv_pipe.cuh) ran gate_up in 65 us at 2.0 TB/s and down in 39 us at 1.75 TB/s: 360 and 180 CTAs of 4
// warps at 12.5% occupancy (214 registers, 98 KB of shared memory), 1.36 and 0.68 waves. This kernel with one
// CTA of 8 warps per 16 rows: 48.5 / 28.9 us (2.7 / 2.3 TB/s; moe-lora bench M = 1: 73.6 us per layer for
// both, 0.85 of the copy rate measured in that run); persistent warps measured the same (73.7 us), kept for
// the simpler grid (no empty CTAs for inactive experts). What is left is load latency: a warp issues its
// loads, waits, sums; deeper per-warp pipelining (or TMA bulk copies) is the next step. Only included through
// moe_launch.h.
// Must not: depend on anything above common/.
#pragma once

#include <cstring>

#include "kernels/moe/moe_cuda_common.cuh"
#include "kernels/weight_stream.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kGemvThreads = 256;
constexpr int kGemvR = 2;  // rows per warp
// 128-bit loads per row in flight per lane: 8 for passes of up to 2 routed rows, 4 for 4, 2 for 8.
constexpr int gemv_u(int tm) {
  return tm <= 2 ? 8 : tm == 4 ? 4 : 2;
}

// The slot-stacked expert LoRA's shrink as weight-streaming items (fused into moe_gemv_kernel on the GEMV
// path, or moe_gemv_kernel's only items for the other paths whose sorted rows are single rows): one item is a
// sorted row r and two rank rows j, j + 1 of its (slot, expert)'s A: out[...] = A[key][j] · in(r), where
// in(r) is the token's x (gate/up: out row r of [rows, lora_rows]) or the act row r (down: out row pair of
// [pairs, lora_rows]). Rows without LoRA there (slot −1, scale 0 in columns [c0, c1)) are skipped; their
// out rows are never read (the expand kernels test the same key). No split-K (the expands read one sum).
struct LoraShrinkItems {
  const void* a = nullptr;  // [slots, E, lora_rows, K] in dtype (nullptr: no LoRA items)
  DType dtype = DType::kF32;
  const float* scale = nullptr;  // [slots, E, 3]
  const int32_t* token_slots = nullptr;
  const int32_t* ids = nullptr;
  const int32_t* num_rows = nullptr;                      // sorted rows in use (device)
  int64_t slots = 0, E = 0, lora_rows = 0, max_rows = 0;  // max_rows: host bound on the sorted rows
  int c0 = 0, c1 = 0;
  float* out = nullptr;
  __host__ __device__ int64_t items() const { return a == nullptr ? 0 : max_rows * ((lora_rows + 1) / 2); }
};

struct GemvParams {
  const float* x = nullptr;  // kGateUp: token rows [m, H] (stride ldx); kDown: act rows [rows, I]
  int64_t ldx = 0;
  const ExpertView* experts = nullptr;
  const int32_t* counts = nullptr;      // [E] pairs per expert
  const int32_t* offsets = nullptr;     // [E] first sorted row of each expert (compact)
  const int32_t* active = nullptr;      // [E] experts with pairs, in expert order
  const int32_t* num_active = nullptr;  // [1]
  const int32_t* sorted = nullptr;      // [pairs] pair index t·top_k + k per sorted row
  int64_t top_k = 0, hidden = 0, inter = 0;
  float* out = nullptr;     // kGateUp: gu [rows, 2I] by sorted row; kDown: y [pairs, H] by pair
  bool round_bf16 = false;  // BF16 weights: round the activations to bf16 (CudaContext::bf16_split(m) false)
  bool base = true;         // false: only the LoRA items (the shrink of a path with its own expert product)
  LoraShrinkItems lora;
};

// The end of a pass: each (row r, routed row t) sum reduced over the warp, times scales[r] (INT8 row scales,
// else 1), plus the bias, stored by lane 0 for the first nt routed rows of the live rows.
template <Phase P, int TM>
__device__ __forceinline__ void gemv_store(const GemvParams& p, float (&acc)[kGemvR][TM],
                                           const float (&scales)[kGemvR], const bool (&live)[kGemvR],
                                           int64_t N, int64_t n_first, const float* bias, int row0, int nt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) {
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      const float v = cuda_util::warp_sum(acc[r][t]) * scales[r];
      if (lane == 0 && t < nt && live[r]) {
        const int64_t n = n_first + r;
        const float y = v + (bias != nullptr ? bias[n] : 0.0f);
        const int64_t row = row0 + t;
        if (P == Phase::kGateUp) {
          p.out[row * N + n] = y;
        } else {
          p.out[static_cast<int64_t>(p.sorted[row]) * N + n] = y;
        }
      }
    }
  }
}

// One pass over nt (<= TM) routed rows starting at sorted row `row0`: accumulate, reduce, store (+bias).
template <Phase P, typename W, int TM>
__device__ __forceinline__ void gemv_pass(const GemvParams& p, const char* const (&rows)[kGemvR],
                                          const float (&scales)[kGemvR], bool vec, DType dt, int64_t K,
                                          int64_t N, int64_t n_first, const float* bias, int row0, int nt) {
  const float* xs[TM];
#pragma unroll
  for (int t = 0; t < TM; ++t) {
    const int64_t row = row0 + (t < nt ? t : 0);
    xs[t] = P == Phase::kGateUp ? p.x + (p.sorted[row] / p.top_k) * p.ldx : p.x + row * p.inter;
  }
  // As the other paths: only bf16-valued products (BF16 weights, INT8 codes) round the activations.
  const bool round_x = p.round_bf16 && (dt == DType::kBF16 || dt == DType::kI8);
  float acc[kGemvR][TM];
#pragma unroll
  for (int r = 0; r < kGemvR; ++r)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;
  if (vec) {
    stream::dot_rows_vec<W, kGemvR, TM, gemv_u(TM)>(rows, K, xs, round_x, acc);
  } else {
    stream::dot_rows_scalar<kGemvR, TM>(rows, dt, K, xs, round_x, acc);
  }
  bool live[kGemvR];
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) live[r] = rows[r] != nullptr;
  gemv_store<P, TM>(p, acc, scales, live, N, n_first, bias, row0, nt);
}

// The pass for nt routed rows on a kernel built for at most TM per pass (the smallest bucket that holds nt).
template <Phase P, typename W, int TM>
__device__ __forceinline__ void gemv_pass_any(const GemvParams& p, const char* const (&rows)[kGemvR],
                                              const float (&scales)[kGemvR], bool vec, DType dt, int64_t K,
                                              int64_t N, int64_t n_first, const float* bias, int row0,
                                              int nt) {
  if constexpr (TM > 1) {
    if (nt <= TM / 2)
      return gemv_pass_any<P, W, TM / 2>(p, rows, scales, vec, dt, K, N, n_first, bias, row0, nt);
  }
  gemv_pass<P, W, TM>(p, rows, scales, vec, dt, K, N, n_first, bias, row0, nt);
}

// MXFP4 weights (dtype kU8): the pass of gemv_pass over codes and block scales (stream::dot_rows_mxfp4).
template <Phase P, int TM, bool XV>
__device__ __forceinline__ void gemv_pass_mxfp4(const GemvParams& p, const uint8_t* const (&codes)[kGemvR],
                                                const uint8_t* const (&scales)[kGemvR], int64_t K, int64_t N,
                                                int64_t n_first, const float* bias, int row0, int nt) {
  const float* xs[TM];
#pragma unroll
  for (int t = 0; t < TM; ++t) {
    const int64_t row = row0 + (t < nt ? t : 0);
    xs[t] = P == Phase::kGateUp ? p.x + (p.sorted[row] / p.top_k) * p.ldx : p.x + row * p.inter;
  }
  float acc[kGemvR][TM];
#pragma unroll
  for (int r = 0; r < kGemvR; ++r)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;
  stream::dot_rows_mxfp4<kGemvR, TM,
                         (TM == 1   ? 4
                          : TM == 2 ? 2
                                    : 1),
                         XV>(codes, scales, K, xs, p.round_bf16, acc);
  bool live[kGemvR];
  float ones[kGemvR];
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) {
    live[r] = codes[r] != nullptr;
    ones[r] = 1.0f;
  }
  gemv_store<P, TM>(p, acc, ones, live, N, n_first, bias, row0, nt);
}

template <Phase P, int TM, bool XV>
__device__ __forceinline__ void gemv_pass_mxfp4_any(const GemvParams& p,
                                                    const uint8_t* const (&codes)[kGemvR],
                                                    const uint8_t* const (&scales)[kGemvR], int64_t K,
                                                    int64_t N, int64_t n_first, const float* bias, int row0,
                                                    int nt) {
  if constexpr (TM > 1) {
    if (nt <= TM / 2)
      return gemv_pass_mxfp4_any<P, TM / 2, XV>(p, codes, scales, K, N, n_first, bias, row0, nt);
  }
  gemv_pass_mxfp4<P, TM, XV>(p, codes, scales, K, N, n_first, bias, row0, nt);
}

// One warp's MXFP4 item (gemv_item below).
template <Phase P, int TM>
__device__ __forceinline__ void gemv_item_mxfp4(const GemvParams& p, const ExpertView& ex, int count,
                                                int base, int64_t n_first) {
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const float* bias = weight_bias<P>(ex);
  const uint8_t* codes[kGemvR];
  const uint8_t* scales[kGemvR];
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) {
    codes[r] = scales[r] = nullptr;
    if (n_first + r < N) mxfp4_row<P>(ex, n_first + r, K, p.inter, codes[r], scales[r]);
  }
  const int64_t ldx = P == Phase::kGateUp ? p.ldx : p.inter;
  const bool xv = (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 && ldx % 4 == 0;
  for (int tok0 = 0; tok0 < count; tok0 += TM) {
    const int nt = count - tok0 < TM ? count - tok0 : TM;
    if (xv) {
      gemv_pass_mxfp4_any<P, TM, true>(p, codes, scales, K, N, n_first, bias, base + tok0, nt);
    } else {
      gemv_pass_mxfp4_any<P, TM, false>(p, codes, scales, K, N, n_first, bias, base + tok0, nt);
    }
  }
}

// One warp's item: the kGemvR rows from n_first of active expert j, every routed row of it.
template <Phase P, int TM>
__device__ __forceinline__ void gemv_item(const GemvParams& p, int j, int64_t n_first) {
  const int e = p.active[j];
  const int count = p.counts[e], base = p.offsets[e];
  const ExpertView& ex = p.experts[e];
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const DType dt = weight_dtype<P>(ex);
  // MXFP4: only in the kernels for passes of 1 or 2 routed rows (moe_experts launches those for MXFP4 at
  // any m: more rows per pass spill, 32 values per load stay in registers; further passes re-read the rows
  // from L2), so the 4- and 8-row kernels of the other dtypes carry none of its registers.
  if constexpr (TM <= 2) {
    if (dt == DType::kU8) return gemv_item_mxfp4<P, TM>(p, ex, count, base, n_first);
  }
  const float* bias = weight_bias<P>(ex);
  const char* rows[kGemvR];
  float scales[kGemvR];  // INT8 row scales (1 for float weights)
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) {
    rows[r] = n_first + r < N ? weight_row<P>(ex, n_first + r, K, p.inter) : nullptr;
    scales[r] = n_first + r < N ? weight_row_scale<P>(ex, n_first + r, p.inter) : 1.0f;
  }
  // Vector loads need 16-byte weight rows and 16-byte activation rows (the down phase reads the workspace's
  // activation, [rows, I] from a 256-byte aligned base).
  const int64_t ldx = P == Phase::kGateUp ? p.ldx : p.inter;
  const bool x_aligned = (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 && ldx % 4 == 0;
  const bool vec = x_aligned && weight_rows_aligned16<P>(ex, K);
  for (int tok0 = 0; tok0 < count; tok0 += TM) {
    const int nt = count - tok0 < TM ? count - tok0 : TM;
    switch (dt) {
      case DType::kBF16:
        gemv_pass_any<P, __nv_bfloat16, TM>(p, rows, scales, vec, dt, K, N, n_first, bias, base + tok0, nt);
        break;
      case DType::kF32:
        gemv_pass_any<P, float, TM>(p, rows, scales, vec, dt, K, N, n_first, bias, base + tok0, nt);
        break;
      case DType::kI8:
        gemv_pass_any<P, int8_t, TM>(p, rows, scales, vec, dt, K, N, n_first, bias, base + tok0, nt);
        break;
      case DType::kF16:
      case DType::kI32:
      case DType::kI64:
      case DType::kU8:
        gemv_pass_any<P, float, TM>(p, rows, scales, false, dt, K, N, n_first, bias, base + tok0, nt);
        break;
    }
  }
}

// LoRA item q (< p.lora.items()): see LoraShrinkItems. f32 inputs as the tiled shrink reads them (no bf16
// rounding), fp32 sums.
template <Phase P, typename TW>
__device__ __forceinline__ void lora_shrink_item_as(const GemvParams& p, int64_t r, int64_t j0, int64_t key,
                                                    int32_t pair) {
  const LoraShrinkItems& l = p.lora;
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const float* x = P == Phase::kGateUp ? p.x + (pair / p.top_k) * p.ldx : p.x + r * p.inter;
  const char* rows[kGemvR];
#pragma unroll
  for (int q = 0; q < kGemvR; ++q)
    rows[q] = j0 + q < l.lora_rows ? static_cast<const char*>(l.a) +
                                         ((key * l.lora_rows + j0 + q) * K) * static_cast<int64_t>(sizeof(TW))
                                   : nullptr;
  const float* xs[1] = {x};
  float acc[kGemvR][1] = {};
  const int64_t ldx = P == Phase::kGateUp ? p.ldx : p.inter;
  const bool vec = (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 && ldx % 4 == 0 &&
                   (reinterpret_cast<uintptr_t>(l.a) & 15) == 0 &&
                   (K * static_cast<int64_t>(sizeof(TW))) % 16 == 0;
  if (vec) {
    stream::dot_rows_vec<TW, kGemvR, 1, 8>(rows, K, xs, false, acc);
  } else {
    stream::dot_rows_scalar<kGemvR, 1>(rows, l.dtype, K, xs, false, acc);
  }
  const int lane = threadIdx.x & 31;
  float* out = l.out + (P == Phase::kGateUp ? r : static_cast<int64_t>(pair)) * l.lora_rows;
#pragma unroll
  for (int q = 0; q < kGemvR; ++q) {
    const float v = cuda_util::warp_sum(acc[q][0]);
    if (lane == 0 && rows[q] != nullptr) out[j0 + q] = v;
  }
}

template <Phase P>
__device__ __forceinline__ void lora_shrink_item(const GemvParams& p, int64_t q) {
  const LoraShrinkItems& l = p.lora;
  const int64_t per_row = (l.lora_rows + 1) / 2;
  const int64_t r = q / per_row, j0 = (q % per_row) * 2;
  if (r >= *l.num_rows) return;
  const int32_t pair = p.sorted[r];
  const int32_t e = l.ids[pair];
  const int32_t s = l.token_slots[pair / p.top_k];
  if (e < 0 || e >= l.E || s < 0 || s >= l.slots) return;
  const int64_t key = static_cast<int64_t>(s) * l.E + e;
  bool on = false;
  for (int c = l.c0; c < l.c1; ++c) on |= l.scale[key * 3 + c] != 0.0f;
  if (!on) return;
  if (l.dtype == DType::kBF16) {
    lora_shrink_item_as<P, __nv_bfloat16>(p, r, j0, key, pair);
  } else {
    lora_shrink_item_as<P, float>(p, r, j0, key, pair);
  }
}

// TM: the most routed rows per pass (1, 2, 4 or 8: the launch picks the smallest that holds the batch's
// tokens, so a batch-1 step builds no 8-row pass and keeps its registers for loads in flight).
// Persistent warps: the grid is what fits on the GPU at once (moe_gemv_blocks), and warp w of all takes items
// w, w + warps, ... of the num_active x ⌈N / kGemvR⌉ (expert, row pair) items, consecutive warps on
// consecutive rows (same speed as one CTA per 16 rows on the H200 at batch 1, see the top of the file).
template <Phase P, int TM>
__global__ void __launch_bounds__(kGemvThreads, 2) moe_gemv_kernel(GemvParams p) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const int64_t pairs_per_expert = (N + kGemvR - 1) / kGemvR;
  const int64_t base_items = p.base ? static_cast<int64_t>(*p.num_active) * pairs_per_expert : 0;
  const int64_t items = base_items + p.lora.items();
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kGemvThreads / 32);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * (kGemvThreads / 32) + (threadIdx.x >> 5); i < items;
       i += warps) {
    if (i < base_items) {
      const int j = static_cast<int>(i / pairs_per_expert);
      gemv_item<P, TM>(p, j, (i % pairs_per_expert) * kGemvR);
    } else {
      lora_shrink_item<P>(p, i - base_items);
    }
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
