// kernels/moe/moe_gemv.cuh: the small-batch MoE product (few token-expert pairs, e.g. decode): a GEMV-style
// kernel. Grid: x = blocks of kGemvRows output rows, y = the worst-case number of active experts; a CTA
// takes the y-th active expert of the device-side sort (or exits), streams its kGemvRows weight rows once
// with 128-bit loads (one warp per kGemvR rows, lanes across K) and multiplies them with that expert's
// routed rows (up to kGemvMaxTok at a time, f32 or bf16-rounded, staged through shared memory in K chunks),
// fp32 accumulation, warp reduction (the inner loop is kernels/weight_stream.cuh). Weights BF16, F32 or INT8
// (vector loads; INT8 sums times the row scale) or anything else (scalar loads). Only included from
// moe_cuda.cu. Must not: depend on anything above common/.
#pragma once

#include <cstring>

#include "kernels/moe/moe_cuda_common.cuh"
#include "kernels/weight_stream.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kGemvThreads = 256;
constexpr int kGemvR = stream::kR;                       // rows per warp
constexpr int kGemvRows = kGemvR * (kGemvThreads / 32);  // rows per CTA
constexpr int kGemvMaxTok = 8;                           // routed rows per pass
constexpr int kGemvKc = stream::kKc;                     // K chunk staged in shared memory

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
};

template <typename W, int TM>
__device__ __forceinline__ void gemv_accumulate(const char* const (&rows)[kGemvR], bool vec, DType dt,
                                                int64_t K, int nt, const float* const* s_src, float* xs,
                                                bool round_bf16, float (&acc)[kGemvR][TM]) {
  stream::accumulate<W, TM>(rows, vec, dt, K, nt, s_src, xs, round_bf16, acc);
}

// One pass of nt (<= TM) routed rows starting at sorted row `row0`: accumulate, reduce, store (+bias).
template <Phase P, typename W, int TM>
__device__ __forceinline__ void gemv_pass(const GemvParams& p, const char* const (&rows)[kGemvR],
                                          const float (&scales)[kGemvR], bool vec, DType dt, int64_t K,
                                          int64_t N, int64_t n_first, const float* bias, int row0, int nt,
                                          const float* const* s_src, float* xs) {
  float acc[kGemvR][TM];
#pragma unroll
  for (int r = 0; r < kGemvR; ++r)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;
  gemv_accumulate<W, TM>(rows, vec, dt, K, nt, s_src, xs, p.round_bf16, acc);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) {
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      const float v = cuda_util::warp_sum(acc[r][t]) * scales[r];
      if (lane == 0 && t < nt && rows[r] != nullptr) {
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

template <Phase P, typename W>
__device__ __forceinline__ void gemv_pass_any(const GemvParams& p, const char* const (&rows)[kGemvR],
                                              const float (&scales)[kGemvR], bool vec, DType dt, int64_t K,
                                              int64_t N, int64_t n_first, const float* bias, int row0, int nt,
                                              const float* const* s_src, float* xs) {
  if (nt == 1) {
    gemv_pass<P, W, 1>(p, rows, scales, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  } else if (nt == 2) {
    gemv_pass<P, W, 2>(p, rows, scales, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  } else if (nt <= 4) {
    gemv_pass<P, W, 4>(p, rows, scales, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  } else {
    gemv_pass<P, W, 8>(p, rows, scales, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  }
}

template <Phase P>
__global__ void __launch_bounds__(kGemvThreads) moe_gemv_kernel(GemvParams p) {
  __shared__ __align__(16) float xs[kGemvMaxTok * kGemvKc];
  __shared__ const float* s_src[kGemvMaxTok];
  const int j = blockIdx.y;
  if (j >= *p.num_active) return;
  const int e = p.active[j];
  const int count = p.counts[e], base = p.offsets[e];
  const ExpertView& ex = p.experts[e];
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  if (static_cast<int64_t>(blockIdx.x) * kGemvRows >= N) return;
  const int warp = threadIdx.x >> 5;
  const int64_t n_first = static_cast<int64_t>(blockIdx.x) * kGemvRows + warp * kGemvR;
  const DType dt = weight_dtype<P>(ex);
  const float* bias = weight_bias<P>(ex);
  const char* rows[kGemvR];
  float scales[kGemvR];  // INT8 row scales (1 for float weights)
#pragma unroll
  for (int r = 0; r < kGemvR; ++r) {
    rows[r] = n_first + r < N ? weight_row<P>(ex, n_first + r, K, p.inter) : nullptr;
    scales[r] = n_first + r < N ? weight_row_scale<P>(ex, n_first + r, p.inter) : 1.0f;
  }
  const bool aligned = weight_rows_aligned16<P>(ex, K);
  for (int tok0 = 0; tok0 < count; tok0 += kGemvMaxTok) {
    const int nt = count - tok0 < kGemvMaxTok ? count - tok0 : kGemvMaxTok;
    __syncthreads();  // s_src of the previous pass is no longer read
    if (threadIdx.x < nt) {
      const int64_t row = base + tok0 + threadIdx.x;
      s_src[threadIdx.x] =
          P == Phase::kGateUp ? p.x + (p.sorted[row] / p.top_k) * p.ldx : p.x + row * p.inter;
    }
    // (published by the barrier at the start of gemv_accumulate's first chunk)
    switch (dt) {
      case DType::kBF16:
        gemv_pass_any<P, __nv_bfloat16>(p, rows, scales, aligned, dt, K, N, n_first, bias, base + tok0, nt,
                                        s_src, xs);
        break;
      case DType::kF32:
        gemv_pass_any<P, float>(p, rows, scales, aligned, dt, K, N, n_first, bias, base + tok0, nt, s_src,
                                xs);
        break;
      case DType::kI8:
        gemv_pass_any<P, int8_t>(p, rows, scales, aligned, dt, K, N, n_first, bias, base + tok0, nt, s_src,
                                 xs);
        break;
      case DType::kF16:
      case DType::kI32:
      case DType::kI64:
      case DType::kU8:
        gemv_pass_any<P, float>(p, rows, scales, false, dt, K, N, n_first, bias, base + tok0, nt, s_src, xs);
        break;
    }
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
