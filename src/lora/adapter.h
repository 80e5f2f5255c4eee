// lora/adapter.h: a LoRA adapter held in host memory, in the layout the kernels consume.
// Owns: per layer, the dense-module LoRA matrices (q/k/v/o, dense gate/up/down) and the per-expert ones
// (fused gate_up, or separate gate/up, and down), each A [rank, in] and B [out, rank] in f32 with its scale.
// Must not: know about HTTP, requests or kernels' execution.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/model_config.h"

namespace polylora {

enum class LoraModule : uint8_t { kQ, kK, kV, kO, kGate, kUp, kDown };
inline constexpr size_t kNumLoraModules = 7;
const char* lora_module_name(LoraModule module);

struct LoraMatrix {
  int64_t rank = 0;
  int64_t in = 0;
  int64_t out = 0;
  float scale = 1.0f;
  std::vector<float> a;  // [rank, in]
  std::vector<float> b;  // [out, rank]
};

struct LoraExpert {
  std::optional<LoraMatrix> gate_up;  // all 2I outputs of the expert's gate/up projection, in its row order
  std::optional<LoraMatrix> gate;     // first I outputs (separate per-expert modules: gate_proj / w1)
  std::optional<LoraMatrix> up;       // last I outputs (up_proj / w3)
  std::optional<LoraMatrix> down;     // down_proj / w2
};

struct LoraLayer {
  std::array<std::optional<LoraMatrix>, kNumLoraModules> modules;
  std::vector<LoraExpert> experts;  // [num_experts] when the adapter touches this layer's experts, else empty
};

struct LoraAdapter {
  std::string name;
  std::string path;
  uint64_t generation = 0;  // its AdapterId's version, set by the registry (0: not registered)
  int64_t max_rank = 0;
  std::vector<LoraLayer> layers;  // [num_layers]
  bool has_expert_lora = false;
  size_t num_bytes() const;
};

struct LoraLimits {
  int64_t max_lora_rank = 64;
  uint64_t max_adapter_bytes = uint64_t{16} << 30;  // cap on adapter_model.safetensors (16 GiB)
};

// Reads a PEFT adapter directory (adapter_config.json + adapter_model.safetensors) for a model.
// Every problem is a polylora::Error (kInvalid, message valid UTF-8) naming the adapter, the file and the
// offending key: missing files, files that are not regular or over their caps (adapter_config.json 1 MiB,
// the weights limits.max_adapter_bytes), a field of the wrong type, a non-LoRA or unsupported PEFT option
// (DoRA, bias, modules_to_save, embedding/lm_head targets), a bad rank_pattern / alpha_pattern key, rank
// above limits.max_lora_rank, a target the model lacks, or shapes that do not fit the model.
// `dir` is trusted (startup --lora-modules): symbolic links in it are followed.
std::shared_ptr<LoraAdapter> load_peft_adapter(const std::string& dir, const std::string& name,
                                               const ModelConfig& config, const LoraLimits& limits);

// The same for an untrusted `path` (run-time loads): it must lie inside one of `allowed_dirs`
// (--lora-allowed-dirs). An absolute path must lie under an allowed directory after folding '.' and '..';
// a relative one is looked up in each allowed directory in turn. No symbolic link is followed anywhere
// below the allowed directory (the adapter directory and its files included), only regular files are
// read, and every read goes through the descriptor that was checked, so swapping a directory for a
// symbolic link during the load reads nothing from outside. Additional errors:
//   "adapter 'x': <path> is outside the directories allowed by --lora-allowed-dirs"
//   "adapter 'x': <path> is a symbolic link; adapters must be regular files inside --lora-allowed-dirs"
// The returned adapter's `path` is `path` as given.
std::shared_ptr<LoraAdapter> load_peft_adapter_confined(const std::vector<std::string>& allowed_dirs,
                                                        const std::string& path, const std::string& name,
                                                        const ModelConfig& config, const LoraLimits& limits);

}  // namespace polylora
