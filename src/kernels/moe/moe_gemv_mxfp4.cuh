// kernels/moe/moe_gemv_mxfp4.cuh: the small-batch MoE product for MXFP4 experts on bf16 tensor cores, a
// weight-streaming kernel (decode and small batches): each active expert's codes are read from HBM once per
// pass of up to 8·NT routed rows, decoded to bf16 in registers and multiplied with mma.sync m16n8k16.
// Grid and CTA as moe_gemv_pipe_kernel (moe_gemv_pipe.cuh): x = blocks of kMxRows (64) output rows, y =
// the y-th active expert of the device-side sort (or exit); the four warps split K, each warp all 64 rows.
// Why it exists: the fp32 GEMV (moe_gemv.cuh's dot_rows_mxfp4) spends ~7 instructions per value decoding
// and multiplying on the CUDA cores and reached 0.20 of the copy rate at M = 1 on the H200; here a value
// costs ~2.4 (decode and scale) and the products are on the tensor cores. H200, GPT-OSS-20B experts
// (`polylora_bench moe-lora --dtype mxfp4`): M = 1 / 16 / 64 take 51.4 / 322 / 432 us where the fp32 GEMV
// takes 82.7 / 958 and the grouped GEMM ~1,610 (M = 64). Still latency-bound, not at HBM: ncu at M = 16
// (the 16-row, hi + lo instance) shows 96 KiB of shared memory per CTA holding 2 CTAs (8 warps) per SM and
// most cycles with no eligible warp. Tried and dropped: several 64-row blocks per CTA through one pipeline
// (to pay each CTA's start-up latency once); its reduction buffer beside the pipeline left 1 CTA per SM
// and M = 16 took 533 / 555 us with 2 / 4 blocks (333 with one, same run).
// Layout: one stage is a "super-block" of 128 k values (4 MXFP4 blocks). Lane (g, t) copies with cp.async,
// for each of its 8 rows (g and g + 8 of the 4 m16 tiles), the 16 code bytes of block 4·sb + t (32
// values), and for each routed row of its fragment column g the 64 activation bytes of the same 32 k
// values; it reads back only what it copied itself (no barrier in the K loop). Its 8 block scales are
// plain loads one stage ahead. The k order inside a fragment is permuted, for weights and activations
// alike (the dot products are unchanged): 32-bit code word w (codes 8w..8w+7 of the block) gives the bf16
// pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) (mma::mxfp4x8_to_bf16_pairs, no byte permutes), which are
// the A elements (k 2t, 2t+1) and (k 2t+8, 2t+9) of the k16 steps 2w and 2w + 1; the activation pairs are
// permuted to match (4 byte-permutes per 8 values, shared by the 8 rows). The warps' partial sums are
// reduced in shared memory in a fixed order (deterministic); bias in the epilogue. C = 2: the hi + lo
// copies of each activation row (CudaContext::bf16_split), two MMAs. Only included through moe_launch.h.
// Must not: depend on anything above common/.
#pragma once

#include "kernels/mma_util.cuh"
#include "kernels/moe/moe_gemv_pipe.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kMxWarps = 4;  // split K between them
constexpr int kMxThreads = 32 * kMxWarps;
constexpr int kMxMT = 4;  // m16 tiles per warp: all of the CTA's rows
constexpr int kMxRows = 16 * kMxMT;
constexpr int kMxStages = 2;  // the default pipeline depth (KernelTuning::moe_gemv_mxfp4_stages: 2 to 4)
constexpr int kMxSuper = 4 * kMxfp4BlockSize;  // k values of one stage
static_assert(kMxWarps == 4 && kMxMT == 4, "split_k_epilogue: 4 warps, warp w sums m16 tile w");
static_assert(kMxRows == kTcRows, "the grid is moe_gemv_tc_kernel's");

template <int NT, int C, int S = kMxStages>
struct MxGemvCfg {
  static_assert(S >= 2 && S <= 4, "2 to 4 stages");
  static constexpr int kStages = S;
  static constexpr int kW = kMxMT * 2;   // 16-byte code pieces per lane per stage (one block of 8 rows)
  static constexpr int kX = NT * C * 4;  // 16-byte activation pieces per lane per stage (32 values each)
  static constexpr int kSlotBytes = 32 * 16;
  static constexpr int kStageBytes = (kW + kX) * kSlotBytes;
  static constexpr int kWarpBytes = S * kStageBytes;
  // Two stages: NT·C = 1: 48 KiB, 2: 64 KiB, 4: 96 KiB; three / four stages at NT·C = 1: 72 / 96 KiB.
  static constexpr int kSmemBytes = kMxWarps * kWarpBytes;
  static constexpr int kAccPerLane = kMxMT * NT * 4;
  static_assert(kMxWarps * kAccPerLane * 32 * 4 <= kSmemBytes, "the reduction reuses the pipeline");
};

// The bf16x2 factor 2^(s − 1) for a block scale byte s <= 128 (the placed codes read as e2m1 · 2^-126), or
// 2^126 above (then big_factor's second multiply).
__device__ __forceinline__ uint32_t mx_factor(uint32_t s) {
  const uint32_t m = s <= 128u ? (s + 126u) << 7 : 253u << 7;
  return m | (m << 16);
}
// The second factor, 2^(s − 127) above s = 128, else 1.
__device__ __forceinline__ uint32_t mx_big_factor(uint32_t s) {
  const uint32_t m = s > 128u ? s << 7 : 127u << 7;
  return m | (m << 16);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <Phase P, int NT, int C, int S = kMxStages>
__global__ void __launch_bounds__(kMxThreads, 3) moe_gemv_mxfp4_kernel(GemvTcParams p) {
  if (gemv_pdl_begin(p)) return;  // launched by launch_pdl (cuda_util.cuh)
  using Cfg = MxGemvCfg<NT, C, S>;
  constexpr int kStages = Cfg::kStages;
  extern __shared__ __align__(16) unsigned char mx_smem[];
  __shared__ int64_t s_off[8 * NT];  // activation row offset (elements) per routed row of the pass, −1 none
  if (gemv_tc_lora_cta<P, kMxThreads / 32>(p)) return;
  const int j = blockIdx.y;
  // Both loads at once (active has an entry per y-plane: grid.y <= E): one dependent round trip fewer.
  const int num_active = *p.num_active, e = p.active[j];
  if (j >= num_active) return;
  const int count = p.counts[e], base = p.offsets[e];
  const ExpertView& ex = p.experts[e];
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kMxRows;
  if (n0 >= N) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float* bias = weight_bias<P>(ex);
  // The CTA's row pointers (codes, scales; nullptr past N), in shared memory: read once per stage, they
  // would take 32 registers per lane.
  __shared__ const uint8_t* s_codes[kMxRows];
  __shared__ const uint8_t* s_scales[kMxRows];
  if (threadIdx.x < kMxRows) {
    const int64_t n = n0 + threadIdx.x;
    const uint8_t *c = nullptr, *sc = nullptr;
    if (n < N) mxfp4_row<P>(ex, n, K, p.inter, c, sc);
    s_codes[threadIdx.x] = c;
    s_scales[threadIdx.x] = sc;
  }
  const uint8_t* valid_codes;  // any readable address, for zero fills
  const uint8_t* unused_scales;
  mxfp4_row<P>(ex, n0, K, p.inter, valid_codes, unused_scales);
  // This warp's super-blocks (K % 32 == 0: a block is whole or absent).
  const int nblocks = static_cast<int>(K / kMxfp4BlockSize);
  const int nsuper = (nblocks + 3) / 4;
  const int per = (nsuper + kMxWarps - 1) / kMxWarps;
  const int sb_begin = min(nsuper, warp * per);
  const int nsb = min(nsuper, sb_begin + per) - sb_begin;
  const uint32_t smem0 = static_cast<uint32_t>(__cvta_generic_to_shared(mx_smem));
  const uint32_t lane_smem = smem0 + warp * Cfg::kWarpBytes + lane * 16;
  float* red = reinterpret_cast<float*>(mx_smem);  // [warp][kAccPerLane][32] after the K loop

  for (int tok0 = 0; tok0 < count; tok0 += 8 * NT) {
    const int nvalid = count - tok0 < 8 * NT ? count - tok0 : 8 * NT;
    __syncthreads();  // the previous pass no longer reads s_off or the reduction
    pass_row_offsets<P>(p, base + tok0, nvalid, 8 * NT, s_off);
    __syncthreads();
    const int nfrag = (nvalid + 7) / 8;  // n8 fragments holding routed rows (warp-uniform)
    const __nv_bfloat16* xrow[NT];
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int64_t off = s_off[i * 8 + g];
      xrow[i] = off >= 0 ? p.a + off : nullptr;
    }
    // Stage sb (this warp's super-block index) into buffer sb % kStages; past the warp's range nothing is
    // copied (the group is still committed, so the wait counts stay uniform).
    auto issue = [&](int sb) {
      if (sb >= nsb) return;
      const int blk = (sb_begin + sb) * 4 + t;
      const bool kin = blk < nblocks;
      const uint32_t dst = lane_smem + (sb % kStages) * Cfg::kStageBytes;
#pragma unroll
      for (int mt = 0; mt < kMxMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint8_t* r = s_codes[mt * 16 + g + 8 * h];
          const bool ok = kin && r != nullptr;
          mma::cp_async16(dst + (mt * 2 + h) * Cfg::kSlotBytes, ok ? r + blk * 16 : valid_codes, ok ? 16 : 0);
        }
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const bool ok = kin && xrow[i] != nullptr && i < nfrag;
            const void* src = ok ? static_cast<const void*>(xrow[i] + c * p.lda_copy + blk * 32 + q * 8)
                                 : static_cast<const void*>(valid_codes);
            mma::cp_async16(dst + (Cfg::kW + (i * C + c) * 4 + q) * Cfg::kSlotBytes, src, ok ? 16 : 0);
          }
    };
    // This lane's block scales of stage sb (0 past K or the rows: the codes are zero there).
    auto load_scales = [&](int sb, uint32_t(&s)[kMxMT][2]) {
      const int blk = (sb_begin + sb) * 4 + t;
      const bool kin = sb < nsb && blk < nblocks;
#pragma unroll
      for (int mt = 0; mt < kMxMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint8_t* r = s_scales[mt * 16 + g + 8 * h];
          s[mt][h] = kin && r != nullptr ? static_cast<uint32_t>(__ldg(r + blk)) : 0u;
        }
    };
    float acc[kMxMT][NT][4];
#pragma unroll
    for (int mt = 0; mt < kMxMT; ++mt)
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mt][i][q] = 0.0f;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      issue(s);
      mma::cp_async_commit();
    }
    uint32_t sc_next[kMxMT][2];
    load_scales(0, sc_next);
    for (int sb = 0; sb < nsb; ++sb) {
      mma::cp_async_wait<kStages - 2>();  // this lane's copies of stage sb have landed
      issue(sb + kStages - 1);            // into the buffer read in the previous iteration
      mma::cp_async_commit();
      uint32_t sc[kMxMT][2];
      bool big = false;
#pragma unroll
      for (int mt = 0; mt < kMxMT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sc[mt][h] = sc_next[mt][h];
          big = big || sc[mt][h] > 128u;
        }
      load_scales(sb + 1, sc_next);
      big = __any_sync(0xffffffffu, big);  // warp-uniform: scales above 2^1 take a second multiply
      const uint32_t src = lane_smem + (sb % kStages) * Cfg::kStageBytes;
      // The activation pairs of the k16 steps, permuted as the codes: word w of a 32-value piece holds
      // x[8w..8w+7] as (x0,x1)(x2,x3)(x4,x5)(x6,x7); step 2w takes (x0,x4), (x1,x5), step 2w+1 (x2,x6),
      // (x3,x7).
      uint32_t xb[NT][C][4][4];
#pragma unroll
      for (int i = 0; i < NT; ++i)
#pragma unroll
        for (int c = 0; c < C; ++c)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const uint4 v = ld_shared_v4(src + (Cfg::kW + (i * C + c) * 4 + q) * Cfg::kSlotBytes);
            xb[i][c][q][0] = __byte_perm(v.x, v.z, 0x5410);
            xb[i][c][q][1] = __byte_perm(v.x, v.z, 0x7632);
            xb[i][c][q][2] = __byte_perm(v.y, v.w, 0x5410);
            xb[i][c][q][3] = __byte_perm(v.y, v.w, 0x7632);
          }
#pragma unroll
      for (int mt = 0; mt < kMxMT; ++mt) {
        const uint4 c0 = ld_shared_v4(src + (mt * 2) * Cfg::kSlotBytes);      // row g: 32 codes
        const uint4 c1 = ld_shared_v4(src + (mt * 2 + 1) * Cfg::kSlotBytes);  // row g + 8
        const uint32_t f0 = mx_factor(sc[mt][0]), f1 = mx_factor(sc[mt][1]);
        const uint32_t w0[4] = {c0.x, c0.y, c0.z, c0.w}, w1[4] = {c1.x, c1.y, c1.z, c1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          uint32_t r0[4], r1[4];
          mma::mxfp4x8_to_bf16_pairs(w0[q], r0);
          mma::mxfp4x8_to_bf16_pairs(w1[q], r1);
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            r0[u] = bf16x2_mul(r0[u], f0);
            r1[u] = bf16x2_mul(r1[u], f1);
          }
          if (big) {
            const uint32_t b0 = mx_big_factor(sc[mt][0]), b1 = mx_big_factor(sc[mt][1]);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              r0[u] = bf16x2_mul(r0[u], b0);
              r1[u] = bf16x2_mul(r1[u], b1);
            }
          }
          const uint32_t a_s0[4] = {r0[0], r1[0], r0[1], r1[1]};  // step 2q: (c0,c4), (c1,c5)
          const uint32_t a_s1[4] = {r0[2], r1[2], r0[3], r1[3]};  // step 2q+1: (c2,c6), (c3,c7)
#pragma unroll
          for (int i = 0; i < NT; ++i) {
            if (i >= nfrag) break;  // warp-uniform
#pragma unroll
            for (int c = 0; c < C; ++c) {
              mma::mma_bf16(acc[mt][i], a_s0, xb[i][c][q][0], xb[i][c][q][1]);
              mma::mma_bf16(acc[mt][i], a_s1, xb[i][c][q][2], xb[i][c][q][3]);
            }
          }
        }
      }
    }
    split_k_epilogue<P, NT>(p, acc, red, n0, N, bias, base + tok0, nvalid);
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
