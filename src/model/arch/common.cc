// model/arch/common.cc: the binder dispatch, and checkpoint names shared by the Llama-family layouts of all
// four architectures.
#include "model/arch/arch.h"

namespace polylora::arch {

void bind(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w) {
  switch (cfg.arch) {
    case Architecture::kLlama:
    case Architecture::kQwen3:
      bind_llama(cfg, loader, w);
      return;
    case Architecture::kQwen3Moe:
      bind_qwen3_moe(cfg, loader, w);
      return;
    case Architecture::kMixtral:
      bind_mixtral(cfg, loader, w);
      return;
    case Architecture::kGptOss:
      bind_gpt_oss(cfg, loader, w);
      return;
  }
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg) {
  std::vector<ExpectedTensor> plan;
  ModelWeights unused;
  WeightLoader planner(plan, unused);
  bind(cfg, planner, unused);
  return plan;
}

std::string layer_prefix(int64_t layer) {
  return "model.layers." + std::to_string(layer) + ".";
}

void bind_common(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w) {
  w.embed = loader.matrix("model.embed_tokens.weight", cfg.vocab_size, cfg.hidden_size);
  w.final_norm = loader.vector("model.norm.weight", cfg.hidden_size, 1.0f);
  w.lm_head =
      cfg.tie_word_embeddings ? w.embed : loader.matrix("lm_head.weight", cfg.vocab_size, cfg.hidden_size);
  w.layers.resize(static_cast<size_t>(cfg.num_layers));
}

void bind_attention(const ModelConfig& cfg, WeightLoader& loader, int64_t layer, LayerWeights& lw) {
  std::string p = layer_prefix(layer);
  int64_t h = cfg.hidden_size;
  lw.input_norm = loader.vector(p + "input_layernorm.weight", h, 1.0f);
  lw.post_attention_norm = loader.vector(p + "post_attention_layernorm.weight", h, 1.0f);
  AttentionWeights& a = lw.attn;
  a.q.w = loader.matrix(p + "self_attn.q_proj.weight", cfg.q_size(), h);
  a.k.w = loader.matrix(p + "self_attn.k_proj.weight", cfg.kv_size(), h);
  a.v.w = loader.matrix(p + "self_attn.v_proj.weight", cfg.kv_size(), h);
  a.o.w = loader.matrix(p + "self_attn.o_proj.weight", h, cfg.q_size());
  if (cfg.attention_bias) {
    a.q.bias = loader.vector(p + "self_attn.q_proj.bias", cfg.q_size(), 0.0f);
    a.k.bias = loader.vector(p + "self_attn.k_proj.bias", cfg.kv_size(), 0.0f);
    a.v.bias = loader.vector(p + "self_attn.v_proj.bias", cfg.kv_size(), 0.0f);
  }
  if (cfg.o_proj_bias) a.o.bias = loader.vector(p + "self_attn.o_proj.bias", h, 0.0f);
  if (cfg.qk_norm) {
    a.q_norm = loader.vector(p + "self_attn.q_norm.weight", cfg.head_dim, 1.0f);
    a.k_norm = loader.vector(p + "self_attn.k_norm.weight", cfg.head_dim, 1.0f);
  }
  if (cfg.attention_sinks) a.sinks = loader.vector(p + "self_attn.sinks", cfg.num_heads, 0.0f);
}

void bind_dense_mlp(const ModelConfig& cfg, WeightLoader& loader, int64_t layer, LayerWeights& lw) {
  std::string p = layer_prefix(layer) + "mlp.";
  int64_t h = cfg.hidden_size, i = cfg.intermediate_size;
  lw.is_moe = false;
  lw.mlp.gate.w = loader.matrix(p + "gate_proj.weight", i, h);
  lw.mlp.up.w = loader.matrix(p + "up_proj.weight", i, h);
  lw.mlp.down.w = loader.matrix(p + "down_proj.weight", h, i);
  if (cfg.mlp_bias) {
    lw.mlp.gate.bias = loader.vector(p + "gate_proj.bias", i, 0.0f);
    lw.mlp.up.bias = loader.vector(p + "up_proj.bias", i, 0.0f);
    lw.mlp.down.bias = loader.vector(p + "down_proj.bias", h, 0.0f);
  }
}

}  // namespace polylora::arch
