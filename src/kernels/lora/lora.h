// kernels/lora/lora.h: unmerged LoRA on selected rows: y[row] += scale · B · (A · x[row]).
// shrink (x·Aᵀ, [rows, rank]) then expand (·Bᵀ added into y). The rows are those tokens of the batch
// whose sequence uses this adapter (tokens of other adapters, or none, cost nothing here).
// Must not: know about adapters, files or models; depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda_context.h"

namespace polylora::kernels {

struct LoraView {
  const float* a = nullptr;  // [rank, in]
  const float* b = nullptr;  // [out, rank]
  int64_t rank = 0;
  int64_t in = 0;
  int64_t out = 0;
  float scale = 1.0f;
  bool empty() const { return a == nullptr; }
};

struct LoraApplyArgs {
  const float* x = nullptr;  // [*, in], row stride ldx
  int64_t ldx = 0;
  float* y = nullptr;  // [*, out], row stride ldy (added into)
  int64_t ldy = 0;
  const int32_t* rows = nullptr;  // [num_rows] row indices into x and y; nullptr: rows 0..num_rows−1
  int64_t num_rows = 0;
  LoraView lora;
};

// ---- Slot-stacked LoRA: every adapter slot's weights of one module in one tensor each ----
// a [slots, rank, in], b [slots, out, rank] in `dtype` (F32 or BF16: the serving dtype), ranks below
// `rank` zero-padded; scale[slot] (0: the slot has no LoRA on this module, skipped). Device memory on
// CUDA (written by the model's adapter upload, outside any forward pass), host memory on the CPU.
struct LoraStack {
  const void* a = nullptr;
  const void* b = nullptr;
  DType dtype = DType::kF32;
  const float* scale = nullptr;  // [slots]
  int64_t slots = 0;
  int64_t rank = 0;
  int64_t in = 0;
  int64_t out = 0;
  bool empty() const { return a == nullptr; }
};

// Batched LoRA over tokens of any adapters (SGMV): for every module i < num and token t with slot
// s = token_slots[t] >= 0 and w[i].scale[s] != 0:  y[i][t] += scale[s] · B[s] · (A[s] · x[t]).
// The modules share the input x (q/k/v: one read of x for the three shrinks) and w[i].in.
constexpr int kMaxLoraGroup = 3;
struct LoraBatchArgs {
  const float* x = nullptr;  // [m, in], row stride ldx
  int64_t ldx = 0;
  int64_t m = 0;
  const int32_t* token_slots = nullptr;  // [m], −1: no adapter
  int num = 1;
  LoraStack w[kMaxLoraGroup];
  float* y[kMaxLoraGroup] = {};  // [m, w[i].out], row stride ldy[i] (added into)
  int64_t ldy[kMaxLoraGroup] = {};
};

// ---- Dense LoRA split over other ops (few tokens: the CUDA decode path) ----
// lora_shrink: the shrink of a LoraBatchArgs group alone (args.y unused): tmp[t, first_i + r] =
// A_i[s] row r · x[t] with s = token_slots[t], first_i the sum of the earlier modules' ranks, for every token
// whose slot has LoRA in some module of the group (other rows of tmp are not written). The expand is then
// applied by the op that consumes the module's output, before its own work, through a LoraExpandIn:
// out[t, o] += scale[s] · Σ_r B[s, o, r] · tmp[t, first + r] (nothing for s < 0 or scale[s] == 0).
struct LoraExpandIn {
  const int32_t* token_slots = nullptr;  // [m]; nullptr: no LoRA
  const float* tmp = nullptr;            // [m, ld_tmp] lora_shrink's sums
  int64_t ld_tmp = 0;
  int64_t first = 0;  // the module's first column in tmp
  LoraStack w;        // the module's stack (b, scale, rank, out, slots, dtype)
  constexpr bool active() const { return token_slots != nullptr && w.b != nullptr; }
};

namespace ref {
void lora_apply(const LoraApplyArgs& args);
void lora_batch(const LoraBatchArgs& args);
void lora_shrink(const LoraBatchArgs& args, float* tmp, int64_t ld_tmp);
// out[t, o] += l's term for t < m, o < l.w.out (out row stride ld_out): what the consuming ops add.
void lora_expand_in(const LoraExpandIn& l, int64_t m, float* out, int64_t ld_out);
// A dense copy [m, l.w.out] of rows of `in` (row stride ld) with l's term added: the CPU paths of the ops
// that take a LoraExpandIn run on it.
std::vector<float> with_lora_term(const LoraExpandIn& l, const float* in, int64_t m, int64_t ld);
}  // namespace ref
namespace cpu {
void lora_apply(const LoraApplyArgs& args);
void lora_batch(const LoraBatchArgs& args);
}  // namespace cpu
namespace cuda {
// Views (a, b) and rows in device memory; any rank.
void lora_apply(const LoraApplyArgs& args, const CudaContext& ctx);
// Everything in device memory; the rank-sized intermediates in ctx.workspace.
void lora_batch(const LoraBatchArgs& args, const CudaContext& ctx);
size_t lora_batch_workspace_bytes(const LoraBatchArgs& args);
// lora_batch's shrink alone: partial sums tmp[z][t][first_i + r] (z < the returned number of splits, t < m,
// first_i the earlier modules' ranks; sum over z for A_i[s] row r · x[t]) for the tokens whose slot has
// LoRA in some module of the group (other rows are not written). tmp holds lora_batch_workspace_bytes(args).
// x_bf16 (optional, BF16 stacks): args.x rounded to bf16 in device memory (rows ld_bf16 apart), which the
// tensor-core shrink (prefill sizes) then reads instead of args.x: one bf16 part, not x split exactly into
// three (the sums of the rounded x).
int lora_shrink_partials(const LoraBatchArgs& args, float* tmp, const CudaContext& ctx,
                         const void* x_bf16 = nullptr, int64_t ld_bf16 = 0);
// The shrink alone (weight-streaming items, one launch); tmp in device memory.
void lora_shrink(const LoraBatchArgs& args, float* tmp, int64_t ld_tmp, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
