// model/arch/qwen3_moe.cc: Qwen3-MoE checkpoints: per-head q/k norms, a softmax router (mlp.gate) and
// per-expert gate/up/down projections (mlp.experts.{e}.*); layers in mlp_only_layers (or off the
// decoder_sparse_step) keep a dense MLP.
#include "model/arch/arch.h"

namespace polylora::arch {

void bind_qwen3_moe(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w) {
  bind_common(cfg, loader, w);
  int64_t h = cfg.hidden_size, i = cfg.moe_intermediate_size, num_experts = cfg.num_experts;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    bind_attention(cfg, loader, l, lw);
    if (!cfg.moe_layers[l]) {
      bind_dense_mlp(cfg, loader, l, lw);
      continue;
    }
    lw.is_moe = true;
    std::string p = layer_prefix(l) + "mlp.";
    lw.moe.router.w = loader.matrix(p + "gate.weight", num_experts, h, /*keep_f32=*/true);
    lw.moe.experts.resize(static_cast<size_t>(num_experts));
    for (int64_t e = 0; e < num_experts; ++e) {
      std::string ep = p + "experts." + std::to_string(e) + ".";
      kernels::ExpertView& ex = lw.moe.experts[e];
      ex.gate = loader.matrix(ep + "gate_proj.weight", i, h);
      ex.up = loader.matrix(ep + "up_proj.weight", i, h);
      ex.down = loader.matrix(ep + "down_proj.weight", h, i);
    }
    lw.moe.experts_on_device = loader.experts_to_device(lw.moe.experts);
  }
}

}  // namespace polylora::arch
