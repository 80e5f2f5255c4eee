// model/model.h: a loaded decoder model and its forward pass, on one backend (CPU or CUDA).
// Owns: the weights (weights.h) in backend memory, RoPE tables, device copies of the adapters in use,
// and a workspace reused across calls (grown when a larger batch arrives).
// The forward pass is written once for all architectures (decoder.cc) with calls into Backend.
// Must not: own request state or KV-cache block allocation (the caller passes the cache views).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
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
  // Reads <dir>/config.json and the checkpoint (or makes dummy weights) into `backend` (nullptr: a CPU
  // backend owned by the model). Errors name the first problem.
  static std::unique_ptr<Model> load(const std::string& dir, const ModelLoadOptions& options = {},
                                     std::shared_ptr<Backend> backend = nullptr);
  static std::unique_ptr<Model> from_config(const ModelConfig& config, const Checkpoint* checkpoint,
                                            const ModelLoadOptions& options,
                                            std::shared_ptr<Backend> backend);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const std::string& source() const { return source_; }
  Backend& backend() const { return *backend_; }

  // One forward pass. kv: per layer cache views (backend memory); adapters[slot] is the adapter of that
  // slot (nullptr for unused slots). logits: host memory [batch.logits_rows.size(), vocab] f32, written.
  void forward(const ForwardBatch& batch, std::span<const kernels::KvCacheView> kv,
               std::span<const LoraAdapter* const> adapters, float* logits);
  // Frees the device copy of an adapter (by generation) after it is unloaded.
  void release_adapter(uint64_t generation);

 private:
  Model() = default;
  struct DeviceAdapter;
  struct Workspace;
  const DeviceAdapter& device_adapter(const LoraAdapter& adapter);

  ModelConfig config_;
  std::shared_ptr<Backend> backend_;
  ModelWeights weights_;
  RopeTable rope_;
  const float* inv_freq_ = nullptr;  // rope_.inv_freq in backend memory
  std::string source_;
  std::unique_ptr<Workspace> ws_;
  std::map<uint64_t, std::unique_ptr<DeviceAdapter>> adapters_;
};

}  // namespace polylora
