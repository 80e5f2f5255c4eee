// kernels/moe/moe_gemv.cuh: the small-batch MoE product (few token-expert pairs, e.g. decode): a GEMV-style
// kernel. Grid: x = blocks of kGemvRows output rows, y = the worst-case number of active experts; a CTA
// takes the y-th active expert of the device-side sort (or exits), streams its kGemvRows weight rows once
// with 128-bit loads (one warp per kGemvR rows, lanes across K) and multiplies them with that expert's
// routed rows (up to kGemvMaxTok at a time, f32 or bf16-rounded, staged through shared memory in K chunks),
// fp32 accumulation, warp reduction. Weights BF16 or F32 (vector loads) or anything else (scalar loads). Only
// included from moe_cuda.cu. Must not: depend on anything above common/.
#pragma once

#include <cstring>

#include "kernels/moe/moe_cuda_common.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kGemvThreads = 256;
constexpr int kGemvR = 4;                                // rows per warp
constexpr int kGemvRows = kGemvR * (kGemvThreads / 32);  // rows per CTA
constexpr int kGemvMaxTok = 8;                           // routed rows per pass
constexpr int kGemvKc = 1024;                            // K chunk staged in shared memory

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

// 128-bit weight vectors: kN elements, converted to f32.
template <typename W>
struct GemvVec;
template <>
struct GemvVec<__nv_bfloat16> {
  static constexpr int kN = 8;
  __device__ static void cvt(const uint4& u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct GemvVec<float> {
  static constexpr int kN = 4;
  __device__ static void cvt(const uint4& u, float* f) {
    f[0] = __uint_as_float(u.x);
    f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z);
    f[3] = __uint_as_float(u.w);
  }
};

// acc[r][t] += Σ_k W[row r, k] · x_t[k] over all K, for the first nt of TM staged rows (the others hold
// garbage and are never stored). vec: 128-bit loads of W (W is BF16 or F32, rows 16-byte aligned, K a
// multiple of the vector); otherwise scalar loads in any dtype.
template <typename W, int TM>
__device__ __forceinline__ void gemv_accumulate(const char* const (&rows)[kGemvR], bool vec, DType dt,
                                                int64_t K, int nt, const float* const* s_src, float* xs,
                                                bool round_bf16, float (&acc)[kGemvR][TM]) {
  const int lane = threadIdx.x & 31;
  for (int64_t kc0 = 0; kc0 < K; kc0 += kGemvKc) {
    const int kcn = static_cast<int>(K - kc0 < kGemvKc ? K - kc0 : kGemvKc);
    __syncthreads();  // the previous chunk's readers are done
    for (int t = 0; t < nt; ++t) {
      const float* src = s_src[t] + kc0;
      // Without the hi + lo split, bf16 weights multiply activations rounded to bf16, exactly as the
      // tensor-core GEMM and cuBLAS paths then do, so a token's numerics do not depend on the batch size
      // that picked the path. With it, f32 activations (the split paths agree with them to ~2^-17).
      if (round_bf16 && dt == DType::kBF16)
        for (int kk = threadIdx.x; kk < kcn; kk += blockDim.x)
          xs[t * kGemvKc + kk] = __bfloat162float(__float2bfloat16_rn(src[kk]));
      else
        for (int kk = threadIdx.x; kk < kcn; kk += blockDim.x) xs[t * kGemvKc + kk] = src[kk];
    }
    __syncthreads();
    if (vec) {
      constexpr int V = GemvVec<W>::kN, S = 2, kStep = 32 * V * S;
      for (int g = 0; g < kcn; g += kStep) {
        uint4 wv[S][kGemvR];
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int kk = g + (s * 32 + lane) * V;
#pragma unroll
          for (int r = 0; r < kGemvR; ++r) {
            wv[s][r] = rows[r] != nullptr && kk < kcn
                           ? __ldg(reinterpret_cast<const uint4*>(rows[r] + (kc0 + kk) * sizeof(W)))
                           : make_uint4(0u, 0u, 0u, 0u);
          }
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int kk = g + (s * 32 + lane) * V;
          if (kk >= kcn) continue;
          float wf[kGemvR][V];
#pragma unroll
          for (int r = 0; r < kGemvR; ++r) GemvVec<W>::cvt(wv[s][r], wf[r]);
#pragma unroll
          for (int t = 0; t < TM; ++t) {
            float xv[V];
#pragma unroll
            for (int i = 0; i < V; i += 4) {
              const float4 f4 = *reinterpret_cast<const float4*>(xs + t * kGemvKc + kk + i);
              xv[i] = f4.x;
              xv[i + 1] = f4.y;
              xv[i + 2] = f4.z;
              xv[i + 3] = f4.w;
            }
#pragma unroll
            for (int r = 0; r < kGemvR; ++r)
#pragma unroll
              for (int i = 0; i < V; ++i) acc[r][t] = fmaf(wf[r][i], xv[i], acc[r][t]);
          }
        }
      }
    } else {
      for (int kk = lane; kk < kcn; kk += 32) {
        float wf[kGemvR];
#pragma unroll
        for (int r = 0; r < kGemvR; ++r)
          wf[r] = rows[r] != nullptr ? cuda_util::load_as_f32(rows[r], dt, kc0 + kk) : 0.0f;
#pragma unroll
        for (int t = 0; t < TM; ++t) {
          const float xv = xs[t * kGemvKc + kk];
#pragma unroll
          for (int r = 0; r < kGemvR; ++r) acc[r][t] = fmaf(wf[r], xv, acc[r][t]);
        }
      }
    }
  }
}

// One pass of nt (<= TM) routed rows starting at sorted row `row0`: accumulate, reduce, store (+bias).
template <Phase P, typename W, int TM>
__device__ __forceinline__ void gemv_pass(const GemvParams& p, const char* const (&rows)[kGemvR], bool vec,
                                          DType dt, int64_t K, int64_t N, int64_t n_first, const float* bias,
                                          int row0, int nt, const float* const* s_src, float* xs) {
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
      const float v = cuda_util::warp_sum(acc[r][t]);
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
                                              bool vec, DType dt, int64_t K, int64_t N, int64_t n_first,
                                              const float* bias, int row0, int nt, const float* const* s_src,
                                              float* xs) {
  if (nt == 1) {
    gemv_pass<P, W, 1>(p, rows, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  } else if (nt == 2) {
    gemv_pass<P, W, 2>(p, rows, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  } else if (nt <= 4) {
    gemv_pass<P, W, 4>(p, rows, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
  } else {
    gemv_pass<P, W, 8>(p, rows, vec, dt, K, N, n_first, bias, row0, nt, s_src, xs);
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
#pragma unroll
  for (int r = 0; r < kGemvR; ++r)
    rows[r] = n_first + r < N ? weight_row<P>(ex, n_first + r, K, p.inter) : nullptr;
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
        gemv_pass_any<P, __nv_bfloat16>(p, rows, aligned, dt, K, N, n_first, bias, base + tok0, nt, s_src,
                                        xs);
        break;
      case DType::kF32:
        gemv_pass_any<P, float>(p, rows, aligned, dt, K, N, n_first, bias, base + tok0, nt, s_src, xs);
        break;
      case DType::kF16:
      case DType::kI32:
      case DType::kI64:
      case DType::kU8:
        gemv_pass_any<P, float>(p, rows, false, dt, K, N, n_first, bias, base + tok0, nt, s_src, xs);
        break;
    }
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
