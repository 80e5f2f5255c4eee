// kernels/norm/rms_norm_cuda.cu: CUDA RMSNorm, fp32 sum of squares (in place allowed: every thread reads
// its elements before it writes them). Rows of up to kWarpRowMax elements (Qwen3's per-head q/k norms,
// [tokens·heads, head_dim]) take one warp each, eight rows per block; longer rows (the residual stream)
// one block each. Both read and write 16 bytes at a time when n, the strides and the pointers allow.
// add_rms_norm runs the same kernels with ADD: the first pass adds delta into x (stored back) and sums the
// squares of the sums in registers, so its results are bit-identical to add_inplace then rms_norm whenever
// both take the same path (the 16-byte one needs delta aligned too). Must not: allocate; synchronize.
#include <cooperative_groups.h>

#include <algorithm>

#include "kernels/cuda_util.cuh"
#include "kernels/lora/lora_fused_cuda.cuh"
#include "kernels/norm/rms_norm.h"
#include "kernels/tuning.h"

namespace polylora::kernels::cuda {
namespace {

constexpr int64_t kWarpRowMax = 1024;
constexpr int kRowsPerBlock = 8;

// Sum of squares of row xr over the indices this thread owns (first, first + step, ...); VEC: float4.
// ADD: xr[j] += dr[j] first (stored back), the squares are those of the sums.
// With a LoRA term (lora != nullptr; tok: the row's lora_fused::expand_token), delta + the term is added.
template <bool VEC, bool ADD>
__device__ __forceinline__ float row_sumsq(float* xr, const float* dr, int64_t n, int64_t first, int64_t step,
                                           const LoraExpandIn* lora = nullptr,
                                           const lora_fused::ExpandToken* tok = nullptr) {
  float sum = 0.0f;
  if (VEC) {
    for (int64_t j = first * 4; j < n; j += step * 4) {
      float term[4];
      if (ADD && lora != nullptr) lora_fused::expand_n<4>(*lora, *tok, j, term);  // before the row's loads
      float4 v = *reinterpret_cast<const float4*>(xr + j);
      if (ADD) {
        float4 d = *reinterpret_cast<const float4*>(dr + j);
        if (lora != nullptr) {
          d.x += term[0];
          d.y += term[1];
          d.z += term[2];
          d.w += term[3];
        }
        v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
        *reinterpret_cast<float4*>(xr + j) = v;
      }
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int64_t j = first; j < n; j += step) {
      float v = xr[j];
      if (ADD) {
        float d = dr[j];
        if (lora != nullptr) d += lora_fused::expand_at(*lora, *tok, j);
        v += d;
        xr[j] = v;
      }
      sum += v * v;
    }
  }
  return sum;
}

// y = w · (x · inv) over this thread's indices (the same ones row_sumsq visited: with ADD it reads back the
// sums this thread stored).
template <bool VEC>
__device__ __forceinline__ void row_scale(const float* xr, float* yr, const float* w, int64_t n, float inv,
                                          int64_t first, int64_t step) {
  if (VEC) {
    for (int64_t j = first * 4; j < n; j += step * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + j);
      const float4 g = *reinterpret_cast<const float4*>(w + j);
      *reinterpret_cast<float4*>(yr + j) =
          make_float4(g.x * (v.x * inv), g.y * (v.y * inv), g.z * (v.z * inv), g.w * (v.w * inv));
    }
  } else {
    for (int64_t j = first; j < n; j += step) yr[j] = w[j] * (xr[j] * inv);
  }
}

// COMB: row `row` of the combine c (cuda::RowCombine) into c.out over this thread's indices (those row_sumsq
// then visits, so each thread reads back only what it wrote), each element as moe_combine_kernel sums it.
template <bool VEC>
__device__ __forceinline__ void row_combine(const RowCombine& c, int64_t row, int64_t ld_out, int64_t n,
                                            int64_t first, int64_t step) {
  float* out = c.out + row * ld_out;
  const int64_t p0 = row * c.top_k;
  const int64_t per = VEC ? 4 : 1;
  for (int64_t j0 = first * per; j0 < n; j0 += step * per) {
#pragma unroll
    for (int u = 0; u < per; ++u) {
      const int64_t j = j0 + u;
      float sum = 0.0f;
      for (int64_t k = 0; k < c.top_k; ++k) {
        const int64_t p = p0 + k;
        const int32_t e = c.ids[p];
        if (e < 0 || e >= c.num_ids) continue;
        const float v =
            c.rows_delta != nullptr ? c.rows[p * n + j] + c.rows_delta[p * n + j] : c.rows[p * n + j];
        sum += c.weights[p] * v;
      }
      out[j] = sum;
    }
  }
}

// x is written only with ADD (rms_norm passes its const input through a cast). COMB: delta is the combine c
// (rows r0.. of it), computed first.
template <bool VEC, bool ADD, bool COMB = false>
__global__ void rms_norm_block_kernel(float* x, int64_t ldx, const float* delta, int64_t ld_delta, float* y,
                                      int64_t ldy, int64_t n, const float* w, float eps, RowCombine c = {},
                                      int64_t r0 = 0) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  float* xr = x + static_cast<int64_t>(blockIdx.x) * ldx;
  const float* dr = ADD ? delta + static_cast<int64_t>(blockIdx.x) * ld_delta : nullptr;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * ldy;
  if (COMB) row_combine<VEC>(c, r0 + blockIdx.x, ld_delta, n, threadIdx.x, blockDim.x);
  float sum = cuda_util::block_sum(row_sumsq<VEC, ADD>(xr, dr, n, threadIdx.x, blockDim.x));
  float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  row_scale<VEC>(xr, yr, w, n, inv, threadIdx.x, blockDim.x);
}

template <bool VEC, bool ADD, bool COMB = false>
__global__ void rms_norm_warp_kernel(float* x, int64_t ldx, const float* delta, int64_t ld_delta, float* y,
                                     int64_t ldy, int64_t m, int64_t n, const float* w, float eps,
                                     RowCombine c = {}, int64_t r0 = 0) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= m) return;  // whole warps exit together
  const int lane = threadIdx.x & 31;
  float* xr = x + row * ldx;
  const float* dr = ADD ? delta + row * ld_delta : nullptr;
  float* yr = y + row * ldy;
  if (COMB) row_combine<VEC>(c, r0 + row, ld_delta, n, lane, 32);
  float sum = cuda_util::warp_sum(row_sumsq<VEC, ADD>(xr, dr, n, lane, 32));
  float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  row_scale<VEC>(xr, yr, w, n, inv, lane, 32);
}

// Threads per row of the plain path (launch below): one warp up to kWarpRowMax elements, else one block of
// up to 512 threads; the LoRA kernels use the same count, so a row's sum is added in the same order.
int row_threads(int64_t n, bool vec) {
  if (n <= kWarpRowMax) return 32;
  const int64_t units = vec ? n / 4 : n;
  return units >= 512 ? 512 : static_cast<int>(std::max<int64_t>(32, (units + 31) / 32 * 32));
}

using cuda_util::aligned16;

// add_rms_norm with a LoRA term on delta (AddRmsNormArgs::lora_delta): one block per row (t0: the first row's
// token index for the term).
template <bool VEC>
__global__ void add_rms_norm_lora_kernel(float* x, int64_t ldx, const float* delta, int64_t ld_delta,
                                         float* y, int64_t ldy, int64_t n, const float* w, float eps,
                                         LoraExpandIn lora, int64_t t0) {
  const int64_t t = t0 + blockIdx.x;
  float* xr = x + static_cast<int64_t>(blockIdx.x) * ldx;
  const float* dr = delta + static_cast<int64_t>(blockIdx.x) * ld_delta;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * ldy;
  // The term's slot, scale and B rows before waiting on the previous kernel (lora_fused::prefetch_b_rows).
  const lora_fused::ExpandToken tok = lora_fused::expand_token(lora, t);
  lora_fused::prefetch_b_rows(lora, tok, 0, n, threadIdx.x, blockDim.x);
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  float sum = cuda_util::block_sum(row_sumsq<VEC, true>(xr, dr, n, threadIdx.x, blockDim.x, &lora, &tok));
  float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  row_scale<VEC>(xr, yr, w, n, inv, threadIdx.x, blockDim.x);
}

// The same for few rows (KernelTuning::add_norm_lora_cluster_rows): a cluster of kNormCluster CTAs per row
// (blockIdx.y) sharing the one-CTA kernel's work, so that each CTA reads only its share of the term's B
// rows (the one-CTA kernel reads all of them on one SM, 2,880 rows of r = 16 for GPT-OSS-20B's o_proj,
// ~4.9 us per layer at batch 1 in session 40's timeline). Bit-identical to the one-CTA kernel and to the
// plain add_rms_norm (a base-model row's output must not depend on whether adapters share its batch):
// with T = row_threads(n) threads there (blockDim.x · kNormCluster here), CTA c runs that kernel's threads
// [c · blockDim.x, (c + 1) · blockDim.x) (the same units, summed in the same order, so the same warp sums),
// and the warps' sums meet through distributed shared memory in block_sum's order.
constexpr int kNormCluster = 8;

template <bool VEC>
__global__ void __launch_bounds__(512 / kNormCluster)
    add_rms_norm_lora_cluster_kernel(float* x, int64_t ldx, const float* delta, int64_t ld_delta, float* y,
                                     int64_t ldy, int64_t n, const float* w, float eps, LoraExpandIn lora,
                                     int64_t t0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float s_warp[512 / kNormCluster / 32];  // this CTA's warp sums
  const int64_t row = blockIdx.y;
  float* xr = x + row * ldx;
  const float* dr = delta + row * ld_delta;
  float* yr = y + row * ldy;
  constexpr int64_t kUnit = VEC ? 4 : 1;
  const int bd = static_cast<int>(blockDim.x), c = static_cast<int>(cluster.block_rank());
  const int T = bd * kNormCluster, vt = c * bd + static_cast<int>(threadIdx.x);
  const int64_t units = n / kUnit;
  const lora_fused::ExpandToken tok = lora_fused::expand_token(lora, t0 + row);
  // This CTA's B rows: units [k·T + c·bd, k·T + (c + 1)·bd) for k = 0, 1, ...
  for (int64_t u = static_cast<int64_t>(c) * bd; u < units; u += T)
    lora_fused::prefetch_b_rows(lora, tok, u * kUnit, (units - u < bd ? units - u : bd) * kUnit, threadIdx.x,
                                bd);
  cuda_util::pdl_begin();  // launched with the PDL attribute as launch_pdl does
  const float v = cuda_util::warp_sum(row_sumsq<VEC, true>(xr, dr, n, vt, T, &lora, &tok));
  const int lane = threadIdx.x & 31, wpc = bd / 32;
  if (lane == 0) s_warp[threadIdx.x >> 5] = v;
  cluster.sync();
  // block_sum's second step: lane l holds warp l's sum (l < T / 32), then one warp_sum.
  const int warps = T / 32;
  const float r = lane < warps ? *cluster.map_shared_rank(&s_warp[lane % wpc], lane / wpc) : 0.0f;
  const float sum = cuda_util::warp_sum(r);
  cluster.sync();  // no CTA leaves while another still reads its s_warp
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  row_scale<VEC>(xr, yr, w, n, inv, vt, T);
#else
  (void)x, (void)ldx, (void)delta, (void)ld_delta, (void)y, (void)ldy, (void)n, (void)w, (void)eps;
  (void)lora, (void)t0;
  __trap();  // clusters need compute capability 9.0
#endif
}

template <bool VEC>
void launch_add_rms_norm_lora_cluster(const AddRmsNormArgs& a, int threads, cudaStream_t st) {
  cuda_util::launch_pdl_cluster(add_rms_norm_lora_cluster_kernel<VEC>,
                                dim3(kNormCluster, static_cast<unsigned>(a.m)), dim3(threads / kNormCluster),
                                0, kNormCluster, st, a.x, a.ldx, a.delta, a.ld_delta, a.y, a.ldy, a.n, a.w,
                                a.eps, a.lora_delta, int64_t{0});
}

// Both ops: rows of x (with ADD: plus delta, stored back) normalized into y. delta is null without ADD.
template <bool ADD, bool COMB = false>
void launch(float* x, int64_t ldx, const float* delta, int64_t ld_delta, float* y, int64_t ldy, int64_t m,
            int64_t n, const float* w, float eps, cudaStream_t st, const RowCombine& c = {}) {
  if (m == 0) return;
  const bool vec = n % 4 == 0 && ldx % 4 == 0 && ldy % 4 == 0 && aligned16(x) && aligned16(y) &&
                   aligned16(w) && (!ADD || (ld_delta % 4 == 0 && aligned16(delta)));
  const float* d0 = delta;
  if (n <= kWarpRowMax) {
    for (int64_t r0 = 0; r0 < m; r0 += 65535LL * 32 * kRowsPerBlock) {  // far below grid.x's limit
      int64_t rows = std::min<int64_t>(m - r0, 65535LL * 32 * kRowsPerBlock);
      unsigned blocks = static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
      const float* d = ADD ? d0 + r0 * ld_delta : nullptr;
      if (vec)
        cuda_util::launch_pdl(rms_norm_warp_kernel<true, ADD, COMB>, blocks, 32 * kRowsPerBlock, 0, st,
                              x + r0 * ldx, ldx, d, ld_delta, y + r0 * ldy, ldy, rows, n, w, eps, c, r0);
      else
        cuda_util::launch_pdl(rms_norm_warp_kernel<false, ADD, COMB>, blocks, 32 * kRowsPerBlock, 0, st,
                              x + r0 * ldx, ldx, d, ld_delta, y + r0 * ldy, ldy, rows, n, w, eps, c, r0);
      CUDA_CHECK_LAUNCH();
    }
    return;
  }
  const int threads = row_threads(n, vec);
  for (int64_t r0 = 0; r0 < m; r0 += 65535LL * 32) {  // grid.x limit is 2^31−1; chunk to stay far below
    int64_t rows = m - r0 < 65535LL * 32 ? m - r0 : 65535LL * 32;
    const float* d = ADD ? d0 + r0 * ld_delta : nullptr;
    if (vec)
      cuda_util::launch_pdl(rms_norm_block_kernel<true, ADD, COMB>, static_cast<unsigned>(rows), threads, 0,
                            st, x + r0 * ldx, ldx, d, ld_delta, y + r0 * ldy, ldy, n, w, eps, c, r0);
    else
      cuda_util::launch_pdl(rms_norm_block_kernel<false, ADD, COMB>, static_cast<unsigned>(rows), threads, 0,
                            st, x + r0 * ldx, ldx, d, ld_delta, y + r0 * ldy, ldy, n, w, eps, c, r0);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void rms_norm(const RmsNormArgs& a, const CudaContext& ctx) {
  // Without ADD the kernels only read x; the cast lets both ops share them.
  launch<false>(const_cast<float*>(a.x), a.ldx, nullptr, 0, a.y, a.ldy, a.m, a.n, a.w, a.eps,
                cuda_util::stream(ctx));
}

void add_rms_norm_combined(const AddRmsNormArgs& a, const RowCombine& c, const CudaContext& ctx) {
  KERNEL_CHECK(a.delta == c.out && !a.lora_delta.active() && c.rows != nullptr,
               "add_rms_norm_combined: delta must be the combine's output, without a LoRA term");
  launch<true, true>(a.x, a.ldx, a.delta, a.ld_delta, a.y, a.ldy, a.m, a.n, a.w, a.eps,
                     cuda_util::stream(ctx), c);
}

void add_rms_norm(const AddRmsNormArgs& a, const CudaContext& ctx) {
  if (!a.lora_delta.active())
    return launch<true>(a.x, a.ldx, a.delta, a.ld_delta, a.y, a.ldy, a.m, a.n, a.w, a.eps,
                        cuda_util::stream(ctx));
  if (a.m == 0) return;
  KERNEL_CHECK(a.lora_delta.w.out == a.n, "add_rms_norm: the LoRA's outputs differ from the row size");
  const bool vec = a.n % 4 == 0 && a.ldx % 4 == 0 && a.ldy % 4 == 0 && a.ld_delta % 4 == 0 &&
                   aligned16(a.x) && aligned16(a.y) && aligned16(a.w) && aligned16(a.delta);
  const int threads = row_threads(a.n, vec);
  cudaStream_t st = cuda_util::stream(ctx);
  if (a.m <= kernel_tuning(TuningShape{}).add_norm_lora_cluster_rows && threads % (32 * kNormCluster) == 0) {
    vec ? launch_add_rms_norm_lora_cluster<true>(a, threads, st)
        : launch_add_rms_norm_lora_cluster<false>(a, threads, st);
    return;
  }
  for (int64_t r0 = 0; r0 < a.m; r0 += 65535LL * 32) {
    const int64_t rows = std::min<int64_t>(a.m - r0, 65535LL * 32);
    if (vec)
      cuda_util::launch_pdl(add_rms_norm_lora_kernel<true>, static_cast<unsigned>(rows), threads, 0, st,
                            a.x + r0 * a.ldx, a.ldx, a.delta + r0 * a.ld_delta, a.ld_delta, a.y + r0 * a.ldy,
                            a.ldy, a.n, a.w, a.eps, a.lora_delta, r0);
    else
      cuda_util::launch_pdl(add_rms_norm_lora_kernel<false>, static_cast<unsigned>(rows), threads, 0, st,
                            a.x + r0 * a.ldx, a.ldx, a.delta + r0 * a.ld_delta, a.ld_delta, a.y + r0 * a.ldy,
                            a.ldy, a.n, a.w, a.eps, a.lora_delta, r0);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace polylora::kernels::cuda
