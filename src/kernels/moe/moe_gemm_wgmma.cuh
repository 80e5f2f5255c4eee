// kernels/moe/moe_gemm_wgmma.cuh: the large-batch MoE grouped GEMM on Hopper's warpgroup MMA (sm_90a), for
// BF16/F16 experts and MXFP4 ones (MX: each stage's codes through a raw ring, decoded into the bf16 B tile by
// the threads that copied them while the previous slice's MMAs run; no bf16 copy of the experts exists)
// (moe_gemm_mma.cuh stays the path for INT8 weights and for GPUs other than compute capability 9.0). With
// BF16 LoRA stacks on that path the slot-stacked LoRA expand is fused into the epilogue as in moe_gemm_mma
// (lora_expand_mma, LORA = 1, 128 columns per CTA), or (LORA = 2, moe_wgmma_lora_ext) runs as extra K slices
// after the weights' (WgmmaParams::lora_ext; moe_lora_mma.cuh). Same inputs and outputs as moe_gemm_mma
// (MmaParams): one CTA of two warpgroups (256 threads) per (128-row tile of one expert, BN output columns),
// each warpgroup's 64 rows × BN accumulated in registers by wgmma.mma_async m64nBNk16 (f32 accumulation) from
// shared memory. A rows are gathered (gate_up: x by token; down: act by sorted row, both bf16, rows padded to
// a multiple of 64 columns, padding rows zero-filled) and B rows (the expert's weight [N, K], K-major as
// wgmma wants it) are copied with 16-byte cp.async into [rows][64] tiles with the 128-byte swizzle
// (kernels/wgmma_util.cuh), kStages slices of K = 64 deep: slice kt + kStages − 2 is loaded while the MMAs of
// slice kt run and those of kt − 1 may still be in flight (wgmma.wait_group 1), so a stage is overwritten
// only after every warpgroup's MMAs on it completed (the barrier at the top of the next iteration). Odd
// weight shapes (rows not 16-byte multiples, F16) are converted element by element into the same tiles. With
// the hi + lo split the K loop runs over both copies of A while B's K slice wraps (as in moe_gemm_mma). For
// GPT-OSS's interleaved gate/up the activation can be fused into the gate/up epilogue (WgmmaParams::act_out:
// the bf16 activation rows the down product reads, no f32 gu). CTAs are ordered in groups of `group_rows` row
// tiles (row tiles fastest) taking every column tile, so a group's A rows stay in L2 while its column tiles
// pass and each B tile is read by the group's CTAs close together (CTA swizzling). Tiles past the device-side
// tile count exit at once. Compiled to a trap outside sm_90a; moe_cuda.cu launches it only on compute
// capability 9.0 (wgmma_supported()). Only included through moe_launch.h. Must not: depend on anything above
// common/.
#pragma once

#include "kernels/moe/moe_gemm_mma.cuh"
#include "kernels/wgmma_util.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kWgThreads = 256;  // two warpgroups: rows 0-63 and 64-127 of the tile
constexpr int kWgBM = 128;
constexpr int kWgBK = 64;  // one 128-byte swizzled row per tile row and stage

struct WgmmaParams {
  MmaParams mp;        // as moe_gemm_mma's (mx_nb unused: BF16/F16 weights; mp.lora.b set: the LoRA epilogue)
  int group_rows = 8;  // row tiles per CTA group (the CTA swizzle)
  int64_t col_tiles = 0;  // column tiles: ceil(N / BN)
  int64_t max_tiles = 0;  // row tiles of the grid (the workspace's worst case)
  // Gate/up of GPT-OSS's interleaved gate/up rows (ExpertAct::kGptOssSwiglu) with act_out set: the activation
  // fused into the epilogue instead of writing gu: act_out[sorted row][i] = act(gate 2i + bias, up 2i + 1 +
  // bias) as bf16 (the hi part; with act_copies 2 the lo part at + act_lda), as moe_act_kernel writes it
  // (bit for bit); the CTAs of the last column tile zero columns [I, act_lda) of their rows.
  __nv_bfloat16* act_out = nullptr;
  int64_t act_lda = 0;
  int act_copies = 1;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;
  // LORA = 2 (KernelTuning::moe_wgmma_lora_ext): the LoRA expand as extra K slices (moe_lora_mma.cuh, "The
  // LoRA expand as extra K slices"): the rows' K-extensions [max_rows][ext_w] (moe_lora_ext_pack) against
  // the key's B rows of mp.lora, one slice of kWgBK per run of one key in the tile and ext_w / kWgBK part.
  const __nv_bfloat16* lora_ext = nullptr;
  int ext_w = 0;
  const int32_t* lora_keys = nullptr;  // [max_rows] the rows' keys as moe_lora_ext_pack wrote them
};

// MX: MXFP4 weights (BN 128): each stage's B codes (32 bytes per row and slice of 64) travel through a raw
// ring after the stages and are decoded into the swizzled bf16 B tile by the threads that copied them.
template <int BN, bool MX = false>
struct WgCfg {
  static_assert(!MX || BN == 128, "MXFP4 B tiles: 128 rows (one 16-byte code chunk per thread)");
  static constexpr int kStages = MX || BN == 256 ? 4 : 6;
  static constexpr int kABytes = kWgBM * kWgBK * 2;
  static constexpr int kBBytes = BN * kWgBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static constexpr int kRawBytes = MX ? BN * (kWgBK / 2) : 0;  // one stage's codes
  // + slack for the 1024-byte alignment
  static constexpr int kSmemBytes = kStages * (kStageBytes + kRawBytes) + 1024;
  static constexpr int kBRows = BN / 32;  // B rows each thread copies per stage (BF16 / F16 weights)
};

// LORA: 0 none, 1 the expand in the epilogue (lora_expand_mma), 2 as extra K slices (WgmmaParams::lora_ext).
template <Phase P, int BN, int LORA, bool MX>
__global__ void __launch_bounds__(kWgThreads, 1) moe_gemm_wgmma(WgmmaParams wp) {
#if POLYLORA_WGMMA
  constexpr bool kExt = LORA == 2;
  using C = WgCfg<BN, MX>;
  constexpr int S = C::kStages;
  const MmaParams& p = wp.mp;
  extern __shared__ unsigned char wg_smem[];
  __shared__ int32_t s_pair[kWgBM];
  __shared__ int64_t s_arow[kWgBM];                  // A row (−1: padding, zero-filled)
  __shared__ int32_t s_lkey[LORA != 0 ? kWgBM : 1];  // LoRA key of the row (lora_row_key), −1: none
  __shared__ int16_t s_run[kExt ? kWgBM + 1 : 1];    // kExt: the runs' first rows, then kWgBM
  __shared__ uint32_t s_run_mask[kExt ? kWgBM / 32 : 1];
  // CTA → (row tile, column tile) in groups of group_rows row tiles, row tiles fastest.
  const int64_t cta = blockIdx.x;
  const int64_t span = static_cast<int64_t>(wp.group_rows) * wp.col_tiles;
  const int64_t grp = cta / span, local = cta % span;
  const int64_t rows_g = min(static_cast<int64_t>(wp.group_rows), wp.max_tiles - grp * wp.group_rows);
  const int tile = static_cast<int>(grp * wp.group_rows + local % rows_g);
  const int64_t n0 = (local / rows_g) * BN;
  if (tile >= *p.num_tiles) return;
  const int64_t K = P == Phase::kGateUp ? p.hidden : p.inter;
  const int64_t N = P == Phase::kGateUp ? 2 * p.inter : p.hidden;
  if (n0 >= N) return;
  const ExpertView& ex = p.experts[p.tile_expert[tile]];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
  if (tid < kWgBM) {
    const int64_t r = static_cast<int64_t>(tile) * kWgBM + tid;
    const int32_t pr = p.sorted[r];
    s_pair[tid] = pr;
    s_arow[tid] = pr < 0 ? -1 : (P == Phase::kGateUp ? pr / p.top_k : r);
    if constexpr (kExt) {
      s_lkey[tid] = wp.lora_keys[r];
    } else if constexpr (LORA != 0) {
      s_lkey[tid] = lora_row_key(pr, p.tile_expert[tile], p.lora.token_slots, p.top_k, p.lora.slots, p.lora.E,
                                 p.lora.scale, p.lora.c0, p.lora.slices);
    }
  }
  const DType bdt = weight_dtype<P>(ex);
  const float* bias = weight_bias<P>(ex);
  // The tile's bias columns, read at the start (in the epilogue each add waited on its own global load:
  // ncu, session 55).
  __shared__ float s_bias[BN];
  if (bias != nullptr && tid < BN) s_bias[tid] = n0 + tid < N ? bias[n0 + tid] : 0.0f;
  const bool b_fast = bdt == DType::kBF16 && weight_rows_aligned16<P>(ex, K);
  // Each thread copies chunk ld_c (8 bf16) of rows ld_r + 32·i of the A and B tiles; those rows share
  // r % 8, so their swizzled offsets are ld_off + 4096·i.
  const int ld_c = tid & 7, ld_r = tid >> 3;
  const uint32_t ld_off = wgmma::swz128(ld_r, ld_c);
  const char* b_src[MX ? 1 : C::kBRows];
  // MXFP4: thread tid copies and decodes half mx_half (one 16-byte chunk: a block of 32 codes) of B row
  // mx_row's slice of 64, its block's scale read from global memory (L1 / L2).
  const int mx_row = tid >> 1, mx_half = tid & 1;
  const uint8_t* mx_codes = nullptr;
  const uint8_t* mx_scales = nullptr;
  if constexpr (MX) {
    if (n0 + mx_row < N) mxfp4_row<P>(ex, n0 + mx_row, K, p.inter, mx_codes, mx_scales);
  } else {
#pragma unroll
    for (int i = 0; i < C::kBRows; ++i) {
      const int64_t n = n0 + ld_r + 32 * i;
      b_src[i] = n < N ? weight_row<P>(ex, n, K, p.inter) : nullptr;
    }
  }
  __syncthreads();
  // kExt: the tile's runs of rows of one key (their first rows in s_run, by ballot) and the extra K slices.
  int ext_slices = 0;
  if constexpr (kExt) {
    bool start = false;
    if (tid < kWgBM) {  // warps 0-3, whole
      const int32_t k = s_lkey[tid];
      start = k >= 0 && (tid == 0 || s_lkey[tid - 1] != k);
      const uint32_t m = __ballot_sync(0xffffffffu, start);
      if (lane == 0) s_run_mask[warp] = m;
    }
    __syncthreads();
    int nr = 0, before = 0;
#pragma unroll
    for (int w = 0; w < kWgBM / 32; ++w) {
      const int c = __popc(s_run_mask[w]);
      if (w < warp) before += c;
      nr += c;
    }
    if (start) s_run[before + __popc(s_run_mask[warp] & ((1u << lane) - 1u))] = static_cast<int16_t>(tid);
    if (tid == 0) s_run[nr] = kWgBM;
    __syncthreads();
    ext_slices = nr * (wp.ext_w / kWgBK);
  }
  const __nv_bfloat16* a_src[kWgBM / 32];
#pragma unroll
  for (int i = 0; i < kWgBM / 32; ++i) {
    const int64_t ar = s_arow[ld_r + 32 * i];
    a_src[i] = ar < 0 ? nullptr : p.a + ar * p.lda;
  }
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(wg_smem));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const int num_kt = static_cast<int>(p.lda / kWgBK);
  const int kb64 = p.kb_tiles / 2;  // B's K extent in slices of 64 (the launcher makes kb_tiles even)
  const int total_kt = num_kt + ext_slices;

  // kExt: extra slice x (after the weights' num_kt): part x % per of run x / per. A: the run's rows'
  // K-extension part (other rows zero-filled); B: rows n0 + ld_r + 32·i, chunk ld_c of [B | B | 0…] (the
  // key's B row of column n in its slice's place of the rank space, zero in the other slice's).
  auto load_ext = [&](int stage, int x) {
    const int per = wp.ext_w / kWgBK;
    const int run = x / per, part = x % per;
    const int rb = s_run[run], re = s_run[run + 1];
    const int32_t key = s_lkey[rb];
    const uint32_t sa = base + stage * C::kStageBytes + ld_off;
    const uint32_t sb = sa + C::kABytes;
    const int64_t kc = static_cast<int64_t>(part) * kWgBK + ld_c * 8;
#pragma unroll
    for (int i = 0; i < kWgBM / 32; ++i) {
      const int r = ld_r + 32 * i;
      const bool ok = r >= rb && r < re && s_lkey[r] == key;
      cp_async16(sa + 4096 * i,
                 ok ? static_cast<const void*>(wp.lora_ext +
                                               (static_cast<int64_t>(tile) * kWgBM + r) * wp.ext_w + kc)
                    : static_cast<const void*>(p.a),
                 ok ? 16 : 0);
    }
    const LoraExpandMma& l = p.lora;
    const int64_t GR = l.GR, R = l.R;
    const int64_t kr = kc >= GR ? kc - GR : kc;
    const int slice = l.slices == 2 && kr >= R ? 1 : 0;
#pragma unroll
    for (int i = 0; i < BN / 32; ++i) {
      const int64_t n = n0 + ld_r + 32 * i;
      const int ns = l.slices != 2 ? 0 : (l.interleaved ? static_cast<int>(n & 1) : (n >= p.inter ? 1 : 0));
      const bool ok = n < N && kc < 2 * GR && slice == ns;
      cp_async16(
          sb + 4096 * i,
          ok ? static_cast<const void*>(l.b + (static_cast<int64_t>(key) * N + n) * R + (kr - slice * R))
             : static_cast<const void*>(p.a),
          ok ? 16 : 0);
    }
  };

  const uint32_t raw_base = base + C::kStages * C::kStageBytes;  // MXFP4: the codes' ring
  // may_ext: kt may be an extra slice (false in the K loop's first part, so that part is the base variant's
  // code). With the branch in every iteration the LoRA variant's gate/up took +10.8% over the base for ~2
  // extra slices on 45 (H100 prefill trace, session 54); peeled, +6.3%, and prefill with 8 adapters +2.6%
  // (H100, session 56, docs/gpu-machine.md).
  auto load_stage = [&](int stage, int kt, bool may_ext) {
    if constexpr (kExt) {
      if (may_ext && kt >= num_kt) {
        load_ext(stage, kt - num_kt);
        return;
      }
    }
    const uint32_t sa = base + stage * C::kStageBytes + ld_off;
    const uint32_t sb = sa + C::kABytes;
    const int64_t ka = static_cast<int64_t>(kt) * kWgBK + ld_c * 8;
    const int64_t k = static_cast<int64_t>(weight_k_slice(kt, kb64)) * kWgBK + ld_c * 8;  // B's K index
#pragma unroll
    for (int i = 0; i < kWgBM / 32; ++i)
      cp_async16(sa + 4096 * i, a_src[i] != nullptr ? a_src[i] + ka : p.a, a_src[i] != nullptr ? 16 : 0);
    if constexpr (MX) {
      const int64_t blk =
          static_cast<int64_t>(weight_k_slice(kt, kb64)) * 2 + mx_half;  // the chunk's block of 32 values
      const bool ok = mx_codes != nullptr && blk < p.mx_nb;
      cp_async16(raw_base + stage * C::kRawBytes + mx_row * 32 + mx_half * 16,
                 ok ? static_cast<const void*>(mx_codes + blk * 16) : static_cast<const void*>(p.a),
                 ok ? 16 : 0);
    } else {
#pragma unroll
      for (int i = 0; i < C::kBRows; ++i) {
        const bool ok = b_src[i] != nullptr && k < K;
        if (b_fast) {
          cp_async16(sb + 4096 * i, ok ? b_src[i] + k * 2 : static_cast<const void*>(p.a), ok ? 16 : 0);
        } else {
          uint32_t w[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            uint32_t lo = 0, hi = 0;
            if (ok && k + 2 * j < K)
              lo = __bfloat16_as_ushort(cuda_util::load_as_bf16(b_src[i], bdt, k + 2 * j));
            if (ok && k + 2 * j + 1 < K)
              hi = __bfloat16_as_ushort(cuda_util::load_as_bf16(b_src[i], bdt, k + 2 * j + 1));
            w[j] = lo | (hi << 16);
          }
          mma::st_shared_v4(sb + 4096 * i, w);
        }
      }
    }
  };

  // MXFP4: the scale of the thread's block of slice kt (read a slice ahead of its decode: a global load on
  // the decode's path otherwise, ncu's top long-scoreboard stall of this kernel in session 55).
  auto mx_scale = [&](int kt) -> uint32_t {
    if constexpr (MX) {
      const int64_t blk = static_cast<int64_t>(weight_k_slice(kt, kb64)) * 2 + mx_half;
      return kt < num_kt && mx_codes != nullptr && blk < p.mx_nb ? __ldg(mx_scales + blk) : 0u;
    } else {
      return 0u;
    }
  };
  // MXFP4: the thread's own codes of slice kt (its cp.async group complete) as bf16 into that stage's B tile,
  // chunks 4·half .. 4·half + 3 of its row (the swizzled layout), then made visible to the async proxy; sc:
  // mx_scale(kt).
  auto decode_mx = [&](int kt, uint32_t sc) {
    if constexpr (MX) {
      const int stage = kt % C::kStages;
      const uint4 c = *reinterpret_cast<const uint4*>(wg_smem + (raw_base - raw) + stage * C::kRawBytes +
                                                      mx_row * 32 + mx_half * 16);
      const uint32_t sb = base + stage * C::kStageBytes + C::kABytes;
      const uint32_t words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t out[4];
        mma::mxfp4x8_to_bf16x8(words[w], sc, out);
        mma::st_shared_v4(sb + wgmma::swz128(mx_row, 4 * mx_half + w), out);
      }
      wgmma::fence_proxy_async();
    }
  };

  // The warp's 16 rows × BN columns, as lora_expand_mma's single m16 fragment row (MI = 1).
  float acc[1][BN / 8][4];
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[0][j][q] = 0.0f;
#pragma unroll
  for (int s = 0; s < S - 2; ++s) {
    if (s < total_kt) load_stage(s, s, true);
    cp_async_commit();
  }
  uint32_t sc_next = 0;  // MXFP4: mx_scale(kt + 1) at the top of iteration kt
  if constexpr (MX) {    // slice 0's codes (its group complete once at most S − 3 are pending)
    const uint32_t sc0 = mx_scale(0);
    sc_next = mx_scale(1);
    cp_async_wait<S - 3>();
    decode_mx(0, sc0);
  }
  // One K slice: its MMAs, the load of slice kt + S − 2 (an extra slice only where may_ext) and, MXFP4, the
  // decode of slice kt + 1.
  auto k_step = [&](int kt, bool may_ext) {
    // Groups committed so far: S − 2 + kt; slice kt's is complete once at most S − 3 are pending.
    cp_async_wait<S - 3>();
    wgmma::fence_proxy_async();
    // Slice kt is visible to both warpgroups; both waited for their MMAs of slice kt − 2 (wait<1> at the
    // end of iteration kt − 1), whose stage the load below overwrites.
    __syncthreads();
    const int nk = kt + S - 2;
    if (nk < total_kt) load_stage(nk % S, nk, may_ext);
    cp_async_commit();
    const uint32_t st = base + (kt % S) * C::kStageBytes;
    const uint32_t sa = st + wg * (64 * 128);
    const uint32_t sb = st + C::kABytes;
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kWgBK / 16; ++ks)
      wgmma::mma_async<BN>(acc[0], wgmma::desc128(sa + 32 * ks), wgmma::desc128(sb + 32 * ks));
    wgmma::commit();
    if constexpr (MX) {
      // Slice kt + 1's codes while slice kt's MMAs run: its group is complete once at most S − 3 are
      // pending; its B tile was last read by the MMAs of slice kt + 1 − S, long complete.
      if (kt + 1 < num_kt) {
        const uint32_t sc = sc_next;
        sc_next = mx_scale(kt + 2);
        cp_async_wait<S - 3>();
        decode_mx(kt + 1, sc);
      }
    }
    wgmma::wait<1>();
  };
  // The slices whose prefetch is a weight slice: the base variant's loop; then the last S − 2 weight slices
  // and the extra ones.
  const int plain_kt = kExt ? max(0, min(total_kt, num_kt) - (S - 2)) : total_kt;
  int kt = 0;
  for (; kt < plain_kt; ++kt) k_step(kt, false);
  if constexpr (kExt) {
#pragma unroll 1
    for (; kt < total_kt; ++kt) k_step(kt, true);
  }
  wgmma::wait<0>();
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) wgmma::fence_operand(acc[0][j][q]);
  cp_async_wait<0>();
  const int row_base = wg * 64 + (warp & 3) * 16;  // the warp's first row of the tile
  if constexpr (LORA == 1) {
    // The slot-stacked LoRA expand as extra mma.sync k16 steps of the same accumulators (moe_lora_mma.cuh),
    // staging in the pipeline's buffers (every MMA and copy above has completed).
    static_assert(lora_expand_smem_bytes(kWgBM) <= C::kSmemBytes - 1024, "the expand's staging fits");
    lora_expand_mma<kWgBM, 1, BN / 8>(p.lora, s_lkey, wg_smem + (base - raw), row_base,
                                      static_cast<int64_t>(tile) * kWgBM, static_cast<int>(n0),
                                      static_cast<int>(N), static_cast<int>(p.inter), acc);
  }

  if constexpr (P == Phase::kGateUp) {
    if (wp.act_out != nullptr) {  // gate 2i and up 2i + 1 are one thread's accumulator pair
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = row_base + (lane >> 2) + h * 8;
        if (s_pair[r] < 0) continue;
        __nv_bfloat16* arow =
            wp.act_out + (static_cast<int64_t>(tile) * kWgBM + r) * wp.act_copies * wp.act_lda;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int64_t n = n0 + j * 8 + (lane & 3) * 2;  // even; N = 2I is even
          if (n >= N) continue;
          float g = acc[0][j][2 * h], u = acc[0][j][2 * h + 1];
          if (bias != nullptr) {
            g += s_bias[n - n0];
            u += s_bias[n - n0 + 1];
          }
          const float v = expert_act(ExpertAct::kGptOssSwiglu, g, u, wp.swiglu_alpha, wp.swiglu_limit);
          const cuda_util::Bf16Pair q = cuda_util::split_bf16(v);
          arow[n >> 1] = q.hi;
          if (wp.act_copies == 2) arow[wp.act_lda + (n >> 1)] = q.lo;
        }
      }
      const int64_t I = p.inter, pad = wp.act_lda - I;
      if (n0 + BN >= N && pad > 0) {  // the rows' padding columns, read as zeros by the down product
        for (int64_t idx = tid; idx < kWgBM * pad; idx += kWgThreads) {
          const int r = static_cast<int>(idx / pad);
          if (s_pair[r] < 0) continue;
          __nv_bfloat16* arow = wp.act_out +
                                (static_cast<int64_t>(tile) * kWgBM + r) * wp.act_copies * wp.act_lda + I +
                                idx % pad;
          arow[0] = __float2bfloat16_rn(0.0f);
          if (wp.act_copies == 2) arow[wp.act_lda] = __float2bfloat16_rn(0.0f);
        }
      }
      return;
    }
  }
  // Epilogue: the warp holds rows row_base + lane / 4 (+ 8): acc[0][j][0..1] at columns 8j + 2·(lane % 4) +
  // {0, 1} of the first row, acc[0][j][2..3] of the second.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_base + (lane >> 2) + h * 8;
    const int32_t pr = s_pair[r];
    if (pr < 0) continue;
    float* orow = P == Phase::kGateUp ? p.out + (static_cast<int64_t>(tile) * kWgBM + r) * N
                                      : p.out + static_cast<int64_t>(pr) * N;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int c = j * 8 + (lane & 3) * 2;  // the pair's first column in the tile
      float v0 = acc[0][j][2 * h], v1 = acc[0][j][2 * h + 1];
      if (bias != nullptr) {  // (zeros past N, unused there)
        v0 += s_bias[c];
        v1 += s_bias[c + 1];
      }
      store_out_pair(orow, n0 + c, N, v0, v1, nullptr);
    }
  }
#else
  (void)wp;
  __trap();  // launched only on compute capability 9.0 (wgmma_supported)
#endif
}

}  // namespace polylora::kernels::cuda::moe_detail
