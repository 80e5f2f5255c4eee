// kernels/attention/attention_cuda_common.cuh: what the CUDA attention kernels share (attention_cuda.cu's
// CUDA-core kernels, attention_mma_cuda.cu's tensor-core prefill; rope_cuda.cu's cache writes): the CTA shape
// constants, a query row's sequence, a key's offset in the paged cache, loads and stores of the cache's
// elements (F32 or BF16), the prefill grid's (sequence, query block) of a CTA, and the tensor-core
// prefill's launcher. Only included from .cu files. Must not: depend on anything above common/.
#pragma once

#include <type_traits>

#include "kernels/attention/attention.h"
#include "kernels/cuda_util.cuh"

namespace polylora::kernels::cuda::attention_detail {

constexpr int kWarps = 4;
constexpr int kMaxHeadDim = 256;

constexpr int kFaBQ = 64;  // prefill: query rows per CTA (16 per warp)

// Sequence of query row t: the last s with query_start[s] <= t.
__device__ __forceinline__ int seq_of_row(const AttentionArgs& a, int64_t t) {
  int lo = 0, hi = static_cast<int>(a.num_seqs) - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (a.query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Offset (in elements) of key j's head kvh in the cache.
__device__ __forceinline__ int64_t kv_offset(const KvCacheView& c, const int32_t* table, int64_t j,
                                             int64_t kvh) {
  return (static_cast<int64_t>(table[j / c.block_size]) * c.block_size + j % c.block_size) *
             (c.num_kv_heads * c.head_dim) +
         kvh * c.head_dim;
}

// Element `off` of a KV-cache array (B16: BF16, else F32; the kernels take it as a template argument, so
// their F32 instantiations are the f32 kernels as they were) as f32 (BF16 widened exactly); kv_load4:
// elements off .. off + 3 (off a multiple of 4, the array 16-byte aligned); kv_store: v into element off
// (BF16: rounded to nearest even). with_cache_type calls fn with std::true_type for a BF16 cache, else
// std::false_type.
template <bool B16>
__device__ __forceinline__ float kv_load(const void* p, int64_t off) {
  if constexpr (B16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[off]);
  } else {
    return static_cast<const float*>(p)[off];
  }
}
template <bool B16>
__device__ __forceinline__ float4 kv_load4(const void* p, int64_t off) {
  if constexpr (B16) {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + off);
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),
                       __uint_as_float(w.y << 16), __uint_as_float(w.y & 0xffff0000u));
  } else {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(p) + off);
  }
}
template <bool B16>
__device__ __forceinline__ void kv_store(void* p, int64_t off, float v) {
  if constexpr (B16) {
    static_cast<__nv_bfloat16*>(p)[off] = __float2bfloat16_rn(v);
  } else {
    static_cast<float*>(p)[off] = v;
  }
}
template <typename Fn>
void with_cache_type(const KvCacheView& c, Fn&& fn) {
  KERNEL_CHECK(c.dtype == DType::kF32 || c.dtype == DType::kBF16, "the KV cache is F32 or BF16");
  if (c.dtype == DType::kBF16) {
    fn(std::true_type{});
  } else {
    fn(std::false_type{});
  }
}

// Which (sequence, block of kFaBQ query rows) is CTA `b`? Blocks are numbered sequence by sequence.
// Warp 0 scans ceil(q_len / kFaBQ) over the sequences, 32 at a time; s_seq = −1 past the last block.
__device__ __forceinline__ void fa_find_block(const AttentionArgs& a, int b, int* s_seq, int* s_blk) {
  const int lane = threadIdx.x & 31;
  if (threadIdx.x >= 32) return;
  int run = 0;
  if (lane == 0) *s_seq = -1;
  __syncwarp();
  for (int base = 0; base < a.num_seqs; base += 32) {
    const int s = base + lane;
    int nb = 0;
    if (s < a.num_seqs) nb = (a.query_start[s + 1] - a.query_start[s] + kFaBQ - 1) / kFaBQ;
    int incl = nb;
    for (int o = 1; o < 32; o <<= 1) {
      int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (nb > 0 && b >= run + incl - nb && b < run + incl) {
      *s_seq = s;
      *s_blk = b - (run + incl - nb);
    }
    run += __shfl_sync(0xffffffffu, incl, 31);
    if (b < run) break;
  }
}

// A prefill CTA's block of query rows (fa_find_block's sequence s, block blk) and head: its rows' place in
// the sequence and the keys they can see, [kfirst, klast]; and the first key and the last row position of
// warp w's 16 rows (warp_first, warp_last; a warp with no row is inactive).
struct FaBlock {
  int s = 0, row0 = 0, nrows = 0;
  int64_t h = 0, kvh = 0, q_begin = 0, pos0 = 0, klast = 0, kfirst = 0;
  const int32_t* table = nullptr;
  __device__ bool warp_active(int w) const { return w * 16 < nrows; }
  __device__ int64_t warp_last(int w) const { return pos0 + min(w * 16 + 15, nrows - 1); }
  __device__ int64_t warp_first(const AttentionArgs& a, int w) const {
    return a.window > 0 ? max(static_cast<int64_t>(0), pos0 + w * 16 - a.window + 1) : 0;
  }
};
__device__ __forceinline__ FaBlock fa_block(const AttentionArgs& a, int s, int blk, int64_t h) {
  FaBlock b;
  b.s = s;
  b.h = h;
  b.kvh = h / (a.num_heads / a.cache.num_kv_heads);
  b.q_begin = a.query_start[s];
  const int64_t q_len = a.query_start[s + 1] - b.q_begin, ctx = a.context_lens[s];
  b.row0 = blk * kFaBQ;
  b.nrows = static_cast<int>(q_len - b.row0 < kFaBQ ? q_len - b.row0 : kFaBQ);
  b.pos0 = ctx - q_len + b.row0;  // position of the block's first row
  b.klast = b.pos0 + b.nrows - 1;
  b.kfirst = a.window > 0 ? max(static_cast<int64_t>(0), b.pos0 - a.window + 1) : 0;
  b.table = a.block_tables + s * a.max_blocks_per_seq;
  return b;
}

// Can the kernels read the cache 4 elements at a time (kv_load4: rows of a multiple of 4 elements, both
// arrays 16-byte aligned)?
inline bool cache_vec4(const KvCacheView& c) {
  return (c.num_kv_heads * c.head_dim) % 4 == 0 && (reinterpret_cast<uintptr_t>(c.k) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(c.v) & 15) == 0;
}

// The flash prefill kernels' grid: a CTA per (block of kFaBQ query rows of one sequence, head), the blocks
// counted generously (ceil(tokens / kFaBQ) + one partial block per sequence; fa_find_block retires the rest).
inline dim3 prefill_grid(const AttentionArgs& a) {
  const int64_t blocks = (a.num_tokens + kFaBQ - 1) / kFaBQ + a.num_seqs;
  KERNEL_CHECK(blocks < (1LL << 31), "attention: too many query blocks");
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.num_heads));
}

// attention_prefill_cuda.cu: the CUDA-core flash prefill for head_dim D (64 or 128) over an F32 or BF16
// (B16) cache.
template <int D, bool B16>
void launch_prefill(const AttentionArgs& a, cudaStream_t st);
// attention_mma_cuda.cu: the prefill on bf16 tensor cores (head_dim 64 or 128), same grid as the CUDA-core
// prefill (blocks of kFaBQ query rows of one sequence × heads).
void launch_prefill_mma(const AttentionArgs& a, cudaStream_t st);

}  // namespace polylora::kernels::cuda::attention_detail
