// kernels/linear/linear_cuda.cu: CUDA dense products through cuBLAS. Row-major y[m, n] = x[m, k]·W[n, k]ᵀ is
// the column-major product yᵀ = W·xᵀ with W transposed (cuBLAS sees W as a k×n column-major matrix).
// BF16 weights: x is cast to bf16 into the workspace and cublasGemmEx multiplies bf16 × bf16 with f32
// accumulation and f32 output. With ctx.bf16_split(m) x becomes two bf16 matrices, hi = bf16(x) and
// lo = bf16(x − hi), and y = W·hi + W·lo: small products (decode; memory-bound) stack them as 2m rows of one
// GEMM into the workspace and a fold kernel adds the halves (the weights are read once); large ones
// (prefill; compute-bound) run two GEMMs, the second accumulating into y (beta = 1). F32 weights: exact
// fp32 cublasSgemm (the handle's math mode is CUBLAS_DEFAULT_MATH, no TF32). The bias is added by a small
// kernel afterwards (or by the fold). INT8 weights: linear_int8_cuda.cu.
// BF16 weights and at most kStreamMaxRows rows (decode) with the split: a weight-streaming kernel instead
// (linear_stream_kernel: f32 x times the bf16 weights in f32 FMAs, the weights read once at the memory rate,
// bias fused; one launch where the split GEMM took four: cast, GEMM, cuBLAS's split-K reduction, fold). At
// batch 1 on the H200 (GPT-OSS-20B) those four took 15-20 us per projection, ~85 us per layer; with the
// kernel `polylora_bench device` decodes at 299.8 tok/s at batch 1, 249.9 with POLYLORA_LINEAR_STREAM=0 (same
// run). Narrow products split K over the warps of a CTA (stream_slices); the LM head (201,088 x 2,880) runs
// at 4.35 TB/s, q/o_proj (4,096 x 2,880) at ~2 TB/s: too few loads per warp to hide the latency.
#include <cublas_v2.h>

#include <algorithm>
#include <cstdlib>

#include "kernels/cuda_util.cuh"
#include "kernels/linear/linear.h"
#include "kernels/lora/lora_fused_cuda.cuh"
#include "kernels/tuning.h"
#include "kernels/weight_stream.cuh"

#define CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                              \
    cublasStatus_t cublas_check_st_ = (expr);                                                       \
    if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::polylora::check_failed(__FILE__, __LINE__, #expr, cublasGetStatusString(cublas_check_st_)); \
  } while (0)

namespace polylora::kernels::cuda {
namespace {

// out[i, j] = bf16(x[i, j]); with lo != nullptr also lo[i, j] = bf16(x[i, j] − out[i, j]). Rows over the
// grid's y (grid-stride), columns over x; VEC: 8 columns per thread, two 16-byte loads and one 16-byte store
// per output (k and ldx multiples of 8 and 4, 16-byte aligned pointers). The flat loop this replaced (a
// 64-bit division and 2-byte stores per element) took ~1.9x its bytes at prefill (5.8 ms of an 8,192-token
// GPT-OSS-20B step, H100 session 56 trace).
template <bool VEC>
__global__ void cast_rows_bf16_kernel(const float* x, int64_t ldx, int64_t m, int64_t k, __nv_bfloat16* out,
                                      __nv_bfloat16* lo, int64_t ldo) {
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * (VEC ? 8 : 1);
  if (j >= k) return;
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
    if constexpr (VEC) {
      const float4* src = reinterpret_cast<const float4*>(x + i * ldx + j);
      const float4 v0 = src[0], v1 = src[1];
      const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      uint32_t h[4], l[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const cuda_util::Bf16Pair a = cuda_util::split_bf16(v[2 * q]),
                                  b = cuda_util::split_bf16(v[2 * q + 1]);
        h[q] = __bfloat16_as_ushort(a.hi) | (static_cast<uint32_t>(__bfloat16_as_ushort(b.hi)) << 16);
        l[q] = __bfloat16_as_ushort(a.lo) | (static_cast<uint32_t>(__bfloat16_as_ushort(b.lo)) << 16);
      }
      *reinterpret_cast<uint4*>(out + i * ldo + j) = make_uint4(h[0], h[1], h[2], h[3]);
      if (lo != nullptr) *reinterpret_cast<uint4*>(lo + i * ldo + j) = make_uint4(l[0], l[1], l[2], l[3]);
    } else {
      const cuda_util::Bf16Pair p = cuda_util::split_bf16(x[i * ldx + j]);
      out[i * ldo + j] = p.hi;
      if (lo != nullptr) lo[i * ldo + j] = p.lo;
    }
  }
}

constexpr int kRowPassThreads = 256;

// The grid of the row-pass kernels (cast_rows_bf16_kernel, add_bias_kernel): a thread per column unit over
// x, rows over y with ~8 row passes per block at most (enough blocks to fill the GPU).
dim3 row_pass_grid(int64_t units, int64_t m) {
  return dim3(static_cast<unsigned>((units + kRowPassThreads - 1) / kRowPassThreads),
              static_cast<unsigned>(std::clamp<int64_t>((m + 7) / 8, 1, 65535)));
}

// out (and lo) rows ldo values apart (0: k).
void launch_cast_rows_bf16(const float* x, int64_t ldx, int64_t m, int64_t k, __nv_bfloat16* out,
                           __nv_bfloat16* lo, cudaStream_t st, int64_t ldo = 0) {
  if (m == 0 || k == 0) return;
  if (ldo == 0) ldo = k;
  using cuda_util::aligned16;
  const bool vec = k % 8 == 0 && ldx % 4 == 0 && ldo % 8 == 0 && aligned16(x) && aligned16(out) &&
                   (lo == nullptr || aligned16(lo));
  const dim3 grid = row_pass_grid(vec ? k / 8 : k, m);
  if (vec) {
    cast_rows_bf16_kernel<true><<<grid, kRowPassThreads, 0, st>>>(x, ldx, m, k, out, lo, ldo);
  } else {
    cast_rows_bf16_kernel<false><<<grid, kRowPassThreads, 0, st>>>(x, ldx, m, k, out, lo, ldo);
  }
  CUDA_CHECK_LAUNCH();
}

// y[i, j] = halves[i, j] + halves[m + i, j] (+ bias[j]); halves is [2m, n] dense.
__global__ void fold_halves_kernel(const float* halves, int64_t m, int64_t n, const float* bias, float* y,
                                   int64_t ldy) {
  int64_t total = m * n;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = idx / n, j = idx % n;
    float v = halves[idx] + halves[total + idx];
    if (bias != nullptr) v += bias[j];
    y[i * ldy + j] = v;
  }
}

// The streaming kernel: a CTA of 8 warps is 8 / KS row groups of kStreamR rows, the KS warps of a group each
// summing one slice of K (KS > 1 for narrow products: a 512-row k_proj is 32 CTAs at KS = 1). Loads per row
// in flight per lane: stream_u(TM).
constexpr int kStreamThreads = 256;
constexpr int kStreamWarps = kStreamThreads / 32;
constexpr int kStreamR = 2;
constexpr int64_t kStreamMaxRows = 16;  // the largest pass built; the bound in use is tuned (stream_max_rows)
constexpr int stream_u(int tm) {
  return tm <= 2 ? 8 : tm == 4 ? 4 : tm == 8 ? 2 : 1;
}

// Up to kMaxStreamProducts products of the same x streamed by one launch (q, k and v): their rows are
// numbered one after another (product i holds rows first[i] .. first[i + 1] − 1).
constexpr int kMaxStreamProducts = 3;
struct StreamProducts {
  int num = 0;
  const __nv_bfloat16* w[kMaxStreamProducts] = {};
  const float* bias[kMaxStreamProducts] = {};
  float* y[kMaxStreamProducts] = {};
  int64_t ldy[kMaxStreamProducts] = {};
  int64_t first[kMaxStreamProducts + 1] = {};
  __host__ __device__ int64_t rows() const { return first[num]; }
  // The product holding row g (< rows()).
  __device__ __forceinline__ int of(int64_t g) const {
    int i = 0;
#pragma unroll
    for (int j = 1; j < kMaxStreamProducts; ++j)
      if (j < num && g >= first[j]) i = j;
    return i;
  }
  __device__ __forceinline__ const __nv_bfloat16* row(int64_t g, int64_t k) const {
    const int i = of(g);
    return w[i] + (g - first[i]) * k;
  }
  // y[t, row g] = v + its bias.
  __device__ __forceinline__ void store(int64_t t, int64_t g, float v) const {
    const int i = of(g);
    const int64_t r = g - first[i];
    y[i][t * ldy[i] + r] = v + (bias[i] != nullptr ? bias[i][r] : 0.0f);
  }
};

// y[t, n] = Σ_k x[t, k] · W[n, k] (+ bias[n]) for t < m <= TM and every row n of the products; W BF16 [n, k]
// with 16-byte rows, x 16-byte aligned rows, in f32 (what the hi + lo split approximates to ~2^-17; only
// split products take it). With KS > 1 the slices' sums are added in slice order (deterministic; KS depends
// on the products' rows only, not on m).
template <int TM, int KS>
__global__ void __launch_bounds__(kStreamThreads, 2)
    linear_stream_kernel(const float* x, int64_t ldx, int64_t m, StreamProducts pr, int64_t k,
                         lora_fused::ShrinkItems lora) {
  const int64_t n = pr.rows();
  constexpr int kGroups = kStreamWarps / KS;
  constexpr int64_t kRowsPerBlock = kGroups * kStreamR;
  __shared__ float part[KS > 1 ? kStreamWarps * kStreamR * TM : 1];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, group = warp / KS, slice = warp % KS;
  // K slice of this warp: multiples of 8 elements (16-byte weight pieces).
  const int64_t chunk = (k + 8 * KS - 1) / (8 * KS) * 8;
  const int64_t k0 = slice * chunk < k ? slice * chunk : k, kn = (k0 + chunk < k ? k0 + chunk : k) - k0;
  // Launched by launch_pdl: while the kernel before it still runs, the weight slices of this warp's first
  // block go to L2 (weights only; x, y and the LoRA sums wait for pdl_wait).
  if (static_cast<int64_t>(blockIdx.x) * kRowsPerBlock < n) {
    const int64_t n_first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + group * kStreamR;
#pragma unroll
    for (int r = 0; r < kStreamR; ++r) {
      if (n_first + r >= n) break;
      const char* row = reinterpret_cast<const char*>(pr.row(n_first + r, k) + k0);
      for (int64_t off = lane * 128; off < kn * 2; off += 32 * 128) cuda_util::prefetch_l2(row + off);
    }
  }
  cuda_util::pdl_begin();
  const float* xs[TM];
#pragma unroll
  for (int t = 0; t < TM; ++t) xs[t] = x + (t < m ? t : 0) * ldx + k0;
  // Persistent CTAs (the grid is what fits at once): blocks of kRowsPerBlock rows in turn.
  const int64_t blocks = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t n_first = blk * kRowsPerBlock + group * kStreamR;
    const char* rows[kStreamR];
#pragma unroll
    for (int r = 0; r < kStreamR; ++r)
      rows[r] = n_first + r < n ? reinterpret_cast<const char*>(pr.row(n_first + r, k) + k0) : nullptr;
    float acc[kStreamR][TM];
#pragma unroll
    for (int r = 0; r < kStreamR; ++r)
#pragma unroll
      for (int t = 0; t < TM; ++t) acc[r][t] = 0.0f;
    stream::dot_rows_vec<__nv_bfloat16, kStreamR, TM, stream_u(TM)>(rows, kn, xs, false, acc);
#pragma unroll
    for (int r = 0; r < kStreamR; ++r)
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        const float v = cuda_util::warp_sum(acc[r][t]);
        if constexpr (KS > 1) {
          if (lane == 0) part[(warp * kStreamR + r) * TM + t] = v;
        } else if (lane == 0 && t < m && rows[r] != nullptr) {
          pr.store(t, n_first + r, v);
        }
      }
    if constexpr (KS > 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < kGroups * kStreamR * TM; i += kStreamThreads) {
        const int g = i / (kStreamR * TM), r = (i / TM) % kStreamR, t = i % TM;
        const int64_t row = blk * kRowsPerBlock + g * kStreamR + r;
        if (t >= m || row >= n) continue;
        float v = 0.0f;
#pragma unroll
        for (int sl = 0; sl < KS; ++sl) v += part[((g * KS + sl) * kStreamR + r) * TM + t];
        pr.store(t, row, v);
      }
      __syncthreads();  // part is rewritten by the next block
    }
  }
  // A LoRA shrink over the same x (LinearArgs::lora_shrink): its items after the rows, over every warp,
  // from the last CTA down: the persistent CTAs with the highest indices have one row block fewer when the
  // blocks do not divide evenly (q_proj of GPT-OSS-20B at batch 1: 512 blocks on 264 CTAs), so the items
  // fill their idle time instead of lengthening the first CTAs' (ncu, H200: the launch took 19.1 us with
  // the items on CTAs 0-2 against 14.8 without them).
  const int64_t items = lora.items();
  for (int64_t q = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kStreamWarps + warp; q < items;
       q += static_cast<int64_t>(gridDim.x) * kStreamWarps)
    lora_fused::shrink_item(lora, q);
}

// Does the streaming kernel take this product? Split products of up to KernelTuning::linear_stream_max_rows
// rows (at most kStreamMaxRows), unless linear_stream is 0 (POLYLORA_LINEAR_STREAM=0: the split cuBLAS GEMM
// for every BF16 product, for A/B timing and tests).
bool streamed(const LinearArgs& a, bool split) {
  const KernelTuning t = kernel_tuning(TuningShape{});
  return split && t.linear_stream != 0 && a.w.dtype == DType::kBF16 &&
         a.m <= std::min<int64_t>(kStreamMaxRows, t.linear_stream_max_rows) && a.w.cols % 8 == 0 &&
         a.ldx % 4 == 0 && cuda_util::aligned16(a.w.data) && cuda_util::aligned16(a.x);
}

// K slices per row group (1, 2, 4 or 8; from n alone, so a product's sums do not depend on the batch size).
// The busiest persistent CTA streams ceil(blocks / CTAs that fit) row blocks of 16 / KS rows; more slices
// mean smaller blocks dealt more evenly, at the price of a reduction through shared memory, so a larger KS
// is taken only where it lowers that CTA's rows by more than a tenth: q, k and v together (5,120 rows for
// GPT-OSS-20B) 32 -> 20 rows at KS 4, o_proj (2,880) 16 -> 12 at KS 4 (it took KS 2 before, dealing 360
// blocks of 8 rows over 264 CTAs: the busiest did two), a 512-row k_proj 16 -> 2 at KS 8; the LM head
// (201,088 rows) stays at KS 1 (768 vs 762).
int stream_slices(int64_t n) {
  const int64_t fit = 2 * static_cast<int64_t>(cuda_util::num_sms());
  const auto load = [&](int ks) {
    const int64_t rows_per_block = kStreamR * (kStreamWarps / ks);
    const int64_t blocks = (n + rows_per_block - 1) / rows_per_block;
    return (blocks + fit - 1) / fit * rows_per_block;
  };
  int best = 1;
  int64_t best_load = load(1);
  for (int ks : {2, 4, 8})
    if (10 * load(ks) < 9 * best_load) best = ks, best_load = load(ks);
  return best;
}

// The products of `group` (one, or several sharing x, m and K) in one launch; the LoRA shrink items of the
// one that has them.
template <int TM, int KS>
void launch_stream_ks(const LinearArgs* group, int64_t count, cudaStream_t st) {
  constexpr int64_t rows_per_cta = kStreamR * (kStreamWarps / KS);
  const LinearArgs& a = group[0];
  StreamProducts pr;
  lora_fused::ShrinkItems lora;
  for (int64_t gi = 0; gi < count; ++gi) {
    const LinearArgs& g = group[gi];
    pr.w[pr.num] = static_cast<const __nv_bfloat16*>(g.w.data);
    pr.bias[pr.num] = g.bias;
    pr.y[pr.num] = g.y;
    pr.ldy[pr.num] = g.ldy;
    pr.first[pr.num + 1] = pr.first[pr.num] + g.w.rows;
    ++pr.num;
    if (g.lora_shrink != nullptr)
      lora = lora_fused::make_shrink_items(*g.lora_shrink, g.lora_tmp, g.lora_ld_tmp);
  }
  // Persistent: at most the CTAs that fit at once (2 per SM by the launch bounds).
  const int64_t fit = 2 * static_cast<int64_t>(cuda_util::num_sms());
  const int64_t want = std::max((pr.rows() + rows_per_cta - 1) / rows_per_cta,
                                (lora.items() + kStreamWarps - 1) / kStreamWarps);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(want, fit));
  cuda_util::launch_pdl(linear_stream_kernel<TM, KS>, blocks, kStreamThreads, 0, st, a.x, a.ldx, a.m, pr,
                        a.w.cols, lora);
  CUDA_CHECK_LAUNCH();
}

template <int TM>
void launch_stream(const LinearArgs* group, int64_t count, cudaStream_t st) {
  int64_t rows = 0;
  for (int64_t gi = 0; gi < count; ++gi) rows += group[gi].w.rows;
  switch (stream_slices(rows)) {
    case 1:
      return launch_stream_ks<TM, 1>(group, count, st);
    case 2:
      return launch_stream_ks<TM, 2>(group, count, st);
    case 4:
      return launch_stream_ks<TM, 4>(group, count, st);
    default:
      return launch_stream_ks<TM, 8>(group, count, st);
  }
}

// One streamed launch for a group (every product streamed, m rows).
void launch_stream_group(const LinearArgs* group, int64_t count, cudaStream_t st) {
  const int64_t m = group[0].m;
  if (m == 1) return launch_stream<1>(group, count, st);
  if (m == 2) return launch_stream<2>(group, count, st);
  if (m <= 4) return launch_stream<4>(group, count, st);
  if (m <= 8) return launch_stream<8>(group, count, st);
  return launch_stream<16>(group, count, st);
}

// Split products of at most this many rows, with at most kStackedMaxBytes of f32 halves, stack hi and lo
// into one GEMM; others run two.
constexpr int64_t kStackedMaxRows = 64;
constexpr int64_t kStackedMaxBytes = int64_t{64} << 20;

bool stacked(int64_t m, int64_t n) {
  return m <= kStackedMaxRows && 2 * m * n * static_cast<int64_t>(sizeof(float)) <= kStackedMaxBytes;
}

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

// y[i, j] += bias[j]: rows over the grid's y (grid-stride), columns over x; VEC: 4 columns per thread
// (n, ldy and both pointers 4-float aligned). No division per element: the 64-bit index split of the flat
// loop this replaced made it ~1.4x the time of its y traffic at prefill (5.4 ms of an 8,192-token GPT-OSS-20B
// step for q/k/v/o and the router, H100 session 56 trace; bytes ~3.8 ms).
template <bool VEC>
__global__ void add_bias_kernel(float* y, int64_t ldy, int64_t m, int64_t n, const float* bias) {
  cuda_util::pdl_begin();  // launched by launch_pdl (cuda_util.cuh)
  const int64_t cols = VEC ? n / 4 : n;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  if constexpr (VEC) {
    const float4 b = reinterpret_cast<const float4*>(bias)[j];
    for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
      float4* p = reinterpret_cast<float4*>(y + i * ldy) + j;
      float4 v = *p;
      v.x += b.x;
      v.y += b.y;
      v.z += b.z;
      v.w += b.w;
      *p = v;
    }
  } else {
    const float b = bias[j];
    for (int64_t i = blockIdx.y; i < m; i += gridDim.y) y[i * ldy + j] += b;
  }
}

// y += bias, when the product has one.
void add_bias(const LinearArgs& a, cudaStream_t st) {
  if (a.bias == nullptr || a.m == 0) return;
  const int64_t n = a.w.rows;
  const bool vec = n % 4 == 0 && a.ldy % 4 == 0 && cuda_util::aligned16(a.y) && cuda_util::aligned16(a.bias);
  const dim3 grid = row_pass_grid(vec ? n / 4 : n, a.m);  // each thread's bias read once
  if (vec) {
    cuda_util::launch_pdl(add_bias_kernel<true>, grid, kRowPassThreads, 0, st, a.y, a.ldy, a.m, n, a.bias);
  } else {
    cuda_util::launch_pdl(add_bias_kernel<false>, grid, kRowPassThreads, 0, st, a.y, a.ldy, a.m, n, a.bias);
  }
  CUDA_CHECK_LAUNCH();
}

// The extended rows' columns past k (LinearLoraExtArgs): the scaled shrink sums at the token's slot's
// columns of each module, 1 at the bias columns, 0 elsewhere. A thread per column (its module, slot and
// rank found once), rows over the grid's y.
struct ExtPack {
  __nv_bfloat16* xe = nullptr;
  int64_t ld = 0, m = 0, k = 0;
  const int32_t* token_slots = nullptr;
  int64_t slots = 0;
  const float* tmp = nullptr;  // [splits][m][ranks]
  int64_t ranks = 0;
  int splits = 1;
  int num = 0;
  int64_t tail[kMaxLoraGroup] = {}, rank[kMaxLoraGroup] = {}, first[kMaxLoraGroup] = {};
  const float* scale[kMaxLoraGroup] = {};
  int64_t bias_col = -1;
};

__global__ void ext_pack_kernel(ExtPack p) {
  const int64_t c = p.k + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= p.ld) return;
  int mod = -1;
  int64_t cs = -1, r = 0;
  for (int i = 0; i < p.num; ++i) {
    if (c >= p.tail[i] && c < p.tail[i] + p.slots * p.rank[i]) {
      mod = i;
      cs = (c - p.tail[i]) / p.rank[i];
      r = (c - p.tail[i]) % p.rank[i];
    }
  }
  const bool bias = p.bias_col >= 0 && (c == p.bias_col || c == p.bias_col + 1);
  const int64_t split_stride = p.m * p.ranks;
  for (int64_t t = blockIdx.y; t < p.m; t += gridDim.y) {
    float v = bias ? 1.0f : 0.0f;
    if (mod >= 0 && p.token_slots[t] == cs) {
      const float sc = p.scale[mod][cs];
      if (sc != 0.0f) {
        const float* q = p.tmp + t * p.ranks + p.first[mod] + r;
        float sum = 0.0f;
        for (int z = 0; z < p.splits; ++z) sum += q[z * split_stride];
        v = sc * sum;
      }
    }
    p.xe[t * p.ld + c] = __float2bfloat16_rn(v);
  }
}

}  // namespace

size_t linear_workspace_bytes(const LinearArgs& a, const CudaContext& ctx) {
  if (a.w.int8()) return linear_int8_workspace_bytes(a, ctx);
  if (a.w.dtype != DType::kBF16) return 0;
  size_t x_bytes = align256(static_cast<size_t>(a.m * a.w.cols) * sizeof(__nv_bfloat16));
  if (streamed(a, ctx.bf16_split(a.m))) return 0;
  if (!ctx.bf16_split(a.m)) return x_bytes;
  size_t halves = stacked(a.m, a.w.rows) ? static_cast<size_t>(2 * a.m * a.w.rows) * sizeof(float) : 0;
  return 2 * x_bytes + halves;
}

namespace {

// x as bf16 for cuBLAS: hi [m, k] at the workspace's start and (split) lo [m, k] right after it, so hi;lo
// is one [2m, k] matrix; the f32 halves of a stacked product follow (linear_workspace_bytes).
struct CastX {
  __nv_bfloat16* hi = nullptr;
  __nv_bfloat16* lo = nullptr;
};

CastX cast_x(const LinearArgs& a, bool split, const CudaContext& ctx) {
  const int64_t m = a.m, k = a.w.cols;
  KERNEL_CHECK(linear_workspace_bytes(a, ctx) <= ctx.workspace_bytes, "linear: workspace too small");
  CastX c;
  c.hi = static_cast<__nv_bfloat16*>(ctx.workspace);
  c.lo = split ? c.hi + m * k : nullptr;
  launch_cast_rows_bf16(a.x, a.ldx, m, k, c.hi, c.lo, cuda_util::stream(ctx));
  return c;
}

// The BF16 product through cuBLAS from x already cast (cast_x of this or of a product over the same x),
// bias included.
void bf16_product(const LinearArgs& a, bool split, const CastX& c, const CudaContext& ctx) {
  const int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  cudaStream_t st = cuda_util::stream(ctx);
  auto handle = static_cast<cublasHandle_t>(ctx.cublas);
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&](const __nv_bfloat16* xs, int64_t rows, const float* beta, float* y, int64_t ldy) {
    CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(rows),
                              static_cast<int>(k), &one, a.w.data, CUDA_R_16BF, static_cast<int>(k), xs,
                              CUDA_R_16BF, static_cast<int>(k), beta, y, CUDA_R_32F, static_cast<int>(ldy),
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  if (!split) {
    gemm(c.hi, m, &zero, a.y, a.ldy);
  } else if (stacked(m, n)) {
    const size_t x_bytes = static_cast<size_t>(m * k) * sizeof(__nv_bfloat16);
    auto* halves = reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) + 2 * align256(x_bytes));
    gemm(c.hi, 2 * m, &zero, halves, n);
    fold_halves_kernel<<<cuda_util::blocks_for(m * n, 256, 8192), 256, 0, st>>>(halves, m, n, a.bias, a.y,
                                                                                a.ldy);
    CUDA_CHECK_LAUNCH();
    return;  // bias added by the fold
  } else {
    gemm(c.hi, m, &zero, a.y, a.ldy);
    gemm(c.lo, m, &one, a.y, a.ldy);
  }
  add_bias(a, st);
}

void linear_product(const LinearArgs& a, const CudaContext& ctx) {
  const int64_t m = a.m, n = a.w.rows, k = a.w.cols;
  if (m == 0 || n == 0) return;
  KERNEL_CHECK(m < (1LL << 31) && n < (1LL << 31) && k < (1LL << 31),
               "linear: dimension too large for cuBLAS");
  cudaStream_t st = cuda_util::stream(ctx);
  auto handle = static_cast<cublasHandle_t>(ctx.cublas);
  const float one = 1.0f, zero = 0.0f;
  switch (a.w.dtype) {
    case DType::kBF16: {
      const bool split = ctx.bf16_split(m);
      if (streamed(a, split)) return launch_stream_group(&a, 1, st);
      return bf16_product(a, split, cast_x(a, split, ctx), ctx);
    }
    case DType::kF32:
      CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                               static_cast<int>(k), &one, static_cast<const float*>(a.w.data),
                               static_cast<int>(k), a.x, static_cast<int>(a.ldx), &zero, a.y,
                               static_cast<int>(a.ldy)));
      break;
    case DType::kI8:
      linear_int8(a, ctx);
      return;  // bias added by its kernels
    case DType::kF16:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      KERNEL_CHECK(false, "linear: CUDA weights must be BF16 or F32 (matrix_from_host converts them)");
  }
  add_bias(a, st);
}

// A product's LoRA shrink (LinearArgs::lora_shrink) reads the product's own x.
void check_shrink_input(const LinearArgs& a) {
  KERNEL_CHECK(a.lora_shrink->x == a.x && a.lora_shrink->ldx == a.ldx && a.lora_shrink->m == a.m,
               "linear: the LoRA shrink must read the product's x");
}

// Whether a group that does not stream in one launch can still share one cast of its x (q/k/v at prefill:
// the input cast once instead of once per product): BF16 products through cuBLAS of the same x and K.
bool shares_cast(const LinearArgs* group, int64_t count, const CudaContext& ctx) {
  if (count < 2 || kernel_tuning(TuningShape{}).linear_group_shared_cast == 0) return false;
  const LinearArgs& a = group[0];
  if (a.m == 0 || a.m >= (1LL << 31) || a.w.cols >= (1LL << 31)) return false;
  const bool split = ctx.bf16_split(a.m);
  for (int64_t gi = 0; gi < count; ++gi) {
    const LinearArgs& g = group[gi];
    if (g.w.dtype != DType::kBF16 || g.x != a.x || g.ldx != a.ldx || g.m != a.m || g.w.cols != a.w.cols ||
        g.w.rows == 0 || g.w.rows >= (1LL << 31) || streamed(g, split))
      return false;
  }
  return true;
}

// Whether a product's LoRA shrink (a launch of its own, past the streamed rows) runs beside the product on
// ctx's side stream (KernelTuning::lora_shrink_beside_product): it reads only x and writes only its tmp,
// which the product neither reads nor writes.
bool shrink_beside(const CudaContext& ctx) {
  return kernel_tuning(TuningShape{}).lora_shrink_beside_product != 0 && cuda_util::has_side_stream(ctx);
}

}  // namespace

void linear(const LinearArgs& a, const CudaContext& ctx) {
  if (a.lora_shrink != nullptr) {
    check_shrink_input(a);
    if (a.m > 0 && a.w.rows > 0 && streamed(a, ctx.bf16_split(a.m))) return linear_product(a, ctx);
    if (shrink_beside(ctx)) {
      return cuda_util::run_beside(
          ctx, [&](const CudaContext& side) { lora_shrink(*a.lora_shrink, a.lora_tmp, a.lora_ld_tmp, side); },
          [&] { linear_product(a, ctx); });
    }
    linear_product(a, ctx);
    return lora_shrink(*a.lora_shrink, a.lora_tmp, a.lora_ld_tmp, ctx);
  }
  linear_product(a, ctx);
}

bool linear_group_fused(const LinearArgs* group, int64_t count, const CudaContext& ctx) {
  if (count < 2 || count > kMaxStreamProducts) return false;
  const LinearArgs& a = group[0];
  if (a.m == 0 || !streamed(a, ctx.bf16_split(a.m))) return false;
  int shrinks = 0;
  for (int64_t gi = 0; gi < count; ++gi) {
    const LinearArgs& g = group[gi];
    if (g.x != a.x || g.ldx != a.ldx || g.m != a.m || g.w.cols != a.w.cols || g.w.rows == 0 ||
        !streamed(g, ctx.bf16_split(g.m)))
      return false;
    if (g.lora_shrink != nullptr) {
      check_shrink_input(g);
      ++shrinks;
    }
  }
  return shrinks <= 1;
}

void linear_group(const LinearArgs* group, int64_t count, const CudaContext& ctx) {
  if (linear_group_fused(group, count, ctx)) return launch_stream_group(group, count, cuda_util::stream(ctx));
  if (shares_cast(group, count, ctx)) {
    // One cast of x for every product (each product's stacked halves, if any, follow it in the workspace;
    // the products run one after another on the stream), then each product's LoRA shrink as linear does.
    // With lora_shrink_beside_product, every shrink of the group beside the cast and the products.
    const bool split = ctx.bf16_split(group[0].m);
    bool any_shrink = false;
    for (int64_t gi = 0; gi < count; ++gi) {
      KERNEL_CHECK(linear_workspace_bytes(group[gi], ctx) <= ctx.workspace_bytes,
                   "linear: workspace too small");
      if (group[gi].lora_shrink != nullptr) {
        check_shrink_input(group[gi]);
        any_shrink = true;
      }
    }
    if (any_shrink && shrink_beside(ctx)) {
      cuda_util::run_beside(
          ctx,
          [&](const CudaContext& side) {
            for (int64_t gi = 0; gi < count; ++gi)
              if (group[gi].lora_shrink != nullptr)
                lora_shrink(*group[gi].lora_shrink, group[gi].lora_tmp, group[gi].lora_ld_tmp, side);
          },
          [&] {
            const CastX c = cast_x(group[0], split, ctx);
            for (int64_t gi = 0; gi < count; ++gi) bf16_product(group[gi], split, c, ctx);
          });
      return;
    }
    const CastX c = cast_x(group[0], split, ctx);
    for (int64_t gi = 0; gi < count; ++gi) {
      const LinearArgs& g = group[gi];
      bf16_product(g, split, c, ctx);
      if (g.lora_shrink != nullptr) lora_shrink(*g.lora_shrink, g.lora_tmp, g.lora_ld_tmp, ctx);
    }
    return;
  }
  for (int64_t gi = 0; gi < count; ++gi) linear(group[gi], ctx);
}

size_t linear_lora_ext_workspace_bytes(const LinearLoraExtArgs& a) {
  const size_t xe = align256(static_cast<size_t>(a.m * a.w.cols) * sizeof(__nv_bfloat16));
  return xe + (a.shrink.num > 0 ? lora_batch_workspace_bytes(a.shrink) : 0);
}

void linear_lora_ext(const LinearLoraExtArgs& a, const CudaContext& ctx) {
  const int64_t m = a.m, n = a.w.rows, cols = a.w.cols;
  if (m == 0 || n == 0) return;
  KERNEL_CHECK(a.w.dtype == DType::kBF16 && cols % 8 == 0 && a.k > 0 && a.k <= cols,
               "linear_lora_ext: BF16 weights of k columns and their tails (a multiple of 8 columns)");
  KERNEL_CHECK(m < (1LL << 31) && n < (1LL << 31) && cols < (1LL << 31),
               "linear_lora_ext: dimension too large for cuBLAS");
  KERNEL_CHECK(a.bias_col < 0 || (a.bias_col >= a.k && a.bias_col + 2 <= cols),
               "linear_lora_ext: the bias columns lie past k, inside the rows");
  const LoraBatchArgs& g = a.shrink;
  ExtPack p{.xe = static_cast<__nv_bfloat16*>(ctx.workspace),
            .ld = cols,
            .m = m,
            .k = a.k,
            .token_slots = g.token_slots,
            .slots = g.num > 0 ? g.w[0].slots : 0,
            .num = g.num,
            .bias_col = a.bias_col};
  for (int i = 0; i < g.num; ++i) {
    KERNEL_CHECK(g.w[i].rank > 0 && a.tail[i] >= a.k && a.tail[i] + g.w[i].slots * g.w[i].rank <= cols,
                 "linear_lora_ext: each module's tails lie past k, inside the rows");
    p.tail[i] = a.tail[i];
    p.rank[i] = g.w[i].rank;
    p.first[i] = p.ranks;
    p.scale[i] = g.w[i].scale;
    p.ranks += g.w[i].rank;
  }
  KERNEL_CHECK(g.num == 0 || (g.x == a.x && g.ldx == a.ldx && g.m == m),
               "linear_lora_ext: the shrink must read the product's x");
  KERNEL_CHECK(linear_lora_ext_workspace_bytes(a) <= ctx.workspace_bytes,
               "linear_lora_ext: workspace too small");
  cudaStream_t st = cuda_util::stream(ctx);
  auto* tmp = reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) +
                                       align256(static_cast<size_t>(m * cols) * sizeof(__nv_bfloat16)));
  // x into the extended rows first: the tensor-core shrink reads it there (one bf16 part).
  launch_cast_rows_bf16(a.x, a.ldx, m, a.k, p.xe, nullptr, st, cols);
  if (g.num > 0) {
    p.tmp = tmp;
    p.splits = lora_shrink_partials(g, tmp, ctx, p.xe, cols);
  }
  if (cols > a.k) {
    ext_pack_kernel<<<row_pass_grid(cols - a.k, m), kRowPassThreads, 0, st>>>(p);
    CUDA_CHECK_LAUNCH();
  }
  const float one = 1.0f, zero = 0.0f;
  CUBLAS_CHECK(cublasGemmEx(static_cast<cublasHandle_t>(ctx.cublas), CUBLAS_OP_T, CUBLAS_OP_N,
                            static_cast<int>(n), static_cast<int>(m), static_cast<int>(cols), &one, a.w.data,
                            CUDA_R_16BF, static_cast<int>(cols), p.xe, CUDA_R_16BF, static_cast<int>(cols),
                            &zero, a.y, CUDA_R_32F, static_cast<int>(a.ldy), CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

}  // namespace polylora::kernels::cuda
