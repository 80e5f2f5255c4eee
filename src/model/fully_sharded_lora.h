// model/fully_sharded_lora.h: one rank's share of an adapter's dense-module LoRA under --fully-sharded-loras
// (vLLM's meaning, after S-LoRA; docs/tensor-parallel.md), made from its default tensor-parallel share
// (tp_shard.h):
// - column-parallel modules (q, k, v, gate, up): A's rank rows are split too. Rank j of N keeps rows
//   [j·p, (j+1)·p) of A (p = ⌈r / N⌉, zero rows past r) and its output rows of B, its columns padded to N·p;
//   each rank shrinks with its rows, an all_gather of the [tokens, p] shrinks gives every rank A·x, and
//   each expands its output rows.
// - row-parallel modules (o, down): A keeps the rank's input columns (as by default) and B is split by
//   output rows: rank j keeps rows [j·H/N, (j+1)·H/N). The partial shrinks are summed (all_reduce of
//   [tokens, r]) and each rank adds its rows of B·(A·x) into its slice of the partial output, which the
//   layer's all_reduce completes.
// The shrink and the expand run as two Backend::lora_apply calls (the kernels have no separate shrink and
// expand ops): an identity stands in for B in the shrink and for A in the expand, which changes no value.
// Expert LoRA keeps the default split. Must not: run collectives (Model::fully_sharded_lora does, in
// fully_sharded_lora.cc) or hold device memory (CPU backend: host vectors).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "config/model_config.h"
#include "lora/adapter.h"
#include "model/tp_shard.h"

namespace polylora {

struct FullyShardedMatrix {
  bool column = true;  // column-parallel (A's rank rows split, all_gather) or row-parallel (B's rows split)
  int64_t rank = 0;    // the adapter's rank r
  int64_t width = 0;   // shrink width on this rank: p = ⌈r / N⌉ (column) or r (row)
  int64_t in = 0, out = 0;  // this rank's input columns and output rows
  float scale = 1.0f;
  std::vector<float> a;           // [width, in]
  std::vector<float> b;           // [out, N·p] (column) or [out, r] (row)
  std::vector<float> eye_shrink;  // [width, width] identity
  std::vector<float> eye_expand;  // [N·p or r]² identity
};

struct FullyShardedLora {
  std::vector<std::array<std::optional<FullyShardedMatrix>, kNumLoraModules>> layers;  // [layer][module]
};

// The host buffers Model::fully_sharded_lora reuses.
struct FullyShardedScratch {
  std::vector<float> shrink;    // [tokens, width]: this rank's shrinks (summed over the ranks: row-parallel)
  std::vector<float> gathered;  // [N, tokens, width]: every rank's shrinks (column-parallel)
  std::vector<float> packed;    // [tokens, N·width]: each token's A·x in its adapter's rank order
  std::vector<std::vector<int32_t>> rows;  // [slot]: the step's tokens of each slot
};

// Splits a rank's default share of an adapter (shard_adapter) into what the slot stacks apply (its expert
// LoRA; no dense modules) and the fully sharded dense modules.
std::pair<std::shared_ptr<const LoraAdapter>, std::shared_ptr<const FullyShardedLora>> split_fully_sharded(
    const LoraAdapter& rank_share, const ModelConfig& cfg, const TpShard& shard);

}  // namespace polylora
