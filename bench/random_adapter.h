// bench/random_adapter.h: random LoRA adapters at a model's shapes, in host memory, for the benchmarks
// (`polylora_bench device --loras`, `polylora_bench lora-swap`).
// Must not: hold benchmark logic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "config/model_config.h"
#include "lora/adapter.h"

namespace polylora::bench {

// A random adapter of rank r in the layout ../shared/peers/gen_adapters.py writes (lora_alpha 2r, values
// of standard deviation ~0.02): q/k/v/o on every layer and, with `experts`, every expert's gate/up (fused
// for GPT-OSS, gate and up for the others) and down. Host memory only.
std::shared_ptr<LoraAdapter> random_adapter(const ModelConfig& c, const std::string& name, uint64_t seed,
                                            int64_t rank, bool experts);

}  // namespace polylora::bench
