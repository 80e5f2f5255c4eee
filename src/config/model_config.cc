// config/model_config.cc: config.json parsing for the supported architectures.
#include "config/model_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/error.h"
#include "common/mxfp4.h"

namespace polylora {
namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  const std::string& source;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }

  template <typename T>
  T get(const char* key, T fallback) const {
    if (!has(key)) return fallback;
    try {
      return j.at(key).get<T>();
    } catch (const json::exception&) {
      fail("{}: field '{}' has the wrong type ({})", source, key, j.at(key).dump());
    }
  }
  template <typename T>
  T require(const char* key) const {
    if (!has(key)) fail("{}: required field '{}' is missing", source, key);
    return get<T>(key, T{});
  }
};

double num(const json& obj, const char* key, double fallback, const std::string& source) {
  if (!obj.contains(key) || obj.at(key).is_null()) return fallback;
  if (!obj.at(key).is_number()) fail("{}: rope field '{}' must be a number", source, key);
  return obj.at(key).get<double>();
}

RopeConfig parse_rope(const json& j, const Reader& r, int64_t max_pos) {
  RopeConfig rope;
  // transformers 5 writes rope_parameters (with rope_theta inside); published configs use rope_theta
  // plus an optional rope_scaling object.
  const json* params = nullptr;
  if (r.has("rope_parameters"))
    params = &j.at("rope_parameters");
  else if (r.has("rope_scaling"))
    params = &j.at("rope_scaling");
  rope.theta = r.get<double>("rope_theta", 10000.0);
  rope.partial_rotary_factor = r.get<double>("partial_rotary_factor", 1.0);
  if (!params) return rope;
  if (!params->is_object()) fail("{}: rope_parameters/rope_scaling must be an object", r.source);
  const json& p = *params;
  rope.theta = num(p, "rope_theta", rope.theta, r.source);
  rope.partial_rotary_factor = num(p, "partial_rotary_factor", rope.partial_rotary_factor, r.source);
  std::string type = "default";
  if (p.contains("rope_type") && p.at("rope_type").is_string())
    type = p.at("rope_type").get<std::string>();
  else if (p.contains("type") && p.at("type").is_string())
    type = p.at("type").get<std::string>();
  if (type == "default") {
    rope.type = RopeType::kDefault;
  } else if (type == "linear") {
    rope.type = RopeType::kLinear;
    rope.factor = num(p, "factor", 1.0, r.source);
  } else if (type == "llama3") {
    rope.type = RopeType::kLlama3;
    rope.factor = num(p, "factor", 8.0, r.source);
    rope.low_freq_factor = num(p, "low_freq_factor", 1.0, r.source);
    rope.high_freq_factor = num(p, "high_freq_factor", 4.0, r.source);
    rope.original_max_position_embeddings = num(p, "original_max_position_embeddings", 8192, r.source);
  } else if (type == "yarn") {
    rope.type = RopeType::kYarn;
    rope.factor = num(p, "factor", 1.0, r.source);
    rope.beta_fast = num(p, "beta_fast", 32.0, r.source);
    rope.beta_slow = num(p, "beta_slow", 1.0, r.source);
    rope.attention_factor = num(p, "attention_factor", 0.0, r.source);
    rope.mscale = num(p, "mscale", 0.0, r.source);
    rope.mscale_all_dim = num(p, "mscale_all_dim", 0.0, r.source);
    if (p.contains("truncate") && p.at("truncate").is_boolean()) rope.truncate = p.at("truncate").get<bool>();
    if (p.contains("original_max_position_embeddings") &&
        p.at("original_max_position_embeddings").is_number()) {
      // As transformers does: the ratio of the two context lengths is the effective scaling factor.
      rope.original_max_position_embeddings = p.at("original_max_position_embeddings").get<double>();
      rope.factor = static_cast<double>(max_pos) / rope.original_max_position_embeddings;
    } else {
      rope.original_max_position_embeddings = static_cast<double>(max_pos);
    }
  } else {
    fail("{}: rope type '{}' is not supported (supported: default, linear, llama3, yarn)", r.source, type);
  }
  return rope;
}

}  // namespace

std::string_view architecture_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kQwen3:
      return "qwen3";
    case Architecture::kQwen3Moe:
      return "qwen3_moe";
    case Architecture::kMixtral:
      return "mixtral";
    case Architecture::kGptOss:
      return "gpt_oss";
  }
  return "?";
}

std::string supported_architectures() {
  return "llama, qwen3, qwen3_moe, mixtral, gpt_oss";
}

ModelConfig ModelConfig::from_json(std::string_view json_text, const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", source, e.what());
  }
  if (!j.is_object()) fail("{} must hold a JSON object", source);
  Reader r{j, source};
  ModelConfig c;
  c.model_type = r.get<std::string>("model_type", "");
  if (c.model_type == "llama")
    c.arch = Architecture::kLlama;
  else if (c.model_type == "qwen3")
    c.arch = Architecture::kQwen3;
  else if (c.model_type == "qwen3_moe")
    c.arch = Architecture::kQwen3Moe;
  else if (c.model_type == "mixtral")
    c.arch = Architecture::kMixtral;
  else if (c.model_type == "gpt_oss")
    c.arch = Architecture::kGptOss;
  else
    fail("{}: model_type '{}' is not supported (supported: {})", source, c.model_type,
         supported_architectures());

  c.vocab_size = r.require<int64_t>("vocab_size");
  c.hidden_size = r.require<int64_t>("hidden_size");
  c.intermediate_size = r.get<int64_t>("intermediate_size", 0);
  c.num_layers = r.require<int64_t>("num_hidden_layers");
  c.num_heads = r.require<int64_t>("num_attention_heads");
  c.num_kv_heads = r.get<int64_t>("num_key_value_heads", c.num_heads);
  c.head_dim = r.get<int64_t>("head_dim", c.num_heads > 0 ? c.hidden_size / c.num_heads : 0);
  c.max_position_embeddings = r.get<int64_t>("max_position_embeddings", 4096);
  c.rms_norm_eps = r.get<double>("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.get<bool>("tie_word_embeddings", false);
  c.attention_bias = r.get<bool>("attention_bias", false);
  c.mlp_bias = r.get<bool>("mlp_bias", false);
  c.rope = parse_rope(j, r, c.max_position_embeddings);
  c.bos_token_id = r.get<int64_t>("bos_token_id", -1);
  if (r.has("eos_token_id")) {
    const json& e = j.at("eos_token_id");
    if (e.is_array()) {
      for (const auto& v : e) c.eos_token_ids.push_back(v.get<int64_t>());
    } else if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int64_t>());
    }
  }

  // Sliding window: Qwen3 uses it only with use_sliding_window; Mixtral/Llama when set.
  int64_t window = r.get<int64_t>("sliding_window", 0);
  bool use_window = window > 0;
  if (c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe)
    use_window = use_window && r.get<bool>("use_sliding_window", false);
  c.sliding_window = use_window ? window : 0;
  c.layer_types.assign(static_cast<size_t>(std::max<int64_t>(c.num_layers, 0)),
                       c.sliding_window > 0 ? LayerAttention::kSliding : LayerAttention::kFull);
  if (r.has("layer_types")) {
    const json& lt = j.at("layer_types");
    if (!lt.is_array() || static_cast<int64_t>(lt.size()) != c.num_layers)
      fail("{}: layer_types must be a list of num_hidden_layers ({}) entries", source, c.num_layers);
    for (size_t i = 0; i < lt.size(); ++i) {
      std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      if (t == "full_attention")
        c.layer_types[i] = LayerAttention::kFull;
      else if (t == "sliding_attention")
        c.layer_types[i] = LayerAttention::kSliding;
      else
        fail("{}: layer_types[{}] is '{}' (expected full_attention or sliding_attention)", source, i,
             lt[i].dump());
    }
    if (window > 0) c.sliding_window = window;
  } else if (c.arch == Architecture::kQwen3 || c.arch == Architecture::kQwen3Moe) {
    // max_window_layers: layers at or above it use the window (transformers' Qwen3 convention).
    int64_t max_window_layers = r.get<int64_t>("max_window_layers", c.num_layers);
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.layer_types[i] =
          (c.sliding_window > 0 && i >= max_window_layers) ? LayerAttention::kSliding : LayerAttention::kFull;
  }

  c.moe_layers.assign(static_cast<size_t>(std::max<int64_t>(c.num_layers, 0)), false);
  switch (c.arch) {
    case Architecture::kLlama:
      break;
    case Architecture::kQwen3:
      c.qk_norm = true;
      break;
    case Architecture::kQwen3Moe: {
      c.qk_norm = true;
      c.num_experts =
          r.has("num_experts") ? r.get<int64_t>("num_experts", 0) : r.get<int64_t>("num_local_experts", 0);
      c.num_experts_per_tok = r.require<int64_t>("num_experts_per_tok");
      c.moe_intermediate_size = r.require<int64_t>("moe_intermediate_size");
      c.norm_topk_prob = r.get<bool>("norm_topk_prob", false);
      int64_t step = r.get<int64_t>("decoder_sparse_step", 1);
      std::vector<int64_t> mlp_only = r.get<std::vector<int64_t>>("mlp_only_layers", {});
      for (int64_t i = 0; i < c.num_layers; ++i) {
        bool dense = std::find(mlp_only.begin(), mlp_only.end(), i) != mlp_only.end();
        c.moe_layers[i] = !dense && c.num_experts > 0 && step > 0 && (i + 1) % step == 0;
      }
      break;
    }
    case Architecture::kMixtral:
      c.num_experts = r.require<int64_t>("num_local_experts");
      c.num_experts_per_tok = r.require<int64_t>("num_experts_per_tok");
      c.moe_intermediate_size = c.intermediate_size;
      c.norm_topk_prob = true;
      c.moe_layers.assign(c.moe_layers.size(), true);
      break;
    case Architecture::kGptOss:
      c.num_experts = r.require<int64_t>("num_local_experts");
      c.num_experts_per_tok = r.has("num_experts_per_tok") ? r.get<int64_t>("num_experts_per_tok", 0)
                                                           : r.require<int64_t>("experts_per_token");
      c.moe_intermediate_size = c.intermediate_size;
      c.router = RouterKind::kTopKSoftmax;
      c.router_bias = true;
      c.expert_activation = ExpertActivation::kGptOssClampedSwiglu;
      c.expert_bias = true;
      c.attention_bias = r.get<bool>("attention_bias", true);
      c.o_proj_bias = c.attention_bias;
      c.attention_sinks = true;
      c.swiglu_limit = r.get<double>("swiglu_limit", 7.0);
      c.moe_layers.assign(c.moe_layers.size(), true);
      break;
  }
  c.mxfp4_experts.assign(c.moe_layers.size(), false);
  if (r.has("quantization_config")) {
    const json& q = j.at("quantization_config");
    if (!q.is_object()) fail("{}: quantization_config must be an object", source);
    const std::string method =
        q.contains("quant_method") && q.at("quant_method").is_string() ? q.at("quant_method").get<std::string>()
                                                                        : "";
    if (method != "mxfp4")
      fail(
          "{}: quantization_config.quant_method '{}' is not supported (supported: mxfp4, for gpt_oss); use "
          "an unquantized checkpoint",
          source, method);
    if (c.arch != Architecture::kGptOss)
      fail("{}: quant_method mxfp4 is supported for gpt_oss checkpoints only, not {}", source, c.model_type);
    c.quant_method = QuantMethod::kMxfp4;
    if (q.contains("modules_to_not_convert") && !q.at("modules_to_not_convert").is_null()) {
      const json& m = q.at("modules_to_not_convert");
      if (!m.is_array()) fail("{}: quantization_config.modules_to_not_convert must be a list of strings", source);
      for (const json& v : m) {
        if (!v.is_string())
          fail("{}: quantization_config.modules_to_not_convert has an entry that is not a string ({})", source,
               v.dump());
        c.modules_to_not_convert.push_back(v.get<std::string>());
      }
    }
    for (int64_t l = 0; l < c.num_layers; ++l)
      c.mxfp4_experts[l] =
          c.moe_layers[l] && c.quantizes_module("model.layers." + std::to_string(l) + ".mlp.experts");
  }
  c.validate();
  return c;
}

bool ModelConfig::quantizes_module(const std::string& name) const {
  if (quant_method == QuantMethod::kNone) return false;
  // transformers' should_convert_module: re.match(f"{key}\\.", name) or re.match(key, name) or
  // name.endswith(key); re.match anchors at the start only.
  for (const std::string& key : modules_to_not_convert) {
    if (name.size() >= key.size() && name.compare(name.size() - key.size(), key.size(), key) == 0) return false;
    try {
      std::regex re(key, std::regex::ECMAScript);
      std::smatch m;
      if (std::regex_search(name, m, re, std::regex_constants::match_continuous)) return false;
    } catch (const std::regex_error&) {
      fail("model config ({}): quantization_config.modules_to_not_convert entry '{}' is not a valid pattern",
           model_type, key);
    }
  }
  return true;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open model config {}", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

void ModelConfig::validate() const {
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) fail("model config ({}): {} must be positive, got {}", model_type, name, v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_layers);
  positive("num_attention_heads", num_heads);
  positive("num_key_value_heads", num_kv_heads);
  positive("head_dim", head_dim);
  if (num_heads % num_kv_heads != 0)
    fail("model config ({}): num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
         model_type, num_heads, num_kv_heads);
  if (head_dim % 2 != 0) fail("model config ({}): head_dim ({}) must be even for RoPE", model_type, head_dim);
  if (rope.partial_rotary_factor != 1.0)
    fail("model config ({}): partial_rotary_factor {} is not supported", model_type,
         rope.partial_rotary_factor);
  bool any_dense = false;
  for (bool m : moe_layers) any_dense |= !m;
  if (any_dense) positive("intermediate_size", intermediate_size);
  if (is_moe()) {
    positive("moe_intermediate_size", moe_intermediate_size);
    positive("num_experts_per_tok", num_experts_per_tok);
    if (num_experts_per_tok > num_experts)
      fail("model config ({}): num_experts_per_tok ({}) exceeds the number of experts ({})", model_type,
           num_experts_per_tok, num_experts);
  }
  if (quant_method == QuantMethod::kMxfp4 && is_moe()) {
    if (hidden_size % kMxfp4BlockSize != 0 || moe_intermediate_size % kMxfp4BlockSize != 0)
      fail(
          "model config ({}): MXFP4 experts need hidden_size ({}) and intermediate_size ({}) to be multiples "
          "of 32",
          model_type, hidden_size, moe_intermediate_size);
  }
  for (LayerAttention t : layer_types) {
    if (t == LayerAttention::kSliding && sliding_window <= 0)
      fail("model config ({}): a sliding_attention layer needs a positive sliding_window", model_type);
  }
}

int64_t ModelConfig::num_parameters() const {
  int64_t h = hidden_size;
  int64_t total = vocab_size * h * (tie_word_embeddings ? 1 : 2) + h;
  for (int64_t l = 0; l < num_layers; ++l) {
    total += 2 * h;                                 // norms
    total += h * q_size() * 2 + h * kv_size() * 2;  // q, o, k, v
    if (qk_norm) total += 2 * head_dim;
    if (moe_layers[l]) {
      total += num_experts * h + num_experts * 3 * h * moe_intermediate_size;
    } else {
      total += 3 * h * intermediate_size;
    }
  }
  return total;
}

}  // namespace polylora
