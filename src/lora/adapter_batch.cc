// lora/adapter_batch.cc: building the per-step adapter batch (adapter_batch.h).
#include "lora/adapter_batch.h"

#include <algorithm>

#include "common/error.h"

namespace polylora {

AdapterBatch build_adapter_batch(std::span<const int32_t> seq_slots, std::span<const int32_t> query_start,
                                 std::span<const LoraAdapter* const> adapters, int64_t num_layers) {
  AdapterBatch b;
  const int64_t S = query_start.empty() ? 0 : static_cast<int64_t>(query_start.size()) - 1;
  b.token_slots.assign(S > 0 ? static_cast<size_t>(query_start[S]) : 0, -1);
  b.dense.assign(static_cast<size_t>(num_layers), {});
  b.experts.assign(static_cast<size_t>(num_layers), false);
  for (int64_t s = 0; s < S && s < static_cast<int64_t>(seq_slots.size()); ++s) {
    const int32_t slot = seq_slots[s];
    if (slot < 0) continue;
    if (slot >= static_cast<int32_t>(adapters.size()))
      fail("adapter slot {} out of range (the step has {} slots)", slot, adapters.size());
    const LoraAdapter* a = adapters[static_cast<size_t>(slot)];
    if (!a) continue;
    std::fill(b.token_slots.begin() + query_start[s], b.token_slots.begin() + query_start[s + 1], slot);
    if (std::find(b.slots.begin(), b.slots.end(), slot) != b.slots.end()) continue;
    b.slots.push_back(slot);
    const size_t L = std::min(a->layers.size(), static_cast<size_t>(num_layers));
    for (size_t l = 0; l < L; ++l) {
      const LoraLayer& ll = a->layers[l];
      for (size_t m = 0; m < kNumLoraModules; ++m) b.dense[l][m] = b.dense[l][m] || ll.modules[m].has_value();
      if (!ll.experts.empty()) b.experts[l] = true;
    }
  }
  std::sort(b.slots.begin(), b.slots.end());
  return b;
}

}  // namespace polylora
