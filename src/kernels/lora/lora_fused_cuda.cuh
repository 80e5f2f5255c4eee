// kernels/lora/lora_fused_cuda.cuh: dense slot-stacked LoRA split over other kernels for few tokens
// (decode), so that q/k/v/o LoRA adds no launch of its own:
// - the shrink as weight-streaming items any persistent kernel can run beside its own work (ShrinkItems /
//   shrink_item: warps over (token, pair of rank rows), each streaming its two A rows once with 128-bit
//   loads, the token's f32 input through the read-only cache; fp32 sums, one per tmp element, no split-K):
//   the streamed projections run them as extra items of the same launch (linear_cuda.cu), lora_shrink alone
//   otherwise (lora_cuda.cu);
// - the expand as a per-element term (expand_token, then expand_at / expand_n) that the kernels consuming the
// projection's output add
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

// What the LoRA term of one token needs besides B's rows: its slot's B ([out, rank] in the stack's dtype),
// its shrink sums and its scale; b == nullptr: the token has no term (no slot, or scale 0). Reading it once
// per token and then only B rows per output keeps the consuming kernels' loads independent of each other
// (per output, recomputing it would chain slot -> scale -> B row).
struct ExpandToken {
  const void* b = nullptr;
  const float* tp = nullptr;
  float sc = 0.0f;
};

__device__ __forceinline__ ExpandToken expand_token(const LoraExpandIn& l, int64_t t) {
  ExpandToken k;
  const int32_t s = __ldg(l.token_slots + t);
  if (s < 0 || s >= l.w.slots) return k;
  const float sc = __ldg(l.w.scale + s);
  if (sc == 0.0f) return k;
  const int64_t esize = l.w.dtype == DType::kBF16 ? 2 : 4;
  k.b = static_cast<const char*>(l.w.b) + static_cast<int64_t>(s) * l.w.out * l.w.rank * esize;
  k.tp = l.tmp + t * l.ld_tmp + l.first;
  k.sc = sc;
  return k;
}

// sum + Σ bf16 value e of u (8 values, the low half of each word first) · x(e), for e = 0 .. 7 in turn: the
// one order of every expand below, so their sums are the same bits.
template <typename X>
__device__ __forceinline__ float fma_bf16x8(const uint4& u, X x, float sum) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    sum = fmaf(__uint_as_float(w[e] << 16), x(2 * e), sum);
    sum = fmaf(__uint_as_float(w[e] & 0xffff0000u), x(2 * e + 1), sum);
  }
  return sum;
}

// The term of output o for a token whose expand_token is k (0 when it has none).
__device__ __forceinline__ float expand_at(const LoraExpandIn& l, const ExpandToken& k, int64_t o) {
  if (k.b == nullptr) return 0.0f;
  const int64_t R = l.w.rank;
  const float* tp = k.tp;
  float sum = 0.0f;
  if (l.w.dtype == DType::kBF16) {
    const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(k.b) + o * R;
    int64_t r = 0;
    if ((R & 7) == 0 && (reinterpret_cast<uintptr_t>(b) & 15) == 0) {
#pragma unroll 2
      for (; r < R; r += 8) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(b + r));
        sum = fma_bf16x8(
            u, [&](int e) { return __ldg(tp + r + e); }, sum);
      }
    }
    for (; r < R; ++r) sum = fmaf(__bfloat162float(b[r]), __ldg(tp + r), sum);
  } else {
    const float* b = static_cast<const float*>(k.b) + o * R;
    for (int64_t r = 0; r < R; ++r) sum = fmaf(__ldg(b + r), __ldg(tp + r), sum);
  }
  return k.sc * sum;
}

// A lane's B rows in registers (loaded before pdl_wait: adapter weights, which no kernel of the step
// writes), for a lane that adds the terms of outputs o0 + lane + 32·i, i < n: then only the shrink sums
// wait on the previous kernel. BF16 stacks whose rank R is a multiple of 8, n · R / 8 <= kExpandRegs
// 16-byte pieces (expand_regs_fit; the same sums in the same order as expand_at, so the same bits).
constexpr int kExpandRegs = 8;
__device__ __forceinline__ bool expand_regs_fit(const LoraExpandIn& l, int n) {
  return l.w.dtype == DType::kBF16 && l.w.rank > 0 && (l.w.rank & 7) == 0 &&
         n * (l.w.rank / 8) <= kExpandRegs;
}
__device__ __forceinline__ void load_b_regs(const LoraExpandIn& l, const ExpandToken& k, int64_t o0, int n,
                                            int lane, uint4 (&v)[kExpandRegs]) {
  if (k.b == nullptr) return;
  const int64_t R = l.w.rank;
  const int pieces = static_cast<int>(R / 8);
  const auto* b = static_cast<const __nv_bfloat16*>(k.b);
#pragma unroll
  for (int q = 0; q < kExpandRegs; ++q)
    if (q < n * pieces)
      v[q] =
          __ldg(reinterpret_cast<const uint4*>(b + (o0 + lane + 32 * (q / pieces)) * R + (q % pieces) * 8));
}
// expand_at(l, k, o0 + lane + 32·i) from the rows load_b_regs loaded.
__device__ __forceinline__ float expand_regs(const LoraExpandIn& l, const ExpandToken& k,
                                             const uint4 (&v)[kExpandRegs], int i) {
  if (k.b == nullptr) return 0.0f;
  const int pieces = static_cast<int>(l.w.rank / 8);
  const float* tp = k.tp;
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kExpandRegs; ++q) {
    if (q / pieces != i) continue;
    const int r = (q % pieces) * 8;
    sum = fma_bf16x8(
        v[q], [&](int e) { return __ldg(tp + r + e); }, sum);
  }
  return k.sc * sum;
}

// The terms of outputs o .. o + N − 1 (N consecutive outputs of one token), every B row's loads issued
// before the sums (bf16 stacks with 16-byte rows: R/8 loads per row, all in flight together).
template <int N>
__device__ __forceinline__ void expand_n(const LoraExpandIn& l, const ExpandToken& k, int64_t o,
                                         float (&out)[N]) {
  const int64_t R = l.w.rank;
  if (k.b == nullptr) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = 0.0f;
    return;
  }
  const __nv_bfloat16* b = static_cast<const __nv_bfloat16*>(k.b) + o * R;
  if (l.w.dtype != DType::kBF16 || (R & 7) != 0 || (reinterpret_cast<uintptr_t>(b) & 15) != 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = expand_at(l, k, o + i);
    return;
  }
  float sum[N];
#pragma unroll
  for (int i = 0; i < N; ++i) sum[i] = 0.0f;
  for (int64_t r = 0; r < R; r += 16) {  // two 8-value pieces of every row in flight
    const bool two = r + 8 < R;
    uint4 u[N][2];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      u[i][0] = __ldg(reinterpret_cast<const uint4*>(b + i * R + r));
      u[i][1] = two ? __ldg(reinterpret_cast<const uint4*>(b + i * R + r + 8)) : make_uint4(0, 0, 0, 0);
    }
    float t[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) t[e] = e < 8 || two ? __ldg(k.tp + r + e) : 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        sum[i] = fma_bf16x8(
            u[i][h], [&](int e) { return t[8 * h + e]; }, sum[i]);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = k.sc * sum[i];
}

// B rows [o0, o0 + n) of the token's slot into L2, one 128-byte line per lane of `lanes` at a time (nothing
// without a term). With expand_token, what a consuming kernel may run before pdl_wait(): the slot, scale and
// B come from step inputs and adapter weights, which no kernel of the step writes; only tmp (the shrink
// sums) is the previous kernels' output.
__device__ __forceinline__ void prefetch_b_rows(const LoraExpandIn& l, const ExpandToken& k, int64_t o0,
                                                int64_t n, int lane, int lanes) {
  if (k.b == nullptr) return;
  const int64_t esize = l.w.dtype == DType::kBF16 ? 2 : 4;
  const char* first = static_cast<const char*>(k.b) + o0 * l.w.rank * esize;
  const int64_t bytes = n * l.w.rank * esize;
  for (int64_t off = static_cast<int64_t>(lane) * 128; off < bytes; off += static_cast<int64_t>(lanes) * 128)
    cuda_util::prefetch_l2(first + off);
}

}  // namespace polylora::kernels::cuda::lora_fused
