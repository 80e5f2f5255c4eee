// model/arch/llama.cc: Llama and Qwen3 (dense) checkpoints: attention (+ q/k norms for Qwen3) and a
// SwiGLU MLP per layer.
#include "model/arch/arch.h"

namespace polylora::arch {

void bind_llama(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w) {
  bind_common(cfg, loader, w);
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    bind_attention(cfg, loader, l, w.layers[l]);
    bind_dense_mlp(cfg, loader, l, w.layers[l]);
  }
}

}  // namespace polylora::arch
