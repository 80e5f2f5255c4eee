// kernels/moe/moe_route_cuda.cu: routing and sorting for the MoE experts (moe_steps.h), on the device with
// no host sync: top-k per token by one warp, deterministic on ties (lower expert first); the pairs sorted by
// expert (and within an expert by adapter slot with slot-stacked LoRA) either by one block in shared memory
// (small batches, the GEMV paths) or by counts, offsets and a scatter (the grouped GEMMs). Must not: depend
// on anything above common/.
#include "kernels/moe/moe_steps.h"

#include "kernels/cuda_util.cuh"

namespace polylora::kernels::cuda {
namespace moe_detail {
namespace {

// ---- routing ----

// Is (v1, i1) ahead of (v2, i2)? Larger value first, lower index on ties; index −1 is "none".
__device__ __forceinline__ bool ahead(float v1, int i1, float v2, int i2) {
  return i2 < 0 || (i1 >= 0 && (v1 > v2 || (v1 == v2 && i1 < i2)));
}

// Token t's top-k by one whole warp: vals and taken are the warp's E floats and E bytes of shared memory.
__device__ __forceinline__ void route_token(const RouteArgs& a, int64_t t, float* vals, unsigned char* taken,
                                            int lane) {
  const int64_t E = a.num_experts;
  const float* logits = a.logits + t * E;
  const bool softmax_first = a.scoring == RouterScoring::kSoftmaxTopK;
  float mx = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) mx = fmaxf(mx, logits[e]);
  mx = cuda_util::warp_max(mx);
  float sum = 0.0f;
  for (int64_t e = lane; e < E; e += 32) {
    float v = logits[e];
    if (softmax_first) {
      v = expf(v - mx);
      sum += v;
    }
    vals[e] = v;
    taken[e] = 0;
  }
  if (softmax_first) {
    sum = cuda_util::warp_sum(sum);
    for (int64_t e = lane; e < E; e += 32) vals[e] /= sum;
  }
  __syncwarp();
  int32_t* ids = a.ids + t * a.top_k;
  float* w = a.weights + t * a.top_k;
  for (int64_t k = 0; k < a.top_k; ++k) {
    float bv = -INFINITY;
    int bi = -1;
    for (int64_t e = lane; e < E; e += 32) {
      if (!taken[e] && ahead(vals[e], static_cast<int>(e), bv, bi)) {
        bv = vals[e];
        bi = static_cast<int>(e);
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ahead(ov, oi, bv, bi)) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == 0) {
      ids[k] = bi - static_cast<int32_t>(a.id_begin);
      w[k] = bv;
      taken[bi] = 1;
    }
    __syncwarp();
  }
  if (lane == 0) {
    if (softmax_first) {
      if (a.renormalize) {
        float total = 0.0f;
        for (int64_t k = 0; k < a.top_k; ++k) total += w[k];
        for (int64_t k = 0; k < a.top_k; ++k) w[k] /= total;
      }
    } else {
      float top = w[0], total = 0.0f;
      for (int64_t k = 0; k < a.top_k; ++k) total += w[k] = expf(w[k] - top);
      for (int64_t k = 0; k < a.top_k; ++k) w[k] /= total;
    }
  }
  __syncwarp();
}

__global__ void route_kernel(RouteArgs a) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float route_smem_f[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  const int64_t E = a.num_experts;
  if (t >= a.m) return;
  route_token(a, t, route_smem_f + warp * E,
              reinterpret_cast<unsigned char*>(route_smem_f + kRouteWarps * E) + warp * E, lane);
}

// ---- align ----

// The slot bucket of a pair's token: 1 + its adapter slot, 0 without one (or without slots).
__device__ __forceinline__ int32_t slot_bucket(const int32_t* token_slots, int64_t top_k, int64_t buckets,
                                               int64_t pair) {
  if (buckets <= 1 || token_slots == nullptr) return 0;
  const int32_t s = token_slots[pair / top_k];
  return s >= 0 && s + 1 < buckets ? s + 1 : 0;
}

// The body of align_small_kernel for one whole block (align_smem: align_small_smem bytes).
__device__ __forceinline__ void align_small_block(const SmallSortArgs& s, int32_t* align_smem) {
  const int32_t* ids = s.ids;
  const int64_t pairs = s.pairs, E = s.E, top_k = s.top_k, buckets = s.buckets;
  int32_t *counts = s.counts, *offsets = s.offsets, *active = s.active, *num_active = s.num_active,
          *num_rows = s.num_rows, *sorted = s.sorted;
  const int32_t* token_slots = s.token_slots;
  int32_t* cnt = align_smem;  // [E]
  int32_t* cursor = cnt + E;  // [E]
  int32_t* sub = cursor + E;  // [E][buckets] with buckets > 1
  const bool by_slot = buckets > 1 && token_slots != nullptr;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  if (by_slot)
    for (int64_t i = threadIdx.x; i < E * buckets; i += blockDim.x) sub[i] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    int32_t e = ids[p];
    if (e >= 0 && e < E) {
      atomicAdd(&cnt[e], 1);
      if (by_slot) atomicAdd(&sub[e * buckets + slot_bucket(token_slots, top_k, buckets, p)], 1);
    }
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    // Warp 0: exclusive scans of the counts and of (count > 0) over lane-contiguous ranges of experts.
    const int lane = threadIdx.x;
    const int64_t per = (E + 31) / 32, b = lane * per, en = b + per < E ? b + per : E;
    int32_t sum = 0, nact = 0;
    for (int64_t e = b; e < en; ++e) {
      sum += cnt[e];
      nact += cnt[e] > 0;
    }
    int32_t isum = sum, iact = nact;
    for (int o = 1; o < 32; o <<= 1) {
      int32_t vs = __shfl_up_sync(0xffffffffu, isum, o), va = __shfl_up_sync(0xffffffffu, iact, o);
      if (lane >= o) {
        isum += vs;
        iact += va;
      }
    }
    int32_t run = isum - sum, ra = iact - nact;
    for (int64_t e = b; e < en; ++e) {
      cursor[e] = run;
      offsets[e] = run;
      counts[e] = cnt[e];
      if (cnt[e] > 0) active[ra++] = static_cast<int32_t>(e);
      run += cnt[e];
    }
    if (lane == 31) {
      *num_active = iact;
      *num_rows = isum;
    }
  }
  __syncthreads();
  if (by_slot) {
    for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
      int32_t run = cursor[e];
      for (int64_t b = 0; b < buckets; ++b) {
        const int32_t c = sub[e * buckets + b];
        sub[e * buckets + b] = run;
        run += c;
      }
    }
    __syncthreads();
  }
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    int32_t e = ids[p];
    if (e < 0 || e >= E) continue;
    int32_t* cur = by_slot ? &sub[e * buckets + slot_bucket(token_slots, top_k, buckets, p)] : &cursor[e];
    sorted[atomicAdd(cur, 1)] = static_cast<int32_t>(p);
  }
}

__global__ void align_small_kernel(SmallSortArgs s) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ int32_t align_smem[];
  align_small_block(s, align_smem);
}

// Pairs per expert, and per (expert, slot bucket) when there are buckets.
__global__ void count_kernel(const int32_t* ids, int64_t pairs, int64_t E, int32_t* counts,
                             const int32_t* token_slots, int64_t top_k, int64_t buckets,
                             int32_t* sub_counts) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int32_t e = ids[p];
    if (e < 0 || e >= E) continue;
    atomicAdd(&counts[e], 1);
    if (buckets > 1) atomicAdd(&sub_counts[e * buckets + slot_bucket(token_slots, top_k, buckets, p)], 1);
  }
}

// One block: tiles per expert scanned in shared memory, then the tile -> expert map filled in parallel.
__global__ void offsets_kernel(const int32_t* counts, int64_t E, int tile_m, int32_t* offsets,
                               int32_t* tile_expert, int32_t* num_tiles) {
  extern __shared__ int32_t offsets_smem[];  // [E] first tile of each expert, then [E] tiles
  int32_t* first = offsets_smem;
  int32_t* ntiles = offsets_smem + E;
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) ntiles[e] = (counts[e] + tile_m - 1) / tile_m;
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t tile = 0;
    for (int64_t e = 0; e < E; ++e) {
      first[e] = tile;
      tile += ntiles[e];
    }
    *num_tiles = tile;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    offsets[e] = first[e] * tile_m;
    for (int32_t i = 0; i < ntiles[e]; ++i) tile_expert[first[e] + i] = static_cast<int32_t>(e);
  }
}

// With slot buckets: the scatter cursors start at each (expert, bucket)'s first row within the expert
// (an exclusive scan of sub_counts over the buckets; one thread per expert).
__global__ void bucket_cursors_kernel(const int32_t* sub_counts, int64_t E, int64_t buckets, int32_t* fill) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < E;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int32_t run = 0;
    for (int64_t b = 0; b < buckets; ++b) {
      fill[e * buckets + b] = run;
      run += sub_counts[e * buckets + b];
    }
  }
}

// Each pair to its expert's rows (within them, its slot bucket's range when there are buckets; in any order
// within a bucket: each pair's result is computed on its own).
__global__ void scatter_kernel(const int32_t* ids, int64_t pairs, int64_t E, const int32_t* offsets,
                               int32_t* fill, int32_t* sorted, const int32_t* token_slots, int64_t top_k,
                               int64_t buckets) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int32_t e = ids[p];
    if (e < 0 || e >= E) continue;
    const int64_t b = slot_bucket(token_slots, top_k, buckets, p);
    sorted[offsets[e] + atomicAdd(&fill[e * buckets + b], 1)] = static_cast<int32_t>(p);
  }
}

// Eight f32 values -> eight bf16 (hi) and, with lo, the rounding remainders as bf16 (cuda_util::split_bf16).
__device__ __forceinline__ void pack_bf16x8(const float (&v)[8], uint4* hi, uint4* lo) {
  uint32_t h[4], l[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const cuda_util::Bf16Pair a = cuda_util::split_bf16(v[2 * j]), b = cuda_util::split_bf16(v[2 * j + 1]);
    h[j] = static_cast<uint32_t>(__bfloat16_as_ushort(a.hi)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(b.hi)) << 16);
    l[j] = static_cast<uint32_t>(__bfloat16_as_ushort(a.lo)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(b.lo)) << 16);
  }
  *hi = make_uint4(h[0], h[1], h[2], h[3]);
  if (lo != nullptr) *lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// Items first, first + stride, ... of the cast (8 columns each).
__device__ __forceinline__ void cast_x_bf16_items(const CastArgs& c, int64_t first, int64_t stride) {
  const float* x = c.x;
  const int64_t ldx = c.ldx, H = c.H, lda = c.lda, copies = c.copies;
  __nv_bfloat16* out = c.out;
  const int64_t per_row = lda / 8, total = c.m * per_row;
  for (int64_t idx = first; idx < total; idx += stride) {
    const int64_t t = idx / per_row, k0 = (idx % per_row) * 8;
    const float* src = x + t * ldx;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = k0 + j < H ? src[k0 + j] : 0.0f;
    __nv_bfloat16* row = out + t * copies * lda;
    pack_bf16x8(v, reinterpret_cast<uint4*>(row + k0),
                copies == 2 ? reinterpret_cast<uint4*>(row + lda + k0) : nullptr);
  }
}

__global__ void cast_x_bf16_kernel(CastArgs c) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  cast_x_bf16_items(c, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                    static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// Small batches with their routing (MoeExpertsArgs::route, KernelTuning::moe_route_fused_max_tokens): CTA 0
// routes every token (warp w the tokens w, w + warps, ...; route_token as route_kernel) and then sorts the
// pairs (align_small_block); CTAs 1.. cast x to bf16 (with.out != nullptr), which does not need the
// routing. One launch for what took three.
__global__ void route_sort_small_kernel(RouteArgs r, SmallSortArgs s, CastArgs c) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ __align__(16) unsigned char route_sort_smem[];
  if (blockIdx.x > 0) {
    cast_x_bf16_items(c, (blockIdx.x - 1) * static_cast<int64_t>(blockDim.x) + threadIdx.x,
                      static_cast<int64_t>(gridDim.x - 1) * blockDim.x);
    return;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int64_t E = r.num_experts;
  auto* vals = reinterpret_cast<float*>(route_sort_smem);
  auto* taken = route_sort_smem + static_cast<size_t>(warps * E) * sizeof(float);
  for (int64_t t = warp; t < r.m; t += warps) route_token(r, t, vals + warp * E, taken + warp * E, lane);
  __syncthreads();  // the ids (global memory, written by this block) are visible to the whole block
  align_small_block(s, reinterpret_cast<int32_t*>(route_sort_smem));
}

}  // namespace

void launch_route(const RouteArgs& a, cudaStream_t st) {
  const size_t smem = route_smem(a.num_experts, kRouteWarps);
  KERNEL_CHECK(smem <= 48 * 1024, "route: too many experts for one block's shared memory");
  const unsigned blocks = static_cast<unsigned>((a.m + kRouteWarps - 1) / kRouteWarps);
  cuda_util::launch_pdl(route_kernel, blocks, kRouteWarps * 32, smem, st, a);
  CUDA_CHECK_LAUNCH();
}

void launch_align_small(const SmallSortArgs& s, size_t smem, cudaStream_t st) {
  cuda_util::launch_pdl(align_small_kernel, 1, kAlignSmallThreads, smem, st, s);
  CUDA_CHECK_LAUNCH();
}

void launch_route_sort_small(const RouteArgs& r, const SmallSortArgs& s, const CastArgs& c,
                             unsigned cast_blocks, size_t smem, cudaStream_t st) {
  cuda_util::launch_pdl(route_sort_small_kernel, 1 + cast_blocks, kAlignSmallThreads, smem, st, r, s, c);
  CUDA_CHECK_LAUNCH();
}

void launch_cast_x_bf16(const CastArgs& c, unsigned blocks, unsigned threads, cudaStream_t st) {
  cuda_util::launch_pdl(cast_x_bf16_kernel, blocks, threads, 0, st, c);
  CUDA_CHECK_LAUNCH();
}

void launch_grouped_align(const GroupedAlignArgs& g, cudaStream_t st) {
  const int64_t E = g.E, nb = g.buckets;
  CUDA_CHECK(cudaMemsetAsync(g.counts, 0, static_cast<size_t>(4 * E), st));
  CUDA_CHECK(cudaMemsetAsync(g.fill, 0, static_cast<size_t>(4 * E * nb), st));
  if (nb > 1) CUDA_CHECK(cudaMemsetAsync(g.sub_counts, 0, static_cast<size_t>(4 * E * nb), st));
  CUDA_CHECK(cudaMemsetAsync(g.sorted, 0xff, static_cast<size_t>(4 * g.max_rows), st));
  const unsigned pair_blocks = cuda_util::blocks_for(g.pairs, 256, 4096);
  count_kernel<<<pair_blocks, 256, 0, st>>>(g.ids, g.pairs, E, g.counts, g.token_slots, g.top_k, nb,
                                            g.sub_counts);
  CUDA_CHECK_LAUNCH();
  const size_t smem = static_cast<size_t>(8 * E);
  KERNEL_CHECK(smem <= 48 * 1024, "moe_experts: too many experts for the offsets kernel");
  offsets_kernel<<<1, 1024, smem, st>>>(g.counts, E, g.tile_m, g.offsets, g.tile_expert, g.num_tiles);
  CUDA_CHECK_LAUNCH();
  if (nb > 1) {
    bucket_cursors_kernel<<<cuda_util::blocks_for(E, 128, 1024), 128, 0, st>>>(g.sub_counts, E, nb, g.fill);
    CUDA_CHECK_LAUNCH();
  }
  scatter_kernel<<<pair_blocks, 256, 0, st>>>(g.ids, g.pairs, E, g.offsets, g.fill, g.sorted, g.token_slots,
                                              g.top_k, nb);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moe_detail

void route(const RouteArgs& a, const CudaContext& ctx) {
  if (a.m == 0) return;
  KERNEL_CHECK(a.top_k >= 1 && a.top_k <= a.num_experts, "route: top_k must be in 1..num_experts");
  moe_detail::launch_route(a, cuda_util::stream(ctx));
}

}  // namespace polylora::kernels::cuda
