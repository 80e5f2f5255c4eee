// kernels/lora/lora_cuda.cu: CUDA dense LoRA over the given rows: one block per row, shrink and expand
// fused (the rank-sized intermediate stays in shared memory).
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/lora/lora_cuda.cuh"
#include "kernels/lora/lora_dense_cuda.cuh"
#include "kernels/lora/lora_fused_cuda.cuh"
#include "kernels/lora/lora_stack_cuda.cuh"
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

// ---- slot-stacked dense LoRA (lora_batch; the tensor-core shrink and expand in lora_dense_mma_cuda.cu) ----

namespace polylora::kernels::cuda {
namespace {

namespace ls = lora_stack;
using lora_dense::dense_key;
using lora_dense::dense_mma_shape;
using lora_dense::DenseMmaShape;
using lora_dense::DenseParams;
using lora_dense::launch_dense_expand_mma;
using lora_dense::launch_dense_shrink_mma;

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

// Whether lora_batch's shrink runs on tensor cores: BF16 stacks, past the per-token shrinks' rows.
bool mma_shrink(const LoraBatchArgs& a) {
  const int64_t from = kernel_tuning({}).lora_dense_shrink_mma_min_rows;
  return a.w[0].dtype == DType::kBF16 && a.m > dense_gemv_shrink_max_rows() && from > 0 && a.m >= from;
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

// lora_batch's shrink: the group's partial sums into p.tmp ([p.splits][m][ranks], p.splits set here) for
// the tokens with LoRA (other rows of tmp are not written). p from dense_params, p.tmp set.
template <typename TW>
void launch_dense_shrinks(const LoraBatchArgs& a, DenseParams<TW>& p, cudaStream_t st) {
  for (int i = 0; i < a.num; ++i) {
    const LoraStack& w = a.w[i];
    KERNEL_CHECK(w.in == p.in && w.slots == p.slots && w.dtype == a.w[0].dtype,
                 "lora_batch: the modules of a group share their input size, slots and dtype");
  }
  const int64_t tiles = (a.m + ls::kTileRows - 1) / ls::kTileRows;
  const int64_t rank_blocks = ls::shrink_rank_blocks(p.first[p.num]);
  const bool gemv = a.m <= dense_gemv_shrink_max_rows();
  const bool tc = mma_shrink(a);
  const DenseMmaShape ms = tc ? dense_mma_shape(a.m, p.first[p.num], p.in) : DenseMmaShape{};
  p.splits = gemv ? 1 : (tc ? ms.splits : ls::shrink_splits(tiles, rank_blocks, p.in));
  KERNEL_CHECK(tiles < (1LL << 31) && rank_blocks < 65535, "lora_batch: shape too large for the grid");
  if (gemv && slot_shrink(a.m)) {
    launch_slot_shrink(p, p.tmp, p.first[p.num], st);
  } else if (gemv) {
    const lora_fused::ShrinkItems items = lora_fused::make_shrink_items(a, p.tmp, p.first[p.num]);
    cuda_util::launch_pdl(lora_shrink_kernel, lora_shrink_blocks(items), kGemvShrinkThreads, 0, st, items);
  } else if (tc) {
    if constexpr (std::is_same_v<TW, __nv_bfloat16>) {
      launch_dense_shrink_mma(p, ms, st);
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
}

template <typename TW>
void launch_lora_batch(const LoraBatchArgs& a, const CudaContext& ctx) {
  DenseParams<TW> p = dense_params<TW>(a);
  int64_t max_out = 0, max_rank = 0;
  for (int i = 0; i < a.num; ++i) {
    max_out = std::max(max_out, a.w[i].out);
    max_rank = std::max(max_rank, a.w[i].rank);
  }
  p.tmp = static_cast<float*>(ctx.workspace);
  const int64_t tiles = (a.m + ls::kTileRows - 1) / ls::kTileRows;
  KERNEL_CHECK(max_out / ls::kExpandThreads < 65535, "lora_batch: shape too large for the grid");
  cudaStream_t st = cuda_util::stream(ctx);
  launch_dense_shrinks(a, p, st);
  if constexpr (std::is_same_v<TW, __nv_bfloat16>) {
    if (mma_expand(a)) {
      launch_dense_expand_mma(p, st);
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

int lora_shrink_partials(const LoraBatchArgs& a, float* tmp, const CudaContext& ctx, const void* x_bf16,
                         int64_t ld_bf16) {
  if (a.m == 0 || a.num == 0) return 1;
  KERNEL_CHECK(a.num >= 1 && a.num <= kMaxLoraGroup, "lora_shrink_partials: 1 to 3 modules per call");
  for (int i = 0; i < a.num; ++i)
    KERNEL_CHECK(!a.w[i].empty() && a.w[i].rank > 0, "lora_shrink_partials: empty module");
  cudaStream_t st = cuda_util::stream(ctx);
  if (a.w[0].dtype == DType::kBF16) {
    DenseParams<__nv_bfloat16> p = dense_params<__nv_bfloat16>(a);
    p.tmp = tmp;
    p.xb = static_cast<const __nv_bfloat16*>(x_bf16);
    p.ldxb = ld_bf16;
    launch_dense_shrinks(a, p, st);
    return p.splits;
  }
  KERNEL_CHECK(a.w[0].dtype == DType::kF32, "lora_shrink_partials: stacks are F32 or BF16");
  DenseParams<float> p = dense_params<float>(a);
  p.tmp = tmp;
  launch_dense_shrinks(a, p, st);
  return p.splits;
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
