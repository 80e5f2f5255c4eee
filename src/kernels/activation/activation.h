// kernels/activation/activation.h: gated activations of the MLP and the experts.
// silu_and_mul: out = silu(gate) · up, gate and up from separate row-major arrays (dense MLP) or the two
// halves of one [m, 2n] array (experts: gate rows first, then up).
// gpt_oss_swiglu: GPT-OSS's clamped SwiGLU over an interleaved [m, 2n] array (even columns gate, odd up):
// g = min(gate, limit); u = clamp(up, −limit, limit); out = (u + 1) · g · sigmoid(alpha · g).
// Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"

namespace polylora::kernels {

struct SiluAndMulArgs {
  const float* gate = nullptr;  // [m, n], row stride ld_gate
  int64_t ld_gate = 0;
  const float* up = nullptr;  // [m, n], row stride ld_up
  int64_t ld_up = 0;
  float* out = nullptr;  // [m, n], row stride ld_out
  int64_t ld_out = 0;
  int64_t m = 0;
  int64_t n = 0;
};

struct GptOssSwigluArgs {
  const float* gate_up = nullptr;  // [m, 2n] interleaved, row stride ld_in
  int64_t ld_in = 0;
  float* out = nullptr;  // [m, n], row stride ld_out
  int64_t ld_out = 0;
  int64_t m = 0;
  int64_t n = 0;
  float alpha = 1.702f;
  float limit = 7.0f;
};

namespace ref {
void silu_and_mul(const SiluAndMulArgs& args);
void gpt_oss_swiglu(const GptOssSwigluArgs& args);
}  // namespace ref
namespace cpu {
void silu_and_mul(const SiluAndMulArgs& args);
void gpt_oss_swiglu(const GptOssSwigluArgs& args);
}  // namespace cpu
namespace cuda {
void silu_and_mul(const SiluAndMulArgs& args, const CudaContext& ctx);
void gpt_oss_swiglu(const GptOssSwigluArgs& args, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
