// kernels/attention/attention.h: paged causal grouped-query attention and the KV-cache write.
// The KV cache of one layer is two arrays [num_blocks, block_size, num_kv_heads, head_dim] (F32; BF16 on CUDA
// backends with --kv-cache-dtype bfloat16, KvCacheView::dtype).
// A sequence's keys are found through its block table; token j of a sequence lives in block
// block_table[j / block_size] at offset j % block_size. Supports sliding windows (a query at position p
// sees keys j with p − j < window) and GPT-OSS attention sinks (one learned logit per head that joins
// the softmax and is then dropped). Must not: depend on anything above common/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/cuda_context.h"

namespace polylora::kernels {

// The cache's element type: F32 (every backend) or BF16 (CUDA, --kv-cache-dtype bfloat16: half the bytes;
// the kernels write it rounded to nearest and compute with the values widened to f32).
struct KvCacheView {
  void* k = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] of `dtype`
  void* v = nullptr;  // same shape
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kF32;
  // The F32 cache's arrays (the CPU kernels: their callers check dtype first, check_f32_cache).
  float* kf() const { return static_cast<float*>(k); }
  float* vf() const { return static_cast<float*>(v); }
  size_t elem_bytes() const { return dtype_size(dtype); }
};
// The CPU kernels keep an f32 cache: a BF16 one is a polylora::Error naming `op`.
void check_f32_cache(const KvCacheView& c, const char* op);

// Writes k[t], v[t] ([m, num_kv_heads·head_dim], row strides ldk/ldv) to slot slot_mapping[t]
// (block_id·block_size + offset); a negative slot is skipped (padding).
struct KvWriteArgs {
  const float* k = nullptr;
  int64_t ldk = 0;
  const float* v = nullptr;
  int64_t ldv = 0;
  int64_t m = 0;
  const int64_t* slot_mapping = nullptr;
  KvCacheView cache;
};

// Queries of S sequences packed by token: sequence s owns query rows [query_start[s], query_start[s+1]),
// its context (keys already cached plus this step's) has context_lens[s] tokens, and its query rows are
// the last (query_start[s+1] − query_start[s]) positions of that context.
struct AttentionArgs {
  const float* q = nullptr;  // [num_tokens, num_heads, head_dim], row stride ldq
  int64_t ldq = 0;
  float* out = nullptr;  // [num_tokens, num_heads, head_dim], row stride ldo
  int64_t ldo = 0;
  int64_t num_seqs = 0;
  int64_t num_tokens = 0;  // query_start[num_seqs] (the CUDA kernels size their grid by it; CPU ignores it)
  const int32_t* query_start = nullptr;   // [num_seqs + 1]
  const int32_t* context_lens = nullptr;  // [num_seqs]
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  int64_t num_heads = 0;
  float scale = 1.0f;
  int64_t window = 0;            // 0: full attention
  const float* sinks = nullptr;  // [num_heads] or nullptr
  KvCacheView cache;
};

namespace ref {
void write_kv(const KvWriteArgs& args);
void attention(const AttentionArgs& args);
}  // namespace ref
namespace cpu {
void write_kv(const KvWriteArgs& args);
void attention(const AttentionArgs& args);
}  // namespace cpu
namespace cuda {
// head_dim <= 256. attention needs attention_workspace_bytes(args) of ctx.workspace (split decode partials).
// tensor_cores (a BF16 backend): prefill steps with head_dim 64 or 128 may run on bf16 tensor cores when the
// tuning field attention_prefill_mma is set (queries, keys, values and probabilities rounded to bf16, as
// Hugging Face's bf16 forward); else everything is f32 on CUDA cores.
void write_kv(const KvWriteArgs& args, const CudaContext& ctx);
void attention(const AttentionArgs& args, const CudaContext& ctx, bool tensor_cores = false);
size_t attention_workspace_bytes(const AttentionArgs& args);
}  // namespace cuda

}  // namespace polylora::kernels
