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

// CUDA graphs of decode steps (ignored on backends without graphs).
struct GraphOptions {
  bool enabled = false;
  std::vector<int64_t> sizes;      // batch sizes (sequences of one token each) captured; a step pads up
  int64_t max_blocks_per_seq = 0;  // block-table width of every graph; longer contexts run eagerly
  int64_t warmup_tokens = 0;       // an eager prefill of this many tokens first sizes every buffer
  int64_t warmup_logits_rows = 1;  // logits rows of that warm-up
};
// vLLM's default capture sizes: 1, 2, 4, then multiples of 8 up to max_num_seqs.
std::vector<int64_t> default_graph_sizes(int64_t max_num_seqs);

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
  // The same pass, greedy: ids[r] = argmax of logits row r, computed where the logits are (on the GPU
  // only the ids come back). ids: host memory [batch.logits_rows.size()].
  void forward_argmax(const ForwardBatch& batch, std::span<const kernels::KvCacheView> kv,
                      std::span<const LoraAdapter* const> adapters, int32_t* ids);
  // Frees the device copy of an adapter (by generation) after it is unloaded.
  void release_adapter(uint64_t generation);
  // Captures a graph per decode batch size (largest first, after a warm-up prefill). From then on a step
  // whose sequences each compute one token, without adapters, whose logits are wanted for every token and
  // whose block tables fit max_blocks_per_seq replays the graph of its padded size; other steps run
  // eagerly. A graph is recorded again at its next use when a buffer it holds moved (a larger eager step)
  // or the KV cache changed; the output is identical to running the same padded step eagerly. With an
  // empty `kv`, nothing is captured now: each graph is recorded at its first use.
  void prepare_graphs(std::span<const kernels::KvCacheView> kv, const GraphOptions& options);
  // An eager prefill of `tokens` dummy tokens (no KV written; one block read) that sizes every workspace
  // buffer for the largest step, so memory can be measured (and graphs captured) after it.
  void warm_up(std::span<const kernels::KvCacheView> kv, int64_t tokens, int64_t logits_rows);
  bool graphs_enabled() const { return graphs_enabled_; }
  // With timing on, each forward measures the GPU time from its first input copy to its logits (events;
  // host staging before it is not included), for benchmarks: last_step_gpu_seconds().
  void set_gpu_timing(bool on) { gpu_timing_ = on; }
  double last_step_gpu_seconds() const { return last_gpu_seconds_; }

 private:
  Model() = default;
  struct DeviceAdapter;
  struct Workspace;
  struct StepInputs;
  struct Graph;
  const DeviceAdapter& device_adapter(const LoraAdapter& adapter);
  // Packs a step's inputs into the host staging buffer.
  StepInputs stage(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters);
  // Every op of the forward pass, reading the staged inputs at `inputs` (backend memory); logits in ws.
  void run_layers(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv, const StepInputs& si,
                  std::byte* inputs);
  bool graph_eligible(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters) const;
  ForwardBatch pad_for_graph(const ForwardBatch& b, int64_t size) const;
  // logits or ids (one of them non-null) receive the output rows.
  void forward_impl(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv,
                    std::span<const LoraAdapter* const> adapters, float* logits, int32_t* ids);
  void forward_graph(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv, float* logits,
                     int32_t* ids);
  // Copies the first `rows` logits rows, or their argmax ids, to the host.
  void read_output(int64_t rows, float* logits, int32_t* ids);

  ModelConfig config_;
  std::shared_ptr<Backend> backend_;
  ModelWeights weights_;
  RopeTable rope_;
  const float* inv_freq_ = nullptr;  // rope_.inv_freq in backend memory
  std::string source_;
  std::unique_ptr<Workspace> ws_;
  std::map<uint64_t, std::unique_ptr<DeviceAdapter>> adapters_;
  bool graphs_enabled_ = false;
  bool gpu_timing_ = false;
  double last_gpu_seconds_ = 0;
  std::vector<int64_t> graph_sizes_;  // ascending
  int64_t graph_max_blocks_ = 0;
  std::map<int64_t, Graph> graphs_;
};

}  // namespace polylora
