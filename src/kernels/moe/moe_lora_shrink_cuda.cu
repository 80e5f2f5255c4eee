// kernels/moe/moe_lora_shrink_cuda.cu: the slot-stacked expert LoRA's shrinks (x · Aᵀ of gate/up, act · Aᵀ
// of down) in each kernel a path and size call for: tiled by 8 sorted rows with split-K, by sorted row, by
// group of same-key rows through a cp.async pipeline, or as weight-streaming items of the GEMV path
// (moe_lora_stack_impl.cuh; the dispatcher is moe_lora_stack_cuda.cu). docs/multi-lora-kernels.md has the
// measurements behind each choice. Must not: allocate; synchronize.
#include "kernels/moe/moe_lora_stack_impl.cuh"

namespace polylora::kernels::cuda::moe_stack {
namespace {

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

// The shrink by group of sorted rows through a cp.async pipeline (tuning moe_lora_shrink_group = G > 0;
// prepared in session 37, compiled, not yet run on a GPU, so off by default). A group: up to G consecutive
// sorted rows with the same key, starting where the key changes or at a multiple of G (delta_key, as the
// cluster kernel's groups: every CTA decides alone whether its row starts one; the others exit at once). Its
// CTA streams the key's A once for all the group's rows (moe_lora_shrink_rows_kernel reads it once per row:
// at M = 256, ~4 rows per key, 188 MB of L2 reads for 45 MB of A) in stages of kSgRankRows rank rows x
// kSgK inputs, with the rows' inputs, kSgStages deep through cp.async (the loads in flight are shared
// memory, not registers: ~48 KB per CTA instead of the by-row kernel's ~40 B per thread). Thread t takes
// rank row t / 8 of the stage and the 8-element pieces t % 8 + 8q (a quarter warp reads 128 contiguous
// bytes of A, but its input pieces 32 bytes apart: bank conflicts, see KM below); the 8 partial sums of a
// rank row meet by shuffles (fixed order).
// Needs K % 8 == 0 and 16-byte aligned A, input rows and row stride (launch_group_shrink checks; otherwise
// the by-row kernel runs). Same outputs as the by-row kernel (rows without LoRA store nothing).
constexpr int kSgThreads = 256;
constexpr int kSgRankRows = 32;
constexpr int kSgK = 256;
constexpr int kSgStages = 3;

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

// 4 weights from shared memory (8- or 16-byte aligned) as f32.
__device__ __forceinline__ void smem4(const float* w, float* v) {
  const float4 a = *reinterpret_cast<const float4*>(w);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
__device__ __forceinline__ void smem4(const __nv_bfloat16* w, float* v) {
  const uint2 u = *reinterpret_cast<const uint2*>(w);
  v[0] = __uint_as_float(u.x << 16);
  v[1] = __uint_as_float(u.x & 0xffff0000u);
  v[2] = __uint_as_float(u.y << 16);
  v[3] = __uint_as_float(u.y & 0xffff0000u);
}

// One step of warp_transpose_sum32: lanes with bit H keep the upper H of their 2H values and send the lower
// H, the others the reverse; each kept value adds its partner's sent one.
template <int H>
__device__ __forceinline__ void transpose_sum_step(float (&v)[32], int lane) {
  const bool upper = (lane & H) != 0;
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float send = upper ? v[i] : v[i + H];
    const float keep = upper ? v[i + H] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, H);
  }
}

// The sums over a warp's 32 lanes of each lane's 32 values v[0..31], by a butterfly that halves the values
// at every step (31 shuffles instead of 5 per value): lane l ends with the total of value l in v[0]. Fixed
// order (deterministic).
__device__ __forceinline__ float warp_transpose_sum32(float (&v)[32]) {
  const int lane = threadIdx.x & 31;
  transpose_sum_step<16>(v, lane);
  transpose_sum_step<8>(v, lane);
  transpose_sum_step<4>(v, lane);
  transpose_sum_step<2>(v, lane);
  transpose_sum_step<1>(v, lane);
  return v[0];
}

// KM (tuning moe_lora_shrink_group_kmajor): the stage's products split by k instead of by rank row. By
// rank row (KM false), thread t takes rank row t / 8 and every row of the group reads its input pieces again
// per rank row (ncu, H100, M = 256: 7.2-way shared-memory bank conflicts on those reads, the FMAs waiting
// on them, 78-92 us per call). K-major: warp w takes rank rows 4w..4w+3, lane l the inputs 4l..4l+3 and
// 128+4l..128+4l+3 of the stage (a warp reads each A row and each input row once, 16 contiguous bytes per
// lane: no conflicts), the 32 sums per lane (4 rank rows x up to 8 rows) meet by warp_transpose_sum32.
template <typename TW, bool KM>
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
    constexpr int kRowsPerWarp = kSgRankRows / (kSgThreads / 32);
    static_assert(kRowsPerWarp * kSgMaxGroup == 32 && kSgK == 256, "warp_transpose_sum32: 32 sums per lane");
    float acc[KM ? 32 : kSgMaxGroup];  // KM: [rank row r of the warp's][group row g] at r · 8 + g
#pragma unroll
    for (int i = 0; i < (KM ? 32 : kSgMaxGroup); ++i) acc[i] = 0.0f;
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
      const float* xs = reinterpret_cast<const float*>(sa + kSgRankRows * kSgK * sizeof(TW));
      if constexpr (KM) {
        const int w = tid >> 5, l = tid & 31;
        // One rank row's A values in registers at a time (79 registers: 3 CTAs per SM, as the shared memory).
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
          const TW* as = reinterpret_cast<const TW*>(sa) + (w * kRowsPerWarp + r) * kSgK;
          float wv[8];
          smem4(as + 4 * l, wv);
          smem4(as + 128 + 4 * l, wv + 4);
#pragma unroll
          for (int g = 0; g < kSgMaxGroup; ++g) {
            if (g >= n) break;
            float xv[8];
            smem4(xs + g * kSgK + 4 * l, xv);
            smem4(xs + g * kSgK + 128 + 4 * l, xv + 4);
            float s = acc[r * kSgMaxGroup + g];
#pragma unroll
            for (int e = 0; e < 8; ++e) s = fmaf(wv[e], xv[e], s);
            acc[r * kSgMaxGroup + g] = s;
          }
        }
      } else {
        const TW* as = reinterpret_cast<const TW*>(sa) + j * kSgK;
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
    }
    mma::cp_async_wait<0>();
    __syncthreads();  // the next rank block refills the stages
    if constexpr (KM) {
      const int l = tid & 31;
      const float total =
          warp_transpose_sum32(acc);  // value l: rank row l / 8 of the warp's, group row l % 8
      const int g = l % kSgMaxGroup;
      const int64_t jr = jb + (tid >> 5) * kRowsPerWarp + l / kSgMaxGroup;
      if (g < n && jr < GR) s_o[g][jr] = total;
    } else {
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
}
// Launches moe_lora_shrink_group_kernel with groups of G rows when the shapes allow it (false: they do not,
// the caller runs the by-row kernel).
template <typename TW, bool KM>
void launch_group_shrink_kernel(int G, const StackParams<TW>& p, const float* in, int64_t ld_in, float* out,
                                bool down, int64_t rows, cudaStream_t st) {
  static const bool configured = [] {
    prefer_max_shared(moe_lora_shrink_group_kernel<TW, KM>);
    CUDA_CHECK(cudaFuncSetAttribute(moe_lora_shrink_group_kernel<TW, KM>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kSgStages * sg_stage_bytes<TW>(kSgMaxGroup)));
    return true;
  }();
  (void)configured;
  const size_t smem = static_cast<size_t>(kSgStages) * sg_stage_bytes<TW>(G);
  cuda_util::launch_pdl(moe_lora_shrink_group_kernel<TW, KM>, dim3(static_cast<unsigned>(rows)), kSgThreads,
                        smem, st, p, in, ld_in, out, down, G);
}

template <typename TW>
bool launch_group_shrink(int G, bool kmajor, const StackParams<TW>& p, const StackBuffers& ws,
                         const MoeExpertsArgs& a, const MoeLoraStack& s, bool down, cudaStream_t st) {
  const float* in = down ? static_cast<const float*>(ws.act) : a.x;
  const int64_t ld_in = down ? a.inter : a.ldx, K = down ? a.inter : a.hidden;
  const void* A = down ? s.a_down : s.a_gu;
  if (G < 1 || K % 8 != 0 || ld_in % 4 != 0 || (reinterpret_cast<uintptr_t>(in) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(A) & 15) != 0)
    return false;
  G = std::min(G, kSgMaxGroup);
  float* out = down ? ws.lora_down : ws.lora_gu;
  if (kmajor) {
    launch_group_shrink_kernel<TW, true>(G, p, in, ld_in, out, down, ws.max_rows, st);
  } else {
    launch_group_shrink_kernel<TW, false>(G, p, in, ld_in, out, down, ws.max_rows, st);
  }
  return true;
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

}  // namespace

// Do the shrinks run by sorted row (moe_lora_shrink_rows_kernel) or by group of same-key rows? On the
// tile_m 1 paths whenever they are not items of the products (shrinks_fused), for up to moe_lora_by_row
// sorted rows (above, and with 0, the item or tiled shrinks), or for any number with the group kernel
// (moe_lora_shrink_group > 0). On the grouped-GEMM paths (tile_m > 1: an expert's rows padded to whole
// tiles, the padding rows exit at once) only by group, with moe_lora_gemm_group_shrink.
bool row_shrink(const KernelTuning& t, const StackBuffers& b) {
  if (b.shrinks_fused) return false;
  if (b.tile_m == 1) return b.max_rows <= t.moe_lora_by_row || t.moe_lora_shrink_group > 0;
  return t.moe_lora_gemm_group_shrink != 0 && t.moe_lora_shrink_group > 0;
}

template <typename TW>
void launch_shrink_step(bool down, const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                        const KernelTuning& t, cudaStream_t st) {
  const MoeLoraStack& s = a.lora_stack;
  if (row_shrink(t, ws)) {
    if (!launch_group_shrink<TW>(static_cast<int>(t.moe_lora_shrink_group),
                                 t.moe_lora_shrink_group_kmajor != 0, p, ws, a, s, down, st))
      launch_row_shrink<TW>(p, ws, a, s, down, st);
    return;
  }
  if (gemv_shrink(a, ws)) {
    if (ws.shrinks_fused) return;
    if (down) {
      launch_gemv_shrink<Phase::kDown>(a, ws, st);
    } else {
      launch_gemv_shrink<Phase::kGateUp>(a, ws, st);
    }
    return;
  }
  const auto tiles = static_cast<unsigned>((ws.max_rows + ls::kTileRows - 1) / ls::kTileRows);
  const moe_detail::StackSplits sp = moe_detail::stack_splits(a, ws.max_rows);
  const dim3 grid(tiles, static_cast<unsigned>(ls::shrink_rank_blocks(down ? s.rank : s.gu_slices * s.rank)),
                  static_cast<unsigned>(down ? sp.down : sp.gu));
  launch_stack_shrink<TW>(grid, st, p, down ? static_cast<const float*>(ws.act) : a.x, down ? a.inter : a.ldx,
                          down ? ws.lora_down : ws.lora_gu, down);
}

template void launch_shrink_step<float>(bool, const StackParams<float>&, const StackBuffers&,
                                        const MoeExpertsArgs&, const KernelTuning&, cudaStream_t);
template void launch_shrink_step<__nv_bfloat16>(bool, const StackParams<__nv_bfloat16>&, const StackBuffers&,
                                                const MoeExpertsArgs&, const KernelTuning&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_stack
