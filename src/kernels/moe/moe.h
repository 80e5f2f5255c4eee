// kernels/moe/moe.h: Mixture-of-Experts routing and expert computation (with optional expert LoRA).
// route(): router logits [m, E] -> top-k expert ids and weights per token, in two flavours:
//   kSoftmaxTopK (Mixtral, Qwen3-MoE): softmax over all E, top-k, optionally renormalised to sum 1;
//   kTopKSoftmax (GPT-OSS): top-k of the logits, softmax over those k values.
// experts(): out[t] = Σ_k w[t,k] · expert_{id[t,k]}(x[t]), where an expert is
//   gu = x·W_guᵀ (+b_gu) (+ LoRA), h = act(gu), y = h·W_downᵀ (+b_down) (+ LoRA).
//   W_gu is either one [2I, H] matrix (rows: gate then up, or interleaved for GPT-OSS) or two [I, H]
//   matrices (gate, up). LoRA is chosen per token by its adapter slot (−1: none).
// Must not: know about models or adapters beyond these views; depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"
#include "kernels/lora/lora.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/tensor_view.h"

namespace polylora::kernels {

enum class RouterScoring { kSoftmaxTopK, kTopKSoftmax };
enum class ExpertAct { kSiluGate, kGptOssSwiglu };

struct RouteArgs {
  const float* logits = nullptr;  // [m, num_experts] (bias already added)
  int64_t m = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  RouterScoring scoring = RouterScoring::kSoftmaxTopK;
  bool renormalize = false;  // kSoftmaxTopK only
  int32_t* ids = nullptr;    // [m, top_k] out
  float* weights = nullptr;  // [m, top_k] out
  // The ids written are expert − id_begin (expert parallelism: this rank's numbering of its own experts;
  // other ranks' experts come out negative or past its count, and moe_experts skips them). The weights
  // are those of the routing over all experts either way.
  int64_t id_begin = 0;
};

struct ExpertView {
  WeightView gate_up;                   // [2I, H], or empty when gate and up are separate
  WeightView gate;                      // [I, H] (when gate_up is empty)
  WeightView up;                        // [I, H]
  WeightView down;                      // [H, I]
  const float* gate_up_bias = nullptr;  // [2I] or nullptr
  const float* down_bias = nullptr;     // [H] or nullptr
};

// LoRA of one expert for one adapter. gate_up applies to all 2I outputs of the gate/up projection
// (in its own row order); gate and up to the first and second halves (non-interleaved layouts only).
struct ExpertLoraView {
  LoraView gate_up;
  LoraView gate;
  LoraView up;
  LoraView down;
};

// Expert LoRA of one MoE layer for every adapter slot, slot-stacked in `dtype` (F32 or BF16), ranks
// below `rank` zero-padded:
//   a_gu [slots, E, gu_slices · rank, H], b_gu [slots, E, 2I, rank],
//   a_down [slots, E, rank, I], b_down [slots, E, H, rank],
//   scale [slots, E, 3]: gate/up slice 0, slice 1, down (0: none there, skipped).
// gu_slices 1: one LoRA over all 2I gate/up outputs (GPT-OSS's fused gate_up_proj); 2: separate gate and
// up LoRAs, output row n of gate_up (in the weight's row order) taking slice (interleaved ? n & 1 : n >= I)
// of the shrink (interleaved: ExpertAct::kGptOssSwiglu's layout).
struct MoeLoraStack {
  const void* a_gu = nullptr;
  const void* b_gu = nullptr;
  const void* a_down = nullptr;
  const void* b_down = nullptr;
  DType dtype = DType::kF32;
  const float* scale = nullptr;
  int64_t slots = 0;
  int64_t rank = 0;
  int gu_slices = 1;
  bool empty() const { return a_gu == nullptr; }
};

struct MoeExpertsArgs {
  const float* x = nullptr;  // [m, hidden], row stride ldx
  int64_t ldx = 0;
  int64_t m = 0;
  int64_t hidden = 0;
  int64_t inter = 0;  // I
  int64_t num_experts = 0;
  int64_t top_k = 0;
  // Ids outside [0, num_experts) are experts of other ranks (expert parallelism, RouteArgs::id_begin): their
  // pairs are skipped (out[t] sums this rank's experts only).
  const int32_t* ids = nullptr;         // [m, top_k]
  const float* weights = nullptr;       // [m, top_k]
  const ExpertView* experts = nullptr;  // [num_experts]
  // Every expert's gate_up and down are MXFP4 views (tensor_view.h; gate_up fused): the CPU kernels read
  // the views' formats themselves, CUDA dispatches on this (the views are in device memory).
  bool experts_mxfp4 = false;
  // Every expert's matrices are INT8 views (tensor_view.h, --quantization int8; gate_up fused or gate and
  // up): the CPU kernels read the views' formats themselves, CUDA dispatches on this.
  bool experts_int8 = false;
  ExpertAct act = ExpertAct::kSiluGate;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  // Expert LoRA: token t uses slot token_slots[t] (−1: none); lora[slot · num_experts + e] (entries may
  // be empty views). Both nullptr when no token of the batch has expert LoRA.
  const int32_t* token_slots = nullptr;  // [m]
  const ExpertLoraView* lora = nullptr;  // [num_slots · num_experts]
  int64_t num_slots = 0;
  // Or slot-stacked expert LoRA (used when not empty; token_slots as above, `lora` unused).
  MoeLoraStack lora_stack;
  float* out = nullptr;  // [m, hidden], row stride ldo; overwritten
  int64_t ldo = 0;
  // Optional: the routing that gives ids and weights (route.logits != nullptr; route.ids / route.weights
  // must be ids / weights and route.m and top_k these args'; route.num_experts is the router's, these args'
  // num_experts plus route.id_begin at least: with expert parallelism by masking the router sees every
  // expert and writes this rank's numbering). moe_experts then routes first, as
  // route(route) would; on CUDA, small batches route in the launch that sorts the pairs by expert (one
  // launch where route, the sort and the activations' bf16 cast took three; KernelTuning::
  // moe_route_fused_max_tokens).
  RouteArgs route;
  // Optional: the residual add and RMSNorm after the experts (then_norm.w != nullptr): add_rms_norm with
  // delta = out (then_norm.delta / ld_delta are ignored), which moe_experts runs after writing out; on CUDA
  // in the combine's launch where the combine is the plain one (cuda::add_rms_norm_combined). No LoRA term.
  AddRmsNormArgs then_norm;
};

// The host entry points' handling of MoeExpertsArgs::route and then_norm: when args has either, route, then
// the experts on args without them, then add_rms_norm with delta = out; returns whether it ran them.
template <typename Route, typename Experts, typename Norm>
bool route_and_norm_around(const MoeExpertsArgs& args, Route route, Experts experts, Norm norm) {
  if (args.route.logits == nullptr && args.then_norm.w == nullptr) return false;
  if (args.route.logits != nullptr) route(args.route);
  MoeExpertsArgs a = args;
  a.route = {};
  a.then_norm = {};
  experts(a);
  if (args.then_norm.w != nullptr) {
    AddRmsNormArgs n = args.then_norm;
    n.delta = args.out;
    n.ld_delta = args.ldo;
    norm(n);
  }
  return true;
}

namespace ref {
void route(const RouteArgs& args);
void moe_experts(const MoeExpertsArgs& args);
}  // namespace ref
namespace cpu {
void route(const RouteArgs& args);
void moe_experts(const MoeExpertsArgs& args);
}  // namespace cpu
namespace cuda {
// route: one warp per token, any num_experts.
void route(const RouteArgs& args, const CudaContext& ctx);
// Everything on the device, no host synchronization: token-expert pairs counted and sorted by expert
// (offsets padded to the GEMM tile), grouped GEMMs for gate_up and down over all experts (one launch
// each), expert LoRA per sorted row, activation, weighted combine. experts/lora/ids/token_slots are in
// device memory; weights of every expert are F32 (fp32 FMA path) or BF16/F16 (bf16 tensor cores with fp32
// accumulation; activations as hi + lo bf16 pairs with ctx.bf16_split(m), else cast to one bf16; the
// small-batch GEMV path multiplies f32 activations when split, bf16-rounded ones when not) as
// `tensor_cores` says (the backend's weight dtype). MXFP4 experts (args.experts_mxfp4) are read as stored:
// the codes and scales decoded in registers by the GEMV or the grouped GEMM, no bf16 copy in memory.
void moe_experts(const MoeExpertsArgs& args, bool tensor_cores, const CudaContext& ctx);
size_t moe_experts_workspace_bytes(const MoeExpertsArgs& args, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
