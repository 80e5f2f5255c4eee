// kernels/moe/moe_gemv_pipe.cuh: the small-batch MoE product on bf16 tensor cores with a deep cp.async
// pipeline (the decode path for BF16 experts with 16-byte rows). Same grid and CTA shape as
// moe_gemv_tc_kernel (moe_gemv_mma.cuh): x = blocks of kPipeRows (64) output rows, y = the y-th active
// expert of the device-side sort (or exit); up to kPipeTok (16) routed rows per pass (more rows: another
// pass over the weights).
// Why it exists: moe_gemv_tc_kernel loads weights into registers (122 registers, 25% occupancy) and waits
// on each k-block's loads before its MMAs; ncu on the H200 at M=64 (GPT-OSS-20B experts) measured 23-25% of
// DRAM throughput with 84% of the cycles stalled on L1TEX. Here the four warps of a CTA split K (each warp
// all 64 rows, a quarter of the k-blocks) and every lane streams ITS OWN 16-byte pieces of weights and
// activations into shared memory with cp.async, kPipeStages k-blocks ahead, and reads them back itself
// (no barrier inside the K loop, no bank conflicts: a warp's lanes touch 512 consecutive bytes per slot).
// The mma.sync m16n8k16 fragments are the ones of moe_gemv_tc_kernel: a lane's 8 consecutive k values are
// its A elements of two k16 steps and the activation B fragments use the same k permutation. The warps'
// partial sums are reduced in shared memory in a fixed order (deterministic); bias in the epilogue.
// hi + lo split (CudaContext::bf16_split): the C = 2 instance multiplies both bf16 copies of each row.
// Only included through moe_launch.h. Must not: depend on anything above common/.
#pragma once

#include "kernels/mma_util.cuh"
#include "kernels/moe/moe_gemv_mma.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kPipeWarps = 4;  // split K between them
constexpr int kPipeThreads = 32 * kPipeWarps;
constexpr int kPipeMT = 4;  // m16 tiles per warp: all of the CTA's rows
constexpr int kPipeRows = 16 * kPipeMT;
constexpr int kPipeNT = 2;  // n8 fragments per pass
constexpr int kPipeTok = 8 * kPipeNT;
constexpr int kPipeStages = 4;
static_assert(kPipeWarps == 4 && kPipeMT == 4, "split_k_epilogue: 4 warps, warp w sums m16 tile w");
static_assert(kPipeRows == kTcRows, "the grid is moe_gemv_tc_kernel's");

template <int C>
struct PipeCfg {
  static constexpr int kW = kPipeMT * 2;  // 16-byte weight pieces per lane per k-block (rows g and g + 8)
  static constexpr int kX = kPipeNT * C;  // 16-byte activation pieces per lane per k-block
  static constexpr int kSlotBytes = 32 * 16;
  static constexpr int kStageBytes = (kW + kX) * kSlotBytes;
  static constexpr int kWarpBytes = kPipeStages * kStageBytes;
  static constexpr int kSmemBytes = kPipeWarps * kWarpBytes;  // C = 1: 80 KiB, C = 2: 96 KiB
  static constexpr int kAccPerLane = kPipeMT * kPipeNT * 4;
  static_assert(kPipeWarps * kAccPerLane * 32 * 4 <= kSmemBytes, "the reduction reuses the pipeline");
};

__device__ __forceinline__ uint4 ld_shared_v4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}

// The epilogue of a pass of the K-split tensor-core GEMVs (moe_gemv_pipe_kernel, moe_gemv_mxfp4_kernel):
// after every lane's copies have landed, each of the 4 warps parks its partial sums of the 4 m16 tiles ×
// NT n8 fragments in `red` (the drained pipeline buffers, 4 · 4 · NT · 4 floats per lane), then warp w sums
// m16 tile w over the warps in warp order (deterministic), adds the bias and stores rows n0.. of the pass's
// routed rows row0.. (nvalid of them). c0, c1 are (row g, columns 2t, 2t+1), c2, c3 (row g + 8, same
// columns). Gate/up with GemvTcParams::act_out: GPT-OSS's activation of each gate/up row pair instead.
template <Phase P, int NT>
__device__ __forceinline__ void split_k_epilogue(const GemvTcParams& p, const float (&acc)[4][NT][4],
                                                 float* red, int64_t n0, int64_t N, const float* bias,
                                                 int row0, int nvalid) {
  constexpr int kWarps = 4, kMT = 4, kAccPerLane = kMT * NT * 4;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with its pipeline buffers: they become the reduction
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int i = 0; i < NT; ++i)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        red[(warp * kAccPerLane + (mt * NT + i) * 4 + q) * 32 + lane] = acc[mt][i][q];
  __syncthreads();
  const int mt = warp;
  // The sum over the warps (in warp order) of m16 tile mt's entry (i, q), plus row n's bias.
  auto total = [&](int i, int q, int64_t n) {
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) y += red[(w * kAccPerLane + (mt * NT + i) * 4 + q) * 32 + lane];
    return bias != nullptr ? y + bias[n] : y;
  };
  if constexpr (P == Phase::kGateUp) {
    if (p.act_out != nullptr) {
      // GPT-OSS's activation of the gate (row n, even) and up (row n + 1, the lane 4 further: row g + 1)
      // sums, written by the gate's lane; every lane takes part in the shuffle.
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int col = i * 8 + 2 * t + (q & 1);
          const int64_t n = n0 + mt * 16 + g + (q >= 2 ? 8 : 0);
          const bool ok = col < nvalid && n < N;
          const float y = ok ? total(i, q, n) : 0.0f;
          const float up = __shfl_down_sync(0xffffffffu, y, 4);
          if (!ok || (g & 1) != 0) continue;  // n is even exactly when g is (n0 and the tiles are)
          const float v =
              moe_detail::expert_act(ExpertAct::kGptOssSwiglu, y, up, p.swiglu_alpha, p.swiglu_limit);
          const cuda_util::Bf16Pair hl = cuda_util::split_bf16(v);
          __nv_bfloat16* arow = p.act_out + static_cast<int64_t>(row0 + col) * p.act_copies * p.act_lda;
          arow[n >> 1] = hl.hi;
          if (p.act_copies == 2) arow[p.act_lda + (n >> 1)] = hl.lo;
        }
      // The pass's rows' padding columns (read as zeros by the down product), by the last row tile.
      const int64_t I = N / 2, pad = p.act_lda - I;
      if (n0 + 16 * kMT >= N && pad > 0)
        for (int64_t idx = threadIdx.x; idx < nvalid * pad; idx += blockDim.x) {
          __nv_bfloat16* arow = p.act_out + static_cast<int64_t>(row0 + idx / pad) * p.act_copies * p.act_lda;
          arow[I + idx % pad] = __float2bfloat16_rn(0.0f);
          if (p.act_copies == 2) arow[p.act_lda + I + idx % pad] = __float2bfloat16_rn(0.0f);
        }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < NT; ++i)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int col = i * 8 + 2 * t + (q & 1);
      const int64_t n = n0 + mt * 16 + g + (q >= 2 ? 8 : 0);
      if (col >= nvalid || n >= N) continue;
      const float y = total(i, q, n);
      const int64_t row = row0 + col;
      if (P == Phase::kGateUp) {
        p.out[row * N + n] = y;
      } else {
        p.out[static_cast<int64_t>(p.sorted[row]) * N + n] = y;
      }
    }
}

template <Phase P, int C>
__global__ void __launch_bounds__(kPipeThreads, 2) moe_gemv_pipe_kernel(GemvTcParams p) {
  if (gemv_pdl_begin(p)) return;  // launched by launch_pdl (cuda_util.cuh)
  using Cfg = PipeCfg<C>;
  extern __shared__ __align__(16) unsigned char pipe_smem[];
  __shared__ int64_t s_off[kPipeTok];  // activation row offset (elements) per routed row of the pass, −1 none
  if (gemv_tc_lora_cta<P, kPipeWarps>(p)) return;
  const int j = blockIdx.y;
  // Both loads at once (active has an entry per y-plane: grid.y <= E): one dependent round trip fewer.
  const int num_active = *p.num_active, e = p.active[j];
  if (j >= num_active) return;
  const int count = p.counts[e], base = p.offsets[e];
  const ExpertView& ex = p.experts[e];
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  if (weight_dtype<P>(ex) != DType::kBF16 || !weight_rows_aligned16<P>(ex, K)) {
    gemv_tc_cta<P>(p, e);  // element-by-element loads (F16, odd K): the register-streaming kernel
    return;
  }
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kPipeRows;
  if (n0 >= N) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* bias = weight_bias<P>(ex);
  const char* wrow[kPipeMT][2];
#pragma unroll
  for (int mt = 0; mt < kPipeMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + mt * 16 + g + 8 * h;
      wrow[mt][h] = n < N ? weight_row<P>(ex, n, K, p.inter) : nullptr;
    }
  const char* valid_src = weight_row<P>(ex, n0, K, p.inter);  // any readable address, for zero fills
  // This warp's k-blocks of 32.
  const int nblocks = static_cast<int>((K + 31) / 32);
  const int per = (nblocks + kPipeWarps - 1) / kPipeWarps;
  const int kb_begin = min(nblocks, warp * per);
  const int nkb = min(nblocks, kb_begin + per) - kb_begin;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(pipe_smem));
  const uint32_t lane_smem = smem0 + warp * Cfg::kWarpBytes + lane * 16;
  float* red = reinterpret_cast<float*>(pipe_smem);  // [warp][kAccPerLane][32] after the K loop

  for (int tok0 = 0; tok0 < count; tok0 += kPipeTok) {
    const int nvalid = count - tok0 < kPipeTok ? count - tok0 : kPipeTok;
    __syncthreads();  // the previous pass no longer reads s_off or the reduction
    pass_row_offsets<P>(p, base + tok0, nvalid, kPipeTok, s_off);
    __syncthreads();
    const bool two = nvalid > 8;  // the second n8 fragment holds routed rows (warp-uniform)
    const __nv_bfloat16* xrow[kPipeNT];
#pragma unroll
    for (int i = 0; i < kPipeNT; ++i) {
      const int64_t off = s_off[i * 8 + g];
      xrow[i] = off >= 0 ? p.a + off : nullptr;
    }
    // Stage `kb` (this warp's k-block index) into buffer kb % kPipeStages; past the warp's range nothing
    // is copied (the group is still committed, so the wait counts stay uniform).
    auto issue = [&](int kb) {
      if (kb >= nkb) return;
      const int64_t k = static_cast<int64_t>(kb_begin + kb) * 32 + t * 8;
      const bool kin = k < K;
      const uint32_t dst = lane_smem + (kb % kPipeStages) * Cfg::kStageBytes;
#pragma unroll
      for (int mt = 0; mt < kPipeMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const char* r = wrow[mt][h];
          const bool ok = kin && r != nullptr;
          mma::cp_async16(dst + (mt * 2 + h) * Cfg::kSlotBytes, ok ? r + k * 2 : valid_src, ok ? 16 : 0);
        }
#pragma unroll
      for (int i = 0; i < kPipeNT; ++i)
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const bool ok = kin && xrow[i] != nullptr && (i == 0 || two);
          const void* src = ok ? static_cast<const void*>(xrow[i] + c * p.lda_copy + k) : valid_src;
          mma::cp_async16(dst + (Cfg::kW + i * C + c) * Cfg::kSlotBytes, src, ok ? 16 : 0);
        }
    };
    float acc[kPipeMT][kPipeNT][4];
#pragma unroll
    for (int mt = 0; mt < kPipeMT; ++mt)
#pragma unroll
      for (int i = 0; i < kPipeNT; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mt][i][q] = 0.0f;
#pragma unroll
    for (int s = 0; s < kPipeStages - 1; ++s) {
      issue(s);
      mma::cp_async_commit();
    }
    for (int kb = 0; kb < nkb; ++kb) {
      mma::cp_async_wait<kPipeStages - 2>();  // this lane's copies of stage kb have landed
      issue(kb + kPipeStages - 1);            // into the buffer read in the previous iteration
      mma::cp_async_commit();
      const uint32_t src = lane_smem + (kb % kPipeStages) * Cfg::kStageBytes;
      uint4 xv[kPipeNT][C];
#pragma unroll
      for (int i = 0; i < kPipeNT; ++i)
#pragma unroll
        for (int c = 0; c < C; ++c) xv[i][c] = ld_shared_v4(src + (Cfg::kW + i * C + c) * Cfg::kSlotBytes);
#pragma unroll
      for (int mt = 0; mt < kPipeMT; ++mt) {
        const uint4 w0 = ld_shared_v4(src + (mt * 2) * Cfg::kSlotBytes);
        const uint4 w1 = ld_shared_v4(src + (mt * 2 + 1) * Cfg::kSlotBytes);
        const uint32_t a_s0[4] = {w0.x, w1.x, w0.y, w1.y};
        const uint32_t a_s1[4] = {w0.z, w1.z, w0.w, w1.w};
#pragma unroll
        for (int i = 0; i < kPipeNT; ++i) {
          if (i > 0 && !two) break;  // warp-uniform
#pragma unroll
          for (int c = 0; c < C; ++c) {
            mma::mma_bf16(acc[mt][i], a_s0, xv[i][c].x, xv[i][c].y);
            mma::mma_bf16(acc[mt][i], a_s1, xv[i][c].z, xv[i][c].w);
          }
        }
      }
    }
    split_k_epilogue<P, kPipeNT>(p, acc, red, n0, N, bias, base + tok0, nvalid);
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
