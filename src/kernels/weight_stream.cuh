// kernels/weight_stream.cuh: the inner loops of the weight-streaming (GEMV-style) kernels for few token
// rows. accumulate: the INT8 dense product's (linear/linear_int8_cuda.cu): a warp holds kR weight rows and
// sums their products with up to TM activation rows staged through shared memory in K chunks of kKc, lanes
// across K, fp32 accumulation. dot_rows_vec / dot_rows_scalar (below): the same sums with the activations
// read straight from global memory, no shared memory or barrier, several loads per row in flight (the MoE
// small-batch kernel, moe/moe_gemv.cuh, and the dense BF16 small-batch product, linear/linear_cuda.cu).
// Weights are read with 128-bit loads (BF16: 8, F32: 4, INT8: 16 values per load, widened to f32 in
// registers) when rows are 16-byte aligned, else element by element in any dtype. INT8 sums are of the
// codes: the caller multiplies each row's sum by its scale. Only included from .cu files. Must not: depend
// on anything above common/.
#pragma once

#include "kernels/cuda_util.cuh"
#include "kernels/mma_util.cuh"

namespace polylora::kernels::cuda::stream {

constexpr int kR = 4;      // weight rows per warp
constexpr int kKc = 1024;  // K chunk staged in shared memory (activations: [TM, kKc] f32)

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
struct GemvVec<int8_t> {
  static constexpr int kN = 16;
  __device__ static void cvt(const uint4& u, float* f) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        f[4 * i + j] = static_cast<float>(static_cast<int32_t>(w[i] << (24 - 8 * j)) >> 24);
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
// garbage and are never stored; rows[r] nullptr: a row past the matrix, never stored either). vec: 128-bit
// loads of W (W is BF16, F32 or INT8, rows 16-byte aligned, K a multiple of the vector); otherwise scalar
// loads in any dtype (INT8: the codes). round_bf16: BF16 and INT8 weights multiply activations rounded to
// bf16 (the bf16 model's numerics without the hi + lo split).
template <typename W, int TM>
__device__ __forceinline__ void accumulate(const char* const (&rows)[kR], bool vec, DType dt, int64_t K,
                                           int nt, const float* const* s_src, float* xs, bool round_bf16,
                                           float (&acc)[kR][TM]) {
  const int lane = threadIdx.x & 31;
  for (int64_t kc0 = 0; kc0 < K; kc0 += kKc) {
    const int kcn = static_cast<int>(K - kc0 < kKc ? K - kc0 : kKc);
    __syncthreads();  // the previous chunk's readers are done
    for (int t = 0; t < nt; ++t) {
      const float* src = s_src[t] + kc0;
      // Without the hi + lo split, bf16 weights multiply activations rounded to bf16, exactly as the
      // tensor-core GEMM and cuBLAS paths then do, so a token's numerics do not depend on the batch size
      // that picked the path. With it, f32 activations (the split paths agree with them to ~2^-17).
      if (round_bf16 && (dt == DType::kBF16 || dt == DType::kI8))
        for (int kk = threadIdx.x; kk < kcn; kk += blockDim.x)
          xs[t * kKc + kk] = __bfloat162float(__float2bfloat16_rn(src[kk]));
      else
        for (int kk = threadIdx.x; kk < kcn; kk += blockDim.x) xs[t * kKc + kk] = src[kk];
    }
    __syncthreads();
    if (vec) {
      constexpr int V = GemvVec<W>::kN, S = 2, kStep = 32 * V * S;
      for (int g = 0; g < kcn; g += kStep) {
        uint4 wv[S][kR];
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int kk = g + (s * 32 + lane) * V;
#pragma unroll
          for (int r = 0; r < kR; ++r) {
            wv[s][r] = rows[r] != nullptr && kk < kcn
                           ? __ldg(reinterpret_cast<const uint4*>(rows[r] + (kc0 + kk) * sizeof(W)))
                           : make_uint4(0u, 0u, 0u, 0u);
          }
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
          const int kk = g + (s * 32 + lane) * V;
          if (kk >= kcn) continue;
          float wf[kR][V];
#pragma unroll
          for (int r = 0; r < kR; ++r) GemvVec<W>::cvt(wv[s][r], wf[r]);
#pragma unroll
          for (int t = 0; t < TM; ++t) {
            float xv[V];
#pragma unroll
            for (int i = 0; i < V; i += 4) {
              const float4 f4 = *reinterpret_cast<const float4*>(xs + t * kKc + kk + i);
              xv[i] = f4.x;
              xv[i + 1] = f4.y;
              xv[i + 2] = f4.z;
              xv[i + 3] = f4.w;
            }
#pragma unroll
            for (int r = 0; r < kR; ++r)
#pragma unroll
              for (int i = 0; i < V; ++i) acc[r][t] = fmaf(wf[r][i], xv[i], acc[r][t]);
          }
        }
      }
    } else {
      for (int kk = lane; kk < kcn; kk += 32) {
        float wf[kR];
#pragma unroll
        for (int r = 0; r < kR; ++r)
          wf[r] = rows[r] != nullptr ? cuda_util::load_as_f32(rows[r], dt, kc0 + kk) : 0.0f;
#pragma unroll
        for (int t = 0; t < TM; ++t) {
          const float xv = xs[t * kKc + kk];
#pragma unroll
          for (int r = 0; r < kR; ++r) acc[r][t] = fmaf(wf[r], xv, acc[r][t]);
        }
      }
    }
  }
}

// ---- register-streaming dot products (no shared memory, no barrier): moe/moe_gemv.cuh and the dense
// BF16 small-batch product (linear/linear_cuda.cu) ----

// A 128-bit weight load that skips L1 (weights are read once; L1 keeps the activation rows).
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float x_value(float v, bool round_bf16) {
  return round_bf16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// acc[r][t] += Σ_k W[row r, k] · x_t[k] over all K with 128-bit loads of W (V elements each) and of x (f32,
// 16-byte aligned rows, read through the read-only cache: every warp reads the same few rows). Lane l covers
// k = l·V + j·32·V; U loads per row are issued before their FMAs. rows[r] nullptr: a row past the matrix
// (zeros, never stored). All TM x rows must be readable (callers point unused ones at a real row).
template <typename W, int R, int TM, int U>
__device__ __forceinline__ void dot_rows_vec(const char* const (&rows)[R], int64_t K,
                                             const float* const (&xs)[TM], bool round_bf16,
                                             float (&acc)[R][TM]) {
  constexpr int V = GemvVec<W>::kN;
  constexpr int64_t kStep = 32 * V;
  const int lane = threadIdx.x & 31;
  for (int64_t k0 = static_cast<int64_t>(lane) * V; k0 < K; k0 += kStep * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + u * kStep;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = rows[r] != nullptr && k < K ? ld_stream_v4(rows[r] + k * static_cast<int64_t>(sizeof(W)))
                                               : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + u * kStep;
      if (k >= K) break;
      float wf[R][V];
#pragma unroll
      for (int r = 0; r < R; ++r) GemvVec<W>::cvt(wv[u][r], wf[r]);
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        float xv[V];
#pragma unroll
        for (int i = 0; i < V; i += 4) {
          const float4 f4 = __ldg(reinterpret_cast<const float4*>(xs[t] + k + i));
          xv[i] = x_value(f4.x, round_bf16);
          xv[i + 1] = x_value(f4.y, round_bf16);
          xv[i + 2] = x_value(f4.z, round_bf16);
          xv[i + 3] = x_value(f4.w, round_bf16);
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < V; ++i) acc[r][t] = fmaf(wf[r][i], xv[i], acc[r][t]);
      }
    }
  }
}

// The same sums with element loads (any dtype, any alignment; INT8: the codes).
template <int R, int TM>
__device__ __forceinline__ void dot_rows_scalar(const char* const (&rows)[R], DType dt, int64_t K,
                                                const float* const (&xs)[TM], bool round_bf16,
                                                float (&acc)[R][TM]) {
  const int lane = threadIdx.x & 31;
  for (int64_t k = lane; k < K; k += 32) {
    float wf[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wf[r] = rows[r] != nullptr ? cuda_util::load_as_f32(rows[r], dt, k) : 0.0f;
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      const float xv = x_value(__ldg(xs[t] + k), round_bf16);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] = fmaf(wf[r], xv, acc[r][t]);
    }
  }
}

// 8 E2M1 codes (one 32-bit word, the low nibble of each byte first) as f32 values without the block scale:
// the tensor-core decoder (mma::mxfp4x8_to_bf16x8) at the unit scale byte 127, widened to f32.
__device__ __forceinline__ void e2m1x8_to_f32(uint32_t codes, float (&f)[8]) {
  uint32_t w[4];
  mma::mxfp4x8_to_bf16x8(codes, 127u, w);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f[2 * j] = __uint_as_float(w[j] << 16);
    f[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

// An E8M0 block scale 2^(s − 127) as torch.ldexp gives it (s = 0: the subnormal 2^-127; 255: +inf).
__device__ __forceinline__ float e8m0_to_f32(uint32_t s) {
  return __uint_as_float(s == 0 ? 0x00400000u : s << 23);
}

// dot_rows_vec for MXFP4 rows (common/mxfp4.h): codes[r] / scales[r] are row r's K / 2 code bytes and K / 32
// scale bytes (nullptr: a row past the matrix, zeros, never stored). Lane l takes blocks l + 32·j: one
// 128-bit load of its 32 codes and one scale byte per row, U blocks per row in flight; the 32 products
// with each x row are summed in f32, then times the block's scale. xv: x rows 16-byte aligned (float4
// loads), else element loads.
template <int R, int TM, int U, bool XV>
__device__ __forceinline__ void dot_rows_mxfp4(const uint8_t* const (&codes)[R],
                                               const uint8_t* const (&scales)[R], int64_t K,
                                               const float* const (&xs)[TM], bool round_bf16,
                                               float (&acc)[R][TM]) {
  const int lane = threadIdx.x & 31;
  const int64_t nb = K / 32;
  for (int64_t b0 = lane; b0 < nb; b0 += 32 * U) {
    uint4 cv[U][R];
    uint32_t sv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = codes[r] != nullptr && b < nb;
        cv[u][r] = ok ? ld_stream_v4(codes[r] + b * 16) : make_uint4(0u, 0u, 0u, 0u);
        sv[u][r] = ok ? __ldg(scales[r] + b) : 0u;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u * 32;
      if (b >= nb) break;
      float part[R][TM];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TM; ++t) part[r][t] = 0.0f;
#pragma unroll
      for (int q = 0; q < 4; ++q) {  // 32-bit word q of the block: values 8q .. 8q + 7
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const uint4& c = cv[u][r];
          e2m1x8_to_f32(q == 0 ? c.x : q == 1 ? c.y : q == 2 ? c.z : c.w, wf[r]);
        }
        const int64_t k = b * 32 + 8 * q;
#pragma unroll
        for (int t = 0; t < TM; ++t) {
          float xv[8];
          if constexpr (XV) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(xs[t] + k));
            const float4 c = __ldg(reinterpret_cast<const float4*>(xs[t] + k + 4));
            xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = c.x, xv[5] = c.y, xv[6] = c.z,
            xv[7] = c.w;
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) xv[i] = __ldg(xs[t] + k + i);
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) xv[i] = x_value(xv[i], round_bf16);
#pragma unroll
          for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) part[r][t] = fmaf(wf[r][i], xv[i], part[r][t]);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float sc = e8m0_to_f32(sv[u][r]);
#pragma unroll
        for (int t = 0; t < TM; ++t) acc[r][t] = fmaf(part[r][t], sc, acc[r][t]);
      }
    }
  }
}

}  // namespace polylora::kernels::cuda::stream
