// model/arch/mixtral.cc: Mixtral checkpoints: block_sparse_moe.gate router and per-expert w1 (gate),
// w3 (up), w2 (down).
#include "model/arch/arch.h"

namespace polylora::arch {

void bind_mixtral(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w) {
  bind_common(cfg, loader, w);
  int64_t h = cfg.hidden_size, i = cfg.moe_intermediate_size, num_experts = cfg.num_experts;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    bind_attention(cfg, loader, l, lw);
    lw.is_moe = true;
    std::string p = layer_prefix(l) + "block_sparse_moe.";
    lw.moe.router.w = loader.matrix(p + "gate.weight", num_experts, h, /*keep_f32=*/true);
    lw.moe.experts.resize(static_cast<size_t>(num_experts));
    for (int64_t e = 0; e < num_experts; ++e) {
      std::string ep = p + "experts." + std::to_string(e) + ".";
      kernels::ExpertView& ex = lw.moe.experts[e];
      ex.gate = loader.matrix(ep + "w1.weight", i, h);
      ex.up = loader.matrix(ep + "w3.weight", i, h);
      ex.down = loader.matrix(ep + "w2.weight", h, i);
    }
    lw.moe.experts_on_device = loader.experts_to_device(lw.moe.experts);
  }
}

}  // namespace polylora::arch
