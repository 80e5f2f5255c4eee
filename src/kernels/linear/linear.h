// kernels/linear/linear.h: dense matrix product y[m, n] = x[m, k] · W[n, k]ᵀ (+ bias[n]).
// Reference: plain loops, fp32 accumulation. CPU fast path: blocked, multi-threaded (OpenMP),
// OpenBLAS sgemm on f32-converted weight panels for many rows, SIMD dot products for few.
// Must not: allocate per call beyond thread-local scratch; depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"
#include "kernels/lora/lora.h"
#include "kernels/tensor_view.h"

namespace polylora::kernels {

// x: [m, w.cols] with row stride ldx (>= w.cols); y: [m, w.rows] with row stride ldy (>= w.rows).
// bias: [w.rows] f32 or nullptr. y is overwritten.
struct LinearArgs {
  const float* x = nullptr;
  int64_t m = 0;
  int64_t ldx = 0;
  WeightView w;
  const float* bias = nullptr;
  float* y = nullptr;
  int64_t ldy = 0;
  // Optional, CUDA only: a dense LoRA shrink over the same x (lora.h lora_shrink(*lora_shrink, lora_tmp,
  // lora_ld_tmp); lora_shrink->x, ldx and m must be this product's), computed by the same launch when the
  // product is streamed (few rows), else by its own launch after the product. nullptr: none.
  const LoraBatchArgs* lora_shrink = nullptr;
  float* lora_tmp = nullptr;
  int64_t lora_ld_tmp = 0;
};

// The dense LoRA as extra K columns of its product (the CUDA prefill path, model/lora_dense_ext.h): one
// BF16 GEMM y = [x | t | 1 1] · W_extᵀ replaces the product, its bias add and lora_batch's expand (the
// read-modify-write of y). W_ext [n, w.cols] holds the weights in its first k columns, module i's B of slot
// s (its out rows, rank_i columns) at columns tail[i] + s · rank_i (zeros elsewhere), and, with bias_col
// >= 0, each row's bias split exactly into bf16 hi and lo at bias_col and bias_col + 1. Row t of the
// extended input is x[t] rounded to bf16, then, at module i's columns of the token's slot s, the group's
// shrink sums scaled: bf16(scale_i[s] · A_i[s] · x[t]) (zero where the slot has no LoRA in the module),
// 1 at the bias columns and 0 everywhere else. So y = x · Wᵀ + bias + Σ_i scale_i · B_i · A_i · x with x,
// the weights and the scaled shrink sums rounded to bf16 and f32 sums (the bias exact to ~16 bits). The
// CUDA shrink of many rows reads x as rounded to bf16 (the product's own rows); the reference and the
// shrink of few rows read the f32 x (the difference is within the shrink sums' rounding).
struct LinearLoraExtArgs {
  const float* x = nullptr;  // [m, k], row stride ldx
  int64_t m = 0;
  int64_t ldx = 0;
  int64_t k = 0;
  WeightView w;        // BF16 [n, cols]: cols >= k + the tails (+ 2 bias columns), a multiple of 8
  float* y = nullptr;  // [m, w.rows], row stride ldy (overwritten)
  int64_t ldy = 0;
  // The group's shrink (x, ldx, m, token_slots and the modules' stacks; y unused); num 0: no LoRA term.
  LoraBatchArgs shrink;
  int64_t tail[kMaxLoraGroup] = {};  // W_ext's column of module i's slot 0
  int64_t bias_col = -1;             // -1: no bias
};

namespace ref {
void linear(const LinearArgs& args);
// The semantics above, in f32 from the views in host memory (the extended rows built as the GPU does);
// round_bf16 false: x and the scaled shrink sums not rounded (tests of the model's side of the path).
void linear_lora_ext(const LinearLoraExtArgs& args, bool round_bf16 = true);
}
namespace cpu {
void linear(const LinearArgs& args);
// count independent products (e.g. the experts of an MoE layer) scheduled as one parallel job.
void linear_batch(const LinearArgs* args, int64_t count);
}  // namespace cpu
namespace cuda {
// cuBLAS: BF16 weights multiply bf16 activations (f32 accumulate and output): with ctx.bf16_split(m) each
// row of x as hi + lo bf16 rows (both products summed in f32), else x rounded to bf16. F32 weights run an
// exact fp32 sgemm (no TF32). INT8 weights run linear_int8. F16 weights are not supported (the CUDA backend
// converts them on load).
void linear(const LinearArgs& args, const CudaContext& ctx);
// Products of the same x (m, ldx and K alike: q, k and v): where every one is streamed (few rows, BF16, the
// split) and at most one carries a LoRA shrink, one launch streams all their rows (linear_stream_kernel over
// a table of up to 3 products); otherwise linear() for each. Same values as linear() per product up to the
// order of the K-slice sums (a group picks its slices from its total rows).
void linear_group(const LinearArgs* group, int64_t count, const CudaContext& ctx);
bool linear_group_fused(const LinearArgs* group, int64_t count, const CudaContext& ctx);
// Workspace bytes linear() needs (the bf16 copies of x and, for small split products, the f32 halves).
size_t linear_workspace_bytes(const LinearArgs& args, const CudaContext& ctx);
// LinearLoraExtArgs's product: the shrink (lora_shrink_partials), x cast into the extended rows, the
// tails packed, one cuBLAS GEMM. Needs m rows past ctx.bf16_split (x as one bf16).
void linear_lora_ext(const LinearLoraExtArgs& args, const CudaContext& ctx);
size_t linear_lora_ext_workspace_bytes(const LinearLoraExtArgs& args);
// INT8 weights (linear_int8_cuda.cu; codes and row scales read as stored): a weight-streaming kernel for
// few rows (f32 activations with ctx.bf16_split(m), else rounded to bf16), a bf16 tensor-core GEMM
// dequantizing the codes in its K loop for many (x as hi + lo bf16 with the split, else one bf16).
void linear_int8(const LinearArgs& args, const CudaContext& ctx);
size_t linear_int8_workspace_bytes(const LinearArgs& args, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
