// lora/adapter_batch.h: the per-step adapter batch the model's LoRA kernels consume: each token's slot,
// the distinct slots in use, and where any of their adapters has LoRA (per layer and dense module, and per
// layer's experts), so that an eager step launches LoRA kernels only where some adapter of the step needs
// them (a layer without LoRA in the step costs nothing).
// Must not: know about devices or kernels.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "lora/adapter.h"

namespace polylora {

struct AdapterBatch {
  std::vector<int32_t> token_slots;                        // [tokens], −1: the base model
  std::vector<int32_t> slots;                              // distinct slots with an adapter, ascending
  std::vector<std::array<bool, kNumLoraModules>> dense;    // [layer][module]: some adapter has it
  std::vector<bool> experts;                               // [layer]: some adapter has expert LoRA there
  bool empty() const { return slots.empty(); }
};

// seq_slots[s]: the slot of sequence s (−1 or empty: none), whose tokens are query_start[s] ..
// query_start[s + 1]; adapters[slot]: the adapter in that slot (nullptr: none). A slot outside `adapters`
// is an error (polylora::Error).
AdapterBatch build_adapter_batch(std::span<const int32_t> seq_slots, std::span<const int32_t> query_start,
                                 std::span<const LoraAdapter* const> adapters, int64_t num_layers);

}  // namespace polylora
