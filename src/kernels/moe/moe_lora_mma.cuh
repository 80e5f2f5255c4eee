// kernels/moe/moe_lora_mma.cuh: slot-stacked expert LoRA on bf16 tensor cores for the grouped-GEMM path
// (moe_gemm_mma.cuh), used when the stacks are BF16:
// - moe_lora_shrink_mma: tmp[row, j] = A[key(row)][j] · a[row] over the GEMM's sorted rows, reading the same
//   bf16 activation rows the base product reads (gate/up: x by token; down: act by sorted row; hi + lo copies
//   with the split, as the base). A CTA takes one run of rows of one key (slot · E + expert; rows are sorted
//   by slot within an expert, so a 64-row window holds few runs) and 64 rank rows, mma.sync m16n8k16 over a
//   cp.async pipeline of BK = 32 slices, split over K (partial sums [split][row][j], summed by the reader).
// - lora_expand_mma (called from moe_gemm_mma's epilogue): acc += tmp · scale · Bᵀ for the tile's rows as
//   extra k16 steps of the same accumulators, one pass per run of rows of one key, tmp·scale staged in shared
//   memory as a bf16 hi + lo pair (so the sum keeps ~16 bits of it) against the bf16 B rows; so the LoRA sum
//   costs no pass over the outputs. The gate/up slices (gate and up LoRAs, or one over the fused gate_up) are
//   one rank space of slices·R columns whose B entries are zero outside the output column's slice.
// A row's key is the same in both (lora_row_key): its token's slot, when the slot's scale is non-zero in one
// of the phase's scale columns, else −1 (no LoRA: the shrink skips it, the expand adds nothing). Only
// included from moe_gemm_mma.cuh (moe_launch.h). Must not: depend on anything above common/.
#pragma once

#include "kernels/mma_util.cuh"
#include "kernels/moe/moe_cuda_common.cuh"

namespace polylora::kernels::cuda::moe_detail {

// The LoRA key (slot · E + e) of a pair routed to expert e, or −1: no adapter, or its scale is 0 in every
// scale column [c0, c0 + slices).
__device__ __forceinline__ int32_t lora_row_key(int32_t pair, int32_t e, const int32_t* token_slots,
                                                int64_t top_k, int64_t slots, int64_t E, const float* scale,
                                                int c0, int slices) {
  if (pair < 0) return -1;
  const int32_t s = token_slots[pair / top_k];
  if (s < 0 || s >= slots) return -1;
  const int32_t key = s * static_cast<int32_t>(E) + e;
  for (int c = c0; c < c0 + slices; ++c)
    if (scale[key * 3 + c] != 0.0f) return key;
  return -1;
}

constexpr int kLsRows = 64;      // sorted rows per CTA window
constexpr int kLsCols = 64;      // rank rows per CTA
constexpr int kLsThreads = 128;  // 4 warps, each 16 rows × 64 rank rows
constexpr int kLsStages = 4;
constexpr int kLsTileBytes = 64 * mma::kBK * 2;
constexpr int kLsStageBytes = 2 * kLsTileBytes;

struct LoraShrinkMmaParams {
  const __nv_bfloat16* a = nullptr;      // activation rows as the base GEMM reads them (MmaParams::a)
  int64_t lda = 0;                       // row stride (both copies with the split)
  int kb_tiles = 0;                      // BK slices of one copy (the weights' K extent, padded)
  bool by_token = true;                  // gate/up: row of the pair's token; down: the sorted row
  const int32_t* sorted = nullptr;       // [max_rows] pair per sorted row, −1 for padding
  const int32_t* tile_expert = nullptr;  // [max_tiles]
  const int32_t* num_tiles = nullptr;    // [1]
  int tile_m = 64;
  int64_t max_rows = 0;
  const int32_t* token_slots = nullptr;  // [m]
  int64_t top_k = 0, E = 0, slots = 0;
  const float* scale = nullptr;      // [slots, E, 3]
  int c0 = 0, slices = 1;            // the phase's scale columns
  const __nv_bfloat16* w = nullptr;  // LoRA A [slots, E, GR, K]
  int64_t GR = 0, K = 0;             // rank rows per key (slices · R), input size
  float* out = nullptr;              // [splits][max_rows][GR]
  int splits = 1, nchunks = 1;       // grid.z = splits · nchunks (rank-row chunks of kLsCols)
};

// A template (of nothing) so that every file including this header may see it and only the one launching it
// (moe_gemm_cuda.cu) compiles it.
template <int = 0>
__global__ void __launch_bounds__(kLsThreads) moe_lora_shrink_mma(LoraShrinkMmaParams p) {
  __shared__ __align__(128) unsigned char smem[kLsStages * kLsStageBytes];
  __shared__ int32_t s_key[kLsRows];
  __shared__ int64_t s_arow[kLsRows];
  __shared__ int16_t s_run[kLsRows + 1];  // run starts, then the end
  __shared__ int s_nruns;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kLsRows;
  const int64_t used = static_cast<int64_t>(*p.num_tiles) * p.tile_m;
  if (row0 >= (used < p.max_rows ? used : p.max_rows)) return;
  const int chunk = static_cast<int>(blockIdx.z) % p.nchunks,
            split = static_cast<int>(blockIdx.z) / p.nchunks;
  const int num_kt = static_cast<int>(p.lda / mma::kBK);
  const int per = (num_kt + p.splits - 1) / p.splits;
  const int kt0 = split * per, kt1 = kt0 + per < num_kt ? kt0 + per : num_kt;
  const int64_t j0 = static_cast<int64_t>(chunk) * kLsCols;
  if (kt0 >= kt1 || j0 >= p.GR) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int32_t e = p.tile_expert[row0 / p.tile_m];
  if (tid < kLsRows) {
    const int64_t r = row0 + tid;
    const int32_t pair = p.sorted[r];
    s_key[tid] = lora_row_key(pair, e, p.token_slots, p.top_k, p.slots, p.E, p.scale, p.c0, p.slices);
    s_arow[tid] = pair < 0 ? -1 : (p.by_token ? pair / p.top_k : r);
  }
  __syncthreads();
  if (tid == 0) {
    int n = 0;
    for (int i = 0; i < kLsRows; ++i)
      if (s_key[i] >= 0 && (i == 0 || s_key[i - 1] != s_key[i])) s_run[n++] = static_cast<int16_t>(i);
    s_nruns = n;
  }
  __syncthreads();
  const int nruns = s_nruns;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // Each thread copies chunk (tid % 4) of rows tid / 4 and tid / 4 + 32 of both tiles.
  const int ld_chunk = tid & 3, ld_row = tid >> 2;
  const bool w_fast = (p.K & 7) == 0 && (reinterpret_cast<uintptr_t>(p.w) & 15) == 0;
  for (int d = blockIdx.y; d < nruns; d += gridDim.y) {
    const int rb = s_run[d];
    const int32_t key = s_key[rb];
    int re = rb + 1;
    while (re < kLsRows && s_key[re] == key) ++re;
    const __nv_bfloat16* a_src[2];
    const __nv_bfloat16* w_src[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = ld_row + 32 * i;
      a_src[i] = r >= rb && r < re ? p.a + s_arow[r] * p.lda : nullptr;
      const int64_t j = j0 + r;
      w_src[i] = j < p.GR ? p.w + (static_cast<int64_t>(key) * p.GR + j) * p.K : nullptr;
    }
    auto load_stage = [&](int stage, int kt) {
      const uint32_t sa = base + stage * kLsStageBytes, sb = sa + kLsTileBytes;
      const int64_t ka = static_cast<int64_t>(kt) * mma::kBK + ld_chunk * 8;
      const int64_t k = static_cast<int64_t>(weight_k_slice(kt, p.kb_tiles)) * mma::kBK + ld_chunk * 8;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = ld_row + 32 * i;
        mma::cp_async16(sa + mma::swz(r, ld_chunk),
                        a_src[i] != nullptr ? static_cast<const void*>(a_src[i] + ka) : p.a,
                        a_src[i] != nullptr ? 16 : 0);
        if (w_fast) {
          const bool ok = w_src[i] != nullptr && k < p.K;
          mma::cp_async16(sb + mma::swz(r, ld_chunk), ok ? static_cast<const void*>(w_src[i] + k) : p.a,
                          ok ? 16 : 0);
        } else {
          uint32_t wv[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            uint32_t lo = 0, hi = 0;
            if (w_src[i] != nullptr && k + 2 * q < p.K) lo = __bfloat16_as_ushort(w_src[i][k + 2 * q]);
            if (w_src[i] != nullptr && k + 2 * q + 1 < p.K)
              hi = __bfloat16_as_ushort(w_src[i][k + 2 * q + 1]);
            wv[q] = lo | (hi << 16);
          }
          mma::st_shared_v4(sb + mma::swz(r, ld_chunk), wv);
        }
      }
    };
    float acc[8][4];
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[ni][q] = 0.0f;
    // Warps whose 16 rows hold no row of the run skip the MMAs (they still copy and wait).
    const bool mine = warp * 16 < re && warp * 16 + 16 > rb;
    const int n8 = static_cast<int>((p.GR - j0 + 7) / 8);  // n8 fragments with rank rows
#pragma unroll
    for (int s = 0; s < kLsStages - 1; ++s) {
      if (kt0 + s < kt1) load_stage(s, kt0 + s);
      mma::cp_async_commit();
    }
    for (int kt = kt0; kt < kt1; ++kt) {
      mma::cp_async_wait<kLsStages - 2>();
      __syncthreads();
      const int nk = kt + kLsStages - 1;
      if (nk < kt1) load_stage((nk - kt0) % kLsStages, nk);
      mma::cp_async_commit();
      if (!mine) continue;
      const uint32_t sa = base + ((kt - kt0) % kLsStages) * kLsStageBytes, sb = sa + kLsTileBytes;
#pragma unroll
      for (int ks = 0; ks < mma::kBK / 16; ++ks) {
        uint32_t af[4];
        mma::ldmatrix_x4(af, sa + mma::swz(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          if (2 * nj >= n8) break;
          uint32_t t[4];
          const int r = nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          mma::ldmatrix_x4(t, sb + mma::swz(r, ks * 2 + ((lane >> 3) & 1)));
          mma::mma_bf16(acc[2 * nj], af, t[0], t[1]);
          if (2 * nj + 1 < n8) mma::mma_bf16(acc[2 * nj + 1], af, t[2], t[3]);
        }
      }
    }
    mma::cp_async_wait<0>();
    __syncthreads();  // the next run refills the stages
    if (!mine) continue;
      // c0,c1 at (row g, columns 2t, 2t+1), c2,c3 at row g + 8.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + (lane >> 2) + h * 8;
      if (r < rb || r >= re) continue;
      float* orow = p.out + (static_cast<int64_t>(split) * p.max_rows + row0 + r) * p.GR;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int64_t j = j0 + ni * 8 + (lane & 3) * 2;
        if (j < p.GR) orow[j] = acc[ni][2 * h];
        if (j + 1 < p.GR) orow[j + 1] = acc[ni][2 * h + 1];
      }
    }
  }
}

// The fused expand's inputs (MmaParams::lora; lora_b == nullptr: no LoRA in this product).
struct LoraExpandMma {
  const float* tmp = nullptr;  // [splits][max_rows][GR] shrink partial sums by sorted row
  int64_t split_stride = 0;    // floats between splits (max_rows · GR)
  int splits = 1;
  const __nv_bfloat16* b = nullptr;  // LoRA B [slots, E, N, R] (N: the product's output columns)
  const float* scale = nullptr;      // [slots, E, 3]
  const int32_t* token_slots = nullptr;
  int64_t slots = 0, E = 0, R = 0, GR = 0;
  int c0 = 0, slices = 1;
  bool interleaved = false;  // gate/up with 2 slices: the slice of column n is n & 1 (else n >= inter)
};

__device__ __forceinline__ uint32_t pack2(__nv_bfloat16 a, __nv_bfloat16 b) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(a)) |
         (static_cast<uint32_t>(__bfloat16_as_ushort(b)) << 16);
}

constexpr int kLeChunk = 64;  // rank columns staged at a time
constexpr int kLeStride =
    kLeChunk + 8;  // bf16 per staged row (padded: fragment loads without bank conflicts)

// Shared memory lora_expand_mma needs for a tile of BM rows (it reuses the GEMM's pipeline buffers).
constexpr int lora_expand_smem_bytes(int bm) {
  return 2 * bm * kLeStride * 2;
}

// acc[mi][ni] (a warp's MI m16 × NI n8 fragments: rows row_base + 16·mi of the tile, columns col_base + 8·ni
// of the product) += Σ_k tmp[row][k] · scale[key(row)][slice(k)] · B[key(row)][col][k − slice(k)·R] for the
// tile's rows whose keys (keys[], shared memory, −1: none) are non-negative. Called by every thread of the
// CTA (it has barriers) once its K loop is done: tmp·scale of the tile's BM rows is staged in `smem` as bf16
// hi + lo, kLeChunk rank columns at a time; each warp then runs, per run of rows of one key among its own
// rows, one k16 step per 16 rank columns (hi and lo against the key's B rows, read from global memory; B
// entries of the other slice are zero). tile_row0: the tile's first sorted row; N, inter: the product's
// columns and the intermediate size (gate/up slices).
template <int BM, int MI, int NI>
__device__ __forceinline__ void lora_expand_mma(const LoraExpandMma& l, const int32_t* keys,
                                                unsigned char* smem, int row_base, int64_t tile_row0,
                                                int col_base, int N, int inter, float (&acc)[MI][NI][4]) {
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int R = static_cast<int>(l.R), GR = static_cast<int>(l.GR);
  const bool two = l.slices == 2;
  auto* a_hi = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* a_lo = a_hi + BM * kLeStride;
  const float* tmp0 = l.tmp + tile_row0 * GR;
  // The slice of each of this thread's columns (NI of them).
  int nslice[NI];
  const __nv_bfloat16* bcol[NI];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int n = col_base + ni * 8 + g;
    nslice[ni] = !two ? 0 : (l.interleaved ? (n & 1) : (n >= inter ? 1 : 0));
    bcol[ni] = n < N ? l.b + static_cast<int64_t>(n) * R : nullptr;  // + key · N · R per run
  }
  constexpr int kRows = MI * 16;
  for (int c0 = 0; c0 < GR; c0 += kLeChunk) {
    __syncthreads();  // the pipeline's (or the previous chunk's) reads of smem are done
    // The chunk's columns that hold ranks, rounded up to a k16 step (the rest is never read). kLeBatch
    // elements per thread at a time, their loads issued before any is used (latency, not bandwidth, bounds
    // this staging: ~8 KB per tile).
    const int cw = (GR - c0 < kLeChunk ? (GR - c0 + 15) / 16 * 16 : kLeChunk);
    const int total = BM * cw;
    constexpr int kLeBatch = 4;
    for (int base = tid; base < total; base += kLeBatch * static_cast<int>(blockDim.x)) {
      float v[kLeBatch];
      int r[kLeBatch], c[kLeBatch];
#pragma unroll
      for (int u = 0; u < kLeBatch; ++u) {
        const int idx = base + u * static_cast<int>(blockDim.x);
        r[u] = idx / cw;
        c[u] = idx % cw;
        const int k = c0 + c[u];
        const int32_t key = idx < total ? keys[r[u]] : -1;
        v[u] = 0.0f;
        if (key >= 0 && k < GR) {
          const float* tp = tmp0 + static_cast<int64_t>(r[u]) * GR + k;
          float s = __ldg(tp);
          for (int z = 1; z < l.splits; ++z) s += __ldg(tp + z * l.split_stride);
          v[u] = s * __ldg(l.scale + key * 3 + l.c0 + (two && k >= R ? 1 : 0));
        }
      }
#pragma unroll
      for (int u = 0; u < kLeBatch; ++u) {
        if (base + u * static_cast<int>(blockDim.x) >= total) break;
        const cuda_util::Bf16Pair p = cuda_util::split_bf16(v[u]);
        a_hi[r[u] * kLeStride + c[u]] = p.hi;
        a_lo[r[u] * kLeStride + c[u]] = p.lo;
      }
    }
    __syncthreads();
    const int ksteps = (GR - c0 + 15) / 16 < kLeChunk / 16 ? (GR - c0 + 15) / 16 : kLeChunk / 16;
    int i = 0;
    while (i < kRows) {  // runs of one key among the warp's rows (warp-uniform)
      const int32_t key = keys[row_base + i];
      int j = i + 1;
      while (j < kRows && keys[row_base + j] == key) ++j;
      if (key >= 0) {
        const int rb = row_base + i, re = row_base + j;
        const int64_t boff = static_cast<int64_t>(key) * N * R;
        for (int kk = 0; kk < ksteps; ++kk) {
          uint32_t ahi[MI][4], alo[MI][4];
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              const int row = row_base + mi * 16 + g + (q & 1) * 8;
              const int col = kk * 16 + 2 * t + (q >> 1) * 8;
              const bool in = row >= rb && row < re;
              ahi[mi][q] = in ? *reinterpret_cast<const uint32_t*>(a_hi + row * kLeStride + col) : 0u;
              alo[mi][q] = in ? *reinterpret_cast<const uint32_t*>(a_lo + row * kLeStride + col) : 0u;
            }
          }
          // Every B fragment of the k16 step is loaded before the first MMA that uses one: loads and MMAs
          // interleaved made up to NI dependent trips to L2 / HBM per step (session 51's trace: the LoRA
          // variant of the warpgroup-MMA GEMM +20 us per gate/up CTA, +11 per down CTA, with B rows of 184
          // and 92 KB per key).
          uint32_t bv[NI][2];
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
            const __nv_bfloat16* brow = bcol[ni] != nullptr ? bcol[ni] + boff : nullptr;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int k = c0 + kk * 16 + 2 * t + h * 8;
              const int s0 = two && k >= R ? 1 : 0, s1 = two && k + 1 >= R ? 1 : 0;
              const bool ok0 = brow != nullptr && k < GR && s0 == nslice[ni];
              const bool ok1 = brow != nullptr && k + 1 < GR && s1 == nslice[ni];
              const uint32_t lo = ok0 ? __bfloat16_as_ushort(__ldg(brow + (k - s0 * R))) : 0u;
              const uint32_t hi = ok1 ? __bfloat16_as_ushort(__ldg(brow + (k + 1 - s1 * R))) : 0u;
              bv[ni][h] = lo | (hi << 16);
            }
          }
#pragma unroll
          for (int ni = 0; ni < NI; ++ni) {
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
              mma::mma_bf16(acc[mi][ni], ahi[mi], bv[ni][0], bv[ni][1]);
              mma::mma_bf16(acc[mi][ni], alo[mi], bv[ni][0], bv[ni][1]);
            }
          }
        }
      }
      i = j;
    }
  }
}

// ---- The LoRA expand as extra K slices of the warpgroup-MMA GEMM (WgmmaParams::lora_ext) ----
// y[row, n] += Σ_j v[row][j] · B[key(row)][n][j] is a product over the rank space: the GEMM's K loop runs on
// past the weights' K, one slice of kWgBK per (run of rows of one key in the tile, ext_w / kWgBK part), with
// A = the rows' K-extension (below; rows of other keys zero-filled) and B = the key's LoRA B rows of the
// tile's columns laid out the same way: [B | B | 0…] against [hi | lo | 0…]. So the LoRA sum rides in the
// GEMM's own pipeline (no epilogue pass, no extra registers held across the K loop).

// The K-extension of a sorted row: ext_w bf16 (a multiple of 64 holding 2·GR), [hi(v) | lo(v) | 0…] with
// v[j] = Σ_z tmp[z][row][j] · scale[key][c0 + slice(j)] (slice(j) = j / R with two slices), zeros for rows
// without a key (lora_row_key) and past the used rows' tiles.
struct LoraExtPackParams {
  const float* tmp = nullptr;  // [splits][max_rows][GR] the shrink's partial sums
  int64_t split_stride = 0;
  int splits = 1;
  const int32_t* sorted = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* num_tiles = nullptr;
  int tile_m = 128;
  int64_t max_rows = 0;
  const int32_t* token_slots = nullptr;
  int64_t top_k = 0, E = 0, slots = 0, R = 0, GR = 0;
  const float* scale = nullptr;  // [slots, E, 3]
  int c0 = 0, slices = 1;
  __nv_bfloat16* out = nullptr;  // [max_rows][ext_w]
  int ext_w = 64;
  int32_t* keys =
      nullptr;  // [max_rows] each row's key (−1: none), which the GEMM reads instead of deriving it
};

constexpr int kExtPackThreads = 256;

// One warp per sorted row (grid-stride over the used rows).
template <int = 0>
__global__ void __launch_bounds__(kExtPackThreads) moe_lora_ext_pack(LoraExtPackParams p) {
  const int64_t used_rows = static_cast<int64_t>(*p.num_tiles) * p.tile_m;
  const int64_t used = used_rows < p.max_rows ? used_rows : p.max_rows;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kExtPackThreads / 32);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (kExtPackThreads / 32) + (threadIdx.x >> 5); r < used;
       r += warps) {
    int32_t key = -1;
    if (lane == 0)
      key = lora_row_key(p.sorted[r], p.tile_expert[r / p.tile_m], p.token_slots, p.top_k, p.slots, p.E,
                         p.scale, p.c0, p.slices);
    key = __shfl_sync(0xffffffffu, key, 0);
    if (lane == 0) p.keys[r] = key;
    __nv_bfloat16* orow = p.out + r * p.ext_w;
    for (int c = lane; c < p.ext_w; c += 32) {
      __nv_bfloat16 o = __float2bfloat16_rn(0.0f);
      if (key >= 0 && c < 2 * p.GR) {
        const bool lo = c >= p.GR;
        const int64_t j = lo ? c - p.GR : c;
        const float* tp = p.tmp + r * p.GR + j;
        float s = tp[0];
        for (int z = 1; z < p.splits; ++z) s += tp[z * p.split_stride];
        const float v = s * p.scale[key * 3 + p.c0 + (p.slices == 2 && j >= p.R ? 1 : 0)];
        const cuda_util::Bf16Pair hl = cuda_util::split_bf16(v);
        o = lo ? hl.lo : hl.hi;
      }
      orow[c] = o;
    }
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
