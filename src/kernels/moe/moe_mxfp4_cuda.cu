// kernels/moe/moe_mxfp4_cuda.cu: CUDA MoE experts whose gate_up and down are MXFP4 views (tensor_view.h,
// common/mxfp4.h; GPT-OSS as shipped), read as they are stored: no decoded copy of an expert exists in
// device memory. Entirely on the device (no host sync), in the steps of moe_cuda.cu:
//   1. one block counts the token-expert pairs per expert and sorts them by expert (compact offsets, the
//      list of active experts);
//   2. gate_up, a weight-streaming kernel: grid x = blocks of kRows output rows, y = the worst-case number of
//      active experts (a CTA takes the y-th active expert or exits). A CTA copies its kRows rows of codes and
//      scales from HBM into shared memory once, then multiplies them with every routed row of that expert,
//      kMaxTok rows per pass: each expert's bytes are read once per call however many tokens chose it.
//      Lanes take 8 consecutive values (one 32-bit word of codes) at a time, decode them in registers
//      (a 16-entry table in shared memory) and sum their products with the activations in f32, then scale
//      the 8-value partial sums by the block's 2^(s − 127); fp32 accumulation, warp reduction, bias.
//   3. expert LoRA on gate_up rows, 4. the activation, 5. down (as 2), 6. down LoRA, 7. the weighted
//      combine per token in k order.
// With tensor cores and many pairs per expert (moe_mxfp4_grouped) moe_cuda.cu's grouped GEMM runs instead,
// decoding the codes into its bf16 B tiles in registers (moe_gemm_mma.cuh).
// Activations: f32, or rounded to bf16 when the backend computes in bf16 without the hi + lo split
// (CudaContext::bf16_split false), as the bf16 paths of moe_cuda.cu do, so numerics do not depend on the
// path. Must not: depend on anything above common/.
#include <algorithm>

#include "kernels/lora/lora_cuda.cuh"
#include "kernels/moe/moe_cuda_common.cuh"
#include "kernels/moe/moe.h"

namespace polylora::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kRowsPerWarp * (kThreads / 32);  // weight rows per CTA
constexpr int kMaxTok = 8;                             // routed rows per pass
constexpr int kKc = 1024;                              // K chunk of staged activations (multiple of 32)
constexpr int kAlignThreads = 1024;
constexpr int kMaxDynamicSmem = 160 * 1024;  // the staged weight slice: kRows · (K/2 + K/32) bytes

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

// Workspace layout (each part 256-byte aligned).
struct Mxfp4Workspace {
  int32_t* counts = nullptr;      // [E] pairs per expert
  int32_t* offsets = nullptr;     // [E] first sorted row of each expert
  int32_t* active = nullptr;      // [E] experts with pairs, in expert order
  int32_t* num_active = nullptr;  // [1]
  int32_t* num_rows = nullptr;    // [1] sorted rows (pairs with a valid expert id)
  int32_t* sorted = nullptr;      // [pairs] pair index t·top_k + k per sorted row
  float* gu = nullptr;            // [pairs, 2I] by sorted row
  float* act = nullptr;           // [pairs, I] by sorted row
  float* y = nullptr;             // [pairs, H] by pair
  float* lora_gu = nullptr;       // slot-stacked LoRA shrinks (moe_cuda_common.cuh)
  float* lora_down = nullptr;
  size_t bytes = 0;

  Mxfp4Workspace(const MoeExpertsArgs& a, void* base) {
    const int64_t pairs = a.m * a.top_k;
    auto* p = static_cast<char*>(base);
    auto take = [&](int64_t n) {
      char* r = p ? p + bytes : nullptr;
      bytes += static_cast<size_t>(round_up(n, 256));
      return r;
    };
    counts = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    offsets = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    active = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    num_active = reinterpret_cast<int32_t*>(take(4));
    num_rows = reinterpret_cast<int32_t*>(take(4));
    sorted = reinterpret_cast<int32_t*>(take(4 * pairs));
    gu = reinterpret_cast<float*>(take(4 * pairs * 2 * a.inter));
    act = reinterpret_cast<float*>(take(4 * pairs * a.inter));
    y = reinterpret_cast<float*>(take(4 * pairs * a.hidden));
    if (!a.lora_stack.empty()) {
      const moe_detail::StackSplits sp = moe_detail::stack_splits(a, pairs);
      lora_gu = reinterpret_cast<float*>(take(static_cast<int64_t>(4 * sp.gu_floats)));
      lora_down = reinterpret_cast<float*>(take(static_cast<int64_t>(4 * sp.down_floats)));
    }
  }
};

// One block: counts per expert, compact offsets, the active experts and the pairs in expert order.
__global__ void mxfp4_align_kernel(const int32_t* ids, int64_t pairs, int64_t E, int32_t* counts,
                                   int32_t* offsets, int32_t* active, int32_t* num_active, int32_t* num_rows,
                                   int32_t* sorted) {
  extern __shared__ int32_t align_smem[];
  int32_t* cnt = align_smem;  // [E]
  int32_t* cursor = cnt + E;  // [E]
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t run = 0, nact = 0;
    for (int64_t e = 0; e < E; ++e) {
      cursor[e] = run;
      offsets[e] = run;
      counts[e] = cnt[e];
      if (cnt[e] > 0) active[nact++] = static_cast<int32_t>(e);
      run += cnt[e];
    }
    *num_active = nact;
    *num_rows = run;
  }
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int32_t e = ids[p];
    if (e >= 0 && e < E) sorted[atomicAdd(&cursor[e], 1)] = static_cast<int32_t>(p);
  }
}

struct Mxfp4GemvParams {
  const float* x = nullptr;  // gate_up: token rows [m, H] (stride ldx); down: act rows [pairs, I] by sorted row
  int64_t ldx = 0;
  const ExpertView* experts = nullptr;
  const int32_t* counts = nullptr;
  const int32_t* offsets = nullptr;
  const int32_t* active = nullptr;
  const int32_t* num_active = nullptr;
  const int32_t* sorted = nullptr;
  int64_t top_k = 0, hidden = 0, inter = 0;
  bool round_bf16 = false;
  float* out = nullptr;  // gate_up: gu [pairs, 2I] by sorted row; down: y [pairs, H] by pair
};

// 2^(s − 127) as torch.ldexp gives it (s = 0: the subnormal 2^-127; s = 255: +inf).
__device__ __forceinline__ float mxfp4_scale_of(uint32_t s) {
  return __uint_as_float(s == 0 ? 0x00400000u : s << 23);
}

// One pass over nt (<= TM) routed rows starting at sorted row `row0` of the expert.
template <bool kDown, int TM>
__device__ __forceinline__ void mxfp4_pass(const Mxfp4GemvParams& p, const uint32_t* s_codes,
                                           const uint8_t* s_scales, const float* lut, int64_t K, int64_t N,
                                           int64_t n0, int nrows, const float* bias, int row0, int nt,
                                           const float* const* s_src, float* xs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t words = K / 8, nb = K / kMxfp4BlockSize;
  float acc[kRowsPerWarp][TM];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;
  for (int64_t kc0 = 0; kc0 < K; kc0 += kKc) {
    const int kcn = static_cast<int>(K - kc0 < kKc ? K - kc0 : kKc);
    __syncthreads();  // the previous chunk's readers are done (and s_src is published)
    for (int t = 0; t < nt; ++t) {
      const float* src = s_src[t] + kc0;
      if (p.round_bf16)
        for (int kk = threadIdx.x; kk < kcn; kk += blockDim.x)
          xs[t * kKc + kk] = __bfloat162float(__float2bfloat16_rn(src[kk]));
      else
        for (int kk = threadIdx.x; kk < kcn; kk += blockDim.x) xs[t * kKc + kk] = src[kk];
    }
    __syncthreads();
    for (int wl = lane; wl < kcn / 8; wl += 32) {
      const int64_t wi = kc0 / 8 + wl;
      float xv[TM][8];
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        const float4 a = *reinterpret_cast<const float4*>(xs + t * kKc + wl * 8);
        const float4 b = *reinterpret_cast<const float4*>(xs + t * kKc + wl * 8 + 4);
        xv[t][0] = a.x;
        xv[t][1] = a.y;
        xv[t][2] = a.z;
        xv[t][3] = a.w;
        xv[t][4] = b.x;
        xv[t][5] = b.y;
        xv[t][6] = b.z;
        xv[t][7] = b.w;
      }
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int lr = warp * kRowsPerWarp + r;
        if (lr >= nrows) continue;  // warp-uniform
        const uint32_t cw = s_codes[lr * words + wi];
        const float s = mxfp4_scale_of(s_scales[lr * nb + wi / 4]);
        float wv[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) wv[i] = lut[(cw >> (4 * i)) & 15u];
#pragma unroll
        for (int t = 0; t < TM; ++t) {
          float part = 0.0f;
#pragma unroll
          for (int i = 0; i < 8; ++i) part = fmaf(wv[i], xv[t][i], part);
          acc[r][t] = fmaf(part, s, acc[r][t]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int lr = warp * kRowsPerWarp + r;
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      const float v = cuda_util::warp_sum(acc[r][t]);
      if (lane == 0 && t < nt && lr < nrows) {
        const int64_t n = n0 + lr;
        const float yv = v + (bias != nullptr ? bias[n] : 0.0f);
        const int64_t row = row0 + t;
        if (kDown) {
          p.out[static_cast<int64_t>(p.sorted[row]) * N + n] = yv;
        } else {
          p.out[row * N + n] = yv;
        }
      }
    }
  }
}

template <bool kDown>
__global__ void __launch_bounds__(kThreads) mxfp4_gemv_kernel(Mxfp4GemvParams p) {
  extern __shared__ __align__(16) unsigned char mxfp4_smem[];  // codes [kRows, K/8] u32, scales [kRows, K/32]
  __shared__ __align__(16) float xs[kMaxTok * kKc];
  __shared__ const float* s_src[kMaxTok];
  __shared__ float lut[16];
  const int j = blockIdx.y;
  if (j >= *p.num_active) return;
  const int e = p.active[j];
  const int count = p.counts[e], base = p.offsets[e];
  const ExpertView& ex = p.experts[e];
  const WeightView& w = kDown ? ex.down : ex.gate_up;
  const float* bias = kDown ? ex.down_bias : ex.gate_up_bias;
  const int64_t K = kDown ? p.inter : p.hidden;
  const int64_t N = kDown ? p.hidden : 2 * p.inter;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
  if (n0 >= N) return;
  const int nrows = static_cast<int>(N - n0 < kRows ? N - n0 : kRows);
  const int64_t nb = K / kMxfp4BlockSize;
  auto* s_codes = reinterpret_cast<uint32_t*>(mxfp4_smem);
  uint8_t* s_scales = mxfp4_smem + static_cast<int64_t>(kRows) * (K / 2);
  if (threadIdx.x < 16) {
    const uint32_t m = threadIdx.x & 7u;  // E2M1 magnitude code: 0, 0.5, 1, 1.5, 2, 3, 4, 6
    const float mag = m < 2 ? 0.5f * static_cast<float>(m) : __uint_as_float((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
    lut[threadIdx.x] = threadIdx.x & 8u ? -mag : mag;
  }
  // The CTA's rows are contiguous: nrows · nb 16-byte blocks of codes, nrows · nb scale bytes.
  const auto* gcodes = reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(w.data) + n0 * (K / 2));
  auto* scodes4 = reinterpret_cast<uint4*>(s_codes);
  for (int64_t i = threadIdx.x; i < nrows * nb; i += blockDim.x) scodes4[i] = __ldg(gcodes + i);
  const uint8_t* gscales = w.scales + n0 * nb;
  for (int64_t i = threadIdx.x; i < nrows * nb; i += blockDim.x) s_scales[i] = __ldg(gscales + i);
  for (int tok0 = 0; tok0 < count; tok0 += kMaxTok) {
    const int nt = count - tok0 < kMaxTok ? count - tok0 : kMaxTok;
    __syncthreads();  // s_src of the previous pass is no longer read
    if (threadIdx.x < nt) {
      const int64_t row = base + tok0 + threadIdx.x;
      s_src[threadIdx.x] = kDown ? p.x + row * p.ldx : p.x + (p.sorted[row] / p.top_k) * p.ldx;
    }
    // (published, with the staged weights, by the barrier at the start of mxfp4_pass's first chunk)
    const int row0 = base + tok0;
    if (nt == 1) {
      mxfp4_pass<kDown, 1>(p, s_codes, s_scales, lut, K, N, n0, nrows, bias, row0, nt, s_src, xs);
    } else if (nt == 2) {
      mxfp4_pass<kDown, 2>(p, s_codes, s_scales, lut, K, N, n0, nrows, bias, row0, nt, s_src, xs);
    } else if (nt <= 4) {
      mxfp4_pass<kDown, 4>(p, s_codes, s_scales, lut, K, N, n0, nrows, bias, row0, nt, s_src, xs);
    } else {
      mxfp4_pass<kDown, 8>(p, s_codes, s_scales, lut, K, N, n0, nrows, bias, row0, nt, s_src, xs);
    }
  }
}

// One block per sorted row below *num_rows: the LoRA of (its token's slot, its expert) on gate_up (input
// the token's x, output the gu row) or on down (input the act row, output the pair's y row).
__global__ void mxfp4_lora_kernel(MoeExpertsArgs a, const int32_t* sorted, const int32_t* num_rows, float* gu,
                                  const float* act, float* y, bool down) {
  __shared__ float s_mid[cuda_util::kLoraRankChunk];
  const int64_t r = blockIdx.x;
  if (r >= *num_rows) return;
  const int32_t pr = sorted[r];
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
  if (lv.gate_up.a != nullptr) cuda_util::lora_row(lv.gate_up, a.x + t * a.ldx, gu + r * 2 * I, s_mid);
}

// act = act_fn(gu) for the sorted rows below *num_rows; rows over blocks, columns over threads.
__global__ void mxfp4_act_kernel(const int32_t* num_rows, const float* gu, float* act, int64_t I,
                                 ExpertAct kind, float alpha, float limit) {
  const int64_t rows = *num_rows;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* g = gu + r * 2 * I;
    for (int64_t j = threadIdx.x; j < I; j += blockDim.x) {
      // Gate rows then up rows, or interleaved (even = gate) for GPT-OSS.
      const float v = kind == ExpertAct::kGptOssSwiglu
                          ? moe_detail::expert_act(kind, g[2 * j], g[2 * j + 1], alpha, limit)
                          : moe_detail::expert_act(kind, g[j], g[I + j], alpha, limit);
      act[r * I + j] = v;
    }
  }
}

__global__ void mxfp4_combine_kernel(const float* y, const int32_t* ids, const float* weights, int64_t top_k,
                                     int64_t H, int64_t E, float* out, int64_t ldo) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float sum = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t p = t * top_k + k;
      const int32_t e = ids[p];
      if (e < 0 || e >= E) continue;
      sum += weights[p] * y[p * H + i];
    }
    out[t * ldo + i] = sum;
  }
}

template <bool kDown>
void launch_gemv(dim3 grid, size_t smem, const Mxfp4GemvParams& gp, cudaStream_t st) {
  static const bool configured = [] {
    CUDA_CHECK(cudaFuncSetAttribute(mxfp4_gemv_kernel<kDown>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kMaxDynamicSmem));
    return true;
  }();
  (void)configured;
  mxfp4_gemv_kernel<kDown><<<grid, kThreads, smem, st>>>(gp);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// POLYLORA_MXFP4_LEGACY=1: these kernels for every MXFP4 call (A/B timing against moe_experts' paths).
static bool mxfp4_legacy() {
  static const bool v = [] {
    const char* e = std::getenv("POLYLORA_MXFP4_LEGACY");
    return e != nullptr && e[0] == '1';
  }();
  return v;
}

size_t moe_experts_mxfp4_workspace_bytes(const MoeExpertsArgs& a, bool tensor_cores, const CudaContext& ctx) {
  (void)tensor_cores;
  return std::max(Mxfp4Workspace(a, nullptr).bytes, moe_experts_workspace_bytes(a, ctx));
}

void moe_experts_mxfp4(const MoeExpertsArgs& a, bool tensor_cores, const CudaContext& ctx) {
  if (a.m == 0) return;
  // moe_cuda.cu's paths: the fp32 GEMV decoding in registers, or the tensor-core grouped GEMM.
  if (!mxfp4_legacy()) return moe_experts(a, tensor_cores, ctx);
  Mxfp4Workspace ws(a, ctx.workspace);
  KERNEL_CHECK(ws.bytes <= ctx.workspace_bytes, "moe_experts_mxfp4: workspace too small");
  const int64_t E = a.num_experts, I = a.inter, H = a.hidden, pairs = a.m * a.top_k;
  KERNEL_CHECK(H % kMxfp4BlockSize == 0 && I % kMxfp4BlockSize == 0,
               "moe_experts_mxfp4: hidden and intermediate sizes must be multiples of 32");
  KERNEL_CHECK(E <= 65535 && pairs < (1LL << 31), "moe_experts_mxfp4: shape too large for the grid");
  const size_t smem_gu = static_cast<size_t>(kRows) * static_cast<size_t>(H / 2 + H / kMxfp4BlockSize);
  const size_t smem_down = static_cast<size_t>(kRows) * static_cast<size_t>(I / 2 + I / kMxfp4BlockSize);
  KERNEL_CHECK(std::max(smem_gu, smem_down) <= static_cast<size_t>(kMaxDynamicSmem),
               "moe_experts_mxfp4: hidden or intermediate size too large for the staged weight slice");
  cudaStream_t st = cuda_util::stream(ctx);
  const bool stack = a.token_slots && !a.lora_stack.empty();
  const bool lora = !stack && a.token_slots && a.lora && a.num_slots > 0;
  const moe_detail::StackBuffers sb{.sorted = ws.sorted, .num_tiles = ws.num_rows, .tile_m = 1, .max_rows = pairs,
                                    .gu = ws.gu, .act = ws.act, .act_bf16 = nullptr, .lda_bf16 = 0, .copies = 1,
                                    .y = ws.y, .lora_gu = ws.lora_gu, .lora_down = ws.lora_down};

  // 1. sort the pairs by expert
  const size_t align_smem = static_cast<size_t>(8 * E);
  KERNEL_CHECK(align_smem <= 48 * 1024, "moe_experts_mxfp4: too many experts for the sort");
  mxfp4_align_kernel<<<1, kAlignThreads, align_smem, st>>>(a.ids, pairs, E, ws.counts, ws.offsets, ws.active,
                                                           ws.num_active, ws.num_rows, ws.sorted);
  CUDA_CHECK_LAUNCH();
  Mxfp4GemvParams gp;
  gp.experts = a.experts;
  gp.counts = ws.counts;
  gp.offsets = ws.offsets;
  gp.active = ws.active;
  gp.num_active = ws.num_active;
  gp.sorted = ws.sorted;
  gp.top_k = a.top_k;
  gp.hidden = H;
  gp.inter = I;
  gp.round_bf16 = tensor_cores && !ctx.bf16_split(a.m);
  const auto max_active = static_cast<unsigned>(std::min<int64_t>(E, pairs));
  // 2. gate_up
  gp.x = a.x;
  gp.ldx = a.ldx;
  gp.out = ws.gu;
  launch_gemv<false>(dim3(static_cast<unsigned>((2 * I + kRows - 1) / kRows), max_active), smem_gu, gp, st);
  const auto row_blocks = static_cast<unsigned>(pairs);
  // 3. gate_up LoRA
  if (lora) {
    mxfp4_lora_kernel<<<row_blocks, 256, 0, st>>>(a, ws.sorted, ws.num_rows, ws.gu, ws.act, ws.y, false);
    CUDA_CHECK_LAUNCH();
  }
  // 4. activation (slot-stacked LoRA: gate/up shrink, the activation with its expand, down shrink)
  if (stack) {
    moe_detail::stack_lora_step(moe_detail::StackStep::kShrinkGateUp, a, sb, st);
    moe_detail::stack_lora_step(moe_detail::StackStep::kActivation, a, sb, st);
    moe_detail::stack_lora_step(moe_detail::StackStep::kShrinkDown, a, sb, st);
  } else {
    mxfp4_act_kernel<<<static_cast<unsigned>(std::min<int64_t>(pairs, 16384)), 256, 0, st>>>(
        ws.num_rows, ws.gu, ws.act, I, a.act, a.swiglu_alpha, a.swiglu_limit);
    CUDA_CHECK_LAUNCH();
  }
  // 5. down
  gp.x = ws.act;
  gp.ldx = I;
  gp.out = ws.y;
  launch_gemv<true>(dim3(static_cast<unsigned>((H + kRows - 1) / kRows), max_active), smem_down, gp, st);
  // 6. down LoRA
  if (lora) {
    mxfp4_lora_kernel<<<row_blocks, 256, 0, st>>>(a, ws.sorted, ws.num_rows, ws.gu, ws.act, ws.y, true);
    CUDA_CHECK_LAUNCH();
  }
  // 7. combine
  if (stack) return moe_detail::stack_lora_step(moe_detail::StackStep::kCombine, a, sb, st);
  mxfp4_combine_kernel<<<static_cast<unsigned>(a.m), 256, 0, st>>>(ws.y, a.ids, a.weights, a.top_k, H, E,
                                                                   a.out, a.ldo);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
