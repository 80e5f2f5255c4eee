// model/arch/gpt_oss.cc: GPT-OSS checkpoints (bf16 layout of transformers): attention with biases and
// sinks, a router with bias (mlp.router), and fused expert tensors stored (in, out):
// gate_up_proj [E, H, 2I] (gate/up interleaved by column) with bias [E, 2I], down_proj [E, I, H] with bias
// [E, H]. Each expert is transposed once at load to (out, in) so every linear shares one layout; the
// interleaved gate/up order is kept (the activation and expert LoRA use it as is).
// MXFP4 checkpoints (quantization_config.quant_method mxfp4, as openai/gpt-oss-* ship): the experts of each
// layer that modules_to_not_convert does not exclude are gate_up_proj_blocks/_scales and
// down_proj_blocks/_scales, already (out, in) (HF transposes after decoding; we keep them as they are), and
// stay MXFP4 in memory; their biases are bf16.
#include "common/error.h"
#include "model/arch/arch.h"

namespace polylora::arch {

void bind_gpt_oss(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w) {
  bind_common(cfg, loader, w);
  int64_t h = cfg.hidden_size, i = cfg.moe_intermediate_size, num_experts = cfg.num_experts;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    bind_attention(cfg, loader, l, lw);
    lw.is_moe = true;
    std::string p = layer_prefix(l) + "mlp.";
    lw.moe.router.w = loader.matrix(p + "router.weight", num_experts, h, /*keep_f32=*/true);
    lw.moe.router.bias = loader.vector(p + "router.bias", num_experts, 0.0f);
    lw.moe.experts.resize(static_cast<size_t>(num_experts));
    const bool mxfp4 = cfg.mxfp4_experts[l];
    if (!mxfp4 && loader.has(p + "experts.gate_up_proj_blocks"))
      fail(
          "checkpoint holds MXFP4 experts ('{}experts.gate_up_proj_blocks'), but its config.json does not say "
          "so: add quantization_config {{\"quant_method\": \"mxfp4\"}} (or remove layer {}'s experts from "
          "modules_to_not_convert)",
          p, l);

    for (int64_t e = 0; e < num_experts; ++e) {
      kernels::ExpertView& ex = lw.moe.experts[e];
      if (mxfp4) {
        ex.gate_up = loader.expert_mxfp4(p + "experts.gate_up_proj", num_experts, 2 * i, h, e);
        ex.down = loader.expert_mxfp4(p + "experts.down_proj", num_experts, h, i, e);
      } else {
        ex.gate_up = loader.expert_transposed(p + "experts.gate_up_proj", num_experts, h, 2 * i, e);
        ex.down = loader.expert_transposed(p + "experts.down_proj", num_experts, i, h, e);
      }
      ex.gate_up_bias = loader.expert_vector(p + "experts.gate_up_proj_bias", num_experts, 2 * i, e);
      ex.down_bias = loader.expert_vector(p + "experts.down_proj_bias", num_experts, h, e);
    }
    lw.moe.experts_on_device = loader.experts_to_device(lw.moe.experts);
  }
}

}  // namespace polylora::arch
