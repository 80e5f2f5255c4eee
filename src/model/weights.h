// model/weights.h: the parameters of a decoder model, as views the kernels consume, in backend memory.
// On the CPU, matrices stay in their checkpoint dtype and point into the memory-mapped checkpoint
// (zero-copy); on CUDA they are copied to the device. Small vectors (norms, biases, sinks) are f32.
// GPT-OSS expert tensors are stored (in, out) in the checkpoint and are transposed once at load into
// (out, in) so every linear shares one layout. Must not: hold request state.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/moe/moe.h"
#include "kernels/tensor_view.h"
#include "runtime/safetensors.h"

namespace polylora {

struct LinearWeights {
  kernels::WeightView w;        // [out, in]
  const float* bias = nullptr;  // [out] or nullptr
};

struct AttentionWeights {
  LinearWeights q, k, v, o;
  const float* q_norm = nullptr;  // [head_dim] (Qwen3) or nullptr
  const float* k_norm = nullptr;  // [head_dim] (Qwen3) or nullptr
  const float* sinks = nullptr;   // [num_heads] (GPT-OSS) or nullptr
};

struct DenseMlpWeights {
  LinearWeights gate, up, down;
};

struct MoeWeights {
  LinearWeights router;                                    // [E, H] (+ bias for GPT-OSS)
  std::vector<kernels::ExpertView> experts;                // [E] (pointers in backend memory)
  const kernels::ExpertView* experts_on_device = nullptr;  // the same array in backend memory
};

struct LayerWeights {
  const float* input_norm = nullptr;           // [H]
  const float* post_attention_norm = nullptr;  // [H]
  AttentionWeights attn;
  bool is_moe = false;
  DenseMlpWeights mlp;
  MoeWeights moe;
};

struct ModelWeights {
  kernels::WeightView embed;  // [vocab, H]
  const float* final_norm = nullptr;
  kernels::WeightView lm_head;  // [vocab, H] (the embedding when tied)
  std::vector<LayerWeights> layers;

  // Host storage keeping CPU views valid: the checkpoint mapping and transposed expert buffers.
  std::unique_ptr<Checkpoint> checkpoint;
  std::vector<std::unique_ptr<uint16_t[]>> owned;
  std::vector<std::unique_ptr<float[]>> owned_f32;
  size_t num_bytes = 0;  // bytes of all parameters as stored for the forward pass
};

}  // namespace polylora
