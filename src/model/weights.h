// model/weights.h: the parameters of a decoder model, as views the kernels consume.
// Matrices stay in their checkpoint dtype and, where the layout allows, point into the memory-mapped
// checkpoint (zero-copy); small vectors (norms, biases, sinks) are f32 copies. GPT-OSS expert tensors
// are stored (in, out) in the checkpoint and are transposed once at load into (out, in) buffers.
// Must not: hold request state.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/moe/moe.h"
#include "kernels/tensor_view.h"
#include "runtime/safetensors.h"

namespace polylora {

struct LinearWeights {
  kernels::WeightView w;    // [out, in]
  std::vector<float> bias;  // [out] or empty
  const float* bias_ptr() const { return bias.empty() ? nullptr : bias.data(); }
};

struct AttentionWeights {
  LinearWeights q, k, v, o;
  std::vector<float> q_norm;  // [head_dim] (Qwen3) or empty
  std::vector<float> k_norm;  // [head_dim] (Qwen3) or empty
  std::vector<float> sinks;   // [num_heads] (GPT-OSS) or empty
};

struct DenseMlpWeights {
  LinearWeights gate, up, down;
};

struct MoeWeights {
  LinearWeights router;                       // [E, H] (+ bias for GPT-OSS)
  std::vector<kernels::ExpertView> experts;   // [E]; biases point into expert_biases
  std::vector<std::vector<float>> expert_biases;  // owned storage for gate_up / down biases
};

struct LayerWeights {
  std::vector<float> input_norm;           // [H]
  std::vector<float> post_attention_norm;  // [H]
  AttentionWeights attn;
  bool is_moe = false;
  DenseMlpWeights mlp;
  MoeWeights moe;
};

struct ModelWeights {
  kernels::WeightView embed;  // [vocab, H]
  std::vector<float> final_norm;
  kernels::WeightView lm_head;  // [vocab, H] (the embedding when tied)
  std::vector<LayerWeights> layers;

  // Storage keeping the views valid.
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<uint16_t[]>> owned;  // transposed / dummy 16-bit buffers
  std::vector<std::unique_ptr<float[]>> owned_f32;
  size_t num_bytes = 0;  // bytes of all parameters
};

}  // namespace polylora
