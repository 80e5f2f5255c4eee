// kernels/moe/moe_gemv_mma.cuh: the small-batch MoE product on bf16 tensor cores, a weight-streaming kernel:
// each active expert's weight rows are read from HBM once per step for up to kTcMaxTok of its routed rows
// (more rows: another pass), whatever the batch size. Grid: x = blocks of kTcRows output rows, y = the
// worst-case number of active experts (a CTA takes the y-th active expert of the device-side sort, or exits).
// Each warp owns 16 weight rows over all of K and streams them straight from global memory into mma.sync
// m16n8k16 A fragments with 128-bit loads (no shared memory: a thread's 8 consecutive k values are used as
// its fragment elements of two k16 steps, and the activation B fragments use the same k permutation, so
// the dot products are unchanged); the routed rows are the n dimension, 8 per fragment, read as bf16 from
// the activation buffer (gate_up: x cast once, by token; down: the activation, by sorted row), as hi and lo
// copies with CudaContext::bf16_split(m) (two MMAs summing W·hi + W·lo) or one bf16-rounded copy without.
// fp32 accumulation; bias in the epilogue. BF16 weights with 16-byte rows load as vectors; other tensor-core
// dtypes (F16) or odd K convert element by element to bf16. Only included through moe_launch.h.
// Must not: depend on anything above common/.
#pragma once

#include "kernels/moe/moe_gemm_mma.cuh"
#include "kernels/moe/moe_gemv.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;  // weight rows per CTA
constexpr int kTcMaxTiles = 8;          // n8 fragments per pass
constexpr int kTcMaxTok = 8 * kTcMaxTiles;

struct GemvTcParams {
  const __nv_bfloat16* a = nullptr;  // kGateUp: x as bf16 [m, lda]; kDown: act as bf16 [rows, lda]
  int64_t lda = 0;                   // row stride; with the split the lo copy starts at column lda_copy
  int64_t lda_copy = 0;              // columns of one copy (a multiple of 32 >= K; padding zero)
  bool split = false;
  const ExpertView* experts = nullptr;
  const int32_t* counts = nullptr;      // [E] pairs per expert
  const int32_t* offsets = nullptr;     // [E] first sorted row of each expert (compact)
  const int32_t* active = nullptr;      // [E] experts with pairs, in expert order
  const int32_t* num_active = nullptr;  // [1]
  const int32_t* sorted = nullptr;      // [pairs] pair index t·top_k + k per sorted row
  int64_t top_k = 0, hidden = 0, inter = 0;
  float* out = nullptr;  // kGateUp: gu [rows, 2I] by sorted row; kDown: y [pairs, H] by pair
  // The slot-stacked expert LoRA's shrink of this phase (moe_gemv.cuh LoraShrinkItems over shrink.x, f32),
  // run by lora_ctas extra CTAs per y-plane past the row_tiles weight-row CTAs (blockIdx.x >= row_tiles), so
  // it costs no launch of its own and overlaps the base product: its sums are read by the next kernel (the
  // activation for gate/up, the combine for down). lora_ctas 0: none.
  GemvParams shrink;
  int row_tiles = 0, lora_ctas = 0;
  // The expert LoRA's delta kernel (moe_lora_delta_kernel) was launched just before this product and lets
  // it start at once (gemv_pdl_begin; the grid has one extra CTA in x).
  bool defer_wait = false;
  // MXFP4 passes of 8 routed rows: the cp.async pipeline's stages (2 to 4; KernelTuning::
  // moe_gemv_mxfp4_stages).
  int mx_stages = 2;
  // Gate/up of GPT-OSS's interleaved gate/up rows with act_out set (KernelTuning::moe_gemv_fused_act; no
  // expert LoRA): the pipelined kernels' epilogue writes the bf16 activation the down product reads
  // instead of gu, as moe_act_kernel would (bit for bit): act_out[sorted row · act_copies · act_lda + i] =
  // act(gate 2i, up 2i + 1) (hi; the lo part at + act_lda with act_copies 2), zeros in columns
  // [I, act_lda); gu is not written.
  __nv_bfloat16* act_out = nullptr;
  int64_t act_lda = 0;
  int act_copies = 1;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
};

// A tensor-core product's programmatic-dependent-launch prologue (cuda_util.cuh); true when this CTA has
// nothing else to do. Normally pdl_begin(). With defer_wait the kernel before it in the stream is the expert
// LoRA's delta kernel, which triggers right after its own pdl_wait(): every input of this product
// (activations, the sort) was complete when this kernel could start, so its CTAs do not wait; one extra CTA
// (the last in x, grid.x one larger) only waits, so this kernel's completion implies the delta kernel's,
// whose sums the kernels after this product read. (A wait at every CTA's exit cost the MXFP4 kernel two
// registers for the flag's live range.)
__device__ __forceinline__ bool gemv_pdl_begin(const GemvTcParams& p) {
  if (!p.defer_wait) {
    cuda_util::pdl_begin();
    return false;
  }
  cuda_util::pdl_trigger();
  if (blockIdx.x != gridDim.x - 1) return false;
  if (blockIdx.y == 0) cuda_util::pdl_wait();
  return true;
}

// The CTAs past the row tiles run the shrink items, warp by warp over all such CTAs of every y-plane (planes
// of experts that are not active included). True when this CTA was one of them.
template <Phase P, int kWarps>
__device__ __forceinline__ bool gemv_tc_lora_cta(const GemvTcParams& p) {
  if (p.lora_ctas == 0 || static_cast<int>(blockIdx.x) < p.row_tiles) return false;
  const int64_t cta = static_cast<int64_t>(blockIdx.y) * p.lora_ctas + (blockIdx.x - p.row_tiles);
  const int64_t stride = static_cast<int64_t>(gridDim.y) * p.lora_ctas * kWarps;
  const int64_t items = p.shrink.lora.items();
  for (int64_t i = cta * kWarps + (threadIdx.x >> 5); i < items; i += stride)
    lora_shrink_item<P>(p.shrink, i);
  return true;
}

// Eight bf16 weights of row `row` at k..k+7 (zeros past K), element by element (any dtype, any K).
__device__ __forceinline__ uint4 load_w8_any(const char* row, DType dt, int64_t k, int64_t K) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat16 lo =
        k + 2 * j < K ? cuda_util::load_as_bf16(row, dt, k + 2 * j) : __float2bfloat16(0.f);
    const __nv_bfloat16 hi =
        k + 2 * j + 1 < K ? cuda_util::load_as_bf16(row, dt, k + 2 * j + 1) : __float2bfloat16(0.f);
    w[j] = static_cast<uint32_t>(__bfloat16_as_ushort(lo)) |
           (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// One pass over NT (<= kTcMaxTiles) fragments of 8 routed rows, U k-blocks of 32 loaded per iteration.
template <Phase P, int NT, int U, bool VEC>
__device__ __forceinline__ void gemv_tc_pass(const GemvTcParams& p, const char* row0, const char* row1,
                                             DType dt, int64_t K, int64_t N, int64_t n_warp,
                                             const float* bias, int row_base, int nvalid,
                                             const int64_t* s_off) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float acc[NT][4];
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  const __nv_bfloat16* brow[NT];
#pragma unroll
  for (int i = 0; i < NT; ++i) {
    const int64_t off = s_off[i * 8 + g];
    brow[i] = off >= 0 ? p.a + off : nullptr;
  }
  const int64_t nblocks = (K + 31) / 32;
  for (int64_t kb0 = 0; kb0 < nblocks; kb0 += U) {
    uint4 wa[U], wb[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = (kb0 + u) * 32 + t * 8;
      if (VEC) {
        const bool in = kb0 + u < nblocks && k < K;
        wa[u] = in && row0 ? __ldg(reinterpret_cast<const uint4*>(row0 + k * 2)) : make_uint4(0, 0, 0, 0);
        wb[u] = in && row1 ? __ldg(reinterpret_cast<const uint4*>(row1 + k * 2)) : make_uint4(0, 0, 0, 0);
      } else {
        wa[u] = row0 && kb0 + u < nblocks ? load_w8_any(row0, dt, k, K) : make_uint4(0, 0, 0, 0);
        wb[u] = row1 && kb0 + u < nblocks ? load_w8_any(row1, dt, k, K) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (kb0 + u >= nblocks) break;
      const int64_t k = (kb0 + u) * 32 + t * 8;
      const uint32_t a_s0[4] = {wa[u].x, wb[u].x, wa[u].y, wb[u].y};
      const uint32_t a_s1[4] = {wa[u].z, wb[u].z, wa[u].w, wb[u].w};
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        if (i * 8 >= nvalid) break;  // warp-uniform; mma.sync needs every lane, so empty columns load zeros
        const uint4 xb =
            brow[i] ? __ldg(reinterpret_cast<const uint4*>(brow[i] + k)) : make_uint4(0, 0, 0, 0);
        mma_bf16(acc[i], a_s0, xb.x, xb.y);
        mma_bf16(acc[i], a_s1, xb.z, xb.w);
        if (p.split) {
          const uint4 xl = brow[i] ? __ldg(reinterpret_cast<const uint4*>(brow[i] + p.lda_copy + k))
                                   : make_uint4(0, 0, 0, 0);
          mma_bf16(acc[i], a_s0, xl.x, xl.y);
          mma_bf16(acc[i], a_s1, xl.z, xl.w);
        }
      }
    }
  }
  // Epilogue: c0, c1 are (row g, columns 2t, 2t+1), c2, c3 (row g + 8, same columns).
#pragma unroll
  for (int i = 0; i < NT; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = i * 8 + 2 * t + (j & 1);
      const int64_t n = n_warp + g + (j >= 2 ? 8 : 0);
      if (col >= nvalid || n >= N) continue;
      const float y = acc[i][j] + (bias != nullptr ? bias[n] : 0.0f);
      const int64_t row = row_base + col;
      if (P == Phase::kGateUp) {
        p.out[row * N + n] = y;
      } else {
        p.out[static_cast<int64_t>(p.sorted[row]) * N + n] = y;
      }
    }
  }
}

// The fragment count of a pass (1, 2, 4 or 8 n8 fragments), chosen at run time from the rows left.
template <Phase P, bool VEC>
__device__ __forceinline__ void gemv_tc_pass_any(const GemvTcParams& p, const char* row0, const char* row1,
                                                 DType dt, int64_t K, int64_t N, int64_t n_warp,
                                                 const float* bias, int row_base, int nvalid,
                                                 const int64_t* s_off) {
  if (nvalid <= 8) {
    gemv_tc_pass<P, 1, 8, VEC>(p, row0, row1, dt, K, N, n_warp, bias, row_base, nvalid, s_off);
  } else if (nvalid <= 16) {
    gemv_tc_pass<P, 2, 8, VEC>(p, row0, row1, dt, K, N, n_warp, bias, row_base, nvalid, s_off);
  } else if (nvalid <= 32) {
    gemv_tc_pass<P, 4, 4, VEC>(p, row0, row1, dt, K, N, n_warp, bias, row_base, nvalid, s_off);
  } else {
    gemv_tc_pass<P, 8, 4, VEC>(p, row0, row1, dt, K, N, n_warp, bias, row_base, nvalid, s_off);
  }
}

// The activation row offset (elements) of each of a pass's n routed rows, sorted rows first_row.., into
// s_off (−1 past nvalid): gate_up reads x by token, down the activation by sorted row. Block-strided.
template <Phase P>
__device__ __forceinline__ void pass_row_offsets(const GemvTcParams& p, int first_row, int nvalid, int n,
                                                 int64_t* s_off) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int64_t off = -1;
    if (i < nvalid) {
      const int64_t row = first_row + i;
      off = (P == Phase::kGateUp ? static_cast<int64_t>(p.sorted[row] / p.top_k) : row) * p.lda;
    }
    s_off[i] = off;
  }
}

// One CTA's work (kTcThreads threads): also the fallback of moe_gemv_pipe_kernel for experts whose
// weights are not BF16 with 16-byte rows.
template <Phase P>
__device__ __forceinline__ void gemv_tc_cta(const GemvTcParams& p, int e) {
  __shared__ int64_t
      s_off[kTcMaxTok];  // activation row offset (elements) per routed row of the pass, −1 none
  const int count = p.counts[e], base = p.offsets[e];
  const ExpertView& ex = p.experts[e];
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  if (static_cast<int64_t>(blockIdx.x) * kTcRows >= N) return;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  const int64_t n_warp = static_cast<int64_t>(blockIdx.x) * kTcRows + warp * 16;
  const DType dt = weight_dtype<P>(ex);
  const float* bias = weight_bias<P>(ex);
  const char* row0 = n_warp + g < N ? weight_row<P>(ex, n_warp + g, K, p.inter) : nullptr;
  const char* row1 = n_warp + g + 8 < N ? weight_row<P>(ex, n_warp + g + 8, K, p.inter) : nullptr;
  const bool vec = dt == DType::kBF16 && weight_rows_aligned16<P>(ex, K);
  for (int tok0 = 0; tok0 < count; tok0 += kTcMaxTok) {
    const int nvalid = count - tok0 < kTcMaxTok ? count - tok0 : kTcMaxTok;
    __syncthreads();  // the previous pass no longer reads s_off
    pass_row_offsets<P>(p, base + tok0, nvalid, kTcMaxTok, s_off);
    __syncthreads();
    if (vec) {
      gemv_tc_pass_any<P, true>(p, row0, row1, dt, K, N, n_warp, bias, base + tok0, nvalid, s_off);
    } else {
      gemv_tc_pass_any<P, false>(p, row0, row1, dt, K, N, n_warp, bias, base + tok0, nvalid, s_off);
    }
  }
}

template <Phase P>
__global__ void __launch_bounds__(kTcThreads) moe_gemv_tc_kernel(GemvTcParams p) {
  if (gemv_pdl_begin(p)) return;  // launched by launch_pdl (cuda_util.cuh)
  if (gemv_tc_lora_cta<P, kTcWarps>(p)) return;
  const int j = blockIdx.y;
  if (j >= *p.num_active) return;
  gemv_tc_cta<P>(p, p.active[j]);
}

}  // namespace polylora::kernels::cuda::moe_detail
