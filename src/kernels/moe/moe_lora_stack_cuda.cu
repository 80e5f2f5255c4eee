// kernels/moe/moe_lora_stack_cuda.cu: the slot-stacked expert LoRA (MoeLoraStack) over an expert path's
// sorted rows (moe_lora_stack.cuh is the interface; moe_cuda.cu chooses the path, sorts and runs the
// products): the dispatch of each step (shrink of gate/up, the activation with the gate/up expand fused in,
// shrink of down, the combine with the down expand fused in, delta mode) and the expand-fused activation
// and combine kernels (tiled by 8 rows, by sorted row, by group of same-key rows). The shrinks are in
// moe_lora_shrink_cuda.cu, delta mode (each phase's shrink and expand as one kernel beside the base product)
// in moe_lora_delta_cuda.cu; what they share in moe_lora_stack_impl.cuh. Weights F32 or BF16 (the stack's
// dtype), sums in f32. docs/multi-lora-kernels.md has the measurements behind each choice. Must not:
// allocate; synchronize.
#include "kernels/moe/moe_lora_stack_impl.cuh"

namespace polylora::kernels::cuda {
namespace {

using moe_detail::gemv_shrink;
using moe_detail::kMaxTopKLora;
using moe_detail::Phase;
using moe_detail::StackBuffers;
using moe_detail::StackStep;
using moe_detail::tuning_of;
using moe_stack::delta_key;
using moe_stack::kSgMaxGroup;
using moe_stack::launch_delta_step;
using moe_stack::launch_shrink_step;
using moe_stack::lora_slice;
using moe_stack::row_shrink;
using moe_stack::stack_key;
using moe_stack::stack_rows;
using moe_stack::StackParams;

namespace ls = lora_stack;

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
    case StackStep::kShrinkDown:
      launch_shrink_step<TW>(step == StackStep::kShrinkDown, p, ws, a, t, st);
      break;
    case StackStep::kDeltaGateUp:
    case StackStep::kDeltaDown:
      launch_delta_step<TW>(step == StackStep::kDeltaDown, p, ws, a, t, st);
      break;
    case StackStep::kActivation: {
      if (ws.dgu != nullptr) {
        moe_detail::launch_expert_act(ws.sorted, ws.num_tiles, ws.tile_m, ws.max_rows, ws.gu, ws.dgu, ws.act,
                                      ws.act_bf16, ws.lda_bf16, ws.copies, a, st);
        break;
      }
      const int64_t width = ws.act_bf16 != nullptr ? ws.lda_bf16 : a.inter;
      if (ws.max_rows <= t.moe_lora_by_row) {
        // Rows over x (a group's CTA takes up to G rows); columns over enough CTAs for ~2 per SM in all. The
        // step's size against moe_lora_act_group_min_rows: its sorted rows, or with
        // moe_lora_gemm_group_shrink its pairs (a grouped-GEMM path's rows count each expert's tile padding:
        // 5,120 for 1,024 pairs).
        const int64_t size = ws.tile_m > 1 && t.moe_lora_gemm_group_shrink != 0 ? a.m * a.top_k : ws.max_rows;
        const int64_t G = t.moe_lora_act_group > 0 ? std::min<int64_t>(t.moe_lora_act_group, kSgMaxGroup)
                          : size >= t.moe_lora_act_group_min_rows ? kSgMaxGroup
                                                                  : 0;
        const dim3 rgrid(
            static_cast<unsigned>(ws.max_rows),
            expand_column_ctas(ws.max_rows, width, 2 * std::max<int64_t>(G, 1), kActLoraRowThreads));
        const size_t rsmem = static_cast<size_t>(s.gu_slices * R8) * sizeof(float);
        // With PDL (tuning moe_act_lora_pdl) or plainly: both kernels wait first thing.
        const auto launch = [&](auto* kernel, size_t smem, auto... extra) {
          cuda_util::launch_pdl_if(t.moe_act_lora_pdl != 0, kernel, rgrid, kActLoraRowThreads, smem, st, p,
                                   ws.gu, ws.lora_gu, ws.act, ws.act_bf16, ws.lda_bf16, ws.copies, a.act,
                                   a.swiglu_alpha, a.swiglu_limit, extra...);
        };
        if (G > 0) {
          launch(moe_act_lora_group_kernel<TW>, G * rsmem, static_cast<int>(G));
          break;
        }
        launch(t.moe_lora_expand_batched != 0 ? moe_act_lora_rows_kernel<TW, true>
                                              : moe_act_lora_rows_kernel<TW, false>,
               rsmem);
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
