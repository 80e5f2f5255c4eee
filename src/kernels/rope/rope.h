// kernels/rope/rope.h: rotary position embedding, "rotate half" layout (as HF Llama/Qwen/Mixtral/GPT-OSS):
// for i < d/2: (x_i, x_{i+d/2}) -> (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin), angle =
// pos·inv_freq[i], cos and sin multiplied by attention_scaling (YaRN's mscale; 1 otherwise). Applied in
// place. The frequencies (default, linear, llama3, YaRN) are computed by the model from its config. Must not:
// depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"

namespace polylora::kernels {

// x: [m, num_heads, head_dim] with row stride ldx (per token); positions: [m]; inv_freq: [head_dim / 2].
struct RopeArgs {
  float* x = nullptr;
  int64_t ldx = 0;
  int64_t m = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float attention_scaling = 1.0f;
};

namespace ref {
void rope(const RopeArgs& args);
}
namespace cpu {
void rope(const RopeArgs& args);
}
namespace cuda {
void rope(const RopeArgs& args, const CudaContext& ctx);
}

}  // namespace polylora::kernels
