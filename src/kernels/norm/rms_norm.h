// kernels/norm/rms_norm.h: RMSNorm over the last dimension: y = x / sqrt(mean(x²) + eps) · w.
// Used for the residual-stream norms ([m, n]) and Qwen3's per-head q/k norms ([m·heads, head_dim]).
// In-place use (x == y) is allowed. Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"

namespace polylora::kernels {

// x, y: [m, n] with row strides ldx, ldy; w: [n] f32.
struct RmsNormArgs {
  const float* x = nullptr;
  int64_t ldx = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  const float* w = nullptr;
  float eps = 1e-6f;
};

namespace ref {
void rms_norm(const RmsNormArgs& args);
}
namespace cpu {
void rms_norm(const RmsNormArgs& args);
}
namespace cuda {
void rms_norm(const RmsNormArgs& args, const CudaContext& ctx);
}

}  // namespace polylora::kernels
