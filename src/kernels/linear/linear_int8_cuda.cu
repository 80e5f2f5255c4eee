// kernels/linear/linear_int8_cuda.cu: CUDA dense products with INT8 weights (--quantization int8,
// tensor_view.h: codes [n, k] and one f32 scale per output row), read as stored: no dequantized copy of the
// weights exists in memory.
// - Few rows (m <= kGemvMaxM, decode): a weight-streaming kernel. A CTA owns kGemvRows output rows (a warp
//   kR of them), streams their codes from HBM with 128-bit loads (16 codes each, widened to f32 in
//   registers) and sums their products with up to kGemvMaxTok activation rows at a time staged in shared
//   memory (kernels/weight_stream.cuh), fp32 accumulation, warp reduction, then the row's scale and bias.
// - Many rows (prefill): a bf16 tensor-core GEMM (mma.sync m16n8k16, f32 accumulation, kernels/mma_util.cuh)
//   over tiles of kBM rows × kBN output columns with a kStages-deep pipeline of BK = 32 slices: x cast once
//   to bf16 into the workspace (cp.async into the stages), the codes dequantized in the K loop (8-byte
//   loads into registers, widened to bf16 exactly, stored into the stage after its MMAs); the row scales
//   multiply the accumulators in the epilogue.
// Activations: with ctx.bf16_split(m) f32 (GEMV) or the hi + lo bf16 pair (GEMM: the K loop runs over both
// copies), else rounded to one bf16, as the bf16 cuBLAS path does, so numerics follow the bf16 model's.
// Must not: depend on anything above common/.
#include "kernels/linear/linear.h"
#include "kernels/mma_util.cuh"
#include "kernels/weight_stream.cuh"

namespace polylora::kernels::cuda {
namespace {

constexpr int64_t kGemvMaxM = 16;  // rows of x up to which the weight-streaming kernel runs
constexpr int kGemvThreads = 256;
constexpr int kGemvRows = stream::kR * (kGemvThreads / 32);  // output rows per CTA
constexpr int kGemvMaxTok = 8;                               // activation rows per pass

constexpr int kThreads = 256;  // GEMM: 8 warps, 2 × 4, each a 32 × 32 warp tile
constexpr int kBM = 64;
constexpr int kBN = 128;
constexpr int kStages = 4;
constexpr int kMI = kBM / 2 / 16;  // m16 fragments per warp
constexpr int kNI = 4;             // n8 fragments per warp
constexpr int kABytes = kBM * mma::kBK * 2;
constexpr int kBBytes = kBN * mma::kBK * 2;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kSmemBytes = kStages * kStageBytes;

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

// One pass of nt (<= TM) activation rows from row tok0: sums, scales, bias, stores.
template <int TM>
__device__ __forceinline__ void gemv_pass(const LinearArgs& a, const char* const (&rows)[stream::kR],
                                          const float (&scales)[stream::kR], int64_t n_first, bool vec,
                                          bool round_bf16, int64_t tok0, int nt, const float* const* s_src,
                                          float* xs) {
  float acc[stream::kR][TM];
#pragma unroll
  for (int r = 0; r < stream::kR; ++r)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;
  stream::accumulate<int8_t, TM>(rows, vec, DType::kI8, a.w.cols, nt, s_src, xs, round_bf16, acc);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < stream::kR; ++r) {
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      const float v = cuda_util::warp_sum(acc[r][t]) * scales[r];
      if (lane == 0 && t < nt && rows[r] != nullptr) {
        const int64_t n = n_first + r;
        a.y[(tok0 + t) * a.ldy + n] = v + (a.bias != nullptr ? a.bias[n] : 0.0f);
      }
    }
  }
}

__global__ void __launch_bounds__(kGemvThreads) int8_gemv_kernel(LinearArgs a, bool vec, bool round_bf16) {
  __shared__ __align__(16) float xs[kGemvMaxTok * stream::kKc];
  __shared__ const float* s_src[kGemvMaxTok];
  const int64_t N = a.w.rows, K = a.w.cols;
  const int warp = threadIdx.x >> 5;
  const int64_t n_first = static_cast<int64_t>(blockIdx.x) * kGemvRows + warp * stream::kR;
  const char* rows[stream::kR];
  float scales[stream::kR];
#pragma unroll
  for (int r = 0; r < stream::kR; ++r) {
    const int64_t n = n_first + r;
    rows[r] = n < N ? static_cast<const char*>(a.w.data) + n * K : nullptr;
    scales[r] = n < N ? a.w.row_scales[n] : 0.0f;
  }
  for (int64_t tok0 = 0; tok0 < a.m; tok0 += kGemvMaxTok) {
    const int nt = static_cast<int>(a.m - tok0 < kGemvMaxTok ? a.m - tok0 : kGemvMaxTok);
    __syncthreads();  // s_src of the previous pass is no longer read
    if (threadIdx.x < nt) s_src[threadIdx.x] = a.x + (tok0 + threadIdx.x) * a.ldx;
    // (published by the barrier at the start of accumulate's first chunk)
    if (nt == 1) {
      gemv_pass<1>(a, rows, scales, n_first, vec, round_bf16, tok0, nt, s_src, xs);
    } else if (nt == 2) {
      gemv_pass<2>(a, rows, scales, n_first, vec, round_bf16, tok0, nt, s_src, xs);
    } else if (nt <= 4) {
      gemv_pass<4>(a, rows, scales, n_first, vec, round_bf16, tok0, nt, s_src, xs);
    } else {
      gemv_pass<8>(a, rows, scales, n_first, vec, round_bf16, tok0, nt, s_src, xs);
    }
  }
}

// out row t: [bf16(x[t]) | (copies 2) bf16(x[t] − bf16(x[t]))], each copy lda wide, columns past k zero.
__global__ void cast_rows_padded_kernel(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t lda,
                                        int copies, __nv_bfloat16* out) {
  const int64_t total = m * lda;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / lda, j = idx % lda;
    const cuda_util::Bf16Pair p = cuda_util::split_bf16(j < k ? x[t * ldx + j] : 0.0f);
    __nv_bfloat16* row = out + t * copies * lda;
    row[j] = p.hi;
    if (copies == 2) row[lda + j] = p.lo;
  }
}

struct GemmParams {
  const __nv_bfloat16* a = nullptr;  // [m, lda]: x as bf16 (cast_rows_padded_kernel)
  int64_t lda = 0;                   // kb_tiles · kBK, or twice that with the split
  int kb_tiles = 0;                  // BK slices of one copy of K (padded)
  int64_t m = 0;
  WeightView w;  // INT8 [N, K]
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
};

__global__ void __launch_bounds__(kThreads) int8_gemm_kernel(GemmParams p) {
  extern __shared__ __align__(128) unsigned char int8_gemm_smem[];
  const int64_t K = p.w.cols, N = p.w.rows;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kBM;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kBN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Each thread copies chunk (tid % 4) of A row tid / 4 and of B rows tid / 4 + 64·i.
  const int ld_chunk = tid & 3, ld_row = tid >> 2;
  const auto* codes = static_cast<const int8_t*>(p.w.data);
  const bool vec = (reinterpret_cast<uintptr_t>(codes) & 7) == 0 && K % 8 == 0;
  const int8_t* b_src[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t n = n0 + ld_row + 64 * i;
    b_src[i] = n < N ? codes + n * K : nullptr;
  }
  const __nv_bfloat16* a_src = m0 + ld_row < p.m ? p.a + (m0 + ld_row) * p.lda : nullptr;
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(int8_gemm_smem));
  const int num_kt = static_cast<int>(p.lda / mma::kBK);
  uint2 pending[2];

  auto load_stage = [&](int stage, int kt) {
    const uint32_t sa = smem_base + stage * kStageBytes;
    const uint32_t sb = sa + kABytes;
    const int64_t ka = static_cast<int64_t>(kt) * mma::kBK + ld_chunk * 8;
    const int64_t k = static_cast<int64_t>(kt % p.kb_tiles) * mma::kBK + ld_chunk * 8;  // B's K index
    mma::cp_async16(sa + mma::swz(ld_row, ld_chunk), a_src != nullptr ? a_src + ka : p.a,
                    a_src != nullptr ? 16 : 0);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (vec) {
        const bool ok = b_src[i] != nullptr && k < K;
        pending[i] = ok ? __ldg(reinterpret_cast<const uint2*>(b_src[i] + k)) : make_uint2(0u, 0u);
      } else {
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t lo = 0, hi = 0;
          if (b_src[i] != nullptr && k + 2 * j < K)
            lo = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(b_src[i][k + 2 * j])));
          if (b_src[i] != nullptr && k + 2 * j + 1 < K)
            hi = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(b_src[i][k + 2 * j + 1])));
          w[j] = lo | (hi << 16);
        }
        mma::st_shared_v4(sb + mma::swz(ld_row + 64 * i, ld_chunk), w);
      }
    }
  };
  auto store_pending = [&](int stage) {
    const uint32_t sb = smem_base + stage * kStageBytes + kABytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t w[4];
      mma::int8x8_to_bf16x8(pending[i].x, pending[i].y, w);
      mma::st_shared_v4(sb + mma::swz(ld_row + 64 * i, ld_chunk), w);
    }
  };

  float acc[kMI][kNI][4];
#pragma unroll
  for (int i = 0; i < kMI; ++i)
#pragma unroll
    for (int j = 0; j < kNI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < num_kt) {
      load_stage(s, s);
      if (vec) store_pending(s);
    }
    mma::cp_async_commit();
  }
  const int wm = warp >> 2, wn = warp & 3;
  for (int kt = 0; kt < num_kt; ++kt) {
    mma::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is visible to all; stage kt − 1 is no longer read
    const int nk = kt + kStages - 1;
    if (nk < num_kt) load_stage(nk % kStages, nk);
    mma::cp_async_commit();
    const uint32_t sa = smem_base + (kt % kStages) * kStageBytes;
    const uint32_t sb = sa + kABytes;
#pragma unroll
    for (int ks = 0; ks < mma::kBK / 16; ++ks) {
      uint32_t af[kMI][4];
      uint32_t bf[kNI][2];
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi) {
        const int r = wm * (kBM / 2) + mi * 16 + (lane & 15);
        mma::ldmatrix_x4(af[mi], sa + mma::swz(r, ks * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int nj = 0; nj < kNI / 2; ++nj) {
        const int r = wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t t[4];
        mma::ldmatrix_x4(t, sb + mma::swz(r, ks * 2 + ((lane >> 3) & 1)));
        bf[2 * nj][0] = t[0];
        bf[2 * nj][1] = t[1];
        bf[2 * nj + 1][0] = t[2];
        bf[2 * nj + 1][1] = t[3];
      }
#pragma unroll
      for (int mi = 0; mi < kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < kNI; ++ni) mma::mma_bf16(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
    // Stage nk's slot was last read in iteration kt − 1 (before this iteration's barrier) and is next read
    // after the barrier of iteration nk.
    if (vec && nk < num_kt) store_pending(nk % kStages);
  }
  mma::cp_async_wait<0>();

  // Epilogue: c0,c1 at (row g, columns 2t, 2t+1), c2,c3 at row g + 8 (g = lane / 4, t = lane % 4).
#pragma unroll
  for (int mi = 0; mi < kMI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = m0 + wm * (kBM / 2) + mi * 16 + (lane >> 2) + h * 8;
      if (row >= p.m) continue;
      float* yrow = p.y + row * p.ldy;
#pragma unroll
      for (int ni = 0; ni < kNI; ++ni) {
        const int64_t n = n0 + wn * 32 + ni * 8 + (lane & 3) * 2;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          if (n + c >= N) continue;
          yrow[n + c] =
              acc[mi][ni][2 * h + c] * p.w.row_scales[n + c] + (p.bias != nullptr ? p.bias[n + c] : 0.0f);
        }
      }
    }
  }
}

bool use_gemv(const LinearArgs& a) {
  return a.m <= kGemvMaxM;
}

}  // namespace

size_t linear_int8_workspace_bytes(const LinearArgs& a, const CudaContext& ctx) {
  if (use_gemv(a)) return 0;
  const int64_t copies = ctx.bf16_split(a.m) ? 2 : 1;
  return static_cast<size_t>(a.m * copies * round_up(a.w.cols, mma::kBK)) * sizeof(__nv_bfloat16);
}

void linear_int8(const LinearArgs& a, const CudaContext& ctx) {
  const int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  KERNEL_CHECK(a.w.dtype == DType::kI8 && a.w.row_scales != nullptr, "linear_int8: weights must be INT8");
  if (m == 0 || n == 0) return;
  cudaStream_t st = cuda_util::stream(ctx);
  const bool split = ctx.bf16_split(m);
  if (use_gemv(a)) {
    const bool vec = (reinterpret_cast<uintptr_t>(a.w.data) & 15) == 0 && k % 16 == 0;
    const auto blocks = static_cast<unsigned>((n + kGemvRows - 1) / kGemvRows);
    KERNEL_CHECK((n + kGemvRows - 1) / kGemvRows < (1LL << 31), "linear_int8: too many output rows");
    int8_gemv_kernel<<<blocks, kGemvThreads, 0, st>>>(a, vec, !split);
    CUDA_CHECK_LAUNCH();
    return;
  }
  KERNEL_CHECK(linear_int8_workspace_bytes(a, ctx) <= ctx.workspace_bytes,
               "linear_int8: workspace too small");
  KERNEL_CHECK((m + kBM - 1) / kBM < (1LL << 31) && (n + kBN - 1) / kBN <= 65535,
               "linear_int8: shape too large for the grid");
  const int64_t lda = round_up(k, mma::kBK);
  const int copies = split ? 2 : 1;
  auto* xb = static_cast<__nv_bfloat16*>(ctx.workspace);
  cast_rows_padded_kernel<<<cuda_util::blocks_for(m * lda, 256, 8192), 256, 0, st>>>(a.x, a.ldx, m, k, lda,
                                                                                     copies, xb);
  CUDA_CHECK_LAUNCH();
  static const bool configured = [] {
    CUDA_CHECK(
        cudaFuncSetAttribute(int8_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)configured;
  GemmParams p;
  p.a = xb;
  p.lda = copies * lda;
  p.kb_tiles = static_cast<int>(lda / mma::kBK);
  p.m = m;
  p.w = a.w;
  p.bias = a.bias;
  p.y = a.y;
  p.ldy = a.ldy;
  dim3 grid(static_cast<unsigned>((m + kBM - 1) / kBM), static_cast<unsigned>((n + kBN - 1) / kBN));
  int8_gemm_kernel<<<grid, kThreads, kSmemBytes, st>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
