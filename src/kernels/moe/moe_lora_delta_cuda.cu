// kernels/moe/moe_lora_delta_cuda.cu: the slot-stacked expert LoRA's delta mode (StackStep::kDeltaGateUp /
// kDeltaDown): each phase's shrink and expand as one kernel beside the base product, per CTA or per
// thread-block cluster of a group of same-key rows (moe_lora_stack_impl.cuh; the dispatcher is
// moe_lora_stack_cuda.cu). docs/multi-lora-kernels.md has the measurements behind it. Must not: allocate;
// synchronize.
#include "kernels/moe/moe_lora_stack_impl.cuh"

namespace polylora::kernels::cuda::moe_stack {
namespace {

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
  const size_t smem =
      2 * kDeltaGroup * static_cast<size_t>((down ? 1 : s.gu_slices) * s.rank) * sizeof(float);
  cuda_util::launch_pdl_cluster(
      moe_lora_delta_cluster_kernel<TW>, dim3(static_cast<unsigned>(C), static_cast<unsigned>(ws.max_rows)),
      dim3(kDeltaThreads), smem, static_cast<unsigned>(C), st, p,
      down ? static_cast<const float*>(ws.act) : a.x, down ? a.inter : a.ldx, down ? ws.dy : ws.dgu, down);
}

}  // namespace

template <typename TW>
void launch_delta_step(bool down, const StackParams<TW>& p, const StackBuffers& ws, const MoeExpertsArgs& a,
                       const KernelTuning& t, cudaStream_t st) {
  const MoeLoraStack& s = a.lora_stack;
  const int64_t cluster = t.moe_lora_delta_cluster;
  if (cluster > 1 && a.m * a.top_k <= t.moe_lora_delta_cluster_rows) {
    launch_delta_cluster<TW>(static_cast<int>(std::min<int64_t>(cluster, kDeltaClusterMax)), p, ws, a, s,
                             down, st);
    return;
  }
  const int64_t N = down ? a.hidden : 2 * a.inter;
  // Column parts per row: ~2 CTAs per SM in all, each of at least min_cols columns.
  const int64_t want = std::max<int64_t>(1, 2 * cuda_util::num_sms() / std::max<int64_t>(1, ws.max_rows));
  // The least columns per part (KernelTuning::moe_lora_delta_cols: every part computes the row's shrink
  // again).
  const int64_t cols = t.moe_lora_delta_cols;
  const int64_t min_cols = cols > 0 ? cols : int64_t{1024};
  const int64_t parts = std::clamp<int64_t>(want, 1, (N + min_cols - 1) / min_cols);
  const int64_t chunk = (N + parts - 1) / parts;
  const dim3 grid(static_cast<unsigned>(ws.max_rows), static_cast<unsigned>(parts));
  const size_t smem = static_cast<size_t>((down ? 1 : s.gu_slices) * s.rank) * sizeof(float);
  // The SMs' shared-memory carveout as the product's (which runs beside it, 3 CTAs of 48 KiB per SM for
  // MXFP4): with the default the driver configured the SMs holding this kernel's CTAs for a small carveout
  // and the product's CTAs could not join them until they drained (batch 1, H200: the gate/up GEMV took 43
  // us beside it instead of ~22).
  static const bool carveout = [] {
    prefer_max_shared(moe_lora_delta_kernel<TW>);
    return true;
  }();
  (void)carveout;
  cuda_util::launch_pdl(moe_lora_delta_kernel<TW>, grid, kDeltaThreads, smem, st, p,
                        down ? static_cast<const float*>(ws.act) : a.x, down ? a.inter : a.ldx,
                        down ? ws.dy : ws.dgu, chunk, down);
}

template void launch_delta_step<float>(bool, const StackParams<float>&, const StackBuffers&,
                                       const MoeExpertsArgs&, const KernelTuning&, cudaStream_t);
template void launch_delta_step<__nv_bfloat16>(bool, const StackParams<__nv_bfloat16>&, const StackBuffers&,
                                               const MoeExpertsArgs&, const KernelTuning&, cudaStream_t);

}  // namespace polylora::kernels::cuda::moe_stack
