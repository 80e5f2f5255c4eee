// kernels/moe/moe_lora_stack_cuda.cu: the slot-stacked expert LoRA (MoeLoraStack) over an expert path's
// sorted rows (moe_lora_stack.cuh is the interface; moe_cuda.cu chooses the path, sorts and runs the
// products): shrink of gate/up, the activation with the gate/up expand fused in, shrink of down, the
// combine with the down expand fused in, each in the kernel the path and size call for (tiled by 8 rows,
// by sorted row, as items of the products, or by group of same-key rows), and delta mode (each phase's
// shrink and expand as one kernel, per CTA or per thread-block cluster, beside the base product). Weights
// F32 or BF16 (the stack's dtype), sums in f32. docs/multi-lora-kernels.md has the measurements behind each
// choice. Must not: allocate; synchronize.
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/lora/lora_stack_cuda.cuh"
#include "kernels/mma_util.cuh"
#include "kernels/moe/moe_lora_stack.cuh"

namespace polylora::kernels::cuda {
namespace {

using moe_detail::gemv_shrink;
using moe_detail::kMaxTopKLora;
using moe_detail::moe_gemv_blocks;
using moe_detail::Phase;
using moe_detail::shrink_items;
using moe_detail::shrink_params;
using moe_detail::StackBuffers;
using moe_detail::StackStep;
using moe_detail::tuning_of;

namespace ls = lora_stack;

template <typename TW>
struct StackParams {
  const int32_t* sorted = nullptr;
  const int32_t* num_tiles = nullptr;
  int tile_m = 1;
  int64_t max_rows = 0;
  const int32_t* ids = nullptr;
  const int32_t* token_slots = nullptr;
  int64_t top_k = 0, E = 0, H = 0, I = 0, slots = 0, R = 0;
  int gu_slices = 1;
  bool interleaved = false;
  const TW* a_gu = nullptr;
  const TW* b_gu = nullptr;
  const TW* a_down = nullptr;
  const TW* b_down = nullptr;
  const float* scale = nullptr;        // [slots, E, 3]
  int gu_splits = 1, down_splits = 1;  // partial sums of the shrinks (split-K)
  int64_t gu_stride = 0, down_stride = 0;
};

// Sorted rows below the device-side count.
template <typename TW>
__device__ __forceinline__ int64_t stack_rows(const StackParams<TW>& p) {
  const int64_t rows = static_cast<int64_t>(*p.num_tiles) * p.tile_m;
  return rows < p.max_rows ? rows : p.max_rows;
}

// The key (slot · E + expert) of a pair when its token has an adapter with LoRA on this expert in one of
// the scale columns [c0, c1), else −1.
template <typename TW>
__device__ __forceinline__ int32_t stack_key(const StackParams<TW>& p, int32_t pair, int c0, int c1) {
  const int32_t e = p.ids[pair];
  if (e < 0 || e >= p.E) return -1;
  return moe_detail::lora_row_key(pair, e, p.token_slots, p.top_k, p.slots, p.E, p.scale, c0, c1 - c0);
}

// The LoRA slice of output column n of a phase: 0 on down and with one gate/up slice; else the gate (0) or
// up (1) slice, interleaved (GPT-OSS: n & 1) or gate rows then up rows.
template <typename TW>
__device__ __forceinline__ int lora_slice(const StackParams<TW>& p, int64_t n, bool down) {
  return down || p.gu_slices == 1 ? 0 : (p.interleaved ? static_cast<int>(n & 1) : (n >= p.I ? 1 : 0));
}

// Shrinks over tiles of sorted rows: gate/up (down == false: x of the row's token -> lora_gu[row]) or down
// (the row's activation -> lora_down[pair]).
template <typename TW, int Q>
__global__ void __launch_bounds__(ls::kShrinkWarps * 32)
    moe_stack_shrink_kernel(StackParams<TW> p, const float* in, int64_t ld_in, float* out, bool down) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  __shared__ ls::RowRef refs[ls::kTileRows];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * ls::kTileRows;
  if (r0 >= stack_rows(p)) return;
  if (threadIdx.x < ls::kTileRows) {
    const int64_t r = r0 + threadIdx.x;
    ls::RowRef ref{-1, nullptr, nullptr};
    const int32_t pair = r < stack_rows(p) ? p.sorted[r] : -1;
    if (pair >= 0) {
      ref.key = down ? stack_key(p, pair, 2, 3) : stack_key(p, pair, 0, p.gu_slices);
      if (ref.key >= 0) {
        ref.in = down ? in + r * ld_in : in + (pair / p.top_k) * ld_in;
        ref.out = down ? out + static_cast<int64_t>(pair) * p.R : out + r * p.gu_slices * p.R;
      }
    }
    refs[threadIdx.x] = ref;
  }
  __syncthreads();
  ls::ShrinkGroup<TW> g;
  g.num = 1;
  g.a[0] = down ? p.a_down : p.a_gu;
  g.rank_total[0] = down ? p.R : p.gu_slices * p.R;
  g.first[1] = g.rank_total[0];
  g.in = down ? p.I : p.H;
  g.splits = down ? p.down_splits : p.gu_splits;
  g.split_stride = down ? p.down_stride : p.gu_stride;
  ls::shrink_tile<TW, Q>(g, refs, static_cast<int64_t>(blockIdx.y) * ls::kShrinkWarps * Q,
                         static_cast<int>(blockIdx.z));
}

// Shrink by sorted row (tile_m 1 paths, where the shrinks are not items of the products; tuning
// moe_lora_by_row bounds the rows; above, the tiled or item shrinks): row blockIdx.x, its key's rank rows
// against its input, every thread taking 8-element pieces of K and, per chunk of kRowShrinkChunk rank
// rows, the input piece and all of the chunk's A pieces at once: 10 independent loads per thread in
// flight instead of the tiled kernel's chain of one round per distinct key of its tile, at 76 registers
// (BF16 stacks) instead of ~230. Rows of one key read A again from L2. The CTA's warps' sums meet in shared
// memory (fixed order: deterministic). gate/up (down == false): x of the row's token -> out[row · GR + j];
// down: the row's activation -> out[pair · R + j]. Rows without LoRA store nothing (the expands skip them).
constexpr int kRowShrinkThreads = 256;
constexpr int kRowShrinkChunk = 8;

template <typename TW>
__global__ void __launch_bounds__(kRowShrinkThreads)
    moe_lora_shrink_rows_kernel(StackParams<TW> p, const float* in, int64_t ld_in, float* out, bool down) {
  cuda_util::pdl_begin();         // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float red[];  // [warps][GR]
  const int64_t r = blockIdx.x;
  if (r >= stack_rows(p)) return;
  const int32_t pair = p.sorted[r];
  if (pair < 0) return;
  const int32_t key = down ? stack_key(p, pair, 2, 3) : stack_key(p, pair, 0, p.gu_slices);
  if (key < 0) return;
  const int64_t K = down ? p.I : p.H, GR = down ? p.R : p.gu_slices * p.R;
  const float* x = in + (down ? r : static_cast<int64_t>(pair / p.top_k)) * ld_in;
  const TW* A = (down ? p.a_down : p.a_gu) + static_cast<int64_t>(key) * GR * K;
  const bool xvec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  const bool wvec = (K & 7) == 0 && (reinterpret_cast<uintptr_t>(A) & 15) == 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kRowShrinkThreads / 32;
  for (int64_t j0 = 0; j0 < GR; j0 += kRowShrinkChunk) {
    float acc[kRowShrinkChunk];
#pragma unroll
    for (int q = 0; q < kRowShrinkChunk; ++q) acc[q] = 0.0f;
    for (int64_t k = static_cast<int64_t>(threadIdx.x) * 8; k < K; k += kRowShrinkThreads * 8) {
      const bool vk = k + 8 <= K;
      float xv[8];
      ls::load8(x, k, K, vk && xvec, xv);
      ls::Pack8<TW> w[kRowShrinkChunk];
#pragma unroll
      for (int q = 0; q < kRowShrinkChunk; ++q)
        if (j0 + q < GR) w[q].load(A + (j0 + q) * K, k, K, vk && wvec);
#pragma unroll
      for (int q = 0; q < kRowShrinkChunk; ++q) {
        if (j0 + q >= GR) break;
        float s = acc[q];
#pragma unroll
        for (int e = 0; e < 8; ++e) s = fmaf(w[q].get(e), xv[e], s);
        acc[q] = s;
      }
    }
#pragma unroll
    for (int q = 0; q < kRowShrinkChunk; ++q) {
      const float v = cuda_util::warp_sum(acc[q]);
      if (lane == 0 && j0 + q < GR) red[warp * GR + j0 + q] = v;
    }
  }
  __syncthreads();
  float* o = out + (down ? static_cast<int64_t>(pair) * p.R : r * GR);
  for (int64_t j = threadIdx.x; j < GR; j += blockDim.x) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w * GR + j];
    o[j] = v;
  }
}

// The SMs' shared-memory carveout preference of a kernel that may run beside a tensor-core product (the
// expert LoRA's delta kernel and shrinks: moe_experts), set once: the product's.
template <typename Kernel>
void prefer_max_shared(Kernel kernel) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  cudaSharedmemCarveoutMaxShared));
}

template <typename TW>
void launch_stack_shrink(dim3 grid, cudaStream_t st, const StackParams<TW>& p, const float* in, int64_t ld_in,
                         float* out, bool down) {
  static const bool carveout = [] {
    prefer_max_shared(moe_stack_shrink_kernel<TW, 4>);
    prefer_max_shared(moe_stack_shrink_kernel<TW, 8>);
    return true;
  }();
  (void)carveout;
  if (ls::shrink_q() == 4) {
    cuda_util::launch_pdl(moe_stack_shrink_kernel<TW, 4>, grid, ls::kShrinkWarps * 32, 0, st, p, in, ld_in,
                          out, down);
  } else {
    cuda_util::launch_pdl(moe_stack_shrink_kernel<TW, 8>, grid, ls::kShrinkWarps * 32, 0, st, p, in, ld_in,
                          out, down);
  }
}

// One column j of moe_act_lora_kernel's tile (keys: the rows' keys, −2 no row, −1 no LoRA; sc_g, sc_u their
// gate and up LoRA scales).
template <typename TW>
__device__ __forceinline__ void act_lora_column(const StackParams<TW>& p, const float* gu, float* act,
                                                __nv_bfloat16* act_bf16, int64_t lda_bf16, int64_t copies,
                                                ExpertAct kind, float alpha, float limit, const float* ts,
                                                int64_t lds, int64_t R8, int64_t r0,
                                                const int32_t (&keys)[ls::kTileRows],
                                                const float (&sc_g)[ls::kTileRows],
                                                const float (&sc_u)[ls::kTileRows], int64_t j) {
  const int64_t R = p.R, I = p.I;
  const int64_t n_gate = p.interleaved ? 2 * j : j, n_up = p.interleaved ? 2 * j + 1 : I + j;
  const int up_slice = p.gu_slices == 1 ? 0 : 1;
  const bool vec = (R & 7) == 0;
  float acc_g[ls::kTileRows] = {}, acc_u[ls::kTileRows] = {};
  int32_t lkeys[ls::kTileRows];  // −1 for both "no row" and "no LoRA"
#pragma unroll
  for (int u = 0; u < ls::kTileRows; ++u) lkeys[u] = keys[u] >= 0 ? keys[u] : -1;
  // The base gate/up values first: their loads overlap the B rows'.
  float g_in[ls::kTileRows], up_in[ls::kTileRows];
#pragma unroll
  for (int u = 0; u < ls::kTileRows; ++u) {
    const int64_t r = r0 + u;
    g_in[u] = keys[u] == -2 ? 0.0f : __ldg(gu + r * 2 * I + n_gate);
    up_in[u] = keys[u] == -2 ? 0.0f : __ldg(gu + r * 2 * I + n_up);
  }
  const TW* b = p.b_gu;
  const int64_t two_i = 2 * I;
  ls::expand_tile2<TW>([&](int32_t key) { return b + (static_cast<int64_t>(key) * two_i + n_gate) * R; },
                       [&](int32_t key) { return b + (static_cast<int64_t>(key) * two_i + n_up) * R; }, R,
                       vec, ts, ts + up_slice * R8, lds, lkeys, acc_g, acc_u);
#pragma unroll
  for (int u = 0; u < ls::kTileRows; ++u) {
    if (keys[u] == -2) continue;
    const int64_t r = r0 + u;
    float g = g_in[u], up = up_in[u];
    if (keys[u] >= 0) {
      g += sc_g[u] * acc_g[u];
      up += sc_u[u] * acc_u[u];
    }
    const float v = moe_detail::expert_act(kind, g, up, alpha, limit);
    if (act != nullptr) act[r * I + j] = v;
    if (act_bf16 != nullptr) {
      __nv_bfloat16* brow = act_bf16 + r * copies * lda_bf16;
      const cuda_util::Bf16Pair hl = cuda_util::split_bf16(v);
      brow[j] = hl.hi;
      if (copies == 2) brow[lda_bf16 + j] = hl.lo;
    }
  }
}

// Threads per block of the two expand-fused kernels below: columns over blocks, so few tokens (decode) still
// spread over ~2 x more SMs than with 256 (the B loads are latency-bound there).
constexpr int kActLoraThreads = 128;

// moe_act_kernel with the gate/up LoRA expand fused in: per tile of sorted rows and column j, the B rows
// of the gate and up outputs of j read once per distinct (slot, expert) of the tile, added (scaled) to
// gu before the activation. ts: [kTileRows][gu_slices][R8] shared.
template <typename TW>
__global__ void __launch_bounds__(kActLoraThreads)
    moe_act_lora_kernel(StackParams<TW> p, const float* gu, const float* tmp, float* act,
                        __nv_bfloat16* act_bf16, int64_t lda_bf16, int64_t copies, ExpertAct kind,
                        float alpha, float limit) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float ts[];
  __shared__ int32_t keys_s[ls::kTileRows];                     // −2: no row, −1: a row without LoRA
  __shared__ float scg_s[ls::kTileRows], scu_s[ls::kTileRows];  // gate and up LoRA scales of a row's key
  const int64_t R = p.R, R8 = ls::round8(R), lds = p.gu_slices * R8, I = p.I;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * ls::kTileRows;
  const int64_t rows = stack_rows(p);
  if (r0 >= rows) return;
  if (threadIdx.x < ls::kTileRows) {
    const int64_t r = r0 + threadIdx.x;
    const int32_t pair = r < rows ? p.sorted[r] : -1;
    const int32_t key = pair < 0 ? -2 : stack_key(p, pair, 0, p.gu_slices);
    keys_s[threadIdx.x] = key;
    scg_s[threadIdx.x] = key >= 0 ? p.scale[key * 3] : 0.0f;
    scu_s[threadIdx.x] = key >= 0 ? p.scale[key * 3 + (p.gu_slices == 1 ? 0 : 1)] : 0.0f;
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < ls::kTileRows * lds; idx += blockDim.x) {
    const int64_t u = idx / lds, c = idx % lds, sl = c / R8, r = c % R8;
    float v = 0.0f;
    if (keys_s[u] >= 0 && r < R)
      for (int z = 0; z < p.gu_splits; ++z)
        v += tmp[z * p.gu_stride + (r0 + u) * p.gu_slices * R + sl * R + r];
    ts[idx] = v;
  }
  __syncthreads();
  const int64_t width = act_bf16 != nullptr ? lda_bf16 : I;
  int32_t keys[ls::kTileRows];
  float sc_g[ls::kTileRows], sc_u[ls::kTileRows];
#pragma unroll
  for (int u = 0; u < ls::kTileRows; ++u) {
    keys[u] = keys_s[u];
    sc_g[u] = scg_s[u];
    sc_u[u] = scu_s[u];
  }
  // Columns over blockIdx.y and a loop: the tile's keys and shrink sums above are read once per CTA, not
  // once per 128 columns (moe_act_lora_grid).
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < width;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    if (j >= I) {
#pragma unroll
      for (int u = 0; u < ls::kTileRows; ++u) {
        if (keys[u] == -2) continue;
        __nv_bfloat16* brow = act_bf16 + (r0 + u) * copies * lda_bf16;
        brow[j] = __float2bfloat16_rn(0.0f);
        if (copies == 2) brow[lda_bf16 + j] = __float2bfloat16_rn(0.0f);
      }
      continue;
    }
    act_lora_column(p, gu, act, act_bf16, lda_bf16, copies, kind, alpha, limit, ts, lds, R8, r0, keys, sc_g,
                    sc_u, j);
  }
}

// moe_act_lora_kernel by sorted row (up to tuning moe_lora_by_row sorted rows; above, the tiled one): row
// blockIdx.x, columns over blockIdx.y and the threads. Each (row, column) loads its own key's gate and up B
// rows (rows of one key read them again from L2), so a thread holds one row's state, not a tile's: ~40
// registers instead of ~210, full occupancy, and a CTA's setup (the row's key, scales and shrink sums) is
// one short chain. The sums are the tiled kernel's, in the same order.
constexpr int kActLoraRowThreads = 256;

// BATCHED (tuning moe_lora_expand_batched; prepared in session 37, compiled, not yet run on a GPU): for
// ranks up to kBatchedRank that are multiples of 8, every rank chunk's gate and up B loads are issued before
// the sums (the runtime-bound rank loop above issues one chunk per round: two rounds at r = 16); the same
// sums in the same order. 62 registers instead of 38 (BF16); 32 would take 86.
constexpr int kBatchedRank = 16;

template <typename TW, bool BATCHED>
__global__ void __launch_bounds__(kActLoraRowThreads)
    moe_act_lora_rows_kernel(StackParams<TW> p, const float* gu, const float* tmp, float* act,
                             __nv_bfloat16* act_bf16, int64_t lda_bf16, int64_t copies, ExpertAct kind,
                             float alpha, float limit) {
  cuda_util::pdl_begin();        // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float ts[];  // [gu_slices][R8]
  __shared__ int32_t key_s;      // −2: no pair, −1: no LoRA
  __shared__ float sc_s[2];
  const int64_t r = blockIdx.x;
  if (r >= stack_rows(p)) return;
  const int64_t R = p.R, R8 = ls::round8(R), I = p.I;
  const int up_slice = p.gu_slices == 1 ? 0 : 1;
  if (threadIdx.x == 0) {
    const int32_t pair = p.sorted[r];
    const int32_t key = pair < 0 ? -2 : stack_key(p, pair, 0, p.gu_slices);
    key_s = key;
    sc_s[0] = key >= 0 ? p.scale[key * 3] : 0.0f;
    sc_s[1] = key >= 0 ? p.scale[key * 3 + up_slice] : 0.0f;
  }
  // The shrink sums of the row (read whether or not it has LoRA: the key is not known yet; unused then).
  for (int64_t idx = threadIdx.x; idx < p.gu_slices * R8; idx += blockDim.x) {
    const int64_t sl = idx / R8, k = idx % R8;
    float v = 0.0f;
    if (k < R)
      for (int z = 0; z < p.gu_splits; ++z) v += tmp[z * p.gu_stride + r * p.gu_slices * R + sl * R + k];
    ts[idx] = v;
  }
  __syncthreads();
  const int32_t key = key_s;
  if (key == -2) return;
  const float sc_g = sc_s[0], sc_u = sc_s[1];
  const int64_t width = act_bf16 != nullptr ? lda_bf16 : I;
  const bool vec = (R & 7) == 0;
  const TW* b = key >= 0 ? p.b_gu + static_cast<int64_t>(key) * 2 * I * R : nullptr;
  const float* ts_u = ts + up_slice * R8;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < width;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    __nv_bfloat16* brow = act_bf16 != nullptr ? act_bf16 + r * copies * lda_bf16 : nullptr;
    if (j >= I) {
      brow[j] = __float2bfloat16_rn(0.0f);
      if (copies == 2) brow[lda_bf16 + j] = __float2bfloat16_rn(0.0f);
      continue;
    }
    const int64_t n_gate = p.interleaved ? 2 * j : j, n_up = p.interleaved ? 2 * j + 1 : I + j;
    float g = __ldg(gu + r * 2 * I + n_gate), up = __ldg(gu + r * 2 * I + n_up);
    if (b != nullptr) {
      float ag = 0.0f, au = 0.0f;
      const TW* bg = b + n_gate * R;
      const TW* bu = b + n_up * R;
      if (BATCHED && vec && R <= kBatchedRank) {
        ls::Pack8<TW> wg[kBatchedRank / 8], wu[kBatchedRank / 8];
#pragma unroll
        for (int c = 0; c < kBatchedRank / 8; ++c) {
          if (8 * c < R) {
            wg[c].load(bg, 8 * c, R, true);
            wu[c].load(bu, 8 * c, R, true);
          }
        }
#pragma unroll
        for (int c = 0; c < kBatchedRank / 8; ++c) {
          if (8 * c >= R) break;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            ag = fmaf(wg[c].get(e), ts[8 * c + e], ag);
            au = fmaf(wu[c].get(e), ts_u[8 * c + e], au);
          }
        }
      } else if (vec) {
#pragma unroll 4
        for (int64_t k = 0; k < R; k += 8) {
          ls::Pack8<TW> wg, wu;
          wg.load(bg, k, R, true);
          wu.load(bu, k, R, true);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            ag = fmaf(wg.get(e), ts[k + e], ag);
            au = fmaf(wu.get(e), ts_u[k + e], au);
          }
        }
      } else {
        for (int64_t k = 0; k < R; ++k) {
          ag = fmaf(ls::ld1(bg, k), ts[k], ag);
          au = fmaf(ls::ld1(bu, k), ts_u[k], au);
        }
      }
      g += sc_g * ag;
      up += sc_u * au;
    }
    const float v = moe_detail::expert_act(kind, g, up, alpha, limit);
    if (act != nullptr) act[r * I + j] = v;
    if (brow != nullptr) {
      const cuda_util::Bf16Pair hl = cuda_util::split_bf16(v);
      brow[j] = hl.hi;
      if (copies == 2) brow[lda_bf16 + j] = hl.lo;
    }
  }
}

// moe_combine_kernel with the down LoRA expand fused in: out[t] = Σ_k w_k · (y_pair + scale · B · tmp_pair).
// BATCHED (as moe_act_lora_rows_kernel's): for ranks up to kBatchedRank that are multiples of 8, the four
// pairs' B chunks are all loaded before any sum (dot_rank's runtime-bound loop issues one pair's chunk per
// round); the same sums in the same order. 84 registers instead of 54 (BF16).
template <typename TW, bool BATCHED>
__global__ void __launch_bounds__(kActLoraThreads)
    moe_combine_lora_kernel(StackParams<TW> p, const float* y, const float* tmp, const float* weights,
                            float* out, int64_t ldo) {
  cuda_util::pdl_begin();        // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float ts[];  // [top_k][R8]
  __shared__ int32_t keys[kMaxTopKLora];
  __shared__ float wts[kMaxTopKLora];  // the pair's routing weight, 0 when it has no expert
  __shared__ float scs[kMaxTopKLora];  // its down LoRA scale (keys >= 0)
  const int64_t t = blockIdx.x, K = p.top_k, R = p.R, R8 = ls::round8(R), H = p.H;
  if (threadIdx.x < K) {
    const int32_t pr = static_cast<int32_t>(t * K + threadIdx.x);
    const int32_t e = p.ids[pr];
    const int32_t key = stack_key(p, pr, 2, 3);
    keys[threadIdx.x] = e < 0 || e >= p.E ? -2 : key;
    wts[threadIdx.x] = weights[pr];
    scs[threadIdx.x] = key >= 0 ? p.scale[key * 3 + 2] : 0.0f;
  }
  __syncthreads();
  for (int64_t idx = threadIdx.x; idx < K * R8; idx += blockDim.x) {
    const int64_t k = idx / R8, r = idx % R8;
    float v = 0.0f;
    if (keys[k] >= 0 && r < R)
      for (int z = 0; z < p.down_splits; ++z) v += tmp[z * p.down_stride + (t * K + k) * R + r];
    ts[idx] = v;
  }
  __syncthreads();
  const bool vec = (R & 7) == 0;
  for (int64_t h = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; h < H;
       h += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    float sum = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += 4) {  // four pairs' y values and B rows loaded together
      float yv[4], lt[4];
      if (BATCHED && vec && R <= kBatchedRank) {
        ls::Pack8<TW> w[4][kBatchedRank / 8];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t k = k0 + u;
          const int32_t key = k < K ? keys[k] : -2;
          yv[u] = key == -2 ? 0.0f : __ldg(y + (t * K + k) * H + h);
          const TW* brow = p.b_down + (static_cast<int64_t>(key >= 0 ? key : 0) * H + h) * R;
#pragma unroll
          for (int c = 0; c < kBatchedRank / 8; ++c)
            if (key >= 0 && 8 * c < R) w[u][c].load(brow, 8 * c, R, true);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t k = k0 + u;
          const int32_t key = k < K ? keys[k] : -2;
          float acc = 0.0f;
          if (key >= 0) {
#pragma unroll
            for (int c = 0; c < kBatchedRank / 8; ++c) {
              if (8 * c >= R) break;
#pragma unroll
              for (int e = 0; e < 8; ++e) acc = fmaf(w[u][c].get(e), ts[k * R8 + 8 * c + e], acc);
            }
          }
          lt[u] = acc;
        }
      } else {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const int64_t k = k0 + u;
          const int32_t key = k < K ? keys[k] : -2;
          yv[u] = key == -2 ? 0.0f : __ldg(y + (t * K + k) * H + h);
          lt[u] = key >= 0
                      ? ls::dot_rank(p.b_down + (static_cast<int64_t>(key) * H + h) * R, ts + k * R8, R, vec)
                      : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t k = k0 + u;
        if (k >= K || keys[k] == -2) continue;
        float v = yv[u];
        if (keys[k] >= 0) v += scs[k] * lt[u];
        sum += wts[k] * v;
      }
    }
    out[t * ldo + h] = sum;
  }
}

// Delta mode (StackStep::kDeltaGateUp / kDeltaDown): one phase's whole LoRA for sorted row blockIdx.x and
// output columns [blockIdx.y · chunk, + chunk): the shrink s = A[key] · in (every CTA of the row computes it
// again: A is small and the row's CTAs read it from L2) into shared memory, then out[n] = scale · B[key][n]
// · s; 0 where the pair has no LoRA in this phase. gate/up (down == false): in = x by token, out = dgu by
// sorted row; down: in = the f32 activation by sorted row, out = dy by pair. The kernel triggers its
// dependent right after its own wait: the base product launched after it (GemvTcParams::defer_wait) runs
// beside it, so on a batch-1 step this LoRA costs about a launch instead of a chain of dependent loads in
// the activation and combine.
constexpr int kDeltaThreads = 256;
constexpr int kDeltaRows = 16;  // shrink rows per pass

template <typename TW>
__global__ void __launch_bounds__(kDeltaThreads)
    moe_lora_delta_kernel(StackParams<TW> p, const float* in, int64_t ld_in, float* out, int64_t chunk,
                          bool down) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh); the trigger lets the product start now
  extern __shared__ float s_mid[];  // [gu_slices · R] (down: [R])
  const int64_t r = blockIdx.x;
  if (r >= stack_rows(p)) return;
  const int32_t pair = p.sorted[r];
  if (pair < 0) return;
  const int64_t N = down ? p.H : 2 * p.I, K = down ? p.I : p.H;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t n1 = n0 + chunk < N ? n0 + chunk : N;
  float* o = out + (down ? static_cast<int64_t>(pair) : r) * N;
  const int32_t key = down ? stack_key(p, pair, 2, 3) : stack_key(p, pair, 0, p.gu_slices);
  if (key < 0) {
    for (int64_t n = n0 + threadIdx.x; n < n1; n += blockDim.x) o[n] = 0.0f;
    return;
  }
  const int64_t nr = down ? p.R : p.gu_slices * p.R;
  const TW* A = (down ? p.a_down : p.a_gu) + static_cast<int64_t>(key) * nr * K;
  const float* x = in + (down ? r : static_cast<int64_t>(pair / p.top_k)) * ld_in;
  const bool vec = (K & 7) == 0 && (reinterpret_cast<uintptr_t>(A) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  // The shrink, kDeltaRows rows at a time: thread i takes the 8-element pieces i, i + 256, ... of K, loads
  // each piece of x once and the rows' pieces of A together (one round trip per 2,048 elements of K instead
  // of one per row: a warp per row, rows in turn, made this kernel take 21 us at batch 1), then the sums
  // over lanes (shuffles) and warps (shared memory).
  __shared__ float s_part[kDeltaThreads / 32][kDeltaRows];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t j0 = 0; j0 < nr; j0 += kDeltaRows) {
    float acc[kDeltaRows];
#pragma unroll
    for (int u = 0; u < kDeltaRows; ++u) acc[u] = 0.0f;
    for (int64_t k = static_cast<int64_t>(threadIdx.x) * 8; k < K; k += kDeltaThreads * 8) {
      float xv[8];
      ls::load8(x, k, K, vec, xv);
#pragma unroll
      for (int u = 0; u < kDeltaRows; ++u) {
        if (j0 + u >= nr) break;
        float w[8];
        ls::load8(A + (j0 + u) * K, k, K, vec, w);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[u] = fmaf(w[e], xv[e], acc[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kDeltaRows; ++u) {
      const float v = cuda_util::warp_sum(acc[u]);
      if (lane == 0) s_part[warp][u] = v;
    }
    __syncthreads();
    if (threadIdx.x < kDeltaRows && j0 + threadIdx.x < nr) {
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kDeltaThreads / 32; ++w) v += s_part[w][threadIdx.x];  // fixed order
      s_mid[j0 + threadIdx.x] = v;
    }
    __syncthreads();
  }
  const TW* B = (down ? p.b_down : p.b_gu) + static_cast<int64_t>(key) * N * p.R;
  const bool bvec = (p.R & 7) == 0 && (reinterpret_cast<uintptr_t>(B) & 15) == 0;
  for (int64_t n = n0 + threadIdx.x; n < n1; n += blockDim.x) {
    const int sl = lora_slice(p, n, down);
    const float sc = p.scale[key * 3 + (down ? 2 : sl)];
    o[n] = sc == 0.0f ? 0.0f : sc * ls::dot_rank(B + n * p.R, s_mid + sl * p.R, p.R, bvec);
  }
}

// Delta mode with a thread-block cluster per group of sorted rows (tuning moe_lora_delta_cluster = C > 0).
// A group: up to kDeltaGroup consecutive sorted rows with the same (slot, expert) key, starting where the
// key changes or at a multiple of kDeltaGroup (so every cluster decides alone whether its row blockIdx.y
// starts one; the others exit at once). Its C CTAs read the key's A and B once for all the group's rows:
// CTA c sums its K / C slice of every LoRA row against every row's input (each warp four LoRA rows, its
// lanes the 8-element pieces, so the slice's loads are in flight together instead of in a chain of passes,
// which is what makes moe_lora_delta_kernel take ~25 us beside the gate/up GEMV at batch 1), the slice sums
// meet through distributed shared memory (added in rank order: deterministic), then CTA c expands output
// columns [c · N / C, (c + 1) · N / C) of every row, each B row loaded once. Rows whose pairs have no LoRA
// get zeros; exits are uniform over a cluster (they depend on the group only).
constexpr int kDeltaClusterMax = 8;
constexpr int kDeltaRowsPerWarp = 4;
constexpr int kDeltaGroup = 4;

template <typename TW>
__device__ __forceinline__ int32_t delta_key(const StackParams<TW>& p, int64_t r, bool down) {
  const int32_t pair = p.sorted[r];
  if (pair < 0) return -2;
  return down ? stack_key(p, pair, 2, 3) : stack_key(p, pair, 0, p.gu_slices);
}

template <typename TW>
__global__ void __launch_bounds__(kDeltaThreads)
    moe_lora_delta_cluster_kernel(StackParams<TW> p, const float* in, int64_t ld_in, float* out, bool down) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cuda_util::pdl_begin();  // launched with the PDL attribute as launch_pdl does; the product starts now
  extern __shared__ float s_delta[];  // [kDeltaGroup][nr] this CTA's slice sums, then the group's sums
  cg::cluster_group cluster = cg::this_cluster();
  const int C = static_cast<int>(cluster.num_blocks());
  const int c = static_cast<int>(cluster.block_rank());
  const int64_t rows = stack_rows(p);
  const int64_t r0 = blockIdx.y;
  if (r0 >= rows) return;
  const int32_t key = delta_key(p, r0, down);
  if (key == -2) return;                                                   // no pair in this row
  if (r0 % kDeltaGroup != 0 && delta_key(p, r0 - 1, down) == key) return;  // not the first row of a group
  int n = 1;
  while (n < kDeltaGroup && r0 + n < rows && (r0 + n) % kDeltaGroup != 0 && delta_key(p, r0 + n, down) == key)
    ++n;
  const int64_t N = down ? p.H : 2 * p.I, K = down ? p.I : p.H;
  const int64_t cn = (N + C - 1) / C, n0 = c * cn, n1 = n0 + cn < N ? n0 + cn : N;
  float* o[kDeltaGroup];
  const float* x[kDeltaGroup];
#pragma unroll
  for (int i = 0; i < kDeltaGroup; ++i) {
    const int64_t r = r0 + (i < n ? i : 0);
    const int32_t pair = p.sorted[r];
    o[i] = out + (down ? static_cast<int64_t>(pair) : r) * N;
    x[i] = in + (down ? r : static_cast<int64_t>(pair / p.top_k)) * ld_in;
  }
  if (key < 0) {  // the group's pairs have no LoRA in this phase
    for (int i = 0; i < n; ++i)
      for (int64_t col = n0 + threadIdx.x; col < n1; col += blockDim.x) o[i][col] = 0.0f;
    return;
  }
  const int64_t nr = down ? p.R : p.gu_slices * p.R;
  float* s_part = s_delta;
  float* s_mid = s_delta + kDeltaGroup * nr;
  const TW* A = (down ? p.a_down : p.a_gu) + static_cast<int64_t>(key) * nr * K;
  bool vec = (K & 7) == 0 && (reinterpret_cast<uintptr_t>(A) & 15) == 0;
#pragma unroll
  for (int i = 0; i < kDeltaGroup; ++i) vec = vec && (reinterpret_cast<uintptr_t>(x[i]) & 15) == 0;
  // This CTA's K slice: whole 8-element pieces.
  const int64_t ck = ((K + 8 * C - 1) / (8 * C)) * 8;
  const int64_t k0 = c * ck < K ? c * ck : K, k1 = k0 + ck < K ? k0 + ck : K;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  constexpr int kWarps = kDeltaThreads / 32;
  for (int64_t j0 = static_cast<int64_t>(warp) * kDeltaRowsPerWarp; j0 < nr;
       j0 += kWarps * kDeltaRowsPerWarp) {
    float acc[kDeltaRowsPerWarp][kDeltaGroup];
#pragma unroll
    for (int u = 0; u < kDeltaRowsPerWarp; ++u)
#pragma unroll
      for (int i = 0; i < kDeltaGroup; ++i) acc[u][i] = 0.0f;
    for (int64_t k = k0 + static_cast<int64_t>(lane) * 8; k < k1; k += 32 * 8) {
      float xv[kDeltaGroup][8];
#pragma unroll
      for (int i = 0; i < kDeltaGroup; ++i) {
        if (i < n) {
          ls::load8(x[i], k, K, vec, xv[i]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) xv[i][e] = 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kDeltaRowsPerWarp; ++u) {
        if (j0 + u >= nr) break;
        float w[8];
        ls::load8(A + (j0 + u) * K, k, K, vec, w);
#pragma unroll
        for (int i = 0; i < kDeltaGroup; ++i)
#pragma unroll
          for (int e = 0; e < 8; ++e) acc[u][i] = fmaf(w[e], xv[i][e], acc[u][i]);
      }
    }
#pragma unroll
    for (int u = 0; u < kDeltaRowsPerWarp; ++u)
#pragma unroll
      for (int i = 0; i < kDeltaGroup; ++i) {
        const float v = cuda_util::warp_sum(acc[u][i]);
        if (lane == 0 && j0 + u < nr) s_part[i * nr + j0 + u] = v;
      }
  }
  cluster.sync();  // every CTA's slice sums written
  for (int64_t idx = threadIdx.x; idx < n * nr; idx += blockDim.x) {
    float v = 0.0f;
    for (int q = 0; q < C; ++q) v += cluster.map_shared_rank(s_part, q)[idx];  // rank order
    s_mid[idx] = v;
  }
  __syncthreads();
  const TW* B = (down ? p.b_down : p.b_gu) + static_cast<int64_t>(key) * N * p.R;
  const bool bvec = (p.R & 7) == 0 && (reinterpret_cast<uintptr_t>(B) & 15) == 0;
  for (int64_t col = n0 + threadIdx.x; col < n1; col += blockDim.x) {
    const int sl = lora_slice(p, col, down);
    const float sc = p.scale[key * 3 + (down ? 2 : sl)];
    float dot[kDeltaGroup];
#pragma unroll
    for (int i = 0; i < kDeltaGroup; ++i) dot[i] = 0.0f;
    const TW* b = B + col * p.R;
    for (int64_t rr = 0; rr < p.R; rr += 8) {  // each B piece loaded once for the group's rows
      float w[8];
      ls::load8(b, rr, p.R, bvec, w);
#pragma unroll
      for (int i = 0; i < kDeltaGroup; ++i) {
        if (i >= n) break;
        const float* t = s_mid + i * nr + sl * p.R + rr;
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (rr + e < p.R) dot[i] = fmaf(w[e], t[e], dot[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kDeltaGroup; ++i)
      if (i < n) o[i][col] = sc == 0.0f ? 0.0f : sc * dot[i];
  }
  cluster.sync();  // no CTA leaves while another still reads its slice sums
#endif
}

// The cluster delta kernel: grid (C, rows), clusters of C CTAs along x, with the PDL attribute as
// launch_pdl gives it (the product after it starts at once).
template <typename TW>
void launch_delta_cluster(int C, const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                          const MoeLoraStack& s, bool down, cudaStream_t st) {
  static const bool configured = [] {
    prefer_max_shared(moe_lora_delta_cluster_kernel<TW>);
    // Ranks up to 1,024 with two gate/up slices: 2 · kDeltaGroup · 2,048 floats.
    CUDA_CHECK(cudaFuncSetAttribute(moe_lora_delta_cluster_kernel<TW>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));
    return true;
  }();
  (void)configured;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(C), static_cast<unsigned>(ws.max_rows));
  cfg.blockDim = dim3(kDeltaThreads);
  cfg.dynamicSmemBytes =
      2 * kDeltaGroup * static_cast<size_t>((down ? 1 : s.gu_slices) * s.rank) * sizeof(float);
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(C);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = cuda_util::pdl_launch_on() ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, moe_lora_delta_cluster_kernel<TW>, p,
                                down ? static_cast<const float*>(ws.act) : a.x, down ? a.inter : a.ldx,
                                down ? ws.dy : ws.dgu, down));
}

// CTAs along the columns of the expand-fused activation and combine (`threads` columns each, looping over
// the rest): enough for about per_sm CTAs per SM with `rows` CTAs along the rows, at most one per `threads`
// columns. Each CTA reads its rows' keys and shrink sums once (a chain of dependent loads
// before its first column), so CTAs that take several column blocks pay it once: H200, moe-lora MXFP4
// M = 256 (ncu, serialized): the activation with the expand in 2,944 CTAs took 128 us for 69 MB.
unsigned expand_column_ctas(int64_t rows, int64_t width, int64_t per_sm, int64_t threads) {
  const int64_t blocks = (width + threads - 1) / threads;
  const int64_t want = (per_sm * cuda_util::num_sms() + rows - 1) / std::max<int64_t>(1, rows);
  return static_cast<unsigned>(std::clamp<int64_t>(want, 1, blocks));
}

// The shrink by group of sorted rows through a cp.async pipeline (tuning moe_lora_shrink_group = G > 0;
// prepared in session 37, compiled, not yet run on a GPU, so off by default). A group: up to G consecutive
// sorted rows with the same key, starting where the key changes or at a multiple of G (delta_key, as the
// cluster kernel's groups: every CTA decides alone whether its row starts one; the others exit at once). Its
// CTA streams the key's A once for all the group's rows (moe_lora_shrink_rows_kernel reads it once per row:
// at M = 256, ~4 rows per key, 188 MB of L2 reads for 45 MB of A) in stages of kSgRankRows rank rows x
// kSgK inputs, with the rows' inputs, kSgStages deep through cp.async (the loads in flight are shared
// memory, not registers: ~48 KB per CTA instead of the by-row kernel's ~40 B per thread). Thread t takes
// rank row t / 8 of the stage and the 8-element pieces t % 8 + 8q (a quarter warp reads 128 contiguous
// bytes: no bank conflicts for BF16); the 8 partial sums of a rank row meet by shuffles (fixed order).
// Needs K % 8 == 0 and 16-byte aligned A, input rows and row stride (launch_group_shrink checks; otherwise
// the by-row kernel runs). Same outputs as the by-row kernel (rows without LoRA store nothing).
constexpr int kSgThreads = 256;
constexpr int kSgRankRows = 32;
constexpr int kSgK = 256;
constexpr int kSgStages = 3;
constexpr int kSgMaxGroup = 8;

template <typename TW>
constexpr int sg_stage_bytes(int G) {
  return kSgRankRows * kSgK * static_cast<int>(sizeof(TW)) + G * kSgK * 4;
}

// 8 weights from shared memory (16-byte aligned) as f32.
__device__ __forceinline__ void smem8(const float* w, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(w);
  const float4 b = *reinterpret_cast<const float4*>(w + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void smem8(const __nv_bfloat16* w, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(w);
  const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(q[i] << 16);
    v[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
  }
}

template <typename TW>
__global__ void __launch_bounds__(kSgThreads)
    moe_lora_shrink_group_kernel(StackParams<TW> p, const float* in, int64_t ld_in, float* out, bool down,
                                 int G) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ __align__(16) unsigned char sg_smem[];
  __shared__ const float* s_x[kSgMaxGroup];
  __shared__ float* s_o[kSgMaxGroup];
  const int64_t rows = stack_rows(p);
  const int64_t r0 = blockIdx.x;
  if (r0 >= rows) return;
  const int32_t key = delta_key(p, r0, down);
  if (key < 0) return;                                           // no pair, or no LoRA in this phase
  if (r0 % G != 0 && delta_key(p, r0 - 1, down) == key) return;  // not the first row of a group
  int n = 1;
  while (n < G && r0 + n < rows && (r0 + n) % G != 0 && delta_key(p, r0 + n, down) == key) ++n;
  const int64_t K = down ? p.I : p.H, GR = down ? p.R : p.gu_slices * p.R;
  if (threadIdx.x < n) {
    const int64_t r = r0 + threadIdx.x;
    const int32_t pair = p.sorted[r];
    s_x[threadIdx.x] = in + (down ? r : static_cast<int64_t>(pair / p.top_k)) * ld_in;
    s_o[threadIdx.x] = down ? out + static_cast<int64_t>(pair) * p.R : out + r * GR;
  }
  __syncthreads();
  const TW* A = (down ? p.a_down : p.a_gu) + static_cast<int64_t>(key) * GR * K;
  const int stage_bytes = sg_stage_bytes<TW>(G);
  constexpr int kAChunks = kSgK * static_cast<int>(sizeof(TW)) / 16;  // 16-byte chunks per A row
  constexpr int kElems = 16 / static_cast<int>(sizeof(TW));           // elements per chunk
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(sg_smem));
  const int tid = threadIdx.x, j = tid >> 3, sub = tid & 7;
  const int64_t nkc = (K + kSgK - 1) / kSgK;
  for (int64_t jb = 0; jb < GR; jb += kSgRankRows) {
    auto load_stage = [&](int stage, int64_t kc) {
      const uint32_t sa = base + stage * stage_bytes;
      const uint32_t sx = sa + kSgRankRows * kSgK * static_cast<int>(sizeof(TW));
      const int64_t k0 = kc * kSgK;
      for (int c = tid; c < kSgRankRows * kAChunks; c += kSgThreads) {
        const int row = c / kAChunks, ch = c % kAChunks;
        const int64_t jr = jb + row, k = k0 + static_cast<int64_t>(ch) * kElems;
        const bool ok = jr < GR && k < K;
        mma::cp_async16(sa + row * (kSgK * static_cast<int>(sizeof(TW))) + ch * 16,
                        ok ? static_cast<const void*>(A + jr * K + k) : static_cast<const void*>(A),
                        ok ? 16 : 0);
      }
      for (int c = tid; c < n * (kSgK / 4); c += kSgThreads) {
        const int g = c / (kSgK / 4), ch = c % (kSgK / 4);
        const int64_t k = k0 + static_cast<int64_t>(ch) * 4;
        const bool ok = k < K;
        mma::cp_async16(sx + g * kSgK * 4 + ch * 16,
                        ok ? static_cast<const void*>(s_x[g] + k) : static_cast<const void*>(s_x[0]),
                        ok ? 16 : 0);
      }
    };
    float acc[kSgMaxGroup];
#pragma unroll
    for (int g = 0; g < kSgMaxGroup; ++g) acc[g] = 0.0f;
#pragma unroll
    for (int st = 0; st < kSgStages - 1; ++st) {
      if (st < nkc) load_stage(st, st);
      mma::cp_async_commit();
    }
    for (int64_t kc = 0; kc < nkc; ++kc) {
      mma::cp_async_wait<kSgStages - 2>();
      __syncthreads();
      const int64_t nk = kc + kSgStages - 1;
      if (nk < nkc) load_stage(static_cast<int>(nk % kSgStages), nk);
      mma::cp_async_commit();
      const unsigned char* sa = sg_smem + static_cast<int>(kc % kSgStages) * stage_bytes;
      const TW* as = reinterpret_cast<const TW*>(sa) + j * kSgK;
      const float* xs = reinterpret_cast<const float*>(sa + kSgRankRows * kSgK * sizeof(TW));
#pragma unroll
      for (int q = 0; q < kSgK / 64; ++q) {
        const int k = q * 64 + sub * 8;
        float w[8];
        smem8(as + k, w);
#pragma unroll
        for (int g = 0; g < kSgMaxGroup; ++g) {
          if (g >= n) break;
          float xv[8];
          smem8(xs + g * kSgK + k, xv);
          float s = acc[g];
#pragma unroll
          for (int e = 0; e < 8; ++e) s = fmaf(w[e], xv[e], s);
          acc[g] = s;
        }
      }
    }
    mma::cp_async_wait<0>();
    __syncthreads();  // the next rank block refills the stages
#pragma unroll
    for (int g = 0; g < kSgMaxGroup; ++g) {
      if (g >= n) break;
      float v = acc[g];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      if (sub == 0 && jb + j < GR) s_o[g][jb + j] = v;
    }
  }
}

// Launches moe_lora_shrink_group_kernel with groups of G rows when the shapes allow it (false: they do not,
// the caller runs the by-row kernel).
template <typename TW>
bool launch_group_shrink(int G, const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                         const MoeLoraStack& s, bool down, cudaStream_t st) {
  const float* in = down ? static_cast<const float*>(ws.act) : a.x;
  const int64_t ld_in = down ? a.inter : a.ldx, K = down ? a.inter : a.hidden;
  const void* A = down ? s.a_down : s.a_gu;
  if (G < 1 || K % 8 != 0 || ld_in % 4 != 0 || (reinterpret_cast<uintptr_t>(in) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(A) & 15) != 0)
    return false;
  G = std::min(G, kSgMaxGroup);
  static const bool configured = [] {
    prefer_max_shared(moe_lora_shrink_group_kernel<TW>);
    CUDA_CHECK(cudaFuncSetAttribute(moe_lora_shrink_group_kernel<TW>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kSgStages * sg_stage_bytes<TW>(kSgMaxGroup)));
    return true;
  }();
  (void)configured;
  const size_t smem = static_cast<size_t>(kSgStages) * sg_stage_bytes<TW>(G);
  cuda_util::launch_pdl(moe_lora_shrink_group_kernel<TW>, dim3(static_cast<unsigned>(ws.max_rows)),
                        kSgThreads, smem, st, p, in, ld_in, down ? ws.lora_down : ws.lora_gu, down, G);
  return true;
}

// The expand-fused activation by group of sorted rows (tuning moe_lora_act_group = G > 0, with the by-row
// kernels; prepared in session 37, compiled, not yet run on a GPU, so off by default): groups as
// moe_lora_shrink_group_kernel's (up to G consecutive rows with the same key, rows without LoRA grouped by
// their key −1 too), one CTA per group and column part; each column's gate and up B rows are loaded once for
// the group's rows (moe_act_lora_rows_kernel loads them once per row: at M = 256, ~4 rows per key). The
// sums per row are moe_act_lora_rows_kernel's, in the same order. ts: [G][gu_slices][R8] shared.
template <typename TW>
__global__ void __launch_bounds__(kActLoraRowThreads)
    moe_act_lora_group_kernel(StackParams<TW> p, const float* gu, const float* tmp, float* act,
                              __nv_bfloat16* act_bf16, int64_t lda_bf16, int64_t copies, ExpertAct kind,
                              float alpha, float limit, int G) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  extern __shared__ float ts[];
  const int64_t rows = stack_rows(p);
  const int64_t r0 = blockIdx.x;
  if (r0 >= rows) return;
  const int32_t key = delta_key(p, r0, false);
  if (key == -2) return;                                          // no pair: nothing to write
  if (r0 % G != 0 && delta_key(p, r0 - 1, false) == key) return;  // not the first row of a group
  int n = 1;
  while (n < G && r0 + n < rows && (r0 + n) % G != 0 && delta_key(p, r0 + n, false) == key) ++n;
  const int64_t R = p.R, R8 = ls::round8(R), I = p.I, lds = p.gu_slices * R8;
  const int up_slice = p.gu_slices == 1 ? 0 : 1;
  for (int64_t idx = threadIdx.x; idx < n * lds; idx += blockDim.x) {
    const int64_t g = idx / lds, c = idx % lds, sl = c / R8, k = c % R8;
    float v = 0.0f;
    if (key >= 0 && k < R)
      for (int z = 0; z < p.gu_splits; ++z)
        v += tmp[z * p.gu_stride + (r0 + g) * p.gu_slices * R + sl * R + k];
    ts[idx] = v;
  }
  __syncthreads();
  const float sc_g = key >= 0 ? p.scale[key * 3] : 0.0f;
  const float sc_u = key >= 0 ? p.scale[key * 3 + up_slice] : 0.0f;
  const int64_t width = act_bf16 != nullptr ? lda_bf16 : I;
  const bool vec = (R & 7) == 0;
  const TW* b = key >= 0 ? p.b_gu + static_cast<int64_t>(key) * 2 * I * R : nullptr;
  for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < width;
       j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
    if (j >= I) {
      for (int g = 0; g < n; ++g) {
        __nv_bfloat16* brow = act_bf16 + (r0 + g) * copies * lda_bf16;
        brow[j] = __float2bfloat16_rn(0.0f);
        if (copies == 2) brow[lda_bf16 + j] = __float2bfloat16_rn(0.0f);
      }
      continue;
    }
    const int64_t n_gate = p.interleaved ? 2 * j : j, n_up = p.interleaved ? 2 * j + 1 : I + j;
    // The column's B rows once for the group (ranks up to kBatchedRank in registers; larger ones or ranks
    // that are not multiples of 8 are read again per row, as the by-row kernel does).
    const bool held = b != nullptr && vec && R <= kBatchedRank;
    ls::Pack8<TW> wg[kBatchedRank / 8], wu[kBatchedRank / 8];
    if (held) {
#pragma unroll
      for (int c = 0; c < kBatchedRank / 8; ++c) {
        if (8 * c < R) {
          wg[c].load(b + n_gate * R, 8 * c, R, true);
          wu[c].load(b + n_up * R, 8 * c, R, true);
        }
      }
    }
    for (int g = 0; g < n; ++g) {
      const int64_t r = r0 + g;
      float gv = __ldg(gu + r * 2 * I + n_gate), uv = __ldg(gu + r * 2 * I + n_up);
      if (b != nullptr) {
        const float* tg = ts + g * lds;
        const float* tu = tg + up_slice * R8;
        float ag = 0.0f, au = 0.0f;
        if (held) {
#pragma unroll
          for (int c = 0; c < kBatchedRank / 8; ++c) {
            if (8 * c >= R) break;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
              ag = fmaf(wg[c].get(e), tg[8 * c + e], ag);
              au = fmaf(wu[c].get(e), tu[8 * c + e], au);
            }
          }
        } else {
          for (int64_t k = 0; k < R; ++k) {
            ag = fmaf(ls::ld1(b + n_gate * R, k), tg[k], ag);
            au = fmaf(ls::ld1(b + n_up * R, k), tu[k], au);
          }
        }
        gv += sc_g * ag;
        uv += sc_u * au;
      }
      const float v = moe_detail::expert_act(kind, gv, uv, alpha, limit);
      if (act != nullptr) act[r * I + j] = v;
      if (act_bf16 != nullptr) {
        __nv_bfloat16* brow = act_bf16 + r * copies * lda_bf16;
        const cuda_util::Bf16Pair hl = cuda_util::split_bf16(v);
        brow[j] = hl.hi;
        if (copies == 2) brow[lda_bf16 + j] = hl.lo;
      }
    }
  }
}

// Do the shrinks run by sorted row (moe_lora_shrink_rows_kernel)? On the tile_m 1 paths whenever they are
// not items of the products (shrinks_fused), for up to moe_lora_by_row sorted rows (above, and with 0, the
// item or tiled shrinks), or for any number with the group kernel (moe_lora_shrink_group > 0).
bool row_shrink(const KernelTuning& t, const StackBuffers& b) {
  return b.tile_m == 1 && !b.shrinks_fused &&
         (b.max_rows <= t.moe_lora_by_row || t.moe_lora_shrink_group > 0);
}

template <typename TW>
void launch_row_shrink(const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                       const MoeLoraStack& s, bool down, cudaStream_t st) {
  static const bool carveout = [] {
    prefer_max_shared(moe_lora_shrink_rows_kernel<TW>);
    return true;
  }();
  (void)carveout;
  const int64_t GR = down ? s.rank : s.gu_slices * s.rank;
  const size_t smem = static_cast<size_t>(kRowShrinkThreads / 32 * GR) * sizeof(float);
  cuda_util::launch_pdl(moe_lora_shrink_rows_kernel<TW>, dim3(static_cast<unsigned>(ws.max_rows)),
                        kRowShrinkThreads, smem, st, p, down ? static_cast<const float*>(ws.act) : a.x,
                        down ? a.inter : a.ldx, down ? ws.lora_down : ws.lora_gu, down);
}

// The shrink of one phase alone, as moe_gemv_kernel's LoRA items.
template <Phase P>
void launch_gemv_shrink(const MoeExpertsArgs& a, const StackBuffers& b, cudaStream_t st) {
  const moe_detail::GemvParams gp = shrink_params<P>(a, b);
  moe_detail::launch_gemv<P>(1, dim3(moe_gemv_blocks(gp.lora.items())), gp, st);
}

// One step of the slot-stacked expert LoRA on the workspace of a path (sorted rows as that path sorted
// them).
template <typename TW>
void stack_lora(StackStep step, const MoeExpertsArgs& a, const StackBuffers& ws, cudaStream_t st) {
  const MoeLoraStack& s = a.lora_stack;
  StackParams<TW> p;
  p.sorted = ws.sorted;
  p.num_tiles = ws.num_tiles;
  p.tile_m = ws.tile_m;
  p.max_rows = ws.max_rows;
  p.ids = a.ids;
  p.token_slots = a.token_slots;
  p.top_k = a.top_k;
  p.E = a.num_experts;
  p.H = a.hidden;
  p.I = a.inter;
  p.slots = s.slots;
  p.R = s.rank;
  p.gu_slices = s.gu_slices;
  p.interleaved = a.act == ExpertAct::kGptOssSwiglu;
  p.a_gu = static_cast<const TW*>(s.a_gu);
  p.b_gu = static_cast<const TW*>(s.b_gu);
  p.a_down = static_cast<const TW*>(s.a_down);
  p.b_down = static_cast<const TW*>(s.b_down);
  p.scale = s.scale;
  const auto tiles = static_cast<unsigned>((ws.max_rows + ls::kTileRows - 1) / ls::kTileRows);
  const int64_t R8 = ls::round8(s.rank);
  const moe_detail::StackSplits sp = moe_detail::stack_splits(a, ws.max_rows);
  const KernelTuning t = tuning_of(a);
  const bool gemv = gemv_shrink(a, ws);
  const bool rows = row_shrink(t, ws);
  p.gu_splits = gemv || rows ? 1 : sp.gu;
  p.down_splits = gemv || rows ? 1 : sp.down;
  p.gu_stride = ws.max_rows * s.gu_slices * s.rank;
  p.down_stride = a.m * a.top_k * s.rank;
  switch (step) {
    case StackStep::kShrinkGateUp:
    case StackStep::kShrinkDown: {
      const bool down = step == StackStep::kShrinkDown;
      if (rows) {
        if (!launch_group_shrink<TW>(static_cast<int>(t.moe_lora_shrink_group), p, ws, a, s, down, st))
          launch_row_shrink<TW>(p, ws, a, s, down, st);
        break;
      }
      if (gemv) {
        if (ws.shrinks_fused) return;
        if (down) {
          launch_gemv_shrink<Phase::kDown>(a, ws, st);
        } else {
          launch_gemv_shrink<Phase::kGateUp>(a, ws, st);
        }
        return;
      }
      const dim3 grid(tiles,
                      static_cast<unsigned>(ls::shrink_rank_blocks(down ? s.rank : s.gu_slices * s.rank)),
                      static_cast<unsigned>(down ? sp.down : sp.gu));
      launch_stack_shrink<TW>(grid, st, p, down ? static_cast<const float*>(ws.act) : a.x,
                              down ? a.inter : a.ldx, down ? ws.lora_down : ws.lora_gu, down);
      break;
    }
    case StackStep::kDeltaGateUp:
    case StackStep::kDeltaDown: {
      const bool down = step == StackStep::kDeltaDown;
      const int64_t cluster = t.moe_lora_delta_cluster;
      if (cluster > 1 && a.m * a.top_k <= t.moe_lora_delta_cluster_rows) {
        launch_delta_cluster<TW>(static_cast<int>(std::min<int64_t>(cluster, kDeltaClusterMax)), p, ws, a, s,
                                 down, st);
        break;
      }
      const int64_t N = down ? a.hidden : 2 * a.inter;
      // Column parts per row: ~2 CTAs per SM in all, each of at least min_cols columns.
      const int64_t want = std::max<int64_t>(1, 2 * cuda_util::num_sms() / std::max<int64_t>(1, ws.max_rows));
      // POLYLORA_MOE_LORA_DELTA_COLS: the least columns per part (default 1,024: every part computes the
      // row's shrink again; batch-4 decode steps of GPT-OSS-20B with 8 adapters took 4.975 ms with 1,024
      // against 5.204 with 256, H200, session 36; for A/B timing).
      static const int64_t min_cols = [] {
        const char* e = std::getenv("POLYLORA_MOE_LORA_DELTA_COLS");
        const int64_t v = e != nullptr ? std::atoll(e) : 0;
        return v > 0 ? v : int64_t{1024};
      }();
      const int64_t parts = std::clamp<int64_t>(want, 1, (N + min_cols - 1) / min_cols);
      const int64_t chunk = (N + parts - 1) / parts;
      const dim3 grid(static_cast<unsigned>(ws.max_rows), static_cast<unsigned>(parts));
      const size_t smem = static_cast<size_t>((down ? 1 : s.gu_slices) * s.rank) * sizeof(float);
      // The SMs' shared-memory carveout as the product's (which runs beside it, 3 CTAs of 48 KiB per SM for
      // MXFP4): with the default the driver configured the SMs holding this kernel's CTAs for a small
      // carveout and the product's CTAs could not join them until they drained (batch 1, H200: the gate/up
      // GEMV took 43 us beside it instead of ~22).
      static const bool carveout = [] {
        prefer_max_shared(moe_lora_delta_kernel<TW>);
        return true;
      }();
      (void)carveout;
      cuda_util::launch_pdl(moe_lora_delta_kernel<TW>, grid, kDeltaThreads, smem, st, p,
                            down ? static_cast<const float*>(ws.act) : a.x, down ? a.inter : a.ldx,
                            down ? ws.dy : ws.dgu, chunk, down);
      break;
    }
    case StackStep::kActivation: {
      if (ws.dgu != nullptr) {
        moe_detail::launch_expert_act(ws.sorted, ws.num_tiles, ws.tile_m, ws.max_rows, ws.gu, ws.dgu, ws.act,
                                      ws.act_bf16, ws.lda_bf16, ws.copies, a, st);
        break;
      }
      const int64_t width = ws.act_bf16 != nullptr ? ws.lda_bf16 : a.inter;
      if (ws.max_rows <= t.moe_lora_by_row) {
        // Rows over x (a group's CTA takes up to G rows); columns over enough CTAs for ~2 per SM in all.
        const int64_t G = std::min<int64_t>(t.moe_lora_act_group, kSgMaxGroup);
        const dim3 rgrid(
            static_cast<unsigned>(ws.max_rows),
            expand_column_ctas(ws.max_rows, width, 2 * std::max<int64_t>(G, 1), kActLoraRowThreads));
        const size_t rsmem = static_cast<size_t>(s.gu_slices * R8) * sizeof(float);
        if (G > 0) {
          moe_act_lora_group_kernel<TW><<<rgrid, kActLoraRowThreads, G * rsmem, st>>>(
              p, ws.gu, ws.lora_gu, ws.act, ws.act_bf16, ws.lda_bf16, ws.copies, a.act, a.swiglu_alpha,
              a.swiglu_limit, static_cast<int>(G));
          break;
        }
        auto* kernel = t.moe_lora_expand_batched != 0 ? moe_act_lora_rows_kernel<TW, true>
                                                      : moe_act_lora_rows_kernel<TW, false>;
        kernel<<<rgrid, kActLoraRowThreads, rsmem, st>>>(p, ws.gu, ws.lora_gu, ws.act, ws.act_bf16,
                                                         ws.lda_bf16, ws.copies, a.act, a.swiglu_alpha,
                                                         a.swiglu_limit);
        break;
      }
      const dim3 grid(tiles, expand_column_ctas(tiles, width, 4, kActLoraThreads));
      const size_t smem = static_cast<size_t>(ls::kTileRows * s.gu_slices * R8) * sizeof(float);
      // Launched plainly even in steps that keep PDL (POLYLORA_PDL_LORA=1): a kernel timeline of batch-1
      // LoRA steps with PDL showed this kernel's share of the step doubling (9.07 -> 17.09 us per layer,
      // H200, session 35) while every other kernel gained (docs/pdl.md). pdl_wait is a no-op then.
      moe_act_lora_kernel<TW><<<grid, kActLoraThreads, smem, st>>>(p, ws.gu, ws.lora_gu, ws.act, ws.act_bf16,
                                                                   ws.lda_bf16, ws.copies, a.act,
                                                                   a.swiglu_alpha, a.swiglu_limit);
      break;
    }
    case StackStep::kCombine: {
      if (ws.dy != nullptr) {
        moe_detail::launch_expert_combine(a, ws.y, ws.dy, st);
        break;
      }
      const size_t smem = static_cast<size_t>(a.top_k * R8) * sizeof(float);
      const dim3 grid(static_cast<unsigned>(a.m), expand_column_ctas(a.m, a.hidden, 8, kActLoraThreads));
      auto* kernel = t.moe_lora_expand_batched != 0 ? moe_combine_lora_kernel<TW, true>
                                                    : moe_combine_lora_kernel<TW, false>;
      cuda_util::launch_pdl(kernel, grid, kActLoraThreads, smem, st, p, ws.y, ws.lora_down, a.weights, a.out,
                            a.ldo);
      break;
    }
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace moe_detail {

// Paths whose sorted rows are single pairs (tile_m 1: the GEMV, tensor-core GEMV and MXFP4 paths) with at
// most this many rows take the shrinks as weight-streaming items (moe_gemv.cuh LoraShrinkItems: fused into
// the GEMV path's products, a launch of their own on the others), without split-K. Above it (prefill
// sizes), the tiled shrink, which reads a key's A once per tile of 8 rows. The bound is tuned
// (lora_gemv_shrink_rows; POLYLORA_LORA_GEMV_SHRINK_ROWS, 0: always tiled).
bool gemv_shrink(const MoeExpertsArgs& a, const StackBuffers& b) {
  return b.tile_m == 1 && b.max_rows <= tuning_of(a).lora_gemv_shrink_rows;
}

// The shrink items of one phase (gate/up: x -> lora_gu by sorted row; down: act -> lora_down by pair).
template <Phase P>
LoraShrinkItems shrink_items(const MoeExpertsArgs& a, const StackBuffers& b) {
  const MoeLoraStack& s = a.lora_stack;
  LoraShrinkItems l;
  l.a = P == Phase::kGateUp ? s.a_gu : s.a_down;
  l.dtype = s.dtype;
  l.scale = s.scale;
  l.token_slots = a.token_slots;
  l.ids = a.ids;
  l.num_rows = b.num_tiles;
  l.slots = s.slots;
  l.E = a.num_experts;
  l.lora_rows = P == Phase::kGateUp ? s.gu_slices * s.rank : s.rank;
  l.max_rows = b.max_rows;
  l.c0 = P == Phase::kGateUp ? 0 : 2;
  l.c1 = P == Phase::kGateUp ? s.gu_slices : 3;
  l.out = P == Phase::kGateUp ? b.lora_gu : b.lora_down;
  return l;
}

// The shrink of one phase as GEMV parameters with only LoRA items (its input: x for gate/up, the f32
// activation for down).
template <Phase P>
GemvParams shrink_params(const MoeExpertsArgs& a, const StackBuffers& b) {
  GemvParams gp;
  gp.x = P == Phase::kGateUp ? a.x : b.act;
  gp.ldx = P == Phase::kGateUp ? a.ldx : a.inter;
  gp.sorted = b.sorted;
  gp.top_k = a.top_k;
  gp.hidden = a.hidden;
  gp.inter = a.inter;
  gp.base = false;
  gp.lora = shrink_items<P>(a, b);
  return gp;
}

template LoraShrinkItems shrink_items<Phase::kGateUp>(const MoeExpertsArgs&, const StackBuffers&);
template LoraShrinkItems shrink_items<Phase::kDown>(const MoeExpertsArgs&, const StackBuffers&);
template GemvParams shrink_params<Phase::kGateUp>(const MoeExpertsArgs&, const StackBuffers&);
template GemvParams shrink_params<Phase::kDown>(const MoeExpertsArgs&, const StackBuffers&);

StackSplits stack_splits(const MoeExpertsArgs& a, int64_t max_rows) {
  StackSplits sp;
  const MoeLoraStack& s = a.lora_stack;
  if (s.empty()) return sp;
  // Split by the rows that can hold pairs (the GEMM paths' padding rows exit at once).
  const int64_t tiles = (std::min(max_rows, a.m * a.top_k) + ls::kTileRows - 1) / ls::kTileRows;
  sp.gu = ls::shrink_splits(tiles, ls::shrink_rank_blocks(s.gu_slices * s.rank), a.hidden);
  sp.down = ls::shrink_splits(tiles, ls::shrink_rank_blocks(s.rank), a.inter);
  sp.gu_floats = static_cast<size_t>(sp.gu * max_rows * s.gu_slices * s.rank);
  sp.down_floats = static_cast<size_t>(sp.down * a.m * a.top_k * s.rank);
  return sp;
}

void stack_lora_step(StackStep step, const MoeExpertsArgs& a, const StackBuffers& b, cudaStream_t st) {
  if (a.lora_stack.dtype == DType::kBF16) {
    stack_lora<__nv_bfloat16>(step, a, b, st);
  } else {
    stack_lora<float>(step, a, b, st);
  }
}

}  // namespace moe_detail
}  // namespace polylora::kernels::cuda
