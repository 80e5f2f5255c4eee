// kernels/moe/moe_steps.h: the MoE kernels besides the expert products, as moe_cuda.cu calls them.
// moe_route_cuda.cu: top-k routing per token, the small-batch sort by expert (one block; optionally with the
// routing and the cast of x to bf16 in the same launch), the grouped-GEMM alignment (counts, tile offsets,
// the tile -> expert map, the pairs scattered in expert and slot order) and the cast of x to bf16 rows.
// moe_steps_cuda.cu: the fp32 grouped GEMM and the expert LoRA of per-(slot, expert) views (the activation
// and the combine: moe_lora_stack.cuh's launch_expert_act / launch_expert_combine). Included from .cu files
// only. Must not: depend on anything above common/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/moe/moe.h"
#include "kernels/moe/moe_cuda_common.cuh"

namespace polylora::kernels::cuda::moe_detail {

constexpr int kAlignSmallThreads = 512;  // threads of the small-batch sort's block
constexpr int kRouteWarps = 4;           // tokens per block of the routing kernel (one warp each)

// GEMV paths (tile_m 1), one block: counts per expert, compact offsets, the active experts in expert order
// and the pairs in expert order. Within an expert the results do not depend on the order (each pair is
// computed on its own); with slot buckets (slot-stacked LoRA) the pairs are grouped by adapter slot, so
// consecutive rows mostly share one (slot, expert) and the tiled LoRA shrink reads its A once per tile.
struct SmallSortArgs {
  const int32_t* ids = nullptr;
  int64_t pairs = 0, E = 0;
  int32_t *counts = nullptr, *offsets = nullptr, *active = nullptr, *num_active = nullptr,
          *num_rows = nullptr, *sorted = nullptr;
  const int32_t* token_slots = nullptr;
  int64_t top_k = 0, buckets = 1;
};

// x [m, H] (row stride ldx) -> bf16 rows of copies·lda: hi in columns [0, lda) and, with the split
// (copies = 2), lo in [lda, 2·lda); columns past H zero; 8 columns per thread.
struct CastArgs {
  const float* x = nullptr;
  int64_t ldx = 0, m = 0, H = 0, lda = 0, copies = 1;
  __nv_bfloat16* out = nullptr;
};

// Shared memory of route_token for `warps` warps.
inline size_t route_smem(int64_t E, int64_t warps) {
  return static_cast<size_t>(warps * E) * (sizeof(float) + 1);
}

// Shared memory of align_small_kernel: counts and cursors per expert, and per (expert, slot bucket) with
// buckets.
inline size_t align_small_smem(int64_t E, int64_t buckets) {
  return static_cast<size_t>(8 * E) + (buckets > 1 ? static_cast<size_t>(4 * E * buckets) : 0);
}

// The grouped-GEMM paths' alignment: pairs per expert (and per slot bucket), each expert's first row padded
// to tile_m, the tile -> expert map and its count, and the pairs scattered into their rows (padding −1).
struct GroupedAlignArgs {
  const int32_t* ids = nullptr;
  int64_t pairs = 0, E = 0, max_rows = 0;
  int tile_m = 1;
  int32_t *counts = nullptr, *fill = nullptr, *sub_counts = nullptr, *offsets = nullptr,
          *tile_expert = nullptr, *num_tiles = nullptr, *sorted = nullptr;
  const int32_t* token_slots = nullptr;
  int64_t top_k = 0, buckets = 1;
};

// Launchers (programmatic dependent launch where the kernels allow it; cuda_util.cuh).
void launch_route(const RouteArgs& a, cudaStream_t st);
void launch_align_small(const SmallSortArgs& s, size_t smem, cudaStream_t st);
// Block 0 routes every token and sorts the pairs; blocks 1..cast_blocks cast x (c.out != nullptr).
void launch_route_sort_small(const RouteArgs& r, const SmallSortArgs& s, const CastArgs& c,
                             unsigned cast_blocks, size_t smem, cudaStream_t st);
void launch_cast_x_bf16(const CastArgs& c, unsigned blocks, unsigned threads, cudaStream_t st);
void launch_grouped_align(const GroupedAlignArgs& g, cudaStream_t st);

// The fp32 grouped GEMM of one phase (64 × 64 tiles of 256 threads; grid: row tiles × column tiles).
constexpr int kF32TileM = 64;  // rows of an fp32 GEMM tile
constexpr int kF32TileN = 64;
struct GemmParams {
  const float* x = nullptr;  // kGateUp: token rows [m, H] (stride ldx); kDown: act rows [max_rows, I]
  int64_t ldx = 0;
  const ExpertView* experts = nullptr;
  const int32_t* sorted = nullptr;
  const int32_t* tile_expert = nullptr;
  const int32_t* num_tiles = nullptr;
  int64_t top_k = 0, hidden = 0, inter = 0;
  float* out = nullptr;  // kGateUp: gu [max_rows, 2I]; kDown: y [pairs, H]
};
template <Phase P>
void launch_gemm_f32(dim3 grid, const GemmParams& gp, cudaStream_t st);
// The expert LoRA of per-(slot, expert) views (MoeExpertsArgs::lora), one block per sorted row: on gate_up
// (down false: x into the gu rows) or on down (the act rows into the pairs' y rows).
void launch_expert_lora_views(const MoeExpertsArgs& a, const int32_t* sorted, const int32_t* num_tiles,
                              int tile_m, int64_t max_rows, float* gu, const float* act, float* y, bool down,
                              cudaStream_t st);

}  // namespace polylora::kernels::cuda::moe_detail
