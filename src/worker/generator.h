// worker/generator.h: a batch driver for offline greedy generation (used by `polylora generate`, the
// golden tests and the benchmark until the engine's scheduler exists): all sequences are prefilled in
// one forward pass, then decoded together, one token each per step, each with its own adapter.
// Must not: make scheduling decisions beyond this fixed plan (the engine replaces it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "lora/adapter.h"
#include "model/model.h"
#include "worker/kv_storage.h"

namespace polylora {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int32_t adapter_slot = -1;  // index into the adapters passed to run(); −1: base model
  int64_t max_tokens = 16;
  bool prompt_logits = false;  // return the logits at every prompt position
  std::vector<int32_t> stop_token_ids;
  int64_t top_ids = 0;  // also return the ids of the top-N logits at each generated step
};

struct GenerateResult {
  std::vector<int32_t> output;
  std::vector<float> prompt_logits;                // [prompt.size(), vocab] when asked
  std::vector<float> margins;                      // top-1 minus top-2 logit at each generated step
  std::vector<std::vector<int32_t>> step_top_ids;  // [steps][top_ids] when asked, best first
};

struct GeneratorOptions {
  int64_t block_size = 16;
  int64_t max_batch_tokens = 8192;  // prefill is split into forward passes of at most this many tokens
  bool device_argmax = false;       // decode steps take the argmax where the logits are (no margins, top ids)
};

class Generator {
 public:
  Generator(Model& model, GeneratorOptions options = {});
  // Runs every request to completion (greedy). adapters[slot] may be nullptr.
  std::vector<GenerateResult> run(const std::vector<GenerateRequest>& requests,
                                  std::span<const LoraAdapter* const> adapters);
  // Timing of the last run (seconds), for benchmarks.
  double last_prefill_seconds() const { return prefill_seconds_; }
  double last_decode_seconds() const { return decode_seconds_; }
  int64_t last_decode_steps() const { return decode_steps_; }
  // GPU time of the decode steps (from their first copy to the logits; Model::set_gpu_timing).
  double last_decode_gpu_seconds() const { return decode_gpu_seconds_; }

 private:
  Model& model_;
  GeneratorOptions options_;
  std::unique_ptr<KvStorage> kv_;
  double prefill_seconds_ = 0, decode_seconds_ = 0;
  int64_t decode_steps_ = 0;
  double decode_gpu_seconds_ = 0;
};

}  // namespace polylora
