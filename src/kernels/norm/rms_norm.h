// kernels/norm/rms_norm.h: RMSNorm over the last dimension: y = x / sqrt(mean(x²) + eps) · w.
// Used for the residual-stream norms ([m, n]) and Qwen3's per-head q/k norms ([m·heads, head_dim]).
// In-place use (x == y) is allowed. Also the residual add fused with it (add_rms_norm: x += delta, then
// y = rms_norm(x) · w, one pass over the rows instead of add_inplace then rms_norm).
// Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda_context.h"
#include "kernels/lora/lora.h"

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

// The residual add fused with RMSNorm: x[i] += delta[i], then y[i] = rms_norm(x[i]) · w for every row i.
// x: [m, n] (the residual stream, updated in place), delta: [m, n] (the sub-layer's output), y: [m, n] (the
// next sub-layer's input), row strides ldx, ld_delta, ldy; w: [n] f32. y must not overlap x; it may be
// delta itself (every element of delta is read before the same element of y is written).
// Results are those of `x += delta` (elementwise f32 adds) followed by rms_norm on x: the CPU and CUDA fast
// paths are bit-identical to their own rms_norm after the add (same row kernels, same summation order).
struct AddRmsNormArgs {
  float* x = nullptr;
  int64_t ldx = 0;
  const float* delta = nullptr;
  int64_t ld_delta = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  int64_t m = 0;
  int64_t n = 0;
  const float* w = nullptr;
  float eps = 1e-6f;
  // Optional dense LoRA of the op that produced delta (lora.h LoraExpandIn, output column j): x += delta +
  // its term.
  LoraExpandIn lora_delta;
};

namespace ref {
void rms_norm(const RmsNormArgs& args);
void add_rms_norm(const AddRmsNormArgs& args);
// The args with delta replaced by a copy (held by the result) that has the LoRA term added, for the CPU
// paths.
struct AddRmsNormNoLora {
  AddRmsNormArgs args;
  std::vector<float> delta;
};
AddRmsNormNoLora apply_lora_term(const AddRmsNormArgs& args);
}  // namespace ref
namespace cpu {
void rms_norm(const RmsNormArgs& args);
void add_rms_norm(const AddRmsNormArgs& args);
// One row of cpu::rms_norm (AVX2 or scalar, as the ISA dispatch picks): y[j] = w[j] · (x[j] · inv), inv from
// the sum of squares of x[0..n); x == y allowed. For other CPU kernels that must match rms_norm bit for bit
// (the fused rope + KV write's per-head q/k norms).
void rms_norm_row(const float* x, float* y, const float* w, int64_t n, float eps);
}  // namespace cpu
namespace cuda {
void rms_norm(const RmsNormArgs& args, const CudaContext& ctx);
void add_rms_norm(const AddRmsNormArgs& args, const CudaContext& ctx);
// A weighted sum of rows (the MoE combine): row t of `out` [m, n] (row stride AddRmsNormArgs::ld_delta) is
// Σ_k weights[t·top_k + k] · (rows[t·top_k + k] (+ rows_delta[t·top_k + k])) over the k, in order, with
// 0 <= ids[t·top_k + k] < num_ids; rows / rows_delta [m·top_k, n] with row stride n.
struct RowCombine {
  const float* rows = nullptr;
  const float* rows_delta = nullptr;  // nullptr: none
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int64_t top_k = 0, num_ids = 0;
  float* out = nullptr;
};
// add_rms_norm whose delta is c's combine, computed in the same launch (moe_experts' combine fused with the
// residual add and norm after it: MoeExpertsArgs::then_norm): out is written, then x += out and y =
// rms_norm(x) · w, bit-identical to the combine followed by add_rms_norm (args.delta must be c.out; no LoRA
// term).
void add_rms_norm_combined(const AddRmsNormArgs& args, const RowCombine& c, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
