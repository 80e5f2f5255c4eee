// kernels/lora/lora_dense_mma_cuda.cu: the BF16 slot-stacked dense LoRA shrink and expand on tensor cores
// (mma.sync m16n8k16), for the steps of many tokens (prefill): lora_batch (lora_cuda.cu) launches them from
// KernelTuning::lora_dense_shrink_mma_min_rows / lora_dense_expand_mma_min_rows tokens. The CUDA-core
// kernels beside them in lora_cuda.cu stay the reference paths (the GPU tests run both against the CPU
// reference).
#include <algorithm>
#include <cstdint>

#include "kernels/lora/lora_dense_cuda.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/tuning.h"

namespace polylora::kernels::cuda::lora_dense {
namespace {

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

}  // namespace

// The shrink's grid: token tiles × rank chunks, and enough splits of the input (at least 4 slices each) for
// ~3 CTAs per SM.
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

namespace {

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

// Eight bf16 of a row, row[c .. c + 7], as a uint4, zero from index lim on; vec: one 16-byte load (the
// caller's row is 16-byte aligned and lim a multiple of 8).
__device__ __forceinline__ uint4 load_bf16x8(const __nv_bfloat16* row, int64_t c, int64_t lim, bool vec) {
  if (c >= lim) return make_uint4(0u, 0u, 0u, 0u);
  if (vec) return __ldg(reinterpret_cast<const uint4*>(row + c));
  uint32_t h[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t lo = c + 2 * q < lim ? __bfloat16_as_ushort(row[c + 2 * q]) : 0u;
    const uint32_t hi = c + 2 * q + 1 < lim ? __bfloat16_as_ushort(row[c + 2 * q + 1]) : 0u;
    h[q] = lo | (hi << 16);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// One 32-wide slice on the tensor cores: the warp's 16 rows of the three bf16 parts at sx (swizzled [64][32]
// tiles kDmTile apart) times the [16·nj_n][32] B tile at sw, into acc[2·nj] and acc[2·nj + 1] (16 columns
// per nj); ks_n k16 steps (1: the slice's second half is zero).
template <int NJ, int P = kDmParts>
__device__ __forceinline__ void mma_parts_slice(float (&acc)[2 * NJ][4], uint32_t sx, uint32_t sw, int warp,
                                                int lane, int ks_n, int nj_n) {
#pragma unroll
  for (int ks = 0; ks < mma::kBK / 16; ++ks) {
    if (ks >= ks_n) break;
    uint32_t af[P][4];
#pragma unroll
    for (int q = 0; q < P; ++q)
      mma::ldmatrix_x4(af[q], sx + q * kDmTile + mma::swz(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
    for (int nj = 0; nj < NJ; ++nj) {
      if (nj >= nj_n) break;
      uint32_t w4[4];
      mma::ldmatrix_x4(w4,
                       sw + mma::swz(nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
#pragma unroll
      for (int q = 0; q < P; ++q) {
        mma::mma_bf16(acc[2 * nj], af[q], w4[0], w4[1]);
        mma::mma_bf16(acc[2 * nj + 1], af[q], w4[2], w4[3]);
      }
    }
  }
}

// P: 3, the f32 input p.x split exactly into three bf16 parts; 1, the bf16 input p.xb (x already rounded,
// LinearLoraExtArgs: the product's own bf16 rows), one part.
template <int P>
__global__ void __launch_bounds__(kDmThreads)
    dense_shrink_mma_kernel(DenseParams<__nv_bfloat16> p, int per_kt) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __shared__ __align__(128) unsigned char smem[2][(P + 1) * kDmTile];
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
  const bool x_vec =
      P == 1 ? (in % mma::kBK) == 0 && (p.ldxb & 3) == 0 && (reinterpret_cast<uintptr_t>(p.xb) & 7) == 0
             : (in % mma::kBK) == 0 && (p.ldx & 3) == 0 && (reinterpret_cast<uintptr_t>(p.x) & 15) == 0;
  bool w_vec = (in & 7) == 0;
  for (int i = 0; i < p.num; ++i) w_vec = w_vec && (reinterpret_cast<uintptr_t>(p.a[i]) & 15) == 0;
  for (int d = 0; d < nslots; ++d) {
    const int32_t key = s_slots[d];
    const float* x_src[4];
    const __nv_bfloat16* xb_src[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = xr + 16 * i;
      x_src[i] = P == 3 && s_key[r] == key ? p.x + (row0 + r) * p.ldx : nullptr;
      xb_src[i] = P == 1 && s_key[r] == key ? p.xb + (row0 + r) * p.ldxb : nullptr;
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
    uint2 xbv[4];
    uint4 wv[2];
    auto load = [&](int kt) {
      const int64_t k = static_cast<int64_t>(kt) * mma::kBK;
      if constexpr (P == 1) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          xbv[i] = make_uint2(0u, 0u);
          if (xb_src[i] == nullptr) continue;
          if (x_vec) {
            xbv[i] = __ldg(reinterpret_cast<const uint2*>(xb_src[i] + k + xc));
          } else {
            uint32_t h[4];
#pragma unroll
            for (int e = 0; e < 4; ++e)
              h[e] = k + xc + e < in ? __bfloat16_as_ushort(xb_src[i][k + xc + e]) : 0u;
            xbv[i] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
          }
        }
      }
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
      for (int i = 0; i < 2; ++i)
        wv[i] =
            w_src[i] == nullptr ? make_uint4(0u, 0u, 0u, 0u) : load_bf16x8(w_src[i], k + wc * 8, in, w_vec);
    };
    // The registers into buffer b: the input's three bf16 parts, then the A rows (swizzled [64][32] tiles).
    auto store = [&](int b) {
      unsigned char* s = smem[b];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t off = mma::swz(xr + 16 * i, xc >> 3) + ((xc >> 2) & 1) * 8;
        if constexpr (P == 1) {
          *reinterpret_cast<uint2*>(s + off) = xbv[i];
        } else {
          const float v[4] = {xv[i].x, xv[i].y, xv[i].z, xv[i].w};
          store_parts(s, off, v);
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
        *reinterpret_cast<uint4*>(s + P * kDmTile + mma::swz(wr + 32 * i, wc)) = wv[i];
    };
    float acc[8][4];
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[ni][q] = 0.0f;
    // Whether the warp's 16 tokens hold some of the slot's.
    const bool mine = __any_sync(0xffffffffu, lane < 16 && s_key[warp * 16 + lane] == key);
    // 16-column blocks with rank rows (the B rows past the group's ranks load as zeros).
    const int n16 = static_cast<int>((total - j0 + 15) / 16 < 4 ? (total - j0 + 15) / 16 : 4);
    if (kt0 < kt1) load(kt0);
    for (int kt = kt0; kt < kt1; ++kt) {
      const int b = (kt - kt0) & 1;
      store(b);
      __syncthreads();  // buffer b is complete; buffer b ^ 1's MMAs (slice kt − 1) are done
      if (kt + 1 < kt1) load(kt + 1);
      if (!mine) continue;
      const uint32_t sx = static_cast<uint32_t>(__cvta_generic_to_shared(smem[b]));
      mma_parts_slice<4, P>(acc, sx, sx + P * kDmTile, warp, lane, mma::kBK / 16, n16);
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
// NC: the CTA's outputs, 128 or 64 (KernelTuning::lora_dense_expand_mma_cols: half the registers for the
// accumulators and the y values, so more CTAs per SM keep loads in flight).

// The expand of one tile after its keys and slots (dense_expand_mma_kernel); FULL: the tile's NC outputs all
// in the module, every load and store vectorized (the common case: no per-element guards).
template <int NC, bool FULL>
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
  uint4 wv[NC / 32];
  auto load_b = [&](int32_t key, int64_t k) {
#pragma unroll
    for (int i = 0; i < NC / 32; ++i) {
      const int64_t o = o0 + wr + 32 * i;
      wv[i] = make_uint4(0u, 0u, 0u, 0u);
      if (!FULL && o >= out) continue;
      wv[i] = load_bf16x8(bw + (static_cast<int64_t>(key) * out + o) * R, k + wc * 8, R, w_vec);
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
  float yv[NC / 8][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + (lane >> 2) + h * 8;
    const float* yrow = y + (row0 + r) * ldy;
    const bool live = s_key[r] >= 0;
#pragma unroll
    for (int ni = 0; ni < NC / 8; ++ni) {
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
      FULL ? NC / 16 : static_cast<int>((out - o0 + 15) / 16 < NC / 16 ? (out - o0 + 15) / 16 : NC / 16);
  const uint32_t sx = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t sw = sx + kDmParts * kDmTile;
  for (int d = 0; d < nslots; ++d) {
    const int32_t key = s_slots[d];
    const bool mine = __any_sync(0xffffffffu, lane < 16 && s_key[warp * 16 + lane] == key);
    float acc[NC / 8][4];
#pragma unroll
    for (int ni = 0; ni < NC / 8; ++ni)
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
      for (int i = 0; i < NC / 32; ++i)
        *reinterpret_cast<uint4*>(smem + kDmParts * kDmTile + mma::swz(wr + 32 * i, wc)) = wv[i];
      __syncthreads();
      if (mine) mma_parts_slice<NC / 16>(acc, sx, sw, warp, lane, R - k > 16 ? 2 : 1, n16);  // 1: a zero half
      __syncthreads();  // the next slice or slot refills the tiles
    }
    if (!mine) continue;
    const float sc = p.scale[mod][key];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp * 16 + (lane >> 2) + h * 8;
      if (s_key[r] != key) continue;
#pragma unroll
      for (int ni = 0; ni < NC / 8; ++ni) {
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
    for (int ni = 0; ni < NC / 8; ++ni) {
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

template <int NC>
__global__ void __launch_bounds__(kDmThreads) dense_expand_mma_kernel(DenseParams<__nv_bfloat16> p) {
  __shared__ __align__(128) unsigned char smem[(kDmParts + 2) * kDmTile];  // tmp parts, then B [128][32]
  __shared__ int32_t s_key[kDmRows];
  __shared__ int32_t s_slots[kDmRows];
  __shared__ int s_nslots;
  int mod = 0;
  int64_t chunk = blockIdx.y;
  while (mod + 1 < p.num && chunk >= (p.out[mod] + NC - 1) / NC) {
    chunk -= (p.out[mod] + NC - 1) / NC;
    ++mod;
  }
  const int64_t out = p.out[mod], R = p.rank[mod], o0 = chunk * NC;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kDmRows;
  const int tid = threadIdx.x;
  // Step inputs and adapter weights only, before the wait (cuda_util.cuh).
  __shared__ unsigned s_runs[kDmRows / 32];
  if (tid < kDmRows) s_key[tid] = dense_key(p, row0 + tid, mod);
  __syncthreads();
  distinct_slots(s_key, s_slots, &s_nslots, s_runs);
  const int nslots = s_nslots;
  const int64_t total = p.first[p.num], col0 = p.first[mod];
  const bool full = o0 + NC <= out && (R & 7) == 0 && (total & 3) == 0 && (col0 & 3) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.tmp) & 15) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.b[mod]) & 15) == 0 && (p.ldy[mod] & 1) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.y[mod]) & 7) == 0;
  if (full) {
    expand_mma_tile<NC, true>(p, mod, o0, row0, s_key, s_slots, nslots, smem);
  } else {
    expand_mma_tile<NC, false>(p, mod, o0, row0, s_key, s_slots, nslots, smem);
  }
}

}  // namespace

void launch_dense_shrink_mma(const DenseParams<__nv_bfloat16>& p, const DenseMmaShape& ms, cudaStream_t st) {
  const dim3 gs(static_cast<unsigned>((p.m + kDmRows - 1) / kDmRows), static_cast<unsigned>(ms.chunks),
                static_cast<unsigned>(ms.splits));
  if (p.xb != nullptr) {
    cuda_util::launch_pdl(dense_shrink_mma_kernel<1>, gs, kDmThreads, 0, st, p, ms.per_kt);
  } else {
    cuda_util::launch_pdl(dense_shrink_mma_kernel<3>, gs, kDmThreads, 0, st, p, ms.per_kt);
  }
  CUDA_CHECK_LAUNCH();
}

void launch_dense_expand_mma(const DenseParams<__nv_bfloat16>& p, cudaStream_t st) {
  const int nc = kernel_tuning({}).lora_dense_expand_mma_cols == 64 ? 64 : 128;
  int64_t chunks = 0;
  for (int i = 0; i < p.num; ++i) chunks += (p.out[i] + nc - 1) / nc;
  KERNEL_CHECK((p.m + kDmRows - 1) / kDmRows < (1LL << 31) && chunks < 65535,
               "lora_batch: shape too large for the expand's grid");
  const dim3 ge(static_cast<unsigned>((p.m + kDmRows - 1) / kDmRows), static_cast<unsigned>(chunks));
  if (nc == 64) {
    cuda_util::launch_pdl(dense_expand_mma_kernel<64>, ge, kDmThreads, 0, st, p);
  } else {
    cuda_util::launch_pdl(dense_expand_mma_kernel<128>, ge, kDmThreads, 0, st, p);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda::lora_dense
