// config/model_config.h: the model architecture as read from a Hugging Face config.json.
// Owns: parsing every field the supported architectures (llama, qwen3, qwen3_moe, mixtral, gpt_oss) use,
// accepting both spellings HF accepts (rope_scaling / rope_parameters, num_experts / num_local_experts),
// and validate(). Must not: read checkpoints or parse command-line flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace polylora {

enum class Architecture { kLlama, kQwen3, kQwen3Moe, kMixtral, kGptOss };

std::string_view architecture_name(Architecture arch);  // the config.json model_type
// "llama, qwen3, qwen3_moe, mixtral, gpt_oss"
std::string supported_architectures();

enum class RopeType { kDefault, kLinear, kLlama3, kYarn };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;                          // linear, llama3, yarn
  double original_max_position_embeddings = 0;  // llama3, yarn (0: max_position_embeddings)
  double low_freq_factor = 1.0;                 // llama3
  double high_freq_factor = 4.0;                // llama3
  double beta_fast = 32.0;                      // yarn
  double beta_slow = 1.0;                       // yarn
  double attention_factor = 0.0;                // yarn (0: derived from factor / mscale)
  double mscale = 0.0;                          // yarn
  double mscale_all_dim = 0.0;                  // yarn
  bool truncate = true;                         // yarn: floor/ceil the correction range
  double partial_rotary_factor = 1.0;
};

enum class LayerAttention { kFull, kSliding };

// MoE routing flavour.
enum class RouterKind {
  kSoftmaxTopK,  // Mixtral / Qwen3-MoE: softmax over all experts, top-k, optional renormalisation
  kTopKSoftmax,  // GPT-OSS: logits (+bias), top-k, softmax over the k values
};

enum class ExpertActivation {
  kSiluGate,             // down(silu(gate) * up); gate and up rows: gate first then up
  kGptOssClampedSwiglu,  // interleaved gate/up (even = gate), clamp, gate*sigmoid(alpha*gate)*(up+1)
};

// quantization_config.quant_method of a checkpoint.
enum class QuantMethod {
  kNone,
  kMxfp4,  // GPT-OSS as OpenAI ships it: expert matrices in MXFP4 (common/mxfp4.h), everything else bf16
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense MLP
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // bias on q/k/v (and o for GPT-OSS)
  bool o_proj_bias = false;
  bool mlp_bias = false;
  bool qk_norm = false;          // Qwen3: per-head RMSNorm on q and k before RoPE
  bool attention_sinks = false;  // GPT-OSS
  RopeConfig rope;
  int64_t sliding_window = 0;               // 0: none
  std::vector<LayerAttention> layer_types;  // [num_layers]
  // MoE
  int64_t num_experts = 0;  // 0: dense model
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  bool router_bias = false;
  RouterKind router = RouterKind::kSoftmaxTopK;
  ExpertActivation expert_activation = ExpertActivation::kSiluGate;
  bool expert_bias = false;
  double swiglu_limit = 7.0;     // GPT-OSS
  double swiglu_alpha = 1.702;   // GPT-OSS
  std::vector<bool> moe_layers;  // [num_layers]: true where the MLP is the MoE block
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  // quantization_config: the method and the modules it leaves unconverted (Hugging Face's patterns: a
  // regex matched at the start of a module name, followed by a dot or not, or a suffix of the name).
  QuantMethod quant_method = QuantMethod::kNone;
  std::vector<std::string> modules_to_not_convert;
  std::vector<bool> mxfp4_experts;  // [num_layers]: the layer's experts are MXFP4 (MoE layers only)

  bool is_moe() const { return num_experts > 0; }
  int64_t q_size() const { return num_heads * head_dim; }
  int64_t kv_size() const { return num_kv_heads * head_dim; }
  int64_t layer_window(int64_t layer) const {
    return layer_types[layer] == LayerAttention::kSliding ? sliding_window : 0;
  }

  // Does quantization_config convert the module `name` (e.g. "model.layers.3.mlp.experts")?
  bool quantizes_module(const std::string& name) const;

  // Throws polylora::Error naming the field for inconsistent values.
  void validate() const;
  // Parses config.json text; `source` names it in error messages.
  static ModelConfig from_json(std::string_view json_text, const std::string& source);
  static ModelConfig from_file(const std::string& path);
  // Parameter count (weights only).
  int64_t num_parameters() const;
};

}  // namespace polylora
