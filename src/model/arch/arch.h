// model/arch/arch.h: one binder per architecture: maps its checkpoint names to ModelWeights.
// The forward pass itself is shared (model/decoder.cc), parameterised by ModelConfig.
#pragma once

#include <vector>

#include "config/model_config.h"
#include "model/weight_loader.h"
#include "model/weights.h"

namespace polylora::arch {

void bind_llama(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w);  // llama and qwen3 (dense)
void bind_qwen3_moe(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w);
void bind_mixtral(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w);
void bind_gpt_oss(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w);

// The binder of cfg.arch.
void bind(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w);
// The tensors a checkpoint of `cfg` must hold, in the order the binder reads them (a planning loader).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

// Shared pieces: embeddings, final norm and LM head; one layer's attention and norms; a dense MLP.
void bind_common(const ModelConfig& cfg, WeightLoader& loader, ModelWeights& w);
void bind_attention(const ModelConfig& cfg, WeightLoader& loader, int64_t layer, LayerWeights& lw);
void bind_dense_mlp(const ModelConfig& cfg, WeightLoader& loader, int64_t layer, LayerWeights& lw);
std::string layer_prefix(int64_t layer);  // "model.layers.{layer}."

}  // namespace polylora::arch
