// kernels/moe/moe_steps_cuda.cu: the MoE kernels around the expert products (moe_steps.h): the fp32
// grouped GEMM (F32 weights, large batches), the expert LoRA of per-(slot, expert) views, the activation and
// the weighted combine. Must not: depend on anything above common/.
#include <algorithm>

#include "kernels/lora/lora_cuda.cuh"
#include "kernels/moe/moe_gemv.cuh"
#include "kernels/moe/moe_lora_stack.cuh"
#include "kernels/moe/moe_steps.h"

namespace polylora::kernels::cuda::moe_detail {
namespace {

using cuda_util::load_as_f32;

// ---- fp32 grouped GEMM (F32 weights, large batches) ----

// fp32 FMA: 256 threads, each 4×4 outputs (rows ty + 16i, columns tx + 16j) of a 64×64 tile.
constexpr int kF32K = 16;

template <Phase P>
__global__ void __launch_bounds__(256) moe_gemm_f32(GemmParams p) {
  __shared__ float As[kF32TileM][kF32K + 1];
  __shared__ float Bs[kF32TileN][kF32K + 1];
  __shared__ const float* arow[kF32TileM];
  __shared__ const char* brow[kF32TileN];
  __shared__ int32_t pair[kF32TileM];
  const int tile = blockIdx.x;
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kF32TileN;
  if (tile >= *p.num_tiles || n0 >= N) return;
  const ExpertView& ex = p.experts[p.tile_expert[tile]];
  for (int i = threadIdx.x; i < kF32TileM; i += blockDim.x) {
    int64_t r = static_cast<int64_t>(tile) * kF32TileM + i;
    int32_t pr = p.sorted[r];
    pair[i] = pr;
    arow[i] = pr < 0 ? nullptr : (P == Phase::kGateUp ? p.x + (pr / p.top_k) * p.ldx : p.x + r * p.inter);
  }
  for (int j = threadIdx.x; j < kF32TileN; j += blockDim.x) {
    int64_t n = n0 + j;
    brow[j] = n < N ? moe_detail::weight_row<P>(ex, n, K, p.inter) : nullptr;
  }
  const DType dt = moe_detail::weight_dtype<P>(ex);
  const float* bias = moe_detail::weight_bias<P>(ex);
  __syncthreads();
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kF32K) {
    for (int idx = threadIdx.x; idx < kF32TileM * kF32K; idx += blockDim.x) {
      int r = idx / kF32K, kk = idx % kF32K;
      int64_t k = k0 + kk;
      const float* ar = arow[r];
      As[r][kk] = ar && k < K ? ar[k] : 0.0f;
      const char* br = brow[r];  // kF32TileN == kF32TileM
      Bs[r][kk] = br && k < K ? load_as_f32(br, dt, k) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kF32K; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = As[ty + 16 * i][kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = Bs[tx + 16 * j][kk];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = ty + 16 * i;
    if (pair[r] < 0) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int64_t n = n0 + tx + 16 * j;
      if (n >= N) continue;
      float v = acc[i][j] + (bias ? bias[n] : 0.0f);
      if (P == Phase::kGateUp) {
        p.out[(static_cast<int64_t>(tile) * kF32TileM + r) * N + n] = v;
      } else {
        p.out[static_cast<int64_t>(pair[r]) * N + n] = v;
      }
    }
  }
}

// ---- LoRA, activation, combine ----

// One block per sorted row (rows past num_tiles · tile_m exit): the LoRA of (its token's slot, its
// expert), on gate_up (down == false, input the token's x, output the gu row) or on down (input the act
// row, output the pair's y row).
__global__ void moe_lora_kernel(MoeExpertsArgs a, const int32_t* sorted, const int32_t* num_tiles, int tile_m,
                                float* gu, const float* act, float* y, bool down) {
  __shared__ float s_mid[cuda_util::kLoraRankChunk];
  const int64_t r = blockIdx.x;
  if (r >= static_cast<int64_t>(*num_tiles) * tile_m) return;
  const int32_t pr = sorted[r];
  if (pr < 0) return;
  const int64_t t = pr / a.top_k;
  const int32_t slot = a.token_slots[t];
  if (slot < 0 || slot >= a.num_slots) return;
  const ExpertLoraView& lv = a.lora[slot * a.num_experts + a.ids[pr]];
  const int64_t I = a.inter;
  if (down) {
    if (lv.down.a != nullptr)
      cuda_util::lora_row(lv.down, act + r * I, y + static_cast<int64_t>(pr) * a.hidden, s_mid);
    return;
  }
  const float* x = a.x + t * a.ldx;
  float* g = gu + r * 2 * I;
  if (lv.gate_up.a != nullptr) cuda_util::lora_row(lv.gate_up, x, g, s_mid);
  if (lv.gate.a != nullptr) cuda_util::lora_row(lv.gate, x, g, s_mid);
  if (lv.up.a != nullptr) cuda_util::lora_row(lv.up, x, g + I, s_mid);
}

// act = act_fn(gu) for sorted rows below num_tiles · tile_m that hold a pair: into act (f32, [rows, I],
// when not nullptr) and act_bf16 (rows of copies·lda_bf16: hi in [0, lda_bf16), with copies = 2 lo in
// [lda_bf16, 2·lda_bf16); columns past I zero; when not nullptr). Rows over blockIdx.x (grid-stride),
// columns over blockIdx.y and threads (moe_act_grid: few rows spread over more CTAs).
// moe_act_kernel's grid: rows over x (at most 16384), and when the rows are few (decode) the columns over
// up to 8 CTAs in y, so a batch-1 step's 4 rows take 32 CTAs rather than 4.
dim3 moe_act_grid(int64_t max_rows, int64_t I) {
  const int64_t x = std::min<int64_t>(max_rows, 16384);
  const int64_t y = x >= 64 ? 1 : std::min<int64_t>({8, (I + 255) / 256, std::max<int64_t>(1, 64 / x)});
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(y));
}

// gu_delta (or nullptr): added to gu first (the expert LoRA in delta mode, same layout).
__global__ void moe_act_kernel(const int32_t* sorted, const int32_t* num_tiles, int tile_m, const float* gu,
                               const float* gu_delta, float* act, __nv_bfloat16* act_bf16, int64_t lda_bf16,
                               int64_t copies, int64_t max_rows, int64_t I, ExpertAct kind, float alpha,
                               float limit) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const int64_t rows_dev = static_cast<int64_t>(*num_tiles) * tile_m;
  const int64_t rows = rows_dev < max_rows ? rows_dev : max_rows;
  const int64_t width = act_bf16 != nullptr ? lda_bf16 : I;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (sorted[r] < 0) continue;
    const float* g = gu + r * 2 * I;
    const float* d = gu_delta != nullptr ? gu_delta + r * 2 * I : nullptr;
    for (int64_t j = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; j < width;
         j += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      __nv_bfloat16* brow = act_bf16 != nullptr ? act_bf16 + r * copies * lda_bf16 : nullptr;
      if (j >= I) {
        brow[j] = __float2bfloat16_rn(0.0f);
        if (copies == 2) brow[lda_bf16 + j] = __float2bfloat16_rn(0.0f);
        continue;
      }
      const int64_t ng = kind == ExpertAct::kGptOssSwiglu ? 2 * j : j;
      const int64_t nu = kind == ExpertAct::kGptOssSwiglu ? 2 * j + 1 : I + j;
      float gv = g[ng], uv = g[nu];
      if (d != nullptr) {
        gv += d[ng];
        uv += d[nu];
      }
      const float v = moe_detail::expert_act(kind, gv, uv, alpha, limit);
      if (act != nullptr) act[r * I + j] = v;
      if (brow != nullptr) {
        const cuda_util::Bf16Pair p = cuda_util::split_bf16(v);
        brow[j] = p.hi;
        if (copies == 2) brow[lda_bf16 + j] = p.lo;
      }
    }
  }
}

// out[t] = Σ_k weights[t, k] · y[t·top_k + k]: token t = blockIdx.x, columns over blockIdx.y and threads (a
// single token spreads over ⌈H / 256⌉ CTAs: at batch 1 one CTA took 18 us of a 5 ms step); VEC: 4 columns
// per thread with 16-byte loads and stores (H and ldo multiples of 4, aligned rows; each column's sum in the
// same order as one column per thread). At prefill the one-column loop took 5.0 ms of an 8,192-token
// GPT-OSS-20B step for ~3.4 ms of bytes (H100, session 56).
// y_delta (or nullptr): added to y first (the down LoRA in delta mode, same layout).
template <bool VEC>
__global__ void moe_combine_kernel(const float* y, const float* y_delta, const int32_t* ids,
                                   const float* weights, int64_t top_k, int64_t H, int64_t E, float* out,
                                   int64_t ldo) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const int64_t t = blockIdx.x;
  if constexpr (VEC) {
    const int64_t H4 = H / 4;
    for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < H4;
         i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int64_t k = 0; k < top_k; ++k) {
        const int64_t p = t * top_k + k;
        const int32_t e = ids[p];
        if (e < 0 || e >= E) continue;
        float4 v = reinterpret_cast<const float4*>(y + p * H)[i];
        if (y_delta != nullptr) {
          const float4 d = reinterpret_cast<const float4*>(y_delta + p * H)[i];
          v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
        }
        const float w = weights[p];
        sum.x += w * v.x;
        sum.y += w * v.y;
        sum.z += w * v.z;
        sum.w += w * v.w;
      }
      reinterpret_cast<float4*>(out + t * ldo)[i] = sum;
    }
  } else {
    for (int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x; i < H;
         i += static_cast<int64_t>(gridDim.y) * blockDim.x) {
      float sum = 0.0f;
      for (int64_t k = 0; k < top_k; ++k) {
        int64_t p = t * top_k + k;
        int32_t e = ids[p];
        if (e < 0 || e >= E) continue;
        const float v = y_delta != nullptr ? y[p * H + i] + y_delta[p * H + i] : y[p * H + i];
        sum += weights[p] * v;
      }
      out[t * ldo + i] = sum;
    }
  }
}

}  // namespace

// The fp32 small-batch product's grid: the CTAs that fit on the GPU at once (2 per SM by its launch bounds),
// or fewer when the items are fewer (max_items: the worst case, every expert of the sort active).
unsigned moe_gemv_blocks(int64_t max_items) {
  const int64_t sms = cuda_util::num_sms();
  const int64_t warps = moe_detail::kGemvThreads / 32;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(2 * sms, (max_items + warps - 1) / warps)));
}

void launch_expert_act(const int32_t* sorted, const int32_t* num_tiles, int tile_m, int64_t max_rows,
                       const float* gu, const float* gu_delta, float* act, __nv_bfloat16* act_bf16,
                       int64_t lda_bf16, int64_t copies, const MoeExpertsArgs& a, cudaStream_t st) {
  cuda_util::launch_pdl(moe_act_kernel, moe_act_grid(max_rows, a.inter), 256, 0, st, sorted, num_tiles,
                        tile_m, gu, gu_delta, act, act_bf16, lda_bf16, copies, max_rows, a.inter, a.act,
                        a.swiglu_alpha, a.swiglu_limit);
  CUDA_CHECK_LAUNCH();
}

// Column blocks per token: ~2,048 CTAs in all up to one per 256 columns (at batch 64 one CTA per token left
// 64 CTAs for 2.9 MB of y: 25.6 us under ncu where the activation took 11.5).
void launch_expert_combine(const MoeExpertsArgs& a, const float* y, const float* y_delta, cudaStream_t st) {
  using cuda_util::aligned16;
  const bool vec = a.hidden % 4 == 0 && a.ldo % 4 == 0 && aligned16(y) && aligned16(a.out) &&
                   (y_delta == nullptr || aligned16(y_delta));
  const int64_t cols = vec ? a.hidden / 4 : a.hidden;
  const dim3 grid(static_cast<unsigned>(a.m), static_cast<unsigned>(std::min<int64_t>(
                                                  (cols + 255) / 256, std::max<int64_t>(1, 2048 / a.m))));
  cuda_util::launch_pdl(vec ? moe_combine_kernel<true> : moe_combine_kernel<false>, grid, 256, 0, st, y,
                        y_delta, a.ids, a.weights, a.top_k, a.hidden, a.num_experts, a.out, a.ldo);
  CUDA_CHECK_LAUNCH();
}

template <Phase P>
void launch_gemm_f32(dim3 grid, const GemmParams& gp, cudaStream_t st) {
  moe_gemm_f32<P><<<grid, 256, 0, st>>>(gp);
  CUDA_CHECK_LAUNCH();
}
template void launch_gemm_f32<Phase::kGateUp>(dim3, const GemmParams&, cudaStream_t);
template void launch_gemm_f32<Phase::kDown>(dim3, const GemmParams&, cudaStream_t);

void launch_expert_lora_views(const MoeExpertsArgs& a, const int32_t* sorted, const int32_t* num_tiles,
                              int tile_m, int64_t max_rows, float* gu, const float* act, float* y, bool down,
                              cudaStream_t st) {
  moe_lora_kernel<<<static_cast<unsigned>(max_rows), 256, 0, st>>>(a, sorted, num_tiles, tile_m, gu, act, y,
                                                                   down);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda::moe_detail
