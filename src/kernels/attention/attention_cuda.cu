// kernels/attention/attention_cuda.cu: CUDA KV-cache write and paged attention (f32 queries; the cache F32 or
// BF16, KvCacheView::dtype, read through kv_load/kv_load4 and computed with in f32).
// Three kernels, chosen on the host from the shape (no sync):
// - prefill (num_tokens > 4·num_seqs, head_dim 64 or 128): flash attention (attention_prefill_cuda.cu). A
//   CTA of 4 warps per (block of 64 query rows of one sequence, head); K/V tiles of 32 keys gathered through
//   the block table into shared memory; each warp owns 16 query rows, each lane a 4×4 block of the score
//   tile and a 4-row × head_dim/8 slice of the output; online softmax; causal + sliding window masks; the
//   sink logit joins the denominator. Query rows are the last q_len positions of the context (chunked
//   prefill).
// - decode (otherwise, head_dim a multiple of 32 up to 256): flash decoding. A CTA of 4 warps per (query
//   row, head, split of the visible keys); 8 lanes per key with 128-bit loads (4 keys per warp at a time),
//   online softmax per lane group, merged across lanes, warps and then splits (a combine kernel, when the
//   context is split for parallelism, or the split that finishes last: attention_decode_fused_combine).
//   On a BF16 backend with the tuning field attention_prefill_mma set, the tensor-core version instead
//   (attention_mma_cuda.cu; compiled, not yet run on a GPU: off by default).
// - anything else (odd head_dim): a generic kernel, one CTA of 4 warps per (query row, head), one key per
//   warp at a time.
#include <algorithm>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_cuda_common.cuh"
#include "kernels/cuda_util.cuh"
#include "kernels/tuning.h"

namespace polylora::kernels::cuda {

using namespace attention_detail;

namespace {

template <bool B16>
__global__ void write_kv_kernel(KvWriteArgs a) {
  int64_t t = blockIdx.x;
  int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  int64_t row = a.cache.num_kv_heads * a.cache.head_dim;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    kv_store<B16>(a.cache.k, slot * row + i, a.k[t * a.ldk + i]);
    kv_store<B16>(a.cache.v, slot * row + i, a.v[t * a.ldv + i]);
  }
}

// ---- generic: one key per warp at a time ----

// R = ceil(head_dim / 32) elements per lane.
template <int R, bool B16>
__global__ void __launch_bounds__(kWarps * 32) attention_generic_kernel(AttentionArgs a) {
  const KvCacheView& c = a.cache;
  const int64_t d = c.head_dim, t = blockIdx.x, h = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = seq_of_row(a, t);
  const int64_t q_begin = a.query_start[s], q_len = a.query_start[s + 1] - q_begin, ctx = a.context_lens[s];
  const int64_t pos = ctx - q_len + (t - q_begin);
  const int64_t first = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
  const int64_t group = a.num_heads / c.num_kv_heads, kvh = h / group;
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;

  float qv[R], acc[R];
  const float* q = a.q + t * a.ldq + h * d;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int64_t i = lane + 32 * r;
    qv[r] = i < d ? q[i] : 0.0f;
    acc[r] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = first + warp; j <= pos; j += kWarps) {
    const int64_t off = kv_offset(c, table, j, kvh);
    float kr[R], vr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      int64_t i = lane + 32 * r;
      kr[r] = i < d ? kv_load<B16>(c.k, off + i) : 0.0f;
      vr[r] = i < d ? kv_load<B16>(c.v, off + i) : 0.0f;
    }
    float dot = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) dot += qv[r] * kr[r];
    float score = cuda_util::warp_sum(dot) * a.scale;
    float m_new = fmaxf(m, score);
    float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = acc[r] * corr + p * vr[r];
    m = m_new;
  }

  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    int i = lane + 32 * r;
    if (i < d) s_acc[warp][i] = acc[r];
  }
  __syncthreads();
  float mx = a.sinks ? a.sinks[h] : -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  float denom = a.sinks ? expf(a.sinks[h] - mx) : 0.0f;
  float scale_w[kWarps];
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = s_l[w] > 0.0f ? expf(s_m[w] - mx) : 0.0f;
    denom += s_l[w] * scale_w[w];
  }
  float inv = 1.0f / denom;
  float* o = a.out + t * a.ldo + h * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += s_acc[w][i] * scale_w[w];
    o[i] = sum * inv;
  }
}

// ---- decode: flash decoding ----

// Merges the splits' partial states of (row t, head h) with the sink logit into the output (all threads of
// the CTA, at least 32; splits <= 64, decode_split's bound). L2: read the partials past L1 (written by other
// CTAs of the same kernel: the fused combine). Warp 0 reads every split's max and sum at once (lane i
// splits i and i + 32), reduces them and leaves each split's weight exp(m_s − max) / denominator in shared
// memory; then each output dimension is the weighted sum over the splits, its loads independent of each
// other. (A loop over the splits per thread for the max, again for the denominator and again per
// dimension chained ~3·splits dependent L2 reads: 5.4 us per layer at batch 1 on the H100, session 46.)
template <bool L2>
__device__ __forceinline__ void merge_splits(const AttentionArgs& a, int splits, const float* part, int64_t t,
                                             int64_t h) {
  constexpr int kMaxSplits = 64;
  __shared__ float s_w[kMaxSplits];
  const int64_t D = a.cache.head_dim;
  const float* src = part + (t * a.num_heads + h) * splits * (D + 2);
  auto ld = [&](const float* p) { return L2 ? __ldcg(p) : *p; };
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int sp = lane + 32 * i;
      if (sp < splits) {
        m[i] = ld(src + sp * (D + 2) + D);
        l[i] = ld(src + sp * (D + 2) + D + 1);
      }
    }
    float mx = cuda_util::warp_max(fmaxf(m[0], m[1]));
    if (a.sinks != nullptr) mx = fmaxf(mx, a.sinks[h]);
    float w[2], den = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      w[i] = m[i] != -INFINITY ? expf(m[i] - mx) : 0.0f;
      den += l[i] * w[i];
    }
    den = cuda_util::warp_sum(den);
    if (a.sinks != nullptr) den += expf(a.sinks[h] - mx);
    const float inv = 1.0f / den;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (lane + 32 * i < splits) s_w[lane + 32 * i] = w[i] * inv;
  }
  __syncthreads();
  float* out = a.out + t * a.ldo + h * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
#pragma unroll 4
    for (int sp = 0; sp < splits; ++sp) sum += s_w[sp] * ld(src + sp * (D + 2) + d);
    out[d] = sum;
  }
  __syncthreads();  // s_w is rewritten by the next merge of this CTA (the GQA kernel's heads)
}

// After a CTA wrote its split's partial state: counts it in *counter (one per (row, head) or head group)
// and tells whether it was the last of the `splits`, which then merges them all and leaves the counter zero
// for the next call (threadfence reduction: each CTA's writes are fenced before its count, the last one
// fences again before reading the others'). All threads of the CTA call it.
__device__ __forceinline__ bool last_split(int32_t* counter, int splits) {
  __shared__ int s_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(counter, 1);
    s_last = prev == splits - 1 ? 1 : 0;
    if (s_last) *counter = 0;  // every split has counted: nothing else touches it in this call
  }
  __syncthreads();
  if (s_last) __threadfence();
  return s_last != 0;
}

// NV = head_dim / 32: float4 per lane per key (8 lanes per key). The CTA takes the visible keys
// [first + split·split_len, first + (split+1)·split_len) ∩ [first, pos] of its (row, head), where
// split_len = ceil(visible / splits) of the row's own visible keys: the split count is fixed by the
// longest possible context (a CUDA graph's shape), the work is spread over the context there is. part ==
// nullptr: one split, the output is written; else the split's (unnormalised acc [D], m, l) go to
// part[((t·num_heads + h)·splits + split)·(D + 2)].
template <int NV, bool B16>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_kernel(AttentionArgs a, float* part, int32_t* counters) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  constexpr int D = NV * 32;
  const KvCacheView& c = a.cache;
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int split = blockIdx.z, splits = gridDim.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane >> 3, sub = lane & 7;
  const int s = seq_of_row(a, t);
  const int64_t q_begin = a.query_start[s], q_len = a.query_start[s + 1] - q_begin, ctx = a.context_lens[s];
  const int64_t pos = ctx - q_len + (t - q_begin);
  const int64_t first = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
  const int64_t kvh = h / (a.num_heads / c.num_kv_heads);
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
  const int64_t split_len = (pos + 1 - first + splits - 1) / splits;
  const int64_t j_begin = first + split * split_len;
  const int64_t j_end = min(pos + 1, j_begin + split_len);  // exclusive

  float4 qv[NV], acc[NV];
  const float* q = a.q + t * a.ldq + h * D;
#pragma unroll
  for (int jj = 0; jj < NV; ++jj) {
    const int d = sub * 4 + 32 * jj;
    qv[jj] = make_float4(q[d] * a.scale, q[d + 1] * a.scale, q[d + 2] * a.scale, q[d + 3] * a.scale);
    acc[jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  float m = -INFINITY, l = 0.0f;
  // The warp's lanes stay together (the shuffles need all of them); a group past j_end skips the update.
  for (int64_t jb = j_begin + warp * 4; jb < j_end; jb += kWarps * 4) {
    const int64_t j = jb + grp;
    const bool ok = j < j_end;
    float4 kr[NV], vr[NV];
    if (ok) {
      const int64_t off = kv_offset(c, table, j, kvh);
#pragma unroll
      for (int jj = 0; jj < NV; ++jj) {
        kr[jj] = kv_load4<B16>(c.k, off + 4 * (sub + 8 * jj));
        vr[jj] = kv_load4<B16>(c.v, off + 4 * (sub + 8 * jj));
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < NV; ++jj) kr[jj] = vr[jj] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float dot = 0.0f;
#pragma unroll
    for (int jj = 0; jj < NV; ++jj)
      dot += qv[jj].x * kr[jj].x + qv[jj].y * kr[jj].y + qv[jj].z * kr[jj].z + qv[jj].w * kr[jj].w;
    dot += __shfl_xor_sync(0xffffffffu, dot, 1, 8);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2, 8);
    dot += __shfl_xor_sync(0xffffffffu, dot, 4, 8);
    if (!ok) continue;
    const float m_new = fmaxf(m, dot);
    const float corr = expf(m - m_new), p = expf(dot - m_new);
    l = l * corr + p;
#pragma unroll
    for (int jj = 0; jj < NV; ++jj) {
      acc[jj].x = acc[jj].x * corr + p * vr[jj].x;
      acc[jj].y = acc[jj].y * corr + p * vr[jj].y;
      acc[jj].z = acc[jj].z * corr + p * vr[jj].z;
      acc[jj].w = acc[jj].w * corr + p * vr[jj].w;
    }
    m = m_new;
  }
  // Merge the 4 lane groups of the warp (lanes sub, sub + 8, sub + 16, sub + 24).
#pragma unroll
  for (int o = 8; o < 32; o <<= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, m, o), ol = __shfl_xor_sync(0xffffffffu, l, o);
    const float mn = fmaxf(m, om);
    const float sa = m == -INFINITY ? 0.0f : expf(m - mn), sb = om == -INFINITY ? 0.0f : expf(om - mn);
    l = l * sa + ol * sb;
#pragma unroll
    for (int jj = 0; jj < NV; ++jj) {
      acc[jj].x = acc[jj].x * sa + __shfl_xor_sync(0xffffffffu, acc[jj].x, o) * sb;
      acc[jj].y = acc[jj].y * sa + __shfl_xor_sync(0xffffffffu, acc[jj].y, o) * sb;
      acc[jj].z = acc[jj].z * sa + __shfl_xor_sync(0xffffffffu, acc[jj].z, o) * sb;
      acc[jj].w = acc[jj].w * sa + __shfl_xor_sync(0xffffffffu, acc[jj].w, o) * sb;
    }
    m = mn;
  }
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ __align__(16) float s_acc[kWarps][D];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
  if (grp == 0) {
#pragma unroll
    for (int jj = 0; jj < NV; ++jj) *reinterpret_cast<float4*>(&s_acc[warp][sub * 4 + 32 * jj]) = acc[jj];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  const bool with_sink = part == nullptr && a.sinks != nullptr;
  if (with_sink) mx = fmaxf(mx, a.sinks[h]);
  float scale_w[kWarps];
  float denom = with_sink ? expf(a.sinks[h] - mx) : 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    scale_w[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - mx);
    denom += s_l[w] * scale_w[w];
  }
  if (part == nullptr) {
    const float inv = 1.0f / denom;
    float* out = a.out + t * a.ldo + h * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += s_acc[w][d] * scale_w[w];
      out[d] = sum * inv;
    }
  } else {
    float* dst = part + ((t * a.num_heads + h) * splits + split) * (D + 2);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += s_acc[w][d] * scale_w[w];
      dst[d] = sum;
    }
    if (threadIdx.x == 0) {
      dst[D] = mx;
      dst[D + 1] = denom;
    }
    // The fused combine: the split that finishes last merges them (counters: one per (row, head)).
    if (counters != nullptr && last_split(counters + t * a.num_heads + h, splits))
      merge_splits<true>(a, splits, part, t, h);
  }
}

// ---- decode, GQA: the query heads of one KV head share each K/V read ----

// GC query heads of one KV head per CTA (GQA groups of G heads take G / GC CTAs), NV = head_dim / 32. Each
// warp takes chunks of 32 keys (warp w the chunks w, w + 4, ...) of the CTA's split as the decode kernel's;
// lane i scores key chunk + i against the GC queries (kept scaled in shared memory, read as broadcasts),
// the chunk's online-softmax update per head is a warp reduction, then the lanes own output dimensions
// lane + 32·i and accumulate P·V over the chunk's keys (each V row read once, coalesced, for all GC heads;
// the probabilities through shared memory). K and V are read once per GC heads instead of once per head.
// Partial states and the final merge as attention_decode_kernel's (same part layout, so the same combine).
template <int NV, int GC, bool B16>
__global__ void __launch_bounds__(kWarps * 32)
    attention_decode_gqa_kernel(AttentionArgs a, float* part, int32_t* counters) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  constexpr int D = NV * 32;
  const KvCacheView& c = a.cache;
  const int64_t G = a.num_heads / c.num_kv_heads, chunks = G / GC;
  const int64_t t = blockIdx.x, kvh = blockIdx.y / chunks, h0 = kvh * G + (blockIdx.y % chunks) * GC;
  const int split = blockIdx.z, splits = gridDim.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int s = seq_of_row(a, t);
  const int64_t q_begin = a.query_start[s], q_len = a.query_start[s + 1] - q_begin, ctx = a.context_lens[s];
  const int64_t pos = ctx - q_len + (t - q_begin);
  const int64_t first = a.window > 0 ? max(static_cast<int64_t>(0), pos - a.window + 1) : 0;
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
  const int64_t split_len = (pos + 1 - first + splits - 1) / splits;
  const int64_t j_begin = first + split * split_len;
  const int64_t j_end = min(pos + 1, j_begin + split_len);  // exclusive

  __shared__ __align__(16) float s_q[GC][D];  // the heads' queries times the scale
  __shared__ float s_p[kWarps][GC][32];       // a chunk's probabilities
  __shared__ int64_t s_off[kWarps][32];       // a chunk's keys' offsets in the cache
  for (int i = threadIdx.x; i < GC * D; i += blockDim.x)
    s_q[i / D][i % D] = a.q[t * a.ldq + (h0 + i / D) * D + i % D] * a.scale;
  __syncthreads();
  float m[GC], l[GC], acc[GC][NV];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; ++i) acc[g][i] = 0.0f;
  }
  for (int64_t jc = j_begin + 32 * warp; jc < j_end; jc += 32 * kWarps) {
    const int64_t j = jc + lane;
    const bool ok = j < j_end;
    const int n = static_cast<int>(min(static_cast<int64_t>(32), j_end - jc));  // valid keys of the chunk
    float sc[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) sc[g] = 0.0f;
    if (ok) {
      const int64_t off = kv_offset(c, table, j, kvh);
      s_off[warp][lane] = off;
#pragma unroll 8
      for (int d = 0; d < D; d += 4) {
        const float4 kr = kv_load4<B16>(c.k, off + d);
#pragma unroll
        for (int g = 0; g < GC; ++g) {
          const float4 qv = *reinterpret_cast<const float4*>(&s_q[g][d]);
          sc[g] += qv.x * kr.x + qv.y * kr.y + qv.z * kr.z + qv.w * kr.w;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float mx = ok ? sc[g] : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[g], mx);  // finite: the chunk has a valid key
      const float p = ok ? expf(sc[g] - m_new) : 0.0f;
      float sum = p;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      const float corr = m[g] == -INFINITY ? 0.0f : expf(m[g] - m_new);
      l[g] = l[g] * corr + sum;
      m[g] = m_new;
#pragma unroll
      for (int i = 0; i < NV; ++i) acc[g][i] *= corr;
      s_p[warp][g][lane] = p;
    }
    __syncwarp();
    // Unrolled so that several keys' V loads are in flight at once (they do not depend on each other).
#pragma unroll 4
    for (int kk = 0; kk < n; ++kk) {
      const int64_t off = s_off[warp][kk];
      float vv[NV];
#pragma unroll
      for (int i = 0; i < NV; ++i) vv[i] = kv_load<B16>(c.v, off + lane + 32 * i);
#pragma unroll
      for (int g = 0; g < GC; ++g) {
        const float p = s_p[warp][g][kk];
#pragma unroll
        for (int i = 0; i < NV; ++i) acc[g][i] += p * vv[i];
      }
    }
    __syncwarp();  // s_p and s_off are rewritten by the next chunk
  }
  // Merge the warps per head (as the decode kernel), then write the output or the split's partial state.
  __shared__ float s_m[kWarps][GC], s_l[kWarps][GC];
  __shared__ float s_acc[kWarps][GC][D];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
    if (lane == 0) {
      s_m[warp][g] = m[g];
      s_l[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) s_acc[warp][g][lane + 32 * i] = acc[g][i];
  }
  __syncthreads();
  for (int g = 0; g < GC; ++g) {
    const int64_t h = h0 + g;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][g]);
    const bool with_sink = part == nullptr && a.sinks != nullptr;
    if (with_sink) mx = fmaxf(mx, a.sinks[h]);
    float scale_w[kWarps];
    float denom = with_sink ? expf(a.sinks[h] - mx) : 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      scale_w[w] = s_m[w][g] == -INFINITY ? 0.0f : expf(s_m[w][g] - mx);
      denom += s_l[w][g] * scale_w[w];
    }
    float* dst = part == nullptr ? a.out + t * a.ldo + h * D
                                 : part + ((t * a.num_heads + h) * splits + split) * (D + 2);
    const float inv = part == nullptr ? 1.0f / denom : 1.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += s_acc[w][g][d] * scale_w[w];
      dst[d] = sum * inv;
    }
    if (part != nullptr && threadIdx.x == 0) {
      dst[D] = mx;
      dst[D + 1] = denom;
    }
  }
  // The fused combine (counters: one per (row, head group)): the split that finishes last merges the
  // group's heads.
  if (part != nullptr && counters != nullptr &&
      last_split(counters + t * static_cast<int64_t>(gridDim.y) + blockIdx.y, splits)) {
    for (int g = 0; g < GC; ++g) merge_splits<true>(a, splits, part, t, h0 + g);
  }
}

// One CTA per (row, head): merges the splits' partial states with the sink logit.
__global__ void attention_combine_kernel(AttentionArgs a, int splits, const float* part) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  merge_splits<false>(a, splits, part, blockIdx.x, blockIdx.y);
}

enum class AttnPath { kPrefill, kDecode, kGeneric };

AttnPath choose_path(const AttentionArgs& a) {
  const int64_t d = a.cache.head_dim;
  if (a.num_tokens > 4 * a.num_seqs && (d == 64 || d == 128)) return AttnPath::kPrefill;
  if (d % 32 == 0 && d <= kMaxHeadDim) return AttnPath::kDecode;
  return AttnPath::kGeneric;
}

// Decode splits: enough CTAs for the tuning's attention_decode_ctas_per_sm per multiprocessor, each split
// at least attention_decode_split_keys keys of the longest possible context (max_blocks_per_seq ·
// block_size), at most 64 splits.
struct DecodeSplit {
  int splits = 1;
};
// The GQA decode kernel's heads per CTA for this call: 0 when it does not run (tuning attention_decode_gqa
// 0 or above the call's query rows, head_dim not 64 or 128, groups of one head), else 8, 4 or 2 (the largest
// dividing the group).
int decode_gqa_heads(const AttentionArgs& a, const KernelTuning& t) {
  const int64_t d = a.cache.head_dim, G = a.num_heads / a.cache.num_kv_heads;
  const int64_t from_rows = t.attention_decode_gqa;
  if (from_rows <= 0 || a.num_tokens < from_rows || (d != 64 && d != 128) || G < 2) return 0;
  return G % 8 == 0 ? 8 : G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 0;
}

DecodeSplit decode_split(const AttentionArgs& a, const KernelTuning& t) {
  const int64_t max_ctx = std::max<int64_t>(1, a.max_blocks_per_seq * a.cache.block_size);
  const int64_t visible = a.window > 0 ? std::min<int64_t>(max_ctx, a.window) : max_ctx;
  const int gc = decode_gqa_heads(a, t);  // the GQA kernel's CTAs: one per GC heads
  const int64_t rows = a.num_tokens * (gc > 0 ? a.num_heads / gc : a.num_heads);
  const int64_t per_sm = std::clamp<int64_t>(t.attention_decode_ctas_per_sm, 1, 32);
  const int64_t keys = std::clamp<int64_t>(t.attention_decode_split_keys, 8, 4096);
  const int64_t want = (per_sm * cuda_util::num_sms() + rows - 1) / rows;
  const int64_t most = (visible + keys - 1) / keys;
  DecodeSplit ds;
  ds.splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, 64})));
  return ds;
}

// The splits' partial states (none with one split).
size_t partial_bytes(const AttentionArgs& a, const DecodeSplit& ds) {
  if (ds.splits == 1) return 0;
  return static_cast<size_t>(a.num_tokens * a.num_heads * ds.splits * (a.cache.head_dim + 2)) * sizeof(float);
}

}  // namespace

size_t attention_workspace_bytes(const AttentionArgs& a) {
  if (a.num_seqs == 0 || a.num_tokens <= 0 || choose_path(a) != AttnPath::kDecode) return 0;
  return partial_bytes(a, decode_split(a, kernel_tuning(TuningShape{})));
}

void write_kv(const KvWriteArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  with_cache_type(a.cache, [&](auto b16) {
    write_kv_kernel<decltype(b16)::value><<<static_cast<unsigned>(a.m), 128, 0, cuda_util::stream(ctx)>>>(a);
  });
  CUDA_CHECK_LAUNCH();
}

template <int NV, bool B16>
void launch_decode(const AttentionArgs& a, const CudaContext& ctx) {
  cudaStream_t st = cuda_util::stream(ctx);
  const KernelTuning t = kernel_tuning(TuningShape{});
  const DecodeSplit ds = decode_split(a, t);
  float* part = nullptr;
  if (ds.splits > 1) {
    KERNEL_CHECK(partial_bytes(a, ds) <= ctx.workspace_bytes, "attention: workspace too small");
    part = static_cast<float*>(ctx.workspace);
  }
  const int gc = decode_gqa_heads(a, t);
  const bool gqa = gc > 0 && (NV == 2 || NV == 4);
  // The fused combine where the context's counters cover the CTA rows (each (row, head) or head group).
  const int64_t counter_rows = a.num_tokens * (gqa ? a.num_heads / gc : a.num_heads);
  int32_t* counters = part != nullptr && t.attention_decode_fused_combine != 0 && ctx.counters != nullptr &&
                              counter_rows <= ctx.num_counters
                          ? ctx.counters
                          : nullptr;
  if (gqa) {  // the query heads of a KV head share its K/V reads
    dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_heads / gc),
              static_cast<unsigned>(ds.splits));
    if constexpr (NV == 2 || NV == 4) {
      auto kernel = gc == 8   ? attention_decode_gqa_kernel<NV, 8, B16>
                    : gc == 4 ? attention_decode_gqa_kernel<NV, 4, B16>
                              : attention_decode_gqa_kernel<NV, 2, B16>;
      cuda_util::launch_pdl(kernel, grid, kWarps * 32, 0, st, a, part, counters);
    }
  } else {
    dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_heads),
              static_cast<unsigned>(ds.splits));
    cuda_util::launch_pdl(attention_decode_kernel<NV, B16>, grid, kWarps * 32, 0, st, a, part, counters);
  }
  CUDA_CHECK_LAUNCH();
  if (part != nullptr && counters == nullptr) {
    dim3 cgrid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_heads));
    cuda_util::launch_pdl(attention_combine_kernel, cgrid, 128, 0, st, a, ds.splits, part);
    CUDA_CHECK_LAUNCH();
  }
}

namespace {

// The path and kernel of one call, for a cache of BF16 (B16) or F32 elements.
template <bool B16>
void attention_t(const AttentionArgs& a, const CudaContext& ctx, bool tensor_cores) {
  cudaStream_t st = cuda_util::stream(ctx);
  switch (choose_path(a)) {
    case AttnPath::kPrefill:
      if (tensor_cores && kernel_tuning(TuningShape{}).attention_prefill_mma != 0) {
        launch_prefill_mma(a, st);
        return;
      }
      if (a.cache.head_dim == 64) {
        launch_prefill<64, B16>(a, st);
      } else {
        launch_prefill<128, B16>(a, st);
      }
      return;
    case AttnPath::kDecode: {
      // 128-bit loads need 16-byte aligned rows.
      if (cache_vec4(a.cache)) {
        switch (a.cache.head_dim / 32) {
          case 1:
            launch_decode<1, B16>(a, ctx);
            return;
          case 2:
            launch_decode<2, B16>(a, ctx);
            return;
          case 3:
            launch_decode<3, B16>(a, ctx);
            return;
          case 4:
            launch_decode<4, B16>(a, ctx);
            return;
          case 5:
            launch_decode<5, B16>(a, ctx);
            return;
          case 6:
            launch_decode<6, B16>(a, ctx);
            return;
          case 7:
            launch_decode<7, B16>(a, ctx);
            return;
          case 8:
            launch_decode<8, B16>(a, ctx);
            return;
        }
      }
      break;
    }
    case AttnPath::kGeneric:
      break;
  }
  dim3 grid(static_cast<unsigned>(a.num_tokens), static_cast<unsigned>(a.num_heads));
  switch ((a.cache.head_dim + 31) / 32) {
    case 1:
      attention_generic_kernel<1, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 2:
      attention_generic_kernel<2, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 3:
      attention_generic_kernel<3, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 4:
      attention_generic_kernel<4, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 5:
      attention_generic_kernel<5, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 6:
      attention_generic_kernel<6, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 7:
      attention_generic_kernel<7, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
    case 8:
      attention_generic_kernel<8, B16><<<grid, kWarps * 32, 0, st>>>(a);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention(const AttentionArgs& a, const CudaContext& ctx, bool tensor_cores) {
  if (a.num_seqs == 0) return;
  KERNEL_CHECK(a.num_tokens > 0, "attention: AttentionArgs::num_tokens (query_start[num_seqs]) must be set");
  KERNEL_CHECK(a.cache.head_dim >= 1 && a.cache.head_dim <= kMaxHeadDim,
               "attention: head_dim must be in 1..256");
  KERNEL_CHECK(a.num_heads % a.cache.num_kv_heads == 0,
               "attention: num_heads must be a multiple of num_kv_heads");
  KERNEL_CHECK(a.num_heads <= 65535, "attention: too many heads");
  with_cache_type(a.cache, [&](auto b16) { attention_t<decltype(b16)::value>(a, ctx, tensor_cores); });
}

}  // namespace polylora::kernels::cuda
