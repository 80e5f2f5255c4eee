// kernels/moe/moe_cuda.cu: the CUDA MoE experts, entirely on the device (no host sync, no per-expert host
// loop; the routing and sorting kernels are moe_route_cuda.cu's). Two paths, chosen on the host from the
// number of token-expert pairs m·top_k:
// - small (e.g. decode: pairs <= max(512, 16·E) with tensor-core weights, <= kSmallPairs with F32 weights;
//   the bounds are tuned per device and shape, kernels/tuning.h, with POLYLORA_* overrides): one block sorts
//   the pairs by expert in shared memory (compact offsets and the list of active experts), then
//   weight-streaming kernels read each active expert's weights once for its routed rows: gate_up, [LoRA],
//   activation, down, [LoRA]; BF16/F16 weights with >= moe_tc_min_per_expert pairs per expert on average on
//   tensor cores (moe_gemv_pipe.cuh / moe_gemv_mma.cuh: x cast to bf16 once, the activation written in bf16),
//   fewer, or F32 weights, with fp32 FMAs on f32 activations (moe_gemv.cuh, up to 8 routed rows per weight
//   read);
// - large (prefill), in the manner of vLLM's fused MoE:
//   1. align: count pairs per expert, offsets padded to the GEMM row tile, a tile -> expert map, the
//      pairs scattered into expert order (padding slots hold −1);
//   2. gate_up grouped GEMM over all experts in one launch (grid: worst-case tiles × column tiles; tiles
//      past the device-side count exit at once), bias in the epilogue;
//   3. expert LoRA on gate_up rows (per sorted row: its token's slot and the row's expert);
//   4. activation; 5. down grouped GEMM (bias in the epilogue) into per-pair rows; 6. down LoRA.
//   BF16/F16 weights run the bf16 tensor-core GEMM of moe_gemm_mma.cuh (x cast to bf16 once, the
//   activation written in bf16 by step 4, each as a hi + lo pair with CudaContext::bf16_split(m); fp32
//   accumulation); F32 weights an fp32 FMA GEMM.
// Both end with a weighted combine per token in k order (deterministic). Intermediates are f32 in the
// workspace. INT8 experts (MoeExpertsArgs::experts_int8) take the fp32 GEMV kernel or the tensor-core
// grouped GEMM (both read the codes and row scales directly, moe_gemv.cuh / moe_gemm_mma.cuh); MXFP4 experts
// (experts_mxfp4, GPT-OSS as shipped) the tensor-core weight-streaming kernel (moe_gemv_mxfp4.cuh), the
// fp32 GEMV (f32 mode) or the grouped GEMM, all decoding the codes in registers (docs/mxfp4.md).
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "kernels/lora/lora_cuda.cuh"
#include "kernels/moe/moe.h"
#include "kernels/moe/moe_lora_stack.cuh"
#include "kernels/moe/moe_steps.h"

namespace polylora::kernels::cuda {
namespace {

using cuda_util::load_as_f32;
using moe_detail::align_small_smem;
using moe_detail::CastArgs;
using moe_detail::gemv_shrink;
using moe_detail::kAlignSmallThreads;
using moe_detail::kMaxTopKLora;
using moe_detail::moe_gemv_blocks;
using moe_detail::Phase;
using moe_detail::route_smem;
using moe_detail::shrink_items;
using moe_detail::shrink_params;
using moe_detail::SmallSortArgs;
using moe_detail::StackBuffers;
using moe_detail::StackStep;
using moe_detail::tuning_of;

constexpr int64_t kSmallPairs = 512;  // at most this many token-expert pairs: the GEMV path (F32 weights)
// Tensor-core weights: the tensor-core weight-streaming kernels (moe_gemv_pipe.cuh, falling back to
// moe_gemv_mma.cuh for odd shapes) for up to moe_tc_max_per_expert (16 on the H200) pairs per expert on
// average; above, the grouped GEMM. moe_tc_min_per_expert was 4 (below it the fp32 GEMV kernel) until the
// cp.async pipeline, then 0 (the pipeline was faster from batch 1: 195.7 vs 191.2 tok/s); with the
// register-streaming GEMV of moe_gemv.cuh (8-warp CTAs of 16 rows, the pipeline's 4-warp 64-row CTAs ran
// at 12.5% occupancy and 1.36 / 0.68 waves at batch 1) it is 1: fewer pairs than experts (GPT-OSS-20B: batch
// < 8) take the GEMV kernel.

int64_t round_up(int64_t v, int64_t a) {
  return (v + a - 1) / a * a;
}

enum class Path { kGemv, kGemvTc, kMma, kF32 };

// The GEMV paths' pair limit: kSmallPairs for F32 weights, max(kSmallPairs, moe_tc_max_per_expert·E) for
// tensor-core weights, or moe_small_pairs for both when set (POLYLORA_MOE_SMALL_PAIRS: 0 sends every call to
// the grouped GEMMs, a large value every call to the GEMV kernels).
int64_t small_pairs_limit(const KernelTuning& t, int64_t num_experts, bool tensor_cores) {
  if (t.moe_small_pairs >= 0) return t.moe_small_pairs;
  return tensor_cores ? std::max(kSmallPairs, t.moe_tc_max_per_expert * num_experts) : kSmallPairs;
}

Path choose_path(const MoeExpertsArgs& a, bool tensor_cores) {
  const int64_t pairs = a.m * a.top_k;
  const KernelTuning t = tuning_of(a);
  // MXFP4 experts (codes decoded in registers on every path), with tensor cores from mxfp4_mma_per_expert
  // pairs per expert on average: the grouped GEMM decoding into its bf16 B tiles (moe_gemm_mma.cuh); fewer,
  // the weight-streaming kernels, which read each active expert once per pass: on tensor cores
  // (moe_gemv_mxfp4.cuh) from mxfp4_tc_min_per_expert, else the fp32 GEMV (moe_gemv.cuh; always in f32 mode).
  if (a.experts_mxfp4) {
    if (!tensor_cores) return Path::kGemv;
    if (pairs >= t.mxfp4_mma_per_expert * a.num_experts) return Path::kMma;
    return pairs >= t.mxfp4_tc_min_per_expert * a.num_experts ? Path::kGemvTc : Path::kGemv;
  }
  // INT8 experts (--quantization int8), whatever the backend's dtype: the fp32 GEMV kernel (codes widened in
  // registers) for few pairs, else the bf16 grouped GEMM dequantizing in its K loop.
  if (a.experts_int8) return pairs <= small_pairs_limit(t, a.num_experts, true) ? Path::kGemv : Path::kMma;
  if (pairs <= small_pairs_limit(t, a.num_experts, tensor_cores))
    return tensor_cores && pairs >= t.moe_tc_min_per_expert * a.num_experts ? Path::kGemvTc : Path::kGemv;
  return tensor_cores ? Path::kMma : Path::kF32;
}

// Row tile of the tensor-core GEMM: 128 when experts average at least 256 rows, else 64 (less padding).
int mma_tile_m(const MoeExpertsArgs& a) {
  return a.m * a.top_k >= 256 * a.num_experts ? 128 : 64;
}

// KernelTuning::moe_lora_mma 0 (POLYLORA_MOE_LORA_MMA=0): BF16 expert LoRA on the grouped-GEMM path always
// through the CUDA-core tiled shrinks and the expand-fused activation and combine (as the other paths)
// instead of, from moe_lora_mma_per_expert pairs per expert, the tensor-core shrinks and the expand in the
// GEMMs (moe_lora_mma.cuh), for A/B timing; on by default.

// Does the grouped-GEMM path run the expert LoRA on tensor cores (BF16 stacks)? From 64 pairs per expert on
// average (GPT-OSS-20B: 512 tokens). H200, `polylora_bench moe-lora --act swiglu --gu-slices 1`, LoRA cost
// per layer, tensor cores vs the CUDA-core shrinks and expand-fused activation/combine: M = 256 267.3 vs
// ~220 us, 1024 349.9 vs ~390, 4096 936.1 vs ~1,701, 8192 1,702.6 vs ~3,343 (the old path's figures from the
// previous device run of the same tree).
bool lora_on_mma(const MoeExpertsArgs& a, Path path) {
  if (path != Path::kMma || a.lora_stack.empty() || a.lora_stack.dtype != DType::kBF16) return false;
  const KernelTuning t = tuning_of(a);
  return t.moe_lora_mma != 0 && a.m * a.top_k >= t.moe_lora_mma_per_expert * a.num_experts;
}

// Does the grouped-GEMM path run on the Hopper warpgroup-MMA GEMM (moe_gemm_wgmma.cuh, with the LoRA expand
// in its epilogue when lora_on_mma)? BF16/F16 experts, and MXFP4 ones with moe_wgmma_mxfp4 (INT8 weights are
// decoded by the mma.sync GEMM only), from moe_wgmma_per_expert pairs per expert (0: never, the default until
// measured), on compute capability 9.0.
bool use_wgmma(const MoeExpertsArgs& a, Path path) {
  if (path != Path::kMma || a.experts_int8) return false;
  if (a.experts_mxfp4 && tuning_of(a).moe_wgmma_mxfp4 == 0) return false;
  const int64_t per = tuning_of(a).moe_wgmma_per_expert;
  return per > 0 && a.m * a.top_k >= per * a.num_experts && moe_detail::wgmma_supported();
}

// Does the warpgroup-MMA GEMM take the tensor-core LoRA's expand as extra K slices (moe_wgmma_lora_ext;
// moe_lora_mma.cuh) instead of in its epilogue? Ranks that are multiples of 8 and 16-byte aligned B stacks
// (the slices copy B rows in 16-byte chunks).
bool use_lora_ext(const MoeExpertsArgs& a, Path path) {
  const MoeLoraStack& s = a.lora_stack;
  return lora_on_mma(a, path) && use_wgmma(a, path) && tuning_of(a).moe_wgmma_lora_ext != 0 &&
         s.rank % 8 == 0 && (reinterpret_cast<uintptr_t>(s.b_gu) & 15) == 0 &&
         (reinterpret_cast<uintptr_t>(s.b_down) & 15) == 0;
}

// Split-K of the tensor-core shrinks: enough CTAs for ~3 per SM over the 64-row windows that can hold pairs
// (each taking about two runs of one key), at most 8 and at most one per 4 BK slices of the K loop.
struct LoraMmaSplits {
  int gu = 1, down = 1;
};
LoraMmaSplits lora_mma_splits(const MoeExpertsArgs& a, int64_t num_kt_gu, int64_t num_kt_down) {
  const int64_t windows = (a.m * a.top_k + moe_detail::kLsRows - 1) / moe_detail::kLsRows + a.num_experts;
  const int64_t want = (3 * cuda_util::num_sms() + 2 * windows - 1) / (2 * windows);
  auto pick = [&](int64_t num_kt) {
    return static_cast<int>(
        std::clamp<int64_t>(want, 1, std::max<int64_t>(1, std::min<int64_t>(8, num_kt / 4))));
  };
  return {pick(num_kt_gu), pick(num_kt_down)};
}

// KernelTuning::moe_lora_beside 0 (POLYLORA_MOE_LORA_BESIDE=0): on the tensor-core weight-streaming path,
// the expert LoRA shrinks that do not ride in the products' extra CTAs run after the gate/up product and
// before the down product as before, instead of beside the products (launched just before each, which starts
// at once: GemvTcParams::defer_wait), for A/B timing; on by default.

// Delta mode of the slot-stacked expert LoRA (StackStep::kDeltaGateUp / kDeltaDown): on the tensor-core
// weight-streaming path, from moe_lora_delta_min_rows up to moe_lora_delta_rows token-expert pairs.
bool lora_delta(const MoeExpertsArgs& a, Path path) {
  const KernelTuning t = tuning_of(a);
  return path == Path::kGemvTc && a.token_slots != nullptr && !a.lora_stack.empty() &&
         a.m * a.top_k <= t.moe_lora_delta_rows && a.m * a.top_k >= t.moe_lora_delta_min_rows;
}

// Workspace layout of a path (each part 256-byte aligned).
struct MoeWorkspace {
  int64_t pairs = 0, tile_m = 1, max_tiles = 0, max_rows = 0, lda_h = 0, lda_i = 0;
  int64_t copies = 1;                 // bf16 copies per activation row: 2 (hi, lo) with the split
  bool wgmma = false;                 // kMma: the GEMMs on moe_gemm_wgmma (use_wgmma)
  int32_t* counts = nullptr;          // [E] pairs per expert
  int32_t* fill = nullptr;            // [E·B] scatter cursors per (expert, slot bucket)
  int32_t* sub_counts = nullptr;      // [E·B] pairs per (expert, slot bucket) (GEMM paths)
  int64_t buckets = 1;                // B: slot buckets (slot-stacked LoRA: slots + 1, bucket 0 = none)
  int32_t* offsets = nullptr;         // [E] first sorted row of each expert (padded to tile_m)
  int32_t* active = nullptr;          // [E] GEMV path: experts with pairs
  int32_t* num_active = nullptr;      // [1]
  int32_t* num_tiles = nullptr;       // [1] tiles (GEMV path: sorted rows, tile_m = 1)
  int32_t* tile_expert = nullptr;     // [max_tiles] (GEMM paths)
  int32_t* sorted = nullptr;          // [max_rows] pair index t·top_k + k, or −1 (padding)
  float* gu = nullptr;                // [max_rows, 2I]
  float* act = nullptr;               // [max_rows, I]
  float* y = nullptr;                 // [pairs, H]
  __nv_bfloat16* x_bf16 = nullptr;    // [m, copies·lda_h] (tensor-core path)
  __nv_bfloat16* act_bf16 = nullptr;  // [max_rows, copies·lda_i] (tensor-core path)
  float* lora_gu = nullptr;           // [max_rows, gu_slices·rank] slot-stacked LoRA: gate/up shrink
  float* lora_down = nullptr;         // [pairs, rank] down shrink
  __nv_bfloat16* lora_ext =
      nullptr;                   // [max_rows, ext_w] lora_ext: the rows' K-extensions (one phase at a time)
  int32_t* lora_keys = nullptr;  // [max_rows] lora_ext: the rows' LoRA keys (one phase at a time)
  int64_t ext_w = 0;             // 2 · gu_slices · rank rounded up to the slice of 64
  float* lora_dgu = nullptr;     // [max_rows, 2I] delta mode (moe_lora_delta): gate/up LoRA by sorted row
  float* lora_dy = nullptr;      // [pairs, H] delta mode: down LoRA by pair
  size_t bytes = 0;

  MoeWorkspace(const MoeExpertsArgs& a, void* base, Path path, bool bf16_split) {
    pairs = a.m * a.top_k;
    switch (path) {
      case Path::kGemv:
        tile_m = 1;
        max_tiles = 0;
        max_rows = pairs;
        break;
      case Path::kGemvTc:
        tile_m = 1;
        max_tiles = 0;
        max_rows = pairs;
        lda_h = round_up(a.hidden, 32);
        lda_i = round_up(a.inter, 32);
        copies = bf16_split ? 2 : 1;
        break;
      case Path::kMma:
        // The warpgroup-MMA GEMM: 128-row tiles, activation rows padded to its K slice of 64.
        wgmma = use_wgmma(a, path);
        tile_m = wgmma ? moe_detail::kWgBM : mma_tile_m(a);
        max_tiles = (pairs + tile_m - 1) / tile_m + a.num_experts;
        max_rows = max_tiles * tile_m;
        lda_h = round_up(a.hidden, wgmma ? moe_detail::kWgBK : moe_detail::kMmaBK);
        lda_i = round_up(a.inter, wgmma ? moe_detail::kWgBK : moe_detail::kMmaBK);
        copies = bf16_split ? 2 : 1;
        break;
      case Path::kF32:
        tile_m = moe_detail::kF32TileM;
        max_tiles = (pairs + tile_m - 1) / tile_m + a.num_experts;
        max_rows = max_tiles * tile_m;
        break;
    }
    // With slot-stacked LoRA every path orders each expert's rows by adapter slot, so a tile's rows
    // mostly share one (slot, expert) and the LoRA kernels read its A and B once per tile, not per row.
    // KernelTuning::moe_slot_order 0 (POLYLORA_MOE_SLOT_ORDER=0): expert order only (A/B).
    const bool slot_order = tuning_of(a).moe_slot_order != 0;
    buckets = slot_order && a.token_slots != nullptr && !a.lora_stack.empty() ? a.lora_stack.slots + 1 : 1;
    auto* p = static_cast<char*>(base);
    auto take = [&](size_t n) {
      char* r = p ? p + bytes : nullptr;
      bytes += static_cast<size_t>(round_up(static_cast<int64_t>(n), 256));
      return r;
    };
    counts = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    fill = reinterpret_cast<int32_t*>(take(static_cast<size_t>(4 * a.num_experts * buckets)));
    sub_counts = reinterpret_cast<int32_t*>(take(static_cast<size_t>(4 * a.num_experts * buckets)));
    offsets = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    active = reinterpret_cast<int32_t*>(take(4 * a.num_experts));
    num_active = reinterpret_cast<int32_t*>(take(4));
    num_tiles = reinterpret_cast<int32_t*>(take(4));
    tile_expert = reinterpret_cast<int32_t*>(take(4 * max_tiles));
    sorted = reinterpret_cast<int32_t*>(take(4 * max_rows));
    gu = reinterpret_cast<float*>(take(4 * max_rows * 2 * a.inter));
    act = reinterpret_cast<float*>(take(4 * max_rows * a.inter));
    y = reinterpret_cast<float*>(take(4 * pairs * a.hidden));
    x_bf16 = reinterpret_cast<__nv_bfloat16*>(take(2 * a.m * copies * lda_h));
    act_bf16 = reinterpret_cast<__nv_bfloat16*>(take(2 * max_rows * copies * lda_i));
    if (!a.lora_stack.empty()) {
      const moe_detail::StackSplits sp = moe_detail::stack_splits(a, max_rows);
      size_t gu_floats = sp.gu_floats, down_floats = sp.down_floats;
      if (lora_on_mma(a, path)) {  // partial sums by sorted row
        const LoraMmaSplits ms =
            lora_mma_splits(a, copies * lda_h / moe_detail::kMmaBK, copies * lda_i / moe_detail::kMmaBK);
        const MoeLoraStack& s = a.lora_stack;
        gu_floats = std::max(gu_floats, static_cast<size_t>(ms.gu * max_rows * s.gu_slices * s.rank));
        down_floats = std::max(down_floats, static_cast<size_t>(ms.down * max_rows * s.rank));
      }
      lora_gu = reinterpret_cast<float*>(take(4 * gu_floats));
      lora_down = reinterpret_cast<float*>(take(4 * down_floats));
      if (use_lora_ext(a, path)) {
        ext_w = round_up(2 * a.lora_stack.gu_slices * a.lora_stack.rank, moe_detail::kWgBK);
        lora_ext = reinterpret_cast<__nv_bfloat16*>(take(static_cast<size_t>(2 * max_rows * ext_w)));
        lora_keys = reinterpret_cast<int32_t*>(take(static_cast<size_t>(4 * max_rows)));
      }
      if (lora_delta(a, path)) {
        lora_dgu = reinterpret_cast<float*>(take(4 * max_rows * 2 * a.inter));
        lora_dy = reinterpret_cast<float*>(take(4 * pairs * a.hidden));
      }
    }
  }
};

// What the tensor-core LoRA kernels need to find each sorted row's key (lora_row_key) for one phase: the
// sort, the token slots and the phase's scale columns (gate/up: 0 and with two slices 1; down: 2).
template <typename Params>
void set_row_keys(Params& p, const MoeExpertsArgs& a, const MoeWorkspace& ws, bool gu) {
  const MoeLoraStack& s = a.lora_stack;
  p.sorted = ws.sorted;
  p.tile_expert = ws.tile_expert;
  p.num_tiles = ws.num_tiles;
  p.tile_m = static_cast<int>(ws.tile_m);
  p.max_rows = ws.max_rows;
  p.token_slots = a.token_slots;
  p.top_k = a.top_k;
  p.E = a.num_experts;
  p.slots = s.slots;
  p.scale = s.scale;
  p.c0 = gu ? 0 : 2;
  p.slices = gu ? s.gu_slices : 1;
}

// The tensor-core shrink of one phase (moe_lora_mma.cuh) over the grouped GEMM's sorted rows: gate/up from x
// (bf16, by token) into lora_gu, down from the activation (bf16, by sorted row) into lora_down, both
// [splits][max_rows][slices · rank].
template <Phase P>
void launch_lora_shrink_mma(const MoeExpertsArgs& a, const MoeWorkspace& ws, int splits, cudaStream_t st) {
  using namespace moe_detail;
  const MoeLoraStack& s = a.lora_stack;
  const bool gu = P == Phase::kGateUp;
  LoraShrinkMmaParams lp;
  lp.a = gu ? ws.x_bf16 : ws.act_bf16;
  lp.lda = ws.copies * (gu ? ws.lda_h : ws.lda_i);
  lp.kb_tiles = static_cast<int>((gu ? ws.lda_h : ws.lda_i) / kMmaBK);
  lp.by_token = gu;
  set_row_keys(lp, a, ws, gu);
  lp.w = static_cast<const __nv_bfloat16*>(gu ? s.a_gu : s.a_down);
  lp.GR = lp.slices * s.rank;
  lp.K = gu ? a.hidden : a.inter;
  lp.out = gu ? ws.lora_gu : ws.lora_down;
  lp.splits = splits;
  lp.nchunks = static_cast<int>((lp.GR + kLsCols - 1) / kLsCols);
  KERNEL_CHECK(
      ws.max_rows % kLsRows == 0 && ws.max_rows / kLsRows < (1LL << 31) && splits * lp.nchunks <= 65535,
      "moe_experts: LoRA shape too large for the tensor-core shrink's grid");
  const dim3 grid(static_cast<unsigned>(ws.max_rows / kLsRows),
                  static_cast<unsigned>(std::clamp<int64_t>(s.slots, 1, 8)),
                  static_cast<unsigned>(splits * lp.nchunks));
  launch_lora_shrink_mma_kernel(grid, lp, st);
}

// The K-extensions of one phase's rows for the warpgroup-MMA GEMM's LoRA slices (lora_ext), from that
// phase's shrink sums.
template <Phase P>
void launch_lora_ext_pack(const MoeExpertsArgs& a, const MoeWorkspace& ws, int splits, cudaStream_t st) {
  const MoeLoraStack& s = a.lora_stack;
  const bool gu = P == Phase::kGateUp;
  moe_detail::LoraExtPackParams pp;
  set_row_keys(pp, a, ws, gu);
  pp.GR = pp.slices * s.rank;
  pp.R = s.rank;
  pp.tmp = gu ? ws.lora_gu : ws.lora_down;
  pp.split_stride = ws.max_rows * pp.GR;
  pp.splits = splits;
  pp.out = ws.lora_ext;
  pp.ext_w = static_cast<int>(ws.ext_w);
  pp.keys = ws.lora_keys;
  moe_detail::launch_lora_ext_pack_kernel(pp, st);
}

// The LoRA expand fused into the epilogue of one phase's grouped GEMM, reading that phase's shrink sums.
template <Phase P>
moe_detail::LoraExpandMma lora_expand_params(const MoeExpertsArgs& a, const MoeWorkspace& ws, int splits) {
  const MoeLoraStack& s = a.lora_stack;
  const bool gu = P == Phase::kGateUp;
  moe_detail::LoraExpandMma l;
  l.slices = gu ? s.gu_slices : 1;
  l.GR = l.slices * s.rank;
  l.tmp = gu ? ws.lora_gu : ws.lora_down;
  l.split_stride = ws.max_rows * l.GR;
  l.splits = splits;
  l.b = static_cast<const __nv_bfloat16*>(gu ? s.b_gu : s.b_down);
  l.scale = s.scale;
  l.token_slots = a.token_slots;
  l.slots = s.slots;
  l.E = a.num_experts;
  l.R = s.rank;
  l.c0 = gu ? 0 : 2;
  l.interleaved = a.act == ExpertAct::kGptOssSwiglu;
  return l;
}

// A tensor-core weight-streaming product, after the expert LoRA step `beside` (the delta kernel or a shrink)
// when given, which runs beside it: the product starts at once (GemvTcParams::defer_wait) and its one extra
// CTA in x waits for that step (gemv_pdl_begin), so the product's completion implies the step's. The pair
// keeps programmatic dependent launch even in LoRA steps, which launch the rest plainly
// (Backend::set_lora_step): without it they would run one after the other.
template <Phase P>
void launch_tc_product(dim3 grid, const moe_detail::GemvTcParams& tp, const MoeExpertsArgs& a,
                       const StackBuffers& sb, std::optional<StackStep> beside, cudaStream_t st) {
  if (!beside) return moe_detail::launch_gemv_tc<P>(grid, tp, a.experts_mxfp4, a.m, st);
  ProgrammaticLaunchOn pdl;
  moe_detail::stack_lora_step(*beside, a, sb, st);
  grid.x += 1;
  moe_detail::launch_gemv_tc<P>(grid, tp, a.experts_mxfp4, a.m, st);
}

// Whether the expert products take their bf16 activations as a hi + lo pair (CudaContext::bf16_split).
// MXFP4 experts do not: their weights carry 4-bit values, Hugging Face's and every peer's MXFP4 kernels
// multiply them with bf16 activations, and the split doubled the activation traffic and the MMAs of the
// tensor-core MXFP4 kernels, whose shared memory it filled (H200, session 33: decode without the split ran
// 1.36x / 1.38x faster at batch 16 / 64). KernelTuning::mxfp4_bf16_split 1 (POLYLORA_MXFP4_BF16_SPLIT=1)
// keeps the split for them.
bool moe_split(const MoeExpertsArgs& a, const CudaContext& ctx) {
  return ctx.bf16_split(a.m) && (!a.experts_mxfp4 || tuning_of(a).mxfp4_bf16_split != 0);
}

}  // namespace

size_t moe_experts_workspace_bytes(const MoeExpertsArgs& a, const CudaContext& ctx) {
  // The backend's weight dtype is not known here: the largest of the paths either dtype could take.
  const bool bf16_split = moe_split(a, ctx);
  size_t bytes = 0;
  for (const bool tc : {false, true})
    bytes = std::max(bytes, MoeWorkspace(a, nullptr, choose_path(a, tc), bf16_split).bytes);
  return bytes;
}

void moe_experts(const MoeExpertsArgs& a, bool tensor_cores, const CudaContext& ctx) {
  if (a.m == 0) return;
  const Path path = choose_path(a, tensor_cores);
  MoeWorkspace ws(a, ctx.workspace, path, moe_split(a, ctx));
  KERNEL_CHECK(ws.bytes <= ctx.workspace_bytes, "moe_experts: workspace too small");
  cudaStream_t st = cuda_util::stream(ctx);
  const int64_t E = a.num_experts, I = a.inter, H = a.hidden;
  KERNEL_CHECK(E <= 65535 && ws.max_rows < (1LL << 31), "moe_experts: shape too large for the grid");
  KERNEL_CHECK(!a.experts_mxfp4 || (H % kMxfp4BlockSize == 0 && I % kMxfp4BlockSize == 0),
               "moe_experts: MXFP4 experts need hidden and intermediate sizes that are multiples of 32");
  // Expert LoRA: slot-stacked (lora_stack) or a table of per-(slot, expert) views (lora).
  const bool stack = a.token_slots && !a.lora_stack.empty();
  const bool lora = !stack && a.token_slots && a.lora && a.num_slots > 0;
  const int tile_m = static_cast<int>(ws.tile_m);
  const bool mma = path == Path::kMma;
  const bool tc_gemv = path == Path::kGemvTc;
  const bool bf16_act = mma || tc_gemv;  // the down product reads the activation as bf16
  // BF16 stacks on the grouped-GEMM path: tensor-core shrinks, expands in the GEMMs' epilogues.
  const bool mma_lora = stack && lora_on_mma(a, path);
  const LoraMmaSplits lms = mma_lora ? lora_mma_splits(a, ws.copies * ws.lda_h / moe_detail::kMmaBK,
                                                       ws.copies * ws.lda_i / moe_detail::kMmaBK)
                                     : LoraMmaSplits{};
  moe_detail::StackBuffers sb;
  if (stack) {
    sb = {.sorted = ws.sorted,
          .num_tiles = ws.num_tiles,
          .tile_m = static_cast<int>(ws.tile_m),
          .max_rows = ws.max_rows,
          .gu = ws.gu,
          .act = ws.act,
          .act_bf16 = bf16_act ? ws.act_bf16 : nullptr,
          .lda_bf16 = ws.lda_i,
          .copies = ws.copies,
          .y = ws.y,
          .lora_gu = ws.lora_gu,
          .lora_down = ws.lora_down};
    const MoeLoraStack& ls_ = a.lora_stack;
    KERNEL_CHECK(ls_.rank > 0 && (ls_.gu_slices == 1 || ls_.gu_slices == 2) && a.top_k <= kMaxTopKLora &&
                     (ls_.dtype == DType::kF32 || ls_.dtype == DType::kBF16),
                 "moe_experts: bad LoRA stack (rank > 0, gu_slices 1 or 2, top_k <= 32, F32 or BF16)");
    KERNEL_CHECK(ws.lora_gu != nullptr, "moe_experts: workspace sized without the LoRA stack");
  }
  // Steps 3 and 4 of every path (the GEMV path's sorted rows are tiles of one row): gate_up LoRA, then the
  // activation (f32 for the GEMV and fp32 GEMMs and the down LoRA, bf16 for the tensor-core GEMM).
  auto gate_up_lora_and_activation = [&] {
    if (stack) {
      moe_detail::stack_lora_step(StackStep::kShrinkGateUp, a, sb, st);
      moe_detail::stack_lora_step(StackStep::kActivation, a, sb, st);
      moe_detail::stack_lora_step(StackStep::kShrinkDown, a, sb, st);
      return;
    }
    if (lora) {
      moe_detail::launch_expert_lora_views(a, ws.sorted, ws.num_tiles, tile_m, ws.max_rows, ws.gu, ws.act,
                                           ws.y, false, st);
    }
    moe_detail::launch_expert_act(ws.sorted, ws.num_tiles, tile_m, ws.max_rows, ws.gu, nullptr,
                                  (!bf16_act || lora) ? ws.act : nullptr, bf16_act ? ws.act_bf16 : nullptr,
                                  ws.lda_i, ws.copies, a, st);
  };

  // 0. The routing (when given): here unless the small-batch sort below does it in its own launch.
  const bool small_sort = tc_gemv || path == Path::kGemv;
  const bool routing = a.route.logits != nullptr;
  if (routing)
    KERNEL_CHECK(a.route.ids == a.ids && a.route.weights == a.weights && a.route.m == a.m &&
                     a.route.top_k == a.top_k && a.route.id_begin >= 0 &&
                     a.route.id_begin + E <= a.route.num_experts,
                 "moe_experts: the routing must write this call's ids and weights");
  constexpr int kSortWarps = kAlignSmallThreads / 32;
  // Slot order where its counters fit in shared memory (expert order otherwise: still correct).
  const int64_t nb = align_small_smem(E, ws.buckets) <= 48 * 1024 ? ws.buckets : 1;
  // (The router's experts: all of the model's with expert parallelism by masking, E of them this rank's.)
  const int64_t router_e = routing ? a.route.num_experts : E;
  const size_t fused_smem = std::max(align_small_smem(E, nb), route_smem(router_e, kSortWarps));
  const bool route_fused = routing && small_sort && a.m <= tuning_of(a).moe_route_fused_max_tokens &&
                           a.top_k >= 1 && a.top_k <= router_e && fused_smem <= 48 * 1024;
  if (routing && !route_fused) route(a.route, ctx);
  const CastArgs cast_args{
      .x = a.x, .ldx = a.ldx, .m = a.m, .H = H, .lda = ws.lda_h, .copies = ws.copies, .out = ws.x_bf16};
  // 1. The pairs sorted by expert (one block) and, with `cast`, x cast to bf16 rows: one launch with the
  // routing when it is fused, else one each.
  auto sort_small = [&](bool cast) {
    const SmallSortArgs ss{.ids = a.ids,
                           .pairs = ws.pairs,
                           .E = E,
                           .counts = ws.counts,
                           .offsets = ws.offsets,
                           .active = ws.active,
                           .num_active = ws.num_active,
                           .num_rows = ws.num_tiles,
                           .sorted = ws.sorted,
                           .token_slots = a.token_slots,
                           .top_k = a.top_k,
                           .buckets = nb};
    if (route_fused) {
      const unsigned cast_blocks =
          cast ? cuda_util::blocks_for(a.m * ws.lda_h / 8, kAlignSmallThreads, 8192) : 0u;
      moe_detail::launch_route_sort_small(a.route, ss, cast_args, cast_blocks, fused_smem, st);
      return;
    }
    const size_t smem = align_small_smem(E, nb);
    KERNEL_CHECK(smem <= 48 * 1024, "moe_experts: too many experts for the small-batch sort");
    moe_detail::launch_align_small(ss, smem, st);
    if (!cast) return;
    moe_detail::launch_cast_x_bf16(cast_args, cuda_util::blocks_for(a.m * ws.lda_h / 8, 256, 8192), 256, st);
  };

  if (tc_gemv) {
    sort_small(true);
    moe_detail::GemvTcParams tp;
    tp.split = ws.copies == 2;
    tp.mx_stages = static_cast<int>(std::clamp<int64_t>(tuning_of(a).moe_gemv_mxfp4_stages, 2, 4));
    tp.experts = a.experts;
    tp.counts = ws.counts;
    tp.offsets = ws.offsets;
    tp.active = ws.active;
    tp.num_active = ws.num_active;
    tp.sorted = ws.sorted;
    tp.top_k = a.top_k;
    tp.hidden = H;
    tp.inter = I;
    const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(E, ws.pairs));
    // The LoRA shrinks run in extra CTAs of the two products (gate/up: x, down: the f32 activation), as on
    // the GEMV path: no launches of their own, overlapped with the base product.
    // Only while every item has a warp of its own (up to 4 per SM): with more, the extra CTAs hold the
    // product's shared memory and CTA slots, and at M = 64 (2,048 items) the LoRA cost 47.7 / 63.5 us per
    // layer (one CTA per 4 items / per SM) against 40.8 with the shrinks launched apart (H200, session 33).
    // Delta mode (lora_delta): each phase's LoRA as one kernel just before the product, which runs beside it.
    const bool delta = stack && ws.lora_dgu != nullptr;
    if (delta) {
      sb.dgu = ws.lora_dgu;
      sb.dy = ws.lora_dy;
      tp.defer_wait = true;
    }
    const bool fuse = stack && !delta && gemv_shrink(a, sb) &&
                      shrink_items<Phase::kGateUp>(a, sb).items() <= 4 * cuda_util::num_sms();
    sb.shrinks_fused = fuse;
    // The other shrinks (launches of their own) beside the products: each launched just before its product,
    // which starts at once (defer_wait, as in delta mode); the expand-fused activation and combine after the
    // products read their sums (a product's completion implies its shrink's).
    const bool beside = stack && !delta && !fuse && tuning_of(a).moe_lora_beside != 0;
    if (beside) tp.defer_wait = true;
    // The LoRA step of a phase that runs beside its product (launch_tc_product), if any.
    auto side_step = [&](StackStep delta_step, StackStep shrink_step) -> std::optional<StackStep> {
      if (delta) return delta_step;
      if (beside) return shrink_step;
      return std::nullopt;
    };
    // This phase's shrink items in extra CTAs (one warp per item, spread over the y-planes) past grid.x.
    auto with_shrink = [&](dim3& grid, const moe_detail::GemvParams& shrink) {
      tp.row_tiles = static_cast<int>(grid.x);
      tp.lora_ctas = 0;
      if (!fuse) return;
      tp.shrink = shrink;
      const int64_t ctas = (shrink.lora.items() + 3) / 4;
      tp.lora_ctas = static_cast<int>(std::max<int64_t>((ctas + max_active - 1) / max_active, 1));
      grid.x += static_cast<unsigned>(tp.lora_ctas);
    };
    // 2. gate_up (with GPT-OSS's activation in its epilogue when nothing else reads gu: no expert LoRA)
    tp.a = ws.x_bf16;
    tp.lda = ws.copies * ws.lda_h;
    tp.lda_copy = ws.lda_h;
    tp.out = ws.gu;
    const bool fused_act = !stack && !lora && a.act == ExpertAct::kGptOssSwiglu &&
                           tuning_of(a).moe_gemv_fused_act != 0 &&
                           moe_detail::gemv_tc_writes_act(a.experts_mxfp4);
    if (fused_act) {
      tp.act_out = ws.act_bf16;
      tp.act_lda = ws.lda_i;
      tp.act_copies = static_cast<int>(ws.copies);
      tp.swiglu_alpha = a.swiglu_alpha;
      tp.swiglu_limit = a.swiglu_limit;
    }
    dim3 grid_gu(static_cast<unsigned>((2 * I + moe_detail::kTcRows - 1) / moe_detail::kTcRows), max_active);
    with_shrink(grid_gu, shrink_params<Phase::kGateUp>(a, sb));
    launch_tc_product<Phase::kGateUp>(grid_gu, tp, a, sb,
                                      side_step(StackStep::kDeltaGateUp, StackStep::kShrinkGateUp), st);
    // 3. gate_up LoRA, 4. activation (bf16 hi [+ lo] rows; in the gate/up product's epilogue when fused)
    if (fused_act) {
      // written by the product
    } else if (delta ||
               beside) {  // delta: the activation adds the gate/up LoRA; the down LoRA reads its f32 rows
      moe_detail::stack_lora_step(StackStep::kActivation, a, sb, st);
    } else {
      gate_up_lora_and_activation();
    }
    // 5. down
    tp.act_out = nullptr;
    tp.a = ws.act_bf16;
    tp.lda = ws.copies * ws.lda_i;
    tp.lda_copy = ws.lda_i;
    tp.out = ws.y;
    dim3 grid_down(static_cast<unsigned>((H + moe_detail::kTcRows - 1) / moe_detail::kTcRows), max_active);
    with_shrink(grid_down, shrink_params<Phase::kDown>(a, sb));
    launch_tc_product<Phase::kDown>(grid_down, tp, a, sb,
                                    side_step(StackStep::kDeltaDown, StackStep::kShrinkDown), st);
  } else if (path == Path::kGemv) {
    // 1. sort the pairs by expert (one block)
    sort_small(false);
    moe_detail::GemvParams gp;
    gp.experts = a.experts;
    gp.counts = ws.counts;
    gp.offsets = ws.offsets;
    gp.active = ws.active;
    gp.num_active = ws.num_active;
    gp.sorted = ws.sorted;
    gp.top_k = a.top_k;
    gp.hidden = H;
    gp.inter = I;
    gp.round_bf16 = !moe_split(a, ctx) && (tensor_cores || !a.experts_mxfp4);
    const unsigned max_active = static_cast<unsigned>(std::min<int64_t>(E, ws.pairs));
    // 2. gate_up
    gp.x = a.x;
    gp.ldx = a.ldx;
    gp.out = ws.gu;
    // The LoRA shrinks ride along as extra items of the two products (gate/up: x, down: the activation).
    const bool fuse = stack && gemv_shrink(a, sb);
    sb.shrinks_fused = fuse;
    if (fuse) gp.lora = shrink_items<Phase::kGateUp>(a, sb);
    const dim3 grid_gu(moe_gemv_blocks(max_active * ((2 * I + moe_detail::kGemvR - 1) / moe_detail::kGemvR) +
                                       gp.lora.items()));
    // MXFP4: the kernels of 1- or 2-row passes (moe_gemv.cuh).
    const int64_t pass_m = a.experts_mxfp4 ? std::min<int64_t>(a.m, 2) : a.m;
    moe_detail::launch_gemv<Phase::kGateUp>(pass_m, grid_gu, gp, st);
    // 3. gate_up LoRA, 4. activation
    gate_up_lora_and_activation();
    // 5. down
    gp.x = ws.act;
    gp.ldx = I;
    gp.out = ws.y;
    if (fuse) gp.lora = shrink_items<Phase::kDown>(a, sb);
    const dim3 grid_down(
        moe_gemv_blocks(max_active * ((H + moe_detail::kGemvR - 1) / moe_detail::kGemvR) + gp.lora.items()));
    moe_detail::launch_gemv<Phase::kDown>(pass_m, grid_down, gp, st);
  } else {
    // 1. align
    moe_detail::launch_grouped_align({.ids = a.ids,
                                      .pairs = ws.pairs,
                                      .E = E,
                                      .max_rows = ws.max_rows,
                                      .tile_m = tile_m,
                                      .counts = ws.counts,
                                      .fill = ws.fill,
                                      .sub_counts = ws.sub_counts,
                                      .offsets = ws.offsets,
                                      .tile_expert = ws.tile_expert,
                                      .num_tiles = ws.num_tiles,
                                      .sorted = ws.sorted,
                                      .token_slots = a.token_slots,
                                      .top_k = a.top_k,
                                      .buckets = ws.buckets},
                                     st);
    const int64_t tile_n = mma ? moe_detail::kMmaBN : moe_detail::kF32TileN;
    KERNEL_CHECK((2 * I + tile_n - 1) / tile_n <= 65535 && (H + tile_n - 1) / tile_n <= 65535,
                 "moe_experts: shape too large for the grid");
    dim3 grid_gu(static_cast<unsigned>(ws.max_tiles), static_cast<unsigned>((2 * I + tile_n - 1) / tile_n));
    dim3 grid_down(static_cast<unsigned>(ws.max_tiles), static_cast<unsigned>((H + tile_n - 1) / tile_n));
    moe_detail::MmaParams mp;
    moe_detail::GemmParams gp;
    // The warpgroup-MMA gate/up writes GPT-OSS's bf16 activation itself (no f32 gu, no activation kernel)
    // when nothing else reads gu: no per-adapter LoRA views, no stack LoRA outside the GEMMs.
    const bool fused_act = ws.wgmma && a.act == ExpertAct::kGptOssSwiglu && !lora && (!stack || mma_lora) &&
                           tuning_of(a).moe_wgmma_fused_act != 0;
    // The tensor-core GEMM of one phase (N output columns): the warpgroup-MMA kernel when the workspace was
    // laid out for it, else the mma.sync one.
    auto launch_grouped_gemm = [&](Phase phase, int64_t N, dim3 grid, const moe_detail::MmaParams& p) {
      if (!ws.wgmma) {
        if (phase == Phase::kGateUp) {
          moe_detail::launch_mma_tile<Phase::kGateUp>(tile_m, grid, p, st);
        } else {
          moe_detail::launch_mma_tile<Phase::kDown>(tile_m, grid, p, st);
        }
        return;
      }
      const KernelTuning t = tuning_of(a);
      // With the LoRA epilogue and with MXFP4 weights the launcher takes 128 columns whatever bn says; it
      // counts the grid's column tiles in the BN it takes (counted here in 256, MXFP4 left half of every
      // output's columns unwritten: GpuMoeMxfp4.WarpgroupMmaGroupedGemm's failure, session 40).
      const int bn = t.moe_wgmma_bn == 128 ? 128 : 256;
      moe_detail::WgmmaParams wp{
          .mp = p,
          .group_rows = static_cast<int>(std::clamp<int64_t>(t.moe_wgmma_group, 1, 64)),
          .max_tiles = ws.max_tiles};
      if (ws.lora_ext != nullptr && p.lora.b != nullptr) {  // the LoRA expand as extra K slices
        wp.lora_ext = ws.lora_ext;
        wp.ext_w = static_cast<int>(ws.ext_w);
        wp.lora_keys = ws.lora_keys;
      }
      if (phase == Phase::kGateUp && fused_act) {
        wp.act_out = ws.act_bf16;
        wp.act_lda = ws.lda_i;
        wp.act_copies = static_cast<int>(ws.copies);
        wp.swiglu_alpha = a.swiglu_alpha;
        wp.swiglu_limit = a.swiglu_limit;
      }
      if (phase == Phase::kGateUp) {
        moe_detail::launch_wgmma_tile<Phase::kGateUp>(bn, wp, st);
      } else {
        moe_detail::launch_wgmma_tile<Phase::kDown>(bn, wp, st);
      }
    };
    // 2. gate_up
    if (mma) {
      moe_detail::launch_cast_x_bf16(cast_args, cuda_util::blocks_for(a.m * ws.lda_h / 8, 256, 8192), 256,
                                     st);
      mp.a = ws.x_bf16;
      mp.lda = ws.copies * ws.lda_h;
      mp.kb_tiles = static_cast<int>(ws.lda_h / moe_detail::kMmaBK);
      mp.experts = a.experts;
      mp.sorted = ws.sorted;
      mp.tile_expert = ws.tile_expert;
      mp.num_tiles = ws.num_tiles;
      mp.top_k = a.top_k;
      mp.hidden = H;
      mp.inter = I;
      mp.out = ws.gu;
      mp.mx_nb = a.experts_mxfp4 ? H / kMxfp4BlockSize : 0;
      if (mma_lora) {
        launch_lora_shrink_mma<Phase::kGateUp>(a, ws, lms.gu, st);
        if (ws.lora_ext != nullptr) launch_lora_ext_pack<Phase::kGateUp>(a, ws, lms.gu, st);
        mp.lora = lora_expand_params<Phase::kGateUp>(a, ws, lms.gu);
      }
      launch_grouped_gemm(Phase::kGateUp, 2 * I, grid_gu, mp);
    } else {
      gp.x = a.x;
      gp.ldx = a.ldx;
      gp.experts = a.experts;
      gp.sorted = ws.sorted;
      gp.tile_expert = ws.tile_expert;
      gp.num_tiles = ws.num_tiles;
      gp.top_k = a.top_k;
      gp.hidden = H;
      gp.inter = I;
      gp.out = ws.gu;
      moe_detail::launch_gemm_f32<Phase::kGateUp>(grid_gu, gp, st);
    }
    // 3. gate_up LoRA, 4. activation
    if (mma_lora) {  // the gate/up LoRA is in the GEMM; the down shrink reads the bf16 activation
      if (!fused_act)
        moe_detail::launch_expert_act(ws.sorted, ws.num_tiles, tile_m, ws.max_rows, ws.gu, nullptr, nullptr,
                                      ws.act_bf16, ws.lda_i, ws.copies, a, st);
      launch_lora_shrink_mma<Phase::kDown>(a, ws, lms.down, st);
      if (ws.lora_ext != nullptr) launch_lora_ext_pack<Phase::kDown>(a, ws, lms.down, st);
    } else if (!fused_act) {
      gate_up_lora_and_activation();
    }
    // 5. down
    if (mma) {
      mp.a = ws.act_bf16;
      mp.lda = ws.copies * ws.lda_i;
      mp.kb_tiles = static_cast<int>(ws.lda_i / moe_detail::kMmaBK);
      mp.out = ws.y;
      mp.mx_nb = a.experts_mxfp4 ? I / kMxfp4BlockSize : 0;
      if (mma_lora) mp.lora = lora_expand_params<Phase::kDown>(a, ws, lms.down);
      launch_grouped_gemm(Phase::kDown, H, grid_down, mp);
    } else {
      gp.x = ws.act;
      gp.ldx = I;
      gp.out = ws.y;
      moe_detail::launch_gemm_f32<Phase::kDown>(grid_down, gp, st);
    }
  }
  // 6. down LoRA
  if (lora) {
    moe_detail::launch_expert_lora_views(a, ws.sorted, ws.num_tiles, tile_m, ws.max_rows, ws.gu, ws.act, ws.y,
                                         true, st);
  }
  // 7. combine, and with then_norm the residual add and norm after it (in the same launch after the plain
  // combine)
  AddRmsNormArgs norm = a.then_norm;
  norm.delta = a.out;
  norm.ld_delta = a.ldo;
  if (stack && !mma_lora) {
    moe_detail::stack_lora_step(StackStep::kCombine, a, sb, st);
  } else if (norm.w != nullptr && tuning_of(a).moe_combine_norm != 0) {
    return add_rms_norm_combined(
        norm,
        {.rows = ws.y, .ids = a.ids, .weights = a.weights, .top_k = a.top_k, .num_ids = E, .out = a.out},
        ctx);
  } else {
    moe_detail::launch_expert_combine(a, ws.y, nullptr, st);
  }
  if (norm.w != nullptr) add_rms_norm(norm, ctx);
}

}  // namespace polylora::kernels::cuda
