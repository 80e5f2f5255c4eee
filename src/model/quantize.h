// model/quantize.h: --quantization int8 applied to loaded weights (docs/quantization.md): which matrices
// become INT8 (per-output-channel symmetric, common/int8.h) and which stay as loaded, and the checks that
// refuse combinations that cannot work. Must not: hold request state or call kernels directly (the backend
// quantizes).
#pragma once

#include "backend/backend.h"
#include "config/model_config.h"
#include "model/weight_loader.h"
#include "model/weights.h"

namespace polylora {

// Throws polylora::Error when `q` cannot apply to a model of `cfg` (INT8 on an MXFP4 checkpoint).
void check_quantization(WeightQuantization q, const ModelConfig& cfg, const std::string& source);

// After loader.finish(): quantizes q/k/v/o and the dense MLP's gate/up/down of every layer and every
// expert's gate_up (or gate and up) and down to INT8, freeing the loaded copies, and rewrites the
// experts' device arrays. The embedding, the LM head and the MoE routers stay as loaded (the LM head
// feeds the log-probs directly, a router's near-ties should not flip; together a small share of the bytes).
// Logs the bytes before and after.
void quantize_weights_int8(ModelWeights& weights, WeightLoader& loader, Backend& backend);

}  // namespace polylora
