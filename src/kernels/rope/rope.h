// kernels/rope/rope.h: rotary position embedding, "rotate half" layout (as HF Llama/Qwen/Mixtral/GPT-OSS):
// for i < d/2: (x_i, x_{i+d/2}) -> (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin), angle =
// pos·inv_freq[i], cos and sin multiplied by attention_scaling (YaRN's mscale; 1 otherwise). Applied in
// place. The frequencies (default, linear, llama3, YaRN) are computed by the model from its config. Only the
// whole head is rotated (the configs refuse partial_rotary_factor != 1). Also the attention block's fused
// step after the q/k/v projections (rope_kv_write: optional per-head q/k RMSNorm, RoPE on q and k, the
// paged KV-cache write). Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/cuda_context.h"
#include "kernels/lora/lora.h"

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

// One op for what the attention block does between the q/k/v projections and attention, per token t:
//   1. q_norm / k_norm set (Qwen3's qk_norm): each head of q and of k RMSNorm'ed over head_dim with those
//      weights ([head_dim] f32) and eps (kernels/norm/rms_norm.h's formula);
//   2. RoPE (as RopeArgs: rotate half, angle = positions[t]·inv_freq[i], cos/sin · attention_scaling) on
//      every head of q and of k;
//   3. k (normed and rotated) and v (as given) stored to cache slot slot_mapping[t] ([num_kv_heads·head_dim]
//      each, in the cache's element type: F32, or BF16 rounded to nearest on CUDA), as KvWriteArgs does; a
//      negative slot writes nothing (padding); q is rotated all the same.
// q is updated in place; k and v are only read (the rotated k exists only in the cache). The cache's
// num_kv_heads and head_dim must be the args' own. Results equal the op sequence rms_norm (q, k), rope (q),
// rope (k), write_kv; the CPU fast path is bit-identical to that sequence of CPU kernels.
struct RopeKvWriteArgs {
  float* q = nullptr;  // [m, num_heads, head_dim], row stride ldq
  int64_t ldq = 0;
  const float* k = nullptr;  // [m, num_kv_heads, head_dim], row stride ldk
  int64_t ldk = 0;
  const float* v = nullptr;  // [m, num_kv_heads, head_dim], row stride ldv
  int64_t ldv = 0;
  int64_t m = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  const int32_t* positions = nullptr;  // [m]
  const float* inv_freq = nullptr;     // [head_dim / 2]
  float attention_scaling = 1.0f;
  const float* q_norm = nullptr;  // [head_dim] or nullptr (no q/k norm); set together with k_norm
  const float* k_norm = nullptr;  // [head_dim] or nullptr
  float eps = 1e-6f;
  const int64_t* slot_mapping = nullptr;  // [m]: block_id·block_size + offset, or negative
  KvCacheView cache;
  // Optional dense LoRA of the q/k/v projections (lora.h LoraExpandIn, output column = head·head_dim + i),
  // added to q, k and v before step 1 (q in place; k's and v's sums go only to the cache and attention).
  LoraExpandIn lora_q, lora_k, lora_v;
};

namespace ref {
void rope(const RopeArgs& args);
void rope_kv_write(const RopeKvWriteArgs& args);
// The args' LoRA terms applied (q in place, k and v into copies the result holds) and the args without them,
// for the CPU paths (the reference and the fast path run on those).
struct RopeKvWriteNoLora {
  RopeKvWriteArgs args;
  std::vector<float> k, v;
};
RopeKvWriteNoLora apply_lora_terms(const RopeKvWriteArgs& args);
}  // namespace ref
namespace cpu {
void rope(const RopeArgs& args);
void rope_kv_write(const RopeKvWriteArgs& args);
}  // namespace cpu
namespace cuda {
void rope(const RopeArgs& args, const CudaContext& ctx);
void rope_kv_write(const RopeKvWriteArgs& args, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
