// kernels/lora/lora_stack_cuda.cuh: the CUDA building blocks of slot-stacked LoRA (lora.h LoraStack, moe.h
// MoeLoraStack), shared by lora_cuda.cu (dense, SGMV-style) and moe_lora_stack_cuda.cu (expert LoRA):
// - shrink_kernel: tmp[row, j] = A[key(row)][j] · in[row] over tiles of kTileRows consecutive rows; each
//   warp streams the tile's inputs and its rank rows' weights (no shared staging) and computes Q rank
//   rows of the concatenated rank space of up to kMaxLoraGroup modules (q/k/v share one read of x). Rows
//   of the tile with the same key (adapter slot, or slot × expert) share one read of the weights: the
//   weights are read once per distinct key in the tile, so prefill tiles (one sequence, one slot) and
//   expert segments sorted by slot read each matrix once.
// - expand helpers: B rows for a key read once per tile, dotted with the tmp rows of every row with that
//   key; the dense expand adds scale · B · tmp into y, the MoE ones are fused into the activation and
//   combine kernels (moe_lora_stack_cuda.cu), so the LoRA sum costs no pass of its own over the outputs.
// Weights are F32 or BF16 (TW); inputs, tmp and outputs f32. Only included from .cu files.
// Must not: depend on anything above common/.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda_util.cuh"
#include "kernels/lora/lora.h"

namespace polylora::kernels::lora_stack {

constexpr int kTileRows = 8;  // rows (tokens, or sorted expert rows) per block
constexpr int kShrinkWarps = 4;
constexpr int kChunk = 256;  // input elements per step of a warp (and the split-K granularity)
constexpr int kExpandThreads = 256;

// 8 consecutive elements w[i..i+8) as f32 (vec: i is a multiple of 8 and the row is 16-byte aligned),
// elements at or past `end` read as 0 (scalar path only: the vector path is used when they all exist).
__device__ __forceinline__ void load8(const float* w, int64_t i, int64_t end, bool vec, float* v) {
  if (vec) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(w + i));
    const float4 b = __ldg(reinterpret_cast<const float4*>(w + i + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    return;
  }
#pragma unroll
  for (int q = 0; q < 8; ++q) v[q] = i + q < end ? w[i + q] : 0.0f;
}
__device__ __forceinline__ void load8(const __nv_bfloat16* w, int64_t i, int64_t end, bool vec, float* v) {
  if (vec) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(w + i));
    const auto* p = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 f = __bfloat1622float2(p[q]);
      v[2 * q] = f.x;
      v[2 * q + 1] = f.y;
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < 8; ++q) v[q] = i + q < end ? __bfloat162float(w[i + q]) : 0.0f;
}

// Eight consecutive weights as loaded, converted to f32 when used: F32 keeps 8 floats, BF16 the raw 16 bytes
// (4 registers instead of 8, so tiles that hold a row's weights per tile row keep their occupancy; the
// values and the order of the sums are the same as load8's).
template <typename TW>
struct Pack8;
template <>
struct Pack8<float> {
  float v[8];
  __device__ __forceinline__ void load(const float* w, int64_t i, int64_t end, bool vec) {
    load8(w, i, end, vec, v);
  }
  __device__ __forceinline__ float get(int e) const { return v[e]; }
};
template <>
struct Pack8<__nv_bfloat16> {
  uint32_t u[4];
  __device__ __forceinline__ void load(const __nv_bfloat16* w, int64_t i, int64_t end, bool vec) {
    if (vec) {
      const uint4 q = __ldg(reinterpret_cast<const uint4*>(w + i));
      u[0] = q.x, u[1] = q.y, u[2] = q.z, u[3] = q.w;
      return;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t lo = i + 2 * q < end ? __bfloat16_as_ushort(w[i + 2 * q]) : 0u;
      const uint32_t hi = i + 2 * q + 1 < end ? __bfloat16_as_ushort(w[i + 2 * q + 1]) : 0u;
      u[q] = lo | (hi << 16);
    }
  }
  // bf16 -> f32 is the bf16 bits in the high half.
  __device__ __forceinline__ float get(int e) const {
    const uint32_t w = u[e >> 1];
    return __uint_as_float((e & 1) != 0 ? (w & 0xffff0000u) : (w << 16));
  }
};

// What a shrink row reads and writes: `key` selects the weights (−1: the row has none, skipped),
// `in` the input row, `out` the tmp row.
struct RowRef {
  int32_t key;
  const float* in;
  float* out;
};

// Up to kMaxLoraGroup modules side by side in one rank space: rank row j of the group is row j − first[i]
// of module i's matrix for the key: a[i] + ((key · rank_total[i]) + j − first[i]) · in. The input is split
// into `splits` ranges of whole chunks (split-K: skinny LoRA products at small batches need many blocks
// to have enough loads in flight); split z writes its partial sums at out + z · split_stride, summed by
// the expand step that reads them.
template <typename TW>
struct ShrinkGroup {
  int num = 1;
  const TW* a[kMaxLoraGroup] = {};
  int64_t first[kMaxLoraGroup + 1] = {};   // concatenated rank offsets; first[num] = total rank rows
  int64_t rank_total[kMaxLoraGroup] = {};  // rows per key in module i's stack
  int64_t in = 0;
  int splits = 1;
  int64_t split_stride = 0;  // floats between the partial sums of consecutive splits
};

// Which weights each row of a tile loads: its key, or for a row without LoRA (key −1, its sums are never
// stored) the previous row's (key 0 for the first); same[u]: row u's are row u − 1's, so it reuses them
// instead of loading them again (rows are sorted by key on the expert paths and by sequence on the dense
// ones, so a tile's rows mostly share one key: one load per distinct key and tile).
__device__ __forceinline__ void tile_load_keys(const int32_t* keys, int32_t (&load_key)[kTileRows],
                                               bool (&same)[kTileRows]) {
#pragma unroll
  for (int u = 0; u < kTileRows; ++u) {
    load_key[u] = keys[u] >= 0 ? keys[u] : (u > 0 ? load_key[u - 1] : 0);
    same[u] = u > 0 && load_key[u] == load_key[u - 1];
  }
}

// tmp rows (partial sums of split `split`) for a tile of rows: `refs` (kTileRows, in shared memory,
// filled by the caller's block before a barrier), the block's kShrinkWarps · Q rank rows starting at j_base.
// Call from every thread of a block of kShrinkWarps warps. Each warp computes Q rank rows
// on its own (no shared staging, no barrier): per step of 256 input values every lane loads its 8 values of
// each row's input (f32, 128-bit loads through the read-only cache, all rows at once) and, per distinct key
// of the tile, its 8 values of the key's rank rows, then does the FMAs of the rows with that key. A key's
// weights are read once per tile (rows are sorted by key on the expert paths and by sequence on the dense
// ones, so a tile's rows mostly share one key). Loads of the next step are independent of this step's
// FMAs, so a warp keeps ~24 128-bit loads in flight per lane.
template <typename TW, int Q>
__device__ void shrink_tile(const ShrinkGroup<TW>& g, const RowRef* refs, int64_t j_base, int split) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t total = g.first[g.num];
  const int64_t jw = j_base + warp * Q;
  if (jw >= total) return;  // warp-uniform, and no barrier follows
  int32_t keys[kTileRows];
  const float* ins[kTileRows];
  uint32_t rows = 0;
#pragma unroll
  for (int u = 0; u < kTileRows; ++u) {
    keys[u] = refs[u].key;
    ins[u] = refs[u].in;
    if (keys[u] >= 0) rows |= 1u << u;
  }
  if (rows == 0) return;
  // Rows without LoRA read a row that has it (their sums are never stored).
  const float* fallback = ins[__ffs(static_cast<int>(rows)) - 1];
  bool xvec[kTileRows];
#pragma unroll
  for (int u = 0; u < kTileRows; ++u) {
    if (keys[u] < 0) ins[u] = fallback;
    xvec[u] = (reinterpret_cast<uintptr_t>(ins[u]) & 15) == 0;
  }
  const TW* wrow[Q];
  int64_t key_stride[Q];
  bool valid[Q];
#pragma unroll
  for (int q = 0; q < Q; ++q) {
    const int64_t j = jw + q;
    valid[q] = j < total;
    int i = 0;
    while (i + 1 < g.num && j >= g.first[i + 1]) ++i;
    wrow[q] = valid[q] ? g.a[i] + (j - g.first[i]) * g.in : g.a[0];
    key_stride[q] = g.rank_total[i] * g.in;
  }
  // Distinct keys of the tile in row order, and the rows of each.
  int32_t dkey[kTileRows];
  uint32_t dmask[kTileRows];
  int nd = 0;
  for (uint32_t todo = rows; todo != 0;) {
    const int32_t key = keys[__ffs(static_cast<int>(todo)) - 1];
    uint32_t m = 0;
#pragma unroll
    for (int u = 0; u < kTileRows; ++u)
      if (keys[u] == key) m |= 1u << u;
    dkey[nd] = key;
    dmask[nd] = m;
    ++nd;
    todo &= ~m;
  }
  const bool wvec = (g.in & 7) == 0;
  float acc[kTileRows][Q];
#pragma unroll
  for (int u = 0; u < kTileRows; ++u)
#pragma unroll
    for (int q = 0; q < Q; ++q) acc[u][q] = 0.0f;
  const int64_t chunks = (g.in + kChunk - 1) / kChunk;
  const int64_t per = (chunks + g.splits - 1) / g.splits;
  const int64_t c0 = split * per, c1 = c0 + per < chunks ? c0 + per : chunks;
  const int64_t kend = c1 * kChunk < g.in ? c1 * kChunk : g.in;
  for (int64_t k = c0 * kChunk + lane * 8; k < kend; k += kChunk) {
    const bool vk = k + 8 <= kend;
    float xv[kTileRows][8];
#pragma unroll
    for (int u = 0; u < kTileRows; ++u) load8(ins[u], k, kend, vk && xvec[u], xv[u]);
    // The next key's weights are loaded before this key's FMAs (which wait for this key's): the keys of a
    // tile cost about one round of loads instead of one each.
    Pack8<TW> w[Q], wn[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q)
      w[q].load(wrow[q] + static_cast<int64_t>(dkey[0]) * key_stride[q], k, kend, vk && wvec);
    for (int d = 0; d < nd; ++d) {
      if (d + 1 < nd) {
#pragma unroll
        for (int q = 0; q < Q; ++q)
          wn[q].load(wrow[q] + static_cast<int64_t>(dkey[d + 1]) * key_stride[q], k, kend, vk && wvec);
      }
      const uint32_t m = dmask[d];
#pragma unroll
      for (int u = 0; u < kTileRows; ++u) {
        if (((m >> u) & 1u) == 0) continue;  // warp-uniform
#pragma unroll
        for (int q = 0; q < Q; ++q) {
          float s = acc[u][q];
#pragma unroll
          for (int e = 0; e < 8; ++e) s = fmaf(w[q].get(e), xv[u][e], s);
          acc[u][q] = s;
        }
      }
#pragma unroll
      for (int q = 0; q < Q; ++q) w[q] = wn[q];
    }
  }
#pragma unroll
  for (int u = 0; u < kTileRows; ++u) {
    if (keys[u] < 0) continue;  // warp-uniform
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const float v = cuda_util::warp_sum(acc[u][q]);
      if (lane == 0 && valid[q]) refs[u].out[split * g.split_stride + jw + q] = v;
    }
  }
}

// Rank rows per warp of the tiled shrink (KernelTuning::lora_shrink_ranks_per_warp: 4, or 8), and the blocks
// of kShrinkWarps warps that `ranks` rank rows take.
int shrink_q();
int64_t shrink_rank_blocks(int64_t ranks);

// How many splits of the input a shrink of `tiles` × `rank_blocks` blocks over `in` values takes: enough
// blocks for about eight per SM, at most one per chunk (and 16).
int shrink_splits(int64_t tiles, int64_t rank_blocks, int64_t in);

__device__ __forceinline__ float ld1(const float* w, int64_t i) {
  return w[i];
}
__device__ __forceinline__ float ld1(const __nv_bfloat16* w, int64_t i) {
  return __bfloat162float(w[i]);
}

// Σ_r b[r] · t[r] for r < rank: b a row of B in global memory (vec: 16-byte aligned and rank a multiple
// of 8), t in shared memory.
template <typename TW>
__device__ __forceinline__ float dot_rank(const TW* b, const float* t, int64_t rank, bool vec) {
  float s = 0.0f;
  if (vec) {
    for (int64_t r = 0; r < rank; r += 8) {
      float w[8];
      load8(b, r, rank, true, w);
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(w[e], t[r + e], s);
    }
    return s;
  }
  for (int64_t r = 0; r < rank; ++r) s = fmaf(ld1(b, r), t[r], s);
  return s;
}

// acc[u] += B[key_u] row · ts[u] for every row u of a tile with keys[u] >= 0: row(key) gives the B row
// (R values in global memory, vec: 16-byte aligned with R a multiple of 8). All rows' loads of a chunk of
// 8 rank columns are issued together, one per distinct key in row order (tile_load_keys: rows without LoRA
// reuse a neighbour's and add nothing). ts rows
// (stride lds, a multiple of 8 >= R) are zero past R.
template <typename TW, typename RowOf>
__device__ __forceinline__ void expand_tile(const RowOf& row, int64_t R, bool vec, const float* ts,
                                            int64_t lds, const int32_t* keys, float* acc) {
  int32_t load_key[kTileRows];
  bool same[kTileRows];
  tile_load_keys(keys, load_key, same);
  for (int64_t r = 0; r < R; r += 8) {
    Pack8<TW> w[kTileRows];
#pragma unroll
    for (int u = 0; u < kTileRows; ++u) {
      if (u > 0 && same[u]) {
        w[u] = w[u - 1];
      } else {
        w[u].load(static_cast<const TW*>(row(load_key[u])), r, R, vec);
      }
    }
#pragma unroll
    for (int u = 0; u < kTileRows; ++u) {
      if (keys[u] < 0) continue;
      const float* t = ts + u * lds + r;
      float s = acc[u];
#pragma unroll
      for (int e = 0; e < 8; ++e) s = fmaf(w[u].get(e), t[e], s);
      acc[u] = s;
    }
  }
}

// expand_tile for two B matrices at once (the gate and up outputs of one activation column): both rows'
// loads of a chunk in flight together, the sums in the same order as two expand_tile calls.
template <typename TW, typename RowA, typename RowB>
__device__ __forceinline__ void expand_tile2(const RowA& row_a, const RowB& row_b, int64_t R, bool vec,
                                             const float* ts_a, const float* ts_b, int64_t lds,
                                             const int32_t* keys, float* acc_a, float* acc_b) {
  int32_t load_key[kTileRows];
  bool same[kTileRows];
  tile_load_keys(keys, load_key, same);
  for (int64_t r = 0; r < R; r += 8) {
    Pack8<TW> wa[kTileRows], wb[kTileRows];
#pragma unroll
    for (int u = 0; u < kTileRows; ++u) {
      if (u > 0 && same[u]) {
        wa[u] = wa[u - 1];
        wb[u] = wb[u - 1];
      } else {
        wa[u].load(static_cast<const TW*>(row_a(load_key[u])), r, R, vec);
        wb[u].load(static_cast<const TW*>(row_b(load_key[u])), r, R, vec);
      }
    }
#pragma unroll
    for (int u = 0; u < kTileRows; ++u) {
      if (keys[u] < 0) continue;
      const float* ta = ts_a + u * lds + r;
      const float* tb = ts_b + u * lds + r;
      float sa = acc_a[u], sb = acc_b[u];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        sa = fmaf(wa[u].get(e), ta[e], sa);
        sb = fmaf(wb[u].get(e), tb[e], sb);
      }
      acc_a[u] = sa;
      acc_b[u] = sb;
    }
  }
}

__host__ __device__ inline int64_t round8(int64_t v) {
  return (v + 7) / 8 * 8;
}

}  // namespace polylora::kernels::lora_stack
