// kernels/lora/lora_cuda.cu: CUDA dense LoRA over the given rows: one block per row, shrink and expand
// fused (the rank-sized intermediate stays in shared memory).
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/lora/lora_cuda.cuh"
#include "kernels/lora/lora_fused_cuda.cuh"
#include "kernels/lora/lora_stack_cuda.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/tuning.h"
#include "kernels/weight_stream.cuh"

namespace polylora::kernels::cuda {
namespace {

__global__ void lora_apply_kernel(LoraApplyArgs a) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __shared__ float s_mid[cuda_util::kLoraRankChunk];
  int64_t row = a.rows ? a.rows[blockIdx.x] : blockIdx.x;
  cuda_util::lora_row(a.lora, a.x + row * a.ldx, a.y + row * a.ldy, s_mid);
}

}  // namespace

void lora_apply(const LoraApplyArgs& a, const CudaContext& ctx) {
  if (a.num_rows == 0 || a.lora.empty() || a.lora.rank == 0) return;
  cuda_util::launch_pdl(lora_apply_kernel, static_cast<unsigned>(a.num_rows), 256, 0, cuda_util::stream(ctx),
                        a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda

// ---- slot-stacked dense LoRA (lora_batch) ----

namespace polylora::kernels::cuda {
namespace {

namespace ls = lora_stack;

template <typename TW>
struct DenseParams {
  const float* x = nullptr;
  int64_t ldx = 0, m = 0, in = 0, slots = 0;
  const int32_t* token_slots = nullptr;
  int num = 1;
  const TW* a[kMaxLoraGroup] = {};
  const TW* b[kMaxLoraGroup] = {};
  const float* scale[kMaxLoraGroup] = {};
  int64_t rank[kMaxLoraGroup] = {}, out[kMaxLoraGroup] = {};
  float* y[kMaxLoraGroup] = {};
  int64_t ldy[kMaxLoraGroup] = {};
  int64_t first[kMaxLoraGroup + 1] = {};  // tmp column of each module's ranks; first[num]: the row width
  float* tmp = nullptr;                   // [splits][m][first[num]] partial sums
  int splits = 1;
};

// The token's slot when any module has LoRA for it, else −1.
template <typename TW>
__device__ __forceinline__ int32_t dense_key(const DenseParams<TW>& p, int64_t t, int module) {
  if (t >= p.m) return -1;
  const int32_t s = p.token_slots[t];
  if (s < 0 || s >= p.slots) return -1;
  if (module >= 0) return p.scale[module][s] != 0.0f ? s : -1;
  for (int i = 0; i < p.num; ++i)
    if (p.scale[i][s] != 0.0f) return s;
  return -1;
}

template <typename TW, int Q>
__global__ void __launch_bounds__(ls::kShrinkWarps * 32) dense_shrink_kernel(DenseParams<TW> p) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __shared__ ls::RowRef refs[ls::kTileRows];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * ls::kTileRows;
  if (threadIdx.x < ls::kTileRows) {
    const int64_t t = r0 + threadIdx.x;
    const int32_t key = dense_key(p, t, -1);
    refs[threadIdx.x] = {key, key >= 0 ? p.x + t * p.ldx : nullptr,
                         key >= 0 ? p.tmp + t * p.first[p.num] : nullptr};
  }
  __syncthreads();
  ls::ShrinkGroup<TW> g;
  g.num = p.num;
  g.in = p.in;
  for (int i = 0; i < p.num; ++i) {
    g.a[i] = p.a[i];
    g.first[i] = p.first[i];
    g.rank_total[i] = p.rank[i];
  }
  g.first[p.num] = p.first[p.num];
  g.splits = p.splits;
  g.split_stride = p.m * p.first[p.num];
  ls::shrink_tile<TW, Q>(g, refs, static_cast<int64_t>(blockIdx.y) * ls::kShrinkWarps * Q,
                         static_cast<int>(blockIdx.z));
}

// The shrink for few tokens (decode) as weight streaming: lora_fused_cuda.cuh's items (persistent warps over
// (token, rank row pair), each streaming its two A rows once; one sum per tmp element, no split-K; tokens
// whose slot has no LoRA in any module of the group skipped), for lora_batch and lora_shrink alike.
constexpr int kGemvShrinkThreads = 256;

__global__ void __launch_bounds__(kGemvShrinkThreads) lora_shrink_kernel(lora_fused::ShrinkItems p) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kGemvShrinkThreads / 32);
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * (kGemvShrinkThreads / 32) + (threadIdx.x >> 5);
       q < p.items(); q += warps)
    lora_fused::shrink_item(p, q);
}

// Its grid: at most the CTAs that fit at once (2 per SM), fewer for few items.
unsigned lora_shrink_blocks(const lora_fused::ShrinkItems& p) {
  const int64_t per_block = kGemvShrinkThreads / 32;
  return static_cast<unsigned>(std::max<int64_t>(
      1, std::min<int64_t>(2 * cuda_util::num_sms(), (p.items() + per_block - 1) / per_block)));
}

// Token counts up to this take lora_shrink_kernel (each token reads its slot's A itself; the tiled
// shrink reads it once per 8 tokens, better for prefill). Tuned (kernels/tuning.h
// lora_dense_gemv_shrink_rows; POLYLORA_LORA_GEMV_SHRINK_ROWS overrides, 0: tiled).
int64_t dense_gemv_shrink_max_rows() {
  return kernel_tuning({}).lora_dense_gemv_shrink_rows;
}

// Decode-sized shrinks by adapter slot (KernelTuning::lora_dense_slot_shrink_min_rows): block (slot, group of
// kSlotRanks rank rows) gathers its slot's tokens and takes them kTileRows at a time; warp w sums the input
// chunks w, w + kSlotKWarps, ... (256 values each, 8 per lane) for every token of the tile and rank row of
// the group, and the warps' partial sums are added in warp order through shared memory: one sum per tmp
// element (as the fused expands read it), the same for a token whatever its place in the tile. Each slot's A
// rows are read once per kTileRows of its tokens, where the per-token items read them once per token (a
// batch of 64 sequences over 8 adapters: 17.7 MB of A per q/k/v shrink, 8 us on the H200 in session 51's
// timeline, for 2.2 MB of distinct rows), and each warp makes one or two trips to memory instead of one per
// chunk of the input.
constexpr int kSlotKWarps = 8;
constexpr int kSlotRanks = 4;
constexpr int kSlotMaxRows = 256;  // tokens per call (the block's token list lives in shared memory)

template <typename TW>
__global__ void __launch_bounds__(kSlotKWarps * 32)
    dense_shrink_slot_kernel(DenseParams<TW> p, float* tmp, int64_t ld_tmp) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __shared__ int32_t s_tok[kSlotMaxRows];
  __shared__ int s_n;
  __shared__ float s_part[kSlotKWarps][ls::kTileRows][kSlotRanks];
  const auto slot = static_cast<int32_t>(blockIdx.x);
  const int64_t total = p.first[p.num], j0 = static_cast<int64_t>(blockIdx.y) * kSlotRanks;
  if (j0 >= total) return;  // block-uniform, before any barrier
  if (threadIdx.x == 0) s_n = 0;
  __syncthreads();
  for (int64_t t = threadIdx.x; t < p.m; t += blockDim.x)
    if (dense_key(p, t, -1) == slot) s_tok[atomicAdd(&s_n, 1)] = static_cast<int32_t>(t);
  __syncthreads();
  const int n = s_n;
  if (n == 0) return;  // block-uniform
  const int lane = static_cast<int>(threadIdx.x) & 31, warp = static_cast<int>(threadIdx.x) >> 5;
  const TW* wrow[kSlotRanks];
#pragma unroll
  for (int q = 0; q < kSlotRanks; ++q) {
    const int64_t j = j0 + q < total ? j0 + q : total - 1;  // rows past the group's end: never stored
    int i = 0;
    while (i + 1 < p.num && j >= p.first[i + 1]) ++i;
    wrow[q] = p.a[i] + (static_cast<int64_t>(slot) * p.rank[i] + j - p.first[i]) * p.in;
  }
  const bool wvec = (p.in & 7) == 0;
  const int64_t chunks = (p.in + ls::kChunk - 1) / ls::kChunk;
  for (int b0 = 0; b0 < n; b0 += ls::kTileRows) {
    const int rows = n - b0 < ls::kTileRows ? n - b0 : ls::kTileRows;
    const float* xin[ls::kTileRows];
    bool xvec[ls::kTileRows];
#pragma unroll
    for (int u = 0; u < ls::kTileRows; ++u) {
      xin[u] = p.x + static_cast<int64_t>(s_tok[b0 + (u < rows ? u : rows - 1)]) * p.ldx;
      xvec[u] = (reinterpret_cast<uintptr_t>(xin[u]) & 15) == 0;
    }
    float acc[ls::kTileRows][kSlotRanks];
#pragma unroll
    for (int u = 0; u < ls::kTileRows; ++u)
#pragma unroll
      for (int q = 0; q < kSlotRanks; ++q) acc[u][q] = 0.0f;
    for (int64_t c = warp; c < chunks; c += kSlotKWarps) {
      const int64_t k = c * ls::kChunk + lane * 8;
      if (k >= p.in) continue;
      const bool vk = k + 8 <= p.in;
      float xv[ls::kTileRows][8];
#pragma unroll
      for (int u = 0; u < ls::kTileRows; ++u) ls::load8(xin[u], k, p.in, vk && xvec[u], xv[u]);
      ls::Pack8<TW> w[kSlotRanks];
#pragma unroll
      for (int q = 0; q < kSlotRanks; ++q) w[q].load(wrow[q], k, p.in, vk && wvec);
#pragma unroll
      for (int u = 0; u < ls::kTileRows; ++u)
#pragma unroll
        for (int q = 0; q < kSlotRanks; ++q) {
          float sum = acc[u][q];
#pragma unroll
          for (int e = 0; e < 8; ++e) sum = fmaf(w[q].get(e), xv[u][e], sum);
          acc[u][q] = sum;
        }
    }
#pragma unroll
    for (int u = 0; u < ls::kTileRows; ++u)
#pragma unroll
      for (int q = 0; q < kSlotRanks; ++q) {
        const float v = cuda_util::warp_sum(acc[u][q]);
        if (lane == 0) s_part[warp][u][q] = v;
      }
    __syncthreads();
    if (threadIdx.x < ls::kTileRows * kSlotRanks) {
      const int u = static_cast<int>(threadIdx.x) / kSlotRanks,
                q = static_cast<int>(threadIdx.x) % kSlotRanks;
      if (u < rows && j0 + q < total) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kSlotKWarps; ++w) sum += s_part[w][u][q];
        tmp[static_cast<int64_t>(s_tok[b0 + u]) * ld_tmp + j0 + q] = sum;
      }
    }
    __syncthreads();  // s_part is refilled by the next tile
  }
}

// Whether a shrink of m tokens takes dense_shrink_slot_kernel.
bool slot_shrink(int64_t m) {
  const int64_t from = kernel_tuning({}).lora_dense_slot_shrink_min_rows;
  return from > 0 && m >= from && m <= kSlotMaxRows;
}

template <typename TW>
void launch_slot_shrink(const DenseParams<TW>& p, float* tmp, int64_t ld_tmp, cudaStream_t st) {
  KERNEL_CHECK(p.slots <= 65535 && p.first[p.num] / kSlotRanks < 65535,
               "lora shrink: too many slots or rank rows for the by-slot grid");
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(p.slots, 1)),
                  static_cast<unsigned>((p.first[p.num] + kSlotRanks - 1) / kSlotRanks));
  cuda_util::launch_pdl(dense_shrink_slot_kernel<TW>, grid, kSlotKWarps * 32, 0, st, p, tmp, ld_tmp);
  CUDA_CHECK_LAUNCH();
}

// ---- the BF16 shrink on tensor cores (KernelTuning::lora_dense_shrink_mma_min_rows) ----
// A CTA of 4 warps takes 64 tokens × 64 rank rows of the group's concatenated rank space (grid (token
// tiles, rank chunks, splits of the input)); each warp 16 tokens × 64 rank rows with mma.sync m16n8k16.
// The f32 input is split exactly into three bf16 parts (x = p1 + p2 + p3: 24 bits of mantissa), each
// multiplied by the bf16 A rows, so the sums are of the exact products as in the CUDA-core kernel. The
// K loop runs once per distinct slot among the tile's tokens (other tokens' inputs read as zero): once for
// a prefill tile inside one sequence, at most once per adapter for decode tokens of many sequences. A
// slice's input and A rows are loaded into registers while the previous slice's MMAs run (double-buffered
// shared memory, one barrier per slice). Writes tmp[split][t][j] for the slot's tokens.
constexpr int kDmRows = 64;
constexpr int kDmCols = 64;
constexpr int kDmThreads = 128;
constexpr int kDmTile = kDmRows * mma::kBK * 2;  // bytes of one [64][32] bf16 tile
constexpr int kDmParts = 3;                      // bf16 parts of an f32 input

struct DenseMmaShape {
  int splits = 1, chunks = 1, per_kt = 1;
};

// Its grid: token tiles × rank chunks, and enough splits of the input (at least 4 slices each) for ~3
// CTAs per SM.
DenseMmaShape dense_mma_shape(int64_t m, int64_t ranks, int64_t in) {
  DenseMmaShape s;
  const int64_t tiles = (m + kDmRows - 1) / kDmRows;
  s.chunks = static_cast<int>((ranks + kDmCols - 1) / kDmCols);
  const int64_t num_kt = (in + mma::kBK - 1) / mma::kBK;
  const int64_t want = (3 * cuda_util::num_sms() + tiles * s.chunks - 1) / (tiles * s.chunks);
  s.splits =
      static_cast<int>(std::clamp<int64_t>(want, 1, std::max<int64_t>(1, std::min<int64_t>(16, num_kt / 4))));
  s.per_kt = static_cast<int>((num_kt + s.splits - 1) / s.splits);
  s.splits = static_cast<int>((num_kt + s.per_kt - 1) / s.per_kt);  // no empty split
  return s;
}

// The distinct slots (>= 0) among a tile's kDmRows token keys, in order of first appearance, into s_slots
// and their number into s_n; called by every thread of the CTA (kDmRows <= its threads), between barriers.
// The starts of runs of one key are found in parallel (ballots of the first two warps); thread 0 then
// dedupes only those (one or two per tile in prefill, where a sequence's tokens are contiguous).
__device__ void distinct_slots(const int32_t* s_key, int32_t* s_slots, int* s_n, unsigned* s_runs) {
  const int tid = threadIdx.x;
  if (tid < kDmRows) {
    const int32_t k = s_key[tid];
    const bool start = k >= 0 && (tid == 0 || s_key[tid - 1] != k);
    const unsigned b = __ballot_sync(0xffffffffu, start);
    if ((tid & 31) == 0) s_runs[tid >> 5] = b;
  }
  __syncthreads();
  if (tid == 0) {
    int n = 0;
    for (int w = 0; w < kDmRows / 32; ++w) {
      for (unsigned b = s_runs[w]; b != 0; b &= b - 1) {
        const int32_t k = s_key[w * 32 + __ffs(b) - 1];
        bool seen = false;
        for (int q = 0; q < n && !seen; ++q) seen = s_slots[q] == k;
        if (!seen) s_slots[n++] = k;
      }
    }
    *s_n = n;
  }
  __syncthreads();
}

// The three bf16 parts of four f32 values (v = p1 + p2 + p3 exactly), stored at byte offset off of the
// three [64][32] tiles at s (kDmTile apart).
__device__ __forceinline__ void store_parts(unsigned char* s, uint32_t off, const float (&v)[4]) {
  uint16_t part[kDmParts][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float rest = v[e];
#pragma unroll
    for (int q = 0; q < kDmParts; ++q) {
      const __nv_bfloat16 h = __float2bfloat16_rn(rest);
      part[q][e] = __bfloat16_as_ushort(h);
      rest -= __bfloat162float(h);
    }
  }
#pragma unroll
  for (int q = 0; q < kDmParts; ++q)
    *reinterpret_cast<uint2*>(s + q * kDmTile + off) =
        make_uint2(part[q][0] | (static_cast<uint32_t>(part[q][1]) << 16),
                   part[q][2] | (static_cast<uint32_t>(part[q][3]) << 16));
}

__global__ void __launch_bounds__(kDmThreads)
    dense_shrink_mma_kernel(DenseParams<__nv_bfloat16> p, int per_kt) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __shared__ __align__(128) unsigned char smem[2][(kDmParts + 1) * kDmTile];
  __shared__ int32_t s_key[kDmRows];
  __shared__ int32_t s_slots[kDmRows];  // the distinct slots among the tile's tokens
  __shared__ int s_nslots;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kDmRows;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * kDmCols;
  const int split = static_cast<int>(blockIdx.z);
  const int64_t in = p.in, total = p.first[p.num];
  const int num_kt = static_cast<int>((in + mma::kBK - 1) / mma::kBK);
  const int kt0 = split * per_kt, kt1 = min(kt0 + per_kt, num_kt);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  __shared__ unsigned s_runs[kDmRows / 32];
  if (tid < kDmRows) s_key[tid] = dense_key(p, row0 + tid, -1);
  __syncthreads();
  distinct_slots(s_key, s_slots, &s_nslots, s_runs);
  const int nslots = s_nslots;
  // Loads: the input as 4 float4 per thread (rows xr + 16·i, columns xc .. xc + 3 of the slice), the A rows
  // as 2 chunks of 8 bf16 (rank rows wr and wr + 32, chunk wc).
  const int xr = tid >> 3, xc = (tid & 7) * 4;
  const int wr = tid >> 2, wc = tid & 3;
  const bool x_vec = (in % mma::kBK) == 0 && (p.ldx & 3) == 0 && (reinterpret_cast<uintptr_t>(p.x) & 15) == 0;
  bool w_vec = (in & 7) == 0;
  for (int i = 0; i < p.num; ++i) w_vec = w_vec && (reinterpret_cast<uintptr_t>(p.a[i]) & 15) == 0;
  for (int d = 0; d < nslots; ++d) {
    const int32_t key = s_slots[d];
    const float* x_src[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = xr + 16 * i;
      x_src[i] = s_key[r] == key ? p.x + (row0 + r) * p.ldx : nullptr;
    }
    const __nv_bfloat16* w_src[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t j = j0 + wr + 32 * i;
      w_src[i] = nullptr;
      if (j < total) {
        int mod = 0;
        while (j >= p.first[mod + 1]) ++mod;
        w_src[i] = p.a[mod] + (static_cast<int64_t>(key) * p.rank[mod] + (j - p.first[mod])) * in;
      }
    }
    float4 xv[4];
    uint4 wv[2];
    auto load = [&](int kt) {
      const int64_t k = static_cast<int64_t>(kt) * mma::kBK;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        xv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (x_src[i] == nullptr) continue;
        if (x_vec) {
          xv[i] = __ldg(reinterpret_cast<const float4*>(x_src[i] + k + xc));
        } else {
          const int64_t c = k + xc;
          xv[i].x = c < in ? x_src[i][c] : 0.0f;
          xv[i].y = c + 1 < in ? x_src[i][c + 1] : 0.0f;
          xv[i].z = c + 2 < in ? x_src[i][c + 2] : 0.0f;
          xv[i].w = c + 3 < in ? x_src[i][c + 3] : 0.0f;
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wv[i] = make_uint4(0u, 0u, 0u, 0u);
        if (w_src[i] == nullptr) continue;
        const int64_t c = k + wc * 8;
        if (w_vec) {
          if (c < in) wv[i] = __ldg(reinterpret_cast<const uint4*>(w_src[i] + c));
        } else {
          uint32_t h[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint32_t lo = c + 2 * q < in ? __bfloat16_as_ushort(w_src[i][c + 2 * q]) : 0u;
            const uint32_t hi = c + 2 * q + 1 < in ? __bfloat16_as_ushort(w_src[i][c + 2 * q + 1]) : 0u;
            h[q] = lo | (hi << 16);
          }
          wv[i] = make_uint4(h[0], h[1], h[2], h[3]);
        }
      }
    };
    // The registers into buffer b: the input's three bf16 parts, then the A rows (swizzled [64][32] tiles).
    auto store = [&](int b) {
      unsigned char* s = smem[b];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float v[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
        store_parts(s, mma::swz(xr + 16 * i, xc >> 3) + ((xc >> 2) & 1) * 8, v);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
        *reinterpret_cast<uint4*>(s + kDmParts * kDmTile + mma::swz(wr + 32 * i, wc)) = wv[i];
    };
    float acc[8][4];
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[ni][q] = 0.0f;
    // Whether the warp's 16 tokens hold some of the slot's.
    const bool mine = __any_sync(0xffffffffu, lane < 16 && s_key[warp * 16 + lane] == key);
    const int n8 = static_cast<int>((total - j0 + 7) / 8 < 8 ? (total - j0 + 7) / 8 : 8);
    if (kt0 < kt1) load(kt0);
    for (int kt = kt0; kt < kt1; ++kt) {
      const int b = (kt - kt0) & 1;
      store(b);
      __syncthreads();  // buffer b is complete; buffer b ^ 1's MMAs (slice kt − 1) are done
      if (kt + 1 < kt1) load(kt + 1);
      if (!mine) continue;
      const uint32_t sx = static_cast<uint32_t>(__cvta_generic_to_shared(smem[b]));
      const uint32_t sw = sx + kDmParts * kDmTile;
#pragma unroll
      for (int ks = 0; ks < mma::kBK / 16; ++ks) {
        uint32_t af[kDmParts][4];
#pragma unroll
        for (int q = 0; q < kDmParts; ++q)
          mma::ldmatrix_x4(af[q], sx + q * kDmTile + mma::swz(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
        for (int nj = 0; nj < 4; ++nj) {
          if (2 * nj >= n8) break;
          uint32_t w4[4];
          const int r = nj * 16 + (lane & 7) + ((lane >> 4) << 3);
          mma::ldmatrix_x4(w4, sw + mma::swz(r, ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
          for (int q = 0; q < kDmParts; ++q) {
            mma::mma_bf16(acc[2 * nj], af[q], w4[0], w4[1]);
            if (2 * nj + 1 < n8) mma::mma_bf16(acc[2 * nj + 1], af[q], w4[2], w4[3]);
          }
        }
      }
    }
    __syncthreads();  // the next slot refills the buffers
    // c0, c1 at (token g, rank rows 2t, 2t + 1), c2, c3 at token g + 8.
    if (!mine) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + (lane >> 2) + h * 8;
      if (s_key[r] != key) continue;
      float* orow = p.tmp + (static_cast<int64_t>(split) * p.m + row0 + r) * total;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int64_t j = j0 + ni * 8 + (lane & 3) * 2;
        if (j < total) orow[j] = acc[ni][2 * h];
        if (j + 1 < total) orow[j + 1] = acc[ni][2 * h + 1];
      }
    }
  }
}

// Whether lora_batch's shrink runs on tensor cores: BF16 stacks, past the per-token shrinks' rows.
bool mma_shrink(const LoraBatchArgs& a) {
  const int64_t from = kernel_tuning({}).lora_dense_shrink_mma_min_rows;
  return a.w[0].dtype == DType::kBF16 && a.m > dense_gemv_shrink_max_rows() && from > 0 && a.m >= from;
}

// ---- the BF16 expand on tensor cores (KernelTuning::lora_dense_expand_mma_min_rows) ----
// y[t, o] += scale · B[s, o, :] · tmp[t, module's ranks] for a tile of 64 tokens × 128 outputs of one
// module (grid (token tiles, the modules' 128-output chunks one after the other)); each of the 4 warps 16
// tokens × 128 outputs with mma.sync m16n8k16. tmp (summed over the shrink's splits) is split exactly into
// three bf16 parts, as the shrink's input, so the products are those of the CUDA-core expand; the rank runs
// in slices of 32 (zero past the rank). One pass per distinct slot among the tile's tokens (other tokens'
// tmp rows read as zero). Prefill's expands re-read and re-write the projections' f32 outputs, so the
// kernel is bound by that traffic: the tile's keys and slots are found and the first slot's B rows loaded
// before the PDL wait, the thread's y values are loaded right after it (in flight while tmp and B load and
// the MMAs run), each slot's terms are added to them, and each token's outputs are written once.
constexpr int kEmCols = 128;

// The expand of one tile after its keys and slots (dense_expand_mma_kernel); FULL: the tile's 128 outputs all
// in the module, every load and store vectorized (the common case: no per-element guards).
template <bool FULL>
__device__ __forceinline__ void expand_mma_tile(const DenseParams<__nv_bfloat16>& p, int mod, int64_t o0,
                                                int64_t row0, const int32_t* s_key, const int32_t* s_slots,
                                                int nslots, unsigned char* smem) {
  const int64_t out = p.out[mod], R = p.rank[mod];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t total = p.first[p.num], col0 = p.first[mod], split_stride = p.m * total;
  const int num_kt = static_cast<int>((R + mma::kBK - 1) / mma::kBK);
  // Loads: tmp as 4 groups of 4 floats per thread (rows xr + 16·i, ranks xc .. xc + 3 of the slice), B as
  // 4 chunks of 8 bf16 (output rows wr + 32·i, chunk wc).
  const int xr = tid >> 3, xc = (tid & 7) * 4;
  const int wr = tid >> 2, wc = tid & 3;
  const bool x_vec = FULL || ((R & 3) == 0 && (total & 3) == 0 && (col0 & 3) == 0 &&
                              (reinterpret_cast<uintptr_t>(p.tmp) & 15) == 0);
  const __nv_bfloat16* bw = p.b[mod];
  const bool w_vec = FULL || ((R & 7) == 0 && (reinterpret_cast<uintptr_t>(bw) & 15) == 0);
  uint4 wv[4];
  auto load_b = [&](int32_t key, int64_t k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t o = o0 + wr + 32 * i, c = k + wc * 8;
      wv[i] = make_uint4(0u, 0u, 0u, 0u);
      if ((!FULL && o >= out) || c >= R) continue;
      const __nv_bfloat16* src = bw + (static_cast<int64_t>(key) * out + o) * R + c;
      if (w_vec) {
        wv[i] = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        uint32_t h[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t lo = c + 2 * q < R ? __bfloat16_as_ushort(src[2 * q]) : 0u;
          const uint32_t hi = c + 2 * q + 1 < R ? __bfloat16_as_ushort(src[2 * q + 1]) : 0u;
          h[q] = lo | (hi << 16);
        }
        wv[i] = make_uint4(h[0], h[1], h[2], h[3]);
      }
    }
  };
  if (nslots > 0) load_b(s_slots[0], 0);
  cuda_util::pdl_wait();
  cuda_util::pdl_trigger();
  if (nslots == 0) return;
  // The thread's y values: c0, c1 at (token g, outputs 2t, 2t + 1) of each 8-output block, c2, c3 at token
  // g + 8 (the MMA's accumulator layout), for tokens with LoRA.
  float* y = p.y[mod];
  const int64_t ldy = p.ldy[mod];
  const bool y_vec = FULL || ((ldy & 1) == 0 && (reinterpret_cast<uintptr_t>(y) & 7) == 0);  // o is even
  float yv[16][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + (lane >> 2) + h * 8;
    const float* yrow = y + (row0 + r) * ldy;
    const bool live = s_key[r] >= 0;
#pragma unroll
    for (int ni = 0; ni < 16; ++ni) {
      const int64_t o = o0 + ni * 8 + (lane & 3) * 2;
      yv[ni][2 * h] = yv[ni][2 * h + 1] = 0.0f;
      if (!live || (!FULL && o >= out)) continue;
      if (FULL || (y_vec && o + 1 < out)) {
        const float2 v = *reinterpret_cast<const float2*>(yrow + o);
        yv[ni][2 * h] = v.x;
        yv[ni][2 * h + 1] = v.y;
      } else {
        yv[ni][2 * h] = yrow[o];
        if (o + 1 < out) yv[ni][2 * h + 1] = yrow[o + 1];
      }
    }
  }
  const int n16 =
      FULL ? 8 : static_cast<int>((out - o0 + 15) / 16 < 8 ? (out - o0 + 15) / 16 : 8);  // in range
  const uint32_t sx = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t sw = sx + kDmParts * kDmTile;
  for (int d = 0; d < nslots; ++d) {
    const int32_t key = s_slots[d];
    const bool mine = __any_sync(0xffffffffu, lane < 16 && s_key[warp * 16 + lane] == key);
    float acc[16][4];
#pragma unroll
    for (int ni = 0; ni < 16; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[ni][q] = 0.0f;
    for (int kt = 0; kt < num_kt; ++kt) {
      const int64_t k = static_cast<int64_t>(kt) * mma::kBK;
      if (d > 0 || kt > 0) load_b(key, k);
      // The slice's tmp, summed over the shrink's splits: per split, the loads of the thread's 4 rows issued
      // together (ncu, session 54: the one-row-at-a-time sums waited on each load in turn).
      float v[4][4] = {};
      const float* src[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int r = xr + 16 * i;
        src[i] = s_key[r] == key && k + xc < R ? p.tmp + (row0 + r) * total + col0 + k + xc : nullptr;
      }
#pragma unroll 4
      for (int z = 0; z < p.splits; ++z) {
        float4 f[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          f[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (src[i] == nullptr) continue;
          const float* q = src[i] + z * split_stride;
          if (x_vec) {
            f[i] = *reinterpret_cast<const float4*>(q);
          } else {
            f[i].x = q[0];
            f[i].y = k + xc + 1 < R ? q[1] : 0.0f;
            f[i].z = k + xc + 2 < R ? q[2] : 0.0f;
            f[i].w = k + xc + 3 < R ? q[3] : 0.0f;
          }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          v[i][0] += f[i].x;
          v[i][1] += f[i].y;
          v[i][2] += f[i].z;
          v[i][3] += f[i].w;
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        store_parts(smem, mma::swz(xr + 16 * i, xc >> 3) + ((xc >> 2) & 1) * 8, v[i]);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint4*>(smem + kDmParts * kDmTile + mma::swz(wr + 32 * i, wc)) = wv[i];
      __syncthreads();
      if (mine) {
#pragma unroll
        for (int ks = 0; ks < mma::kBK / 16; ++ks) {
          if (k + ks * 16 >= R) break;  // a zero half-slice
          uint32_t af[kDmParts][4];
#pragma unroll
          for (int q = 0; q < kDmParts; ++q)
            mma::ldmatrix_x4(af[q],
                             sx + q * kDmTile + mma::swz(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
          for (int nj = 0; nj < 8; ++nj) {
            if (nj >= n16) break;
            uint32_t w4[4];
            mma::ldmatrix_x4(
                w4, sw + mma::swz(nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
            for (int q = 0; q < kDmParts; ++q) {
              mma::mma_bf16(acc[2 * nj], af[q], w4[0], w4[1]);
              mma::mma_bf16(acc[2 * nj + 1], af[q], w4[2], w4[3]);
            }
          }
        }
      }
      __syncthreads();  // the next slice or slot refills the tiles
    }
    if (!mine) continue;
    const float sc = p.scale[mod][key];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + (lane >> 2) + h * 8;
      if (s_key[r] != key) continue;
#pragma unroll
      for (int ni = 0; ni < 16; ++ni) {
        yv[ni][2 * h] += sc * acc[ni][2 * h];
        yv[ni][2 * h + 1] += sc * acc[ni][2 * h + 1];
      }
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + (lane >> 2) + h * 8;
    if (s_key[r] < 0) continue;
    float* yrow = y + (row0 + r) * ldy;
#pragma unroll
    for (int ni = 0; ni < 16; ++ni) {
      const int64_t o = o0 + ni * 8 + (lane & 3) * 2;
      if (!FULL && o >= out) break;
      if (FULL || (y_vec && o + 1 < out)) {
        *reinterpret_cast<float2*>(yrow + o) = make_float2(yv[ni][2 * h], yv[ni][2 * h + 1]);
      } else {
        yrow[o] = yv[ni][2 * h];
        if (o + 1 < out) yrow[o + 1] = yv[ni][2 * h + 1];
      }
    }
  }
}

__global__ void __launch_bounds__(kDmThreads) dense_expand_mma_kernel(DenseParams<__nv_bfloat16> p) {
  __shared__ __align__(128) unsigned char smem[(kDmParts + 2) * kDmTile];  // tmp parts, then B [128][32]
  __shared__ int32_t s_key[kDmRows];
  __shared__ int32_t s_slots[kDmRows];
  __shared__ int s_nslots;
  int mod = 0;
  int64_t chunk = blockIdx.y;
  while (mod + 1 < p.num && chunk >= (p.out[mod] + kEmCols - 1) / kEmCols) {
    chunk -= (p.out[mod] + kEmCols - 1) / kEmCols;
    ++mod;
  }
  const int64_t out = p.out[mod], R = p.rank[mod], o0 = chunk * kEmCols;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kDmRows;
  const int tid = threadIdx.x;
  // Step inputs and adapter weights only, before the wait (cuda_util.cuh).
  __shared__ unsigned s_runs[kDmRows / 32];
  if (tid < kDmRows) s_key[tid] = dense_key(p, row0 + tid, mod);
  __syncthreads();
  distinct_slots(s_key, s_slots, &s_nslots, s_runs);
  const int nslots = s_nslots;
  const int64_t total = p.first[p.num], col0 = p.first[mod];
  const bool full = o0 + kEmCols <= out && (R & 7) == 0 && (total & 3) == 0 && (col0 & 3) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.tmp) & 15) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.b[mod]) & 15) == 0 && (p.ldy[mod] & 1) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.y[mod]) & 7) == 0;
  if (full) {
    expand_mma_tile<true>(p, mod, o0, row0, s_key, s_slots, nslots, smem);
  } else {
    expand_mma_tile<false>(p, mod, o0, row0, s_key, s_slots, nslots, smem);
  }
}

// Whether lora_batch's expand runs on tensor cores: BF16 stacks, from lora_dense_expand_mma_min_rows tokens.
bool mma_expand(const LoraBatchArgs& a) {
  const int64_t from = kernel_tuning({}).lora_dense_expand_mma_min_rows;
  return a.w[0].dtype == DType::kBF16 && from > 0 && a.m >= from;
}

// y[t, o] += scale · B[s, o, :] · tmp[t, module's ranks]; grid (blocks of SUB tiles of kTileRows tokens,
// output chunks, module). SUB > 1 (KernelTuning::lora_dense_expand_tiles, prefill): fewer, longer blocks,
// each thread's B row re-read from L1 for the next tile of the same adapter.
template <typename TW, int SUB>
__global__ void __launch_bounds__(ls::kExpandThreads) dense_expand_kernel(DenseParams<TW> p, int64_t lds) {
  cuda_util::pdl_begin();        // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float ts[];  // [SUB · kTileRows][lds]
  constexpr int kRows = SUB * ls::kTileRows;
  __shared__ int32_t keys_s[kRows];
  const int i = static_cast<int>(blockIdx.z);
  const int64_t R = p.rank[i], r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  if (threadIdx.x < kRows) keys_s[threadIdx.x] = dense_key(p, r0 + threadIdx.x, i);
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < kRows * lds; idx += blockDim.x) {
    const int64_t u = idx / lds, r = idx % lds;
    float v = 0.0f;
    if (keys_s[u] >= 0 && r < R)
      for (int z = 0; z < p.splits; ++z) v += p.tmp[(z * p.m + r0 + u) * p.first[p.num] + p.first[i] + r];
    ts[idx] = v;
  }
  __syncthreads();
  const int64_t o = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (o >= p.out[i]) return;
  const bool vec = (R & 7) == 0;
  const TW* b = p.b[i];
  const int64_t out = p.out[i];
#pragma unroll 1
  for (int s = 0; s < SUB; ++s) {
    int32_t keys[ls::kTileRows];
    bool any = false;
#pragma unroll
    for (int u = 0; u < ls::kTileRows; ++u) {
      keys[u] = keys_s[s * ls::kTileRows + u];
      any |= keys[u] >= 0;
    }
    if (!any) continue;
    float acc[ls::kTileRows] = {};
    ls::expand_tile<TW>([&](int32_t key) { return b + (static_cast<int64_t>(key) * out + o) * R; }, R, vec,
                        ts + s * ls::kTileRows * lds, lds, keys, acc);
    const int64_t rs = r0 + s * ls::kTileRows;
#pragma unroll
    for (int u = 0; u < ls::kTileRows; ++u)
      if (keys[u] >= 0) p.y[i][(rs + u) * p.ldy[i] + o] += p.scale[i][keys[u]] * acc[u];
  }
}

// Tiles of kTileRows tokens per expand block for a step of m tokens: lora_dense_expand_tiles (1 or 4) from
// 256 tokens, else 1.
int dense_expand_sub(int64_t m) {
  return m >= 256 && kernel_tuning({}).lora_dense_expand_tiles == 4 ? 4 : 1;
}

// The kernels' parameters of a group (tmp and splits left to the caller).
template <typename TW>
DenseParams<TW> dense_params(const LoraBatchArgs& a) {
  DenseParams<TW> p;
  p.x = a.x;
  p.ldx = a.ldx;
  p.m = a.m;
  p.in = a.w[0].in;
  p.slots = a.w[0].slots;
  p.token_slots = a.token_slots;
  p.num = a.num;
  for (int i = 0; i < a.num; ++i) {
    const LoraStack& w = a.w[i];
    p.a[i] = static_cast<const TW*>(w.a);
    p.b[i] = static_cast<const TW*>(w.b);
    p.scale[i] = w.scale;
    p.rank[i] = w.rank;
    p.out[i] = w.out;
    p.y[i] = a.y[i];
    p.ldy[i] = a.ldy[i];
    p.first[i + 1] = p.first[i] + w.rank;
  }
  return p;
}

template <typename TW>
void launch_lora_batch(const LoraBatchArgs& a, const CudaContext& ctx) {
  DenseParams<TW> p = dense_params<TW>(a);
  int64_t max_out = 0, max_rank = 0;
  for (int i = 0; i < a.num; ++i) {
    const LoraStack& w = a.w[i];
    KERNEL_CHECK(w.in == p.in && w.slots == p.slots && w.dtype == a.w[0].dtype,
                 "lora_batch: the modules of a group share their input size, slots and dtype");
    max_out = std::max(max_out, w.out);
    max_rank = std::max(max_rank, w.rank);
  }
  p.tmp = static_cast<float*>(ctx.workspace);
  const int64_t tiles = (a.m + ls::kTileRows - 1) / ls::kTileRows;
  const int64_t rank_blocks = ls::shrink_rank_blocks(p.first[p.num]);
  const bool gemv = a.m <= dense_gemv_shrink_max_rows();
  const bool tc = mma_shrink(a);
  const DenseMmaShape ms = tc ? dense_mma_shape(a.m, p.first[p.num], p.in) : DenseMmaShape{};
  p.splits = gemv ? 1 : (tc ? ms.splits : ls::shrink_splits(tiles, rank_blocks, p.in));
  KERNEL_CHECK(tiles < (1LL << 31) && rank_blocks < 65535 && max_out / ls::kExpandThreads < 65535,
               "lora_batch: shape too large for the grid");
  cudaStream_t st = cuda_util::stream(ctx);
  if (gemv && slot_shrink(a.m)) {
    launch_slot_shrink(p, p.tmp, p.first[p.num], st);
  } else if (gemv) {
    const lora_fused::ShrinkItems items = lora_fused::make_shrink_items(a, p.tmp, p.first[p.num]);
    cuda_util::launch_pdl(lora_shrink_kernel, lora_shrink_blocks(items), kGemvShrinkThreads, 0, st, items);
  } else if (tc) {
    if constexpr (std::is_same_v<TW, __nv_bfloat16>) {
      const dim3 gs(static_cast<unsigned>((a.m + kDmRows - 1) / kDmRows), static_cast<unsigned>(ms.chunks),
                    static_cast<unsigned>(ms.splits));
      cuda_util::launch_pdl(dense_shrink_mma_kernel, gs, kDmThreads, 0, st, p, ms.per_kt);
    }
  } else {
    dim3 gs(static_cast<unsigned>(tiles), static_cast<unsigned>(rank_blocks),
            static_cast<unsigned>(p.splits));
    if (ls::shrink_q() == 4) {
      cuda_util::launch_pdl(dense_shrink_kernel<TW, 4>, gs, ls::kShrinkWarps * 32, 0, st, p);
    } else {
      cuda_util::launch_pdl(dense_shrink_kernel<TW, 8>, gs, ls::kShrinkWarps * 32, 0, st, p);
    }
  }
  CUDA_CHECK_LAUNCH();
  if constexpr (std::is_same_v<TW, __nv_bfloat16>) {
    if (mma_expand(a)) {
      int64_t chunks = 0;
      for (int i = 0; i < a.num; ++i) chunks += (a.w[i].out + kEmCols - 1) / kEmCols;
      KERNEL_CHECK((a.m + kDmRows - 1) / kDmRows < (1LL << 31) && chunks < 65535,
                   "lora_batch: shape too large for the expand's grid");
      const dim3 ge(static_cast<unsigned>((a.m + kDmRows - 1) / kDmRows), static_cast<unsigned>(chunks));
      cuda_util::launch_pdl(dense_expand_mma_kernel, ge, kDmThreads, 0, st, p);
      CUDA_CHECK_LAUNCH();
      return;
    }
  }
  const int64_t lds = ls::round8(max_rank);
  const int sub = dense_expand_sub(a.m);
  dim3 ge(static_cast<unsigned>((tiles + sub - 1) / sub),
          static_cast<unsigned>((max_out + ls::kExpandThreads - 1) / ls::kExpandThreads),
          static_cast<unsigned>(a.num));
  const size_t smem = static_cast<size_t>(sub * ls::kTileRows * lds) * sizeof(float);
  if (sub == 4) {
    cuda_util::launch_pdl(dense_expand_kernel<TW, 4>, ge, ls::kExpandThreads, smem, st, p, lds);
  } else {
    cuda_util::launch_pdl(dense_expand_kernel<TW, 1>, ge, ls::kExpandThreads, smem, st, p, lds);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void lora_shrink(const LoraBatchArgs& a, float* tmp, int64_t ld_tmp, const CudaContext& ctx) {
  if (a.m == 0 || a.num == 0) return;
  KERNEL_CHECK(a.num <= kMaxLoraGroup, "lora_shrink: 1 to 3 modules per call");
  int64_t ranks = 0;
  for (int i = 0; i < a.num; ++i) {
    KERNEL_CHECK(!a.w[i].empty() && a.w[i].in == a.w[0].in && a.w[i].slots == a.w[0].slots &&
                     a.w[i].dtype == a.w[0].dtype &&
                     (a.w[i].dtype == DType::kBF16 || a.w[i].dtype == DType::kF32),
                 "lora_shrink: the modules of a group share their input size, slots and dtype (F32 or BF16)");
    ranks += a.w[i].rank;
  }
  KERNEL_CHECK(ld_tmp >= ranks, "lora_shrink: tmp rows narrower than the group's ranks");
  if (slot_shrink(a.m)) {
    if (a.w[0].dtype == DType::kBF16) {
      launch_slot_shrink(dense_params<__nv_bfloat16>(a), tmp, ld_tmp, cuda_util::stream(ctx));
    } else {
      launch_slot_shrink(dense_params<float>(a), tmp, ld_tmp, cuda_util::stream(ctx));
    }
    return;
  }
  const lora_fused::ShrinkItems p = lora_fused::make_shrink_items(a, tmp, ld_tmp);
  cuda_util::launch_pdl(lora_shrink_kernel, lora_shrink_blocks(p), kGemvShrinkThreads, 0,
                        cuda_util::stream(ctx), p);
  CUDA_CHECK_LAUNCH();
}

size_t lora_batch_workspace_bytes(const LoraBatchArgs& a) {
  int64_t ranks = 0;
  for (int i = 0; i < a.num; ++i) ranks += a.w[i].empty() ? 0 : a.w[i].rank;
  if (a.m == 0 || ranks == 0) return 0;
  int splits = lora_stack::shrink_splits((a.m + lora_stack::kTileRows - 1) / lora_stack::kTileRows,
                                         lora_stack::shrink_rank_blocks(ranks), a.w[0].in);
  if (mma_shrink(a)) splits = std::max(splits, dense_mma_shape(a.m, ranks, a.w[0].in).splits);
  return static_cast<size_t>(splits * a.m * ranks) * sizeof(float);
}

void lora_batch(const LoraBatchArgs& a, const CudaContext& ctx) {
  if (a.m == 0 || a.num == 0) return;
  KERNEL_CHECK(a.num >= 1 && a.num <= kMaxLoraGroup, "lora_batch: 1 to 3 modules per call");
  for (int i = 0; i < a.num; ++i)
    KERNEL_CHECK(!a.w[i].empty() && a.w[i].rank > 0, "lora_batch: empty module");
  KERNEL_CHECK(lora_batch_workspace_bytes(a) <= ctx.workspace_bytes, "lora_batch: workspace too small");
  if (a.w[0].dtype == DType::kBF16) {
    launch_lora_batch<__nv_bfloat16>(a, ctx);
  } else {
    KERNEL_CHECK(a.w[0].dtype == DType::kF32, "lora_batch: stacks are F32 or BF16");
    launch_lora_batch<float>(a, ctx);
  }
}

}  // namespace polylora::kernels::cuda

namespace polylora::kernels::lora_stack {

int shrink_q() {
  return kernel_tuning(TuningShape{}).lora_shrink_ranks_per_warp == 8 ? 8 : 4;
}

int64_t shrink_rank_blocks(int64_t ranks) {
  const int64_t per = static_cast<int64_t>(kShrinkWarps) * shrink_q();
  return (ranks + per - 1) / per;
}

int shrink_splits(int64_t tiles, int64_t rank_blocks, int64_t in) {
  const int sms = cuda_util::num_sms();
  const int64_t blocks = std::max<int64_t>(1, tiles * rank_blocks);
  const int64_t chunks = std::max<int64_t>(1, (in + kChunk - 1) / kChunk);
  const int64_t want = (3 * sms + blocks - 1) / blocks;  // ~2 blocks of 4 heavy warps fit an SM
  return static_cast<int>(std::clamp<int64_t>(want, 1, std::min<int64_t>(chunks, 16)));
}

}  // namespace polylora::kernels::lora_stack
