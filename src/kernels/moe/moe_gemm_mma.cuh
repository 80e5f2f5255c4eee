// kernels/moe/moe_gemm_mma.cuh: the large-batch MoE grouped GEMM on bf16 tensor cores. One CTA (8 warps,
// 2×4, each a (BM/2)×32 warp tile) per (row tile of one expert, 128 output columns); mma.sync m16n8k16
// bf16 with f32 accumulation fed by ldmatrix from XOR-swizzled shared memory; a kStages-deep cp.async
// pipeline of BK = 32 slices. A rows are gathered from a bf16 activation buffer cast once (gate_up: x by
// token; down: act by sorted row) whose rows are zero-padded to a multiple of BK; B is the expert's
// weight [N, K] read with 16-byte cp.async when it is BF16 with 16-byte rows; INT8 weights (--quantization
// int8) with 8-byte rows are dequantized in the K loop (codes loaded into registers, widened to bf16 exactly
// and stored into the stage after its MMAs; the row scales multiply the accumulators in the epilogue); else
// MXFP4 weights (GPT-OSS as shipped; K a multiple of 32, so a BK slice is one block of each row): the
// codes travel in the cp.async pipeline as they are stored (a raw ring of kStages × 128 rows × 16 bytes
// after the stages; the CTA's rows' block scales are loaded once into shared memory), and at the end of
// iteration kt each thread decodes the 8 code bytes it copied itself for slice kt + 1 (mma::
// mxfp4x8_to_bf16x8, exact) into that stage's bf16 B tile, published by the next iteration's barrier: no
// bf16 copy of the experts exists; else converted element by element (odd shapes, F16, INT8 codes). Tiles
// past the device-side tile count exit at once.
// hi + lo split (CudaContext::bf16_split(m)): each A row holds bf16(x) in its first kb_tiles·BK columns and
// bf16(x − bf16(x)) in the next kb_tiles·BK; the K loop runs over both copies while B's K index wraps
// (kt mod kb_tiles), so the accumulator sums W·hi + W·lo.
// Only included through moe_launch.h. Must not: depend on anything above common/.
#pragma once

#include "kernels/mma_util.cuh"
#include "kernels/moe/moe_cuda_common.cuh"
#include "kernels/moe/moe_lora_mma.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kMmaThreads = 256;
constexpr int kMmaBN = 128;
constexpr int kMmaBK = mma::kBK;
constexpr int kMmaStages = 4;

template <int BM>
struct MmaCfg {
  static constexpr int kWM = BM / 2;    // warp tile rows (warps 2 × 4)
  static constexpr int kMI = kWM / 16;  // m16 fragments per warp
  static constexpr int kNI = 4;         // n8 fragments per warp (32 columns)
  static constexpr int kABytes = BM * kMmaBK * 2;
  static constexpr int kBBytes = kMmaBN * kMmaBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kSmemBytes = kMmaStages * kStageBytes;
};

struct MmaParams {
  const __nv_bfloat16* a = nullptr;  // kGateUp: x as bf16 [m, lda]; kDown: act as bf16 [max_rows, lda]
  int64_t lda = 0;                   // kb_tiles·kMmaBK, or twice that with the split; columns past K zero
  int kb_tiles = 0;                  // BK slices of one copy of K (B's K extent, padded)
  const ExpertView* experts = nullptr;
  const int32_t* sorted = nullptr;       // [max_rows] pair per sorted row, −1 for padding
  const int32_t* tile_expert = nullptr;  // [max_tiles]
  const int32_t* num_tiles = nullptr;    // [1]
  int64_t top_k = 0, hidden = 0, inter = 0;
  float* out = nullptr;  // kGateUp: gu [max_rows, 2I] by sorted row; kDown: y [pairs, H] by pair
  // Slot-stacked LoRA expand fused into the epilogue (moe_lora_mma.cuh; lora.b == nullptr: none).
  LoraExpandMma lora;
  // MXFP4 weights: K / 32 (blocks per row); the launch adds mma_mxfp4_smem_bytes(mx_nb) of shared memory.
  int64_t mx_nb = 0;
};

constexpr int kMxRawBytes = kMmaBN * 16;  // one stage's codes: 128 rows × one 16-byte block
// Shared memory past the pipeline stages for MXFP4 weights: the raw ring and [128, nb] scales.
__host__ __device__ constexpr int64_t mma_mxfp4_smem_bytes(int64_t nb) {
  return nb == 0 ? 0 : kMmaStages * kMxRawBytes + (kMmaBN * nb + 15) / 16 * 16;
}

using mma::cp_async16;
using mma::cp_async_commit;
using mma::cp_async_wait;
using mma::ldmatrix_x4;
using mma::mma_bf16;
__device__ __forceinline__ uint32_t mma_swz(int r, int c) {
  return mma::swz(r, c);
}

template <Phase P, int BM>
__global__ void __launch_bounds__(kMmaThreads) moe_gemm_mma(MmaParams p) {
  using C = MmaCfg<BM>;
  extern __shared__ __align__(128) unsigned char mma_smem[];
  __shared__ int32_t s_pair[BM];
  __shared__ int64_t s_arow[BM];  // A row (−1: padding, zero-filled)
  __shared__ int32_t s_lkey[BM];  // LoRA key of the row (lora_row_key), −1: none
  const int tile = blockIdx.x;
  if (tile >= *p.num_tiles) return;
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kMmaBN;
  if (n0 >= N) return;
  const ExpertView& ex = p.experts[p.tile_expert[tile]];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < BM; i += kMmaThreads) {
    const int64_t r = static_cast<int64_t>(tile) * BM + i;
    const int32_t pr = p.sorted[r];
    s_pair[i] = pr;
    s_arow[i] = pr < 0 ? -1 : (P == Phase::kGateUp ? pr / p.top_k : r);
    if (p.lora.b != nullptr)
      s_lkey[i] = lora_row_key(pr, p.tile_expert[tile], p.lora.token_slots, p.top_k, p.lora.slots, p.lora.E,
                               p.lora.scale, p.lora.c0, p.lora.slices);
  }
  const DType bdt = weight_dtype<P>(ex);
  const float* bias = weight_bias<P>(ex);
  const bool b_fast = bdt == DType::kBF16 && weight_rows_aligned16<P>(ex, K);
  // INT8 weights with 8-byte rows: 8 codes per 8-byte load into registers, widened to bf16 (exact) and
  // stored after the stage's MMAs (the load's latency hides behind them); the row scales in the epilogue.
  const bool b_int8 = bdt == DType::kI8 && weight_rows_aligned<P>(ex, K, 8);
  // MXFP4 (any K a multiple of 32): the raw codes through the pipeline, decoded at the end of the iteration
  // before their slice's (decode_mxfp4).
  const bool b_mxfp4 = bdt == DType::kU8;
  uint2 b_pending[2];
  // MXFP4: thread tid copies and decodes half tid & 1 (8 code bytes, 16 values) of B row tid / 2.
  const int mx_row = tid >> 1, mx_half = tid & 1;
  const uint8_t* mx_codes = nullptr;
  if (b_mxfp4) {
    const uint8_t* scl = nullptr;
    if (n0 + mx_row < N) mxfp4_row<P>(ex, n0 + mx_row, K, p.inter, mx_codes, scl);
    uint8_t* s_scl = mma_smem + C::kSmemBytes + kMmaStages * kMxRawBytes;
#pragma unroll 8
    for (int64_t kb = mx_half; kb < p.mx_nb; kb += 2)
      s_scl[mx_row * p.mx_nb + kb] = scl != nullptr ? __ldg(scl + kb) : uint8_t{0};
  }
  // Each thread copies chunk (tid % 4) of rows tid / 4 + 64·i of the A and B tiles.
  const int ld_chunk = tid & 3, ld_row = tid >> 2;
  constexpr int kARowsPerThread = BM / 64;
  const char* b_src[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t n = n0 + ld_row + 64 * i;
    if (n >= N) {
      b_src[i] = nullptr;
    } else if (b_mxfp4) {
      b_src[i] = nullptr;  // the raw ring's copies (mx_codes)
    } else {
      b_src[i] = weight_row<P>(ex, n, K, p.inter);
    }
  }
  __syncthreads();
  const __nv_bfloat16* a_src[kARowsPerThread];
#pragma unroll
  for (int i = 0; i < kARowsPerThread; ++i) {
    const int64_t ar = s_arow[ld_row + 64 * i];
    a_src[i] = ar < 0 ? nullptr : p.a + ar * p.lda;
  }
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(mma_smem));
  const int num_kt = static_cast<int>(p.lda / kMmaBK);

  auto load_stage = [&](int stage, int kt) {
    const uint32_t sa = smem_base + stage * C::kStageBytes;
    const uint32_t sb = sa + C::kABytes;
    const int64_t ka = static_cast<int64_t>(kt) * kMmaBK + ld_chunk * 8;
    const int64_t k =
        static_cast<int64_t>(weight_k_slice(kt, p.kb_tiles)) * kMmaBK + ld_chunk * 8;  // B's K index
#pragma unroll
    for (int i = 0; i < kARowsPerThread; ++i) {
      const int r = ld_row + 64 * i;
      cp_async16(sa + mma_swz(r, ld_chunk), a_src[i] != nullptr ? a_src[i] + ka : p.a,
                 a_src[i] != nullptr ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = ld_row + 64 * i;
      if (b_mxfp4) {
        if (i == 0) {  // the thread's 8 code bytes of this slice's block, raw, into the ring
          const int64_t kb = weight_k_slice(kt, p.kb_tiles);
          const uint32_t dst = smem_base + C::kSmemBytes + stage * kMxRawBytes + mx_row * 16 + mx_half * 8;
          const void* src = mx_codes != nullptr ? static_cast<const void*>(mx_codes + kb * 16 + mx_half * 8)
                                                : static_cast<const void*>(p.a);
          asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src),
                       "r"(mx_codes != nullptr ? 8 : 0));
        }
      } else if (b_int8) {
        const bool ok = b_src[i] != nullptr && k < K;
        b_pending[i] = ok ? __ldg(reinterpret_cast<const uint2*>(b_src[i] + k)) : make_uint2(0u, 0u);
      } else if (b_fast) {
        const bool ok = b_src[i] != nullptr && k < K;
        cp_async16(sb + mma_swz(r, ld_chunk), ok ? b_src[i] + k * 2 : static_cast<const void*>(p.a),
                   ok ? 16 : 0);
      } else {
        uint32_t w[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t lo = 0, hi = 0;
          if (b_src[i] != nullptr && k + 2 * j < K)
            lo = __bfloat16_as_ushort(cuda_util::load_as_bf16(b_src[i], bdt, k + 2 * j));
          if (b_src[i] != nullptr && k + 2 * j + 1 < K)
            hi = __bfloat16_as_ushort(cuda_util::load_as_bf16(b_src[i], bdt, k + 2 * j + 1));
          w[j] = lo | (hi << 16);
        }
        mma::st_shared_v4(sb + mma_swz(r, ld_chunk), w);
      }
    }
  };
  // MXFP4: the thread's own raw codes of slice kt (complete: the caller waited for its cp.async group) as
  // bf16 into that stage's B tile, chunks 2·half and 2·half + 1 of its row.
  auto decode_mxfp4 = [&](int kt) {
    const int stage = kt % kMmaStages;
    const unsigned char* raw = mma_smem + C::kSmemBytes + stage * kMxRawBytes + mx_row * 16 + mx_half * 8;
    const uint2 c = *reinterpret_cast<const uint2*>(raw);
    const uint32_t sc = mma_smem[C::kSmemBytes + kMmaStages * kMxRawBytes + mx_row * p.mx_nb +
                                 weight_k_slice(kt, p.kb_tiles)];
    const uint32_t sb = smem_base + stage * C::kStageBytes + C::kABytes;
    uint32_t w[4];
    mma::mxfp4x8_to_bf16x8(c.x, sc, w);
    mma::st_shared_v4(sb + mma_swz(mx_row, 2 * mx_half), w);
    mma::mxfp4x8_to_bf16x8(c.y, sc, w);
    mma::st_shared_v4(sb + mma_swz(mx_row, 2 * mx_half + 1), w);
  };
  // b_int8: the codes load_stage left in registers, into stage `stage`'s B tile.
  auto store_pending_b = [&](int stage) {
    const uint32_t sb = smem_base + stage * C::kStageBytes + C::kABytes;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      uint32_t w[4];
      mma::int8x8_to_bf16x8(b_pending[i].x, b_pending[i].y, w);
      mma::st_shared_v4(sb + mma_swz(ld_row + 64 * i, ld_chunk), w);
    }
  };

  float acc[C::kMI][C::kNI][4];
#pragma unroll
  for (int i = 0; i < C::kMI; ++i)
#pragma unroll
    for (int j = 0; j < C::kNI; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#pragma unroll
  for (int s = 0; s < kMmaStages - 1; ++s) {
    if (s < num_kt) {
      load_stage(s, s);
      if (b_int8) store_pending_b(s);
    }
    cp_async_commit();
  }
  if (b_mxfp4) {  // slice 0 (its group is complete once at most kMmaStages − 2 are pending)
    cp_async_wait<kMmaStages - 2>();
    if (num_kt > 0) decode_mxfp4(0);
  }
  const int wm = warp >> 2, wn = warp & 3;
  for (int kt = 0; kt < num_kt; ++kt) {
    cp_async_wait<kMmaStages - 2>();
    __syncthreads();  // stage kt is visible to all; stage kt − 1 is no longer read
    const int nk = kt + kMmaStages - 1;
    if (nk < num_kt) load_stage(nk % kMmaStages, nk);
    cp_async_commit();
    const uint32_t sa = smem_base + (kt % kMmaStages) * C::kStageBytes;
    const uint32_t sb = sa + C::kABytes;
#pragma unroll
    for (int ks = 0; ks < kMmaBK / 16; ++ks) {
      uint32_t af[C::kMI][4];
      uint32_t bf[C::kNI][2];
#pragma unroll
      for (int mi = 0; mi < C::kMI; ++mi) {
        const int r = wm * C::kWM + mi * 16 + (lane & 15);
        ldmatrix_x4(af[mi], sa + mma_swz(r, ks * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int nj = 0; nj < C::kNI / 2; ++nj) {
        const int r = wn * 32 + nj * 16 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t t[4];
        ldmatrix_x4(t, sb + mma_swz(r, ks * 2 + ((lane >> 3) & 1)));
        bf[2 * nj][0] = t[0];
        bf[2 * nj][1] = t[1];
        bf[2 * nj + 1][0] = t[2];
        bf[2 * nj + 1][1] = t[3];
      }
#pragma unroll
      for (int mi = 0; mi < C::kMI; ++mi)
#pragma unroll
        for (int ni = 0; ni < C::kNI; ++ni) mma_bf16(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);
    }
    // Stage nk's slot was last read in iteration kt − 1 (before this iteration's barrier) and is next read
    // after the barrier of iteration nk.
    if (b_int8 && nk < num_kt) store_pending_b(nk % kMmaStages);
    // MXFP4: slice kt + 1's group is complete once at most kMmaStages − 2 are pending; its stage was last
    // read in iteration kt + 1 − kMmaStages, before this iteration's barrier.
    if (b_mxfp4 && kt + 1 < num_kt) {
      cp_async_wait<kMmaStages - 2>();
      decode_mxfp4(kt + 1);
    }
  }
  cp_async_wait<0>();

  // INT8: the codes' products times the rows' scales (before the LoRA sum, which is in real units).
  if (bdt == DType::kI8) {
#pragma unroll
    for (int ni = 0; ni < C::kNI; ++ni) {
      const int64_t n = n0 + wn * 32 + ni * 8 + (lane & 3) * 2;
      const float s0 = n < N ? weight_row_scale<P>(ex, n, p.inter) : 0.0f;
      const float s1 = n + 1 < N ? weight_row_scale<P>(ex, n + 1, p.inter) : 0.0f;
#pragma unroll
      for (int mi = 0; mi < C::kMI; ++mi) {
        acc[mi][ni][0] *= s0;
        acc[mi][ni][1] *= s1;
        acc[mi][ni][2] *= s0;
        acc[mi][ni][3] *= s1;
      }
    }
  }
  if (p.lora.b != nullptr) {
    static_assert(lora_expand_smem_bytes(BM) <= C::kSmemBytes,
                  "the expand's staging fits the pipeline buffers");
    lora_expand_mma<BM, C::kMI, C::kNI>(p.lora, s_lkey, mma_smem, wm * C::kWM,
                                        static_cast<int64_t>(tile) * BM, static_cast<int>(n0) + wn * 32,
                                        static_cast<int>(N), static_cast<int>(p.inter), acc);
  }

  // Epilogue: c0,c1 at (row g, columns 2t, 2t+1), c2,c3 at row g + 8 (g = lane / 4, t = lane % 4).
#pragma unroll
  for (int mi = 0; mi < C::kMI; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * C::kWM + mi * 16 + (lane >> 2) + h * 8;
      const int32_t pr = s_pair[r];
      if (pr < 0) continue;
      float* orow = P == Phase::kGateUp ? p.out + (static_cast<int64_t>(tile) * BM + r) * N
                                        : p.out + static_cast<int64_t>(pr) * N;
#pragma unroll
      for (int ni = 0; ni < C::kNI; ++ni) {
        const int64_t n = n0 + wn * 32 + ni * 8 + (lane & 3) * 2;
        store_out_pair(orow, n, N, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1], bias);
      }
    }
  }
}

}  // namespace polylora::kernels::cuda::moe_detail
