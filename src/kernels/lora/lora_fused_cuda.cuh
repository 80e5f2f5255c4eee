// kernels/lora/lora_fused_cuda.cuh: dense slot-stacked LoRA split over other kernels for few tokens
// (decode), so that q/k/v/o LoRA adds no launch of its own:
// - the shrink as weight-streaming items any persistent kernel can run beside its own work (ShrinkItems /
//   shrink_item: warps over (token, pair of rank rows), each streaming its two A rows once with 128-bit
//   loads, the token's f32 input through the read-only cache; fp32 sums, one per tmp element, no split-K):
//   the streamed projections run them as extra items of the same launch (linear_cuda.cu), lora_shrink alone
//   otherwise (lora_cuda.cu);
// - the expand as a per-element term (expand_value) that the kernels consuming the projection's output add
//   to their input: rope_kv_write for q/k/v, add_rms_norm for o_proj's output (lora.h LoraExpandIn).
// Only included from .cu files. Must not: depend on anything above common/.
#pragma once

#include <cuda_bf16.h>

#include "kernels/cuda_util.cuh"
#include "kernels/lora/lora.h"
#include "kernels/weight_stream.cuh"

namespace polylora::kernels::cuda::lora_fused {

// The shrink of a group of modules sharing their input (lora.h lora_shrink): tmp[t, first[i] + r] =
// A_i[s_t] row r · x[t] for every token whose slot has LoRA in some module of the group.
struct ShrinkItems {
  const float* x = nullptr;  // [m, in], row stride ldx
  int64_t ldx = 0, m = 0, in = 0, slots = 0;
  const int32_t* token_slots = nullptr;  // [m]; nullptr: no items
  int num = 0;
  const void* a[kMaxLoraGroup] = {};  // [slots, rank[i], in] in dtype
  DType dtype = DType::kBF16;
  const float* scale[kMaxLoraGroup] = {};  // [slots]
  int64_t rank[kMaxLoraGroup] = {};
  int64_t first[kMaxLoraGroup + 1] = {};  // tmp column of each module's ranks; first[num]: the group's
  float* tmp = nullptr;                   // [m, ld_tmp]
  int64_t ld_tmp = 0;
  __host__ __device__ int64_t items() const {
    return token_slots == nullptr ? 0 : m * ((first[num] + 1) / 2);
  }
};

// The items of a LoraBatchArgs group (its y unused) writing tmp [m, ld_tmp].
inline ShrinkItems make_shrink_items(const LoraBatchArgs& a, float* tmp, int64_t ld_tmp) {
  ShrinkItems p;
  p.x = a.x;
  p.ldx = a.ldx;
  p.m = a.m;
  p.in = a.w[0].in;
  p.slots = a.w[0].slots;
  p.token_slots = a.num > 0 ? a.token_slots : nullptr;
  p.num = a.num;
  p.dtype = a.w[0].dtype;
  for (int i = 0; i < a.num; ++i) {
    p.a[i] = a.w[i].a;
    p.scale[i] = a.w[i].scale;
    p.rank[i] = a.w[i].rank;
    p.first[i + 1] = p.first[i] + a.w[i].rank;
  }
  p.tmp = tmp;
  p.ld_tmp = ld_tmp;
  return p;
}

// The slot of token t when some module of the group has LoRA for it, else −1.
__device__ __forceinline__ int32_t shrink_key(const ShrinkItems& p, int64_t t) {
  const int32_t s = p.token_slots[t];
  if (s < 0 || s >= p.slots) return -1;
  for (int i = 0; i < p.num; ++i)
    if (p.scale[i][s] != 0.0f) return s;
  return -1;
}

// Item q (< items()) by one whole warp: token q / per, rank rows 2·(q % per) and the next.
__device__ __forceinline__ void shrink_item(const ShrinkItems& p, int64_t q) {
  const int64_t total = p.first[p.num], per = (total + 1) / 2;
  const int64_t t = q / per, j0 = (q % per) * 2;
  const int32_t key = shrink_key(p, t);
  if (key < 0) return;  // warp-uniform
  const int64_t esize = p.dtype == DType::kBF16 ? 2 : 4;
  bool vec = (reinterpret_cast<uintptr_t>(p.x + t * p.ldx) & 15) == 0 && (p.in * esize) % 16 == 0;
  const char* rows[2];
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const int64_t j = j0 + u;
    rows[u] = nullptr;
    if (j >= total) continue;
    int i = 0;
    while (i + 1 < p.num && j >= p.first[i + 1]) ++i;
    rows[u] = static_cast<const char*>(p.a[i]) +
              ((static_cast<int64_t>(key) * p.rank[i] + j - p.first[i]) * p.in) * esize;
    vec = vec && (reinterpret_cast<uintptr_t>(rows[u]) & 15) == 0;
  }
  const float* xs[1] = {p.x + t * p.ldx};
  float acc[2][1] = {};
  if (vec && p.dtype == DType::kBF16) {
    stream::dot_rows_vec<__nv_bfloat16, 2, 1, 8>(rows, p.in, xs, false, acc);
  } else if (vec) {
    stream::dot_rows_vec<float, 2, 1, 8>(rows, p.in, xs, false, acc);
  } else {
    stream::dot_rows_scalar<2, 1>(rows, p.dtype, p.in, xs, false, acc);
  }
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    const float v = cuda_util::warp_sum(acc[u][0]);
    if (lane == 0 && rows[u] != nullptr) p.tmp[t * p.ld_tmp + j0 + u] = v;
  }
}

// scale[s] · Σ_r B[s, o, r] · tmp[t, first + r] for token t's slot s (0 when it has none or its scale is 0):
// the LoRA term of output o of token t (l.active()).
__device__ __forceinline__ float expand_value(const LoraExpandIn& l, int64_t t, int64_t o) {
  const int32_t s = l.token_slots[t];
  if (s < 0 || s >= l.w.slots) return 0.0f;
  const float sc = l.w.scale[s];
  if (sc == 0.0f) return 0.0f;
  const int64_t R = l.w.rank;
  const float* tp = l.tmp + t * l.ld_tmp + l.first;
  float sum = 0.0f;
  if (l.w.dtype == DType::kBF16) {
    const __nv_bfloat16* b =
        static_cast<const __nv_bfloat16*>(l.w.b) + (static_cast<int64_t>(s) * l.w.out + o) * R;
    int64_t r = 0;
    if ((R & 7) == 0 && (reinterpret_cast<uintptr_t>(b) & 15) == 0) {
      for (; r < R; r += 8) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(b + r));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          sum = fmaf(__uint_as_float(w[e] << 16), tp[r + 2 * e], sum);
          sum = fmaf(__uint_as_float(w[e] & 0xffff0000u), tp[r + 2 * e + 1], sum);
        }
      }
    }
    for (; r < R; ++r) sum = fmaf(__bfloat162float(b[r]), tp[r], sum);
  } else {
    const float* b = static_cast<const float*>(l.w.b) + (static_cast<int64_t>(s) * l.w.out + o) * R;
    for (int64_t r = 0; r < R; ++r) sum = fmaf(b[r], tp[r], sum);
  }
  return sc * sum;
}

}  // namespace polylora::kernels::cuda::lora_fused
