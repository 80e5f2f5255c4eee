// model/model.h: a loaded decoder model and its forward pass.
// Owns: the weights (see weights.h), RoPE tables, and a scratch workspace reused across calls.
// The forward pass is written once for all architectures (decoder.cc) with layer calls into kernels/.
// Must not: own request state or KV-cache block allocation (the caller passes the cache views).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "kernels/attention/attention.h"
#include "lora/adapter.h"
#include "model/forward_batch.h"
#include "model/weight_loader.h"
#include "model/weights.h"

namespace polylora {

struct ModelLoadOptions {
  LoadFormat load_format = LoadFormat::kAuto;  // auto: safetensors
  uint64_t seed = 0;                           // dummy weights
};

// RoPE frequencies for a config: inv_freq [rotary_dim / 2] and the cos/sin scale (YaRN's mscale).
struct RopeTable {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
  static RopeTable from_config(const ModelConfig& cfg);
};

class Model {
 public:
  // Reads <dir>/config.json and the checkpoint (or makes dummy weights). Errors name the first problem.
  static std::unique_ptr<Model> load(const std::string& dir, const ModelLoadOptions& options = {});
  static std::unique_ptr<Model> from_config(const ModelConfig& config, const Checkpoint* checkpoint,
                                            const ModelLoadOptions& options);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& source() const { return source_; }

  // One forward pass. kv: per layer cache views; adapters[slot] is the adapter of that slot (may be
  // nullptr for unused slots). logits: [batch.logits_rows.size(), vocab] f32, written.
  void forward(const ForwardBatch& batch, std::span<const kernels::KvCacheView> kv,
               std::span<const LoraAdapter* const> adapters, float* logits);

 private:
  Model() = default;
  ModelConfig config_;
  ModelWeights weights_;
  RopeTable rope_;
  std::string source_;
  struct Workspace;
  std::shared_ptr<Workspace> ws_;
};

}  // namespace polylora
