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
// The shrink and the expand run as Backend::lora_apply calls (the kernels have no separate shrink and
// expand ops): an identity stands in for B in the shrink and for A in the expand, which changes no value;
// the column-parallel expand is one call per rank's part of B over that rank's gathered shrinks. The
// matrices live in the rank's backend memory (device memory on GPUs), uploaded when the shard is made and
// freed with it; the step's token rows per slot come with the step's staged inputs, so the same code runs
// on the CPU and on GPUs (eagerly: steps with fully sharded LoRA do not replay graphs).
// Expert LoRA keeps the default split. Must not: run collectives (Model::fully_sharded_lora does, in
// fully_sharded_lora.cc).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "backend/backend.h"
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
  // In the rank's backend memory:
  const float* a = nullptr;           // [width, in]
  std::vector<const float*> b_parts;  // column: N parts [out, p] (part j: B's columns [j·p, (j+1)·p),
                                      // zero past r); row: one [out, r]
  const float* eye = nullptr;         // [width, width] identity
};

struct FullyShardedLora {
  std::vector<std::array<std::optional<FullyShardedMatrix>, kNumLoraModules>> layers;  // [layer][module]
  // The backend allocations behind the matrices' pointers, freed with this.
  Backend* backend = nullptr;
  std::vector<const void*> owned;
  FullyShardedLora() = default;
  FullyShardedLora(const FullyShardedLora&) = delete;
  FullyShardedLora& operator=(const FullyShardedLora&) = delete;
  ~FullyShardedLora();
};

// Splits a rank's default share of an adapter (shard_adapter) into what the slot stacks apply (its expert
// LoRA; no dense modules) and the fully sharded dense modules, in `be`'s memory.
std::pair<std::shared_ptr<const LoraAdapter>, std::shared_ptr<const FullyShardedLora>> split_fully_sharded(
    const LoraAdapter& rank_share, const ModelConfig& cfg, const TpShard& shard, Backend& be);

}  // namespace polylora
