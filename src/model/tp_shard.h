// model/tp_shard.h: what one rank of a tensor-parallel group owns of a model (docs/tensor-parallel.md):
// its attention heads, KV heads (replicated when the ranks outnumber them), columns of the dense and
// expert intermediate layers and rows of the vocabulary; its ModelConfig, its weight views and its share of
// an adapter. Pure functions of the whole model's config, weights and adapters.
// Column-parallel (q/k/v, gate/up, experts' gate/up, LM head): this rank's output rows of the matrix (a
// view into the checkpoint, no copy). Row-parallel (o_proj, down, experts' down): this rank's input
// columns (a copy), the bias on rank 0 only, the partial outputs summed by an all_reduce. The embedding:
// this rank's vocabulary rows (a view; the lookup reads zeros for ids outside them, and an all_reduce sums
// the ranks' rows). LoRA: A replicated and B split by output rows on column-parallel modules; A split by
// input columns and B whole on row-parallel ones (each rank adds B·(A_r·x_r), the all_reduce sums them to
// B·A·x). Expert parallelism (--enable-expert-parallel): the MoE layers' experts are not split; rank r owns
// the whole experts [r·E/N, (r+1)·E/N) (views, no copy) and their LoRA, and the router stays replicated
// (model/expert_parallel.cc dispatches the token-expert pairs to the owners).
// Must not: run kernels or collectives.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "config/model_config.h"
#include "lora/adapter.h"
#include "model/weights.h"

namespace polylora {

struct TpShard {
  int rank = 0;
  int size = 1;
  int64_t head_begin = 0;       // first attention head of this rank (num_heads / size heads)
  int64_t kv_head_begin = 0;    // first KV head (max(1, num_kv_heads / size) heads)
  int64_t inter_begin = 0;      // first column of the dense MLP's intermediate (intermediate_size / size)
  // Each expert's intermediate columns of this rank: [moe_inter_begin, moe_inter_begin + moe_inter_count);
  // moe_intermediate_size / size each, or for MXFP4 experts whole 32-column blocks spread as evenly as
  // they go (GPT-OSS's 2880 over 4 ranks: 736, 736, 704, 704; the ranks' counts may differ).
  int64_t moe_inter_begin = 0;
  int64_t moe_inter_count = 0;
  int64_t vocab_begin = 0;      // first vocabulary row of this rank
  int64_t vocab_rows = 0;       // rows of this rank (the last rank may have fewer)
  int64_t vocab_stride = 0;     // rows of every rank but the last: ceil(vocab_size / size)
  // Expert parallelism: this rank owns experts [expert_begin, expert_begin + num_local_experts), whole
  // (without it every rank has a slice of every expert: expert_begin 0, num_local_experts num_experts).
  bool expert_parallel = false;
  int64_t expert_begin = 0;
  int64_t num_local_experts = 0;
  // --fully-sharded-loras: the dense modules' LoRA is sharded further (model/fully_sharded_lora.h).
  bool fully_sharded_loras = false;
};

// How the model is split (--tensor-parallel-size, --enable-expert-parallel, --fully-sharded-loras).
struct TpLayout {
  int size = 1;
  bool expert_parallel = false;
  bool fully_sharded_loras = false;
};

// Throws polylora::Error unless `cfg` splits over `size` ranks: the attention heads divide by it, the
// KV heads divide by it or it by them, and so do the dense and expert intermediate sizes (MXFP4 experts:
// their 32-column blocks, at least one per rank, need not divide evenly). With expert parallelism the expert
// intermediate size stays whole and the experts must divide by the size instead; with fully sharded LoRA the
// hidden size must divide too (o_proj's and down's LoRA B are split by output rows). The message names the
// counts and what would divide.
void check_tensor_parallel(const ModelConfig& cfg, const TpLayout& layout);
TpShard make_tp_shard(const ModelConfig& cfg, int rank, const TpLayout& layout);
// cfg with this rank's counts: num_heads, num_kv_heads, intermediate_size and moe_intermediate_size, or
// with expert parallelism num_experts = E / N and moe_intermediate_size whole (the vocabulary and the
// router stay whole: the shard says which rows are here, and the router scores all experts).
ModelConfig shard_config(const ModelConfig& cfg, const TpShard& shard);
// This rank's weights (views into `full`, which must outlive them, and copies in `be`'s memory).
ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& cfg, const TpShard& shard,
                           Backend& be);
// A copy of `host` (a rank's weights in host memory: shard_weights on a CPU backend) in `be`'s memory (a
// GPU): float matrices as be.weight_dtype() (the MoE routers as f32, as the loader keeps them), MXFP4
// and INT8 matrices byte for byte with their scales, vectors as f32. `local`: the rank's config
// (shard_config), which gives the vectors' lengths.
ModelWeights copy_weights(const ModelWeights& host, const ModelConfig& local, Backend& be);
// Weights made for this rank's own config (shard_config: dummy weights made on its GPU directly, the same
// seed on every rank) turned into its shard: the embedding and LM head cut to the rank's vocabulary rows
// (views), the row-parallel biases (o_proj, down, the experts' down) kept on rank 0 only, and with expert
// parallelism the routers (bound for the rank's count of experts) made again for all of the model's
// experts, from `seed`, the same on every rank.
void trim_rank_weights(ModelWeights& w, const ModelConfig& cfg, const TpShard& shard, Backend& be,
                       uint64_t seed);
// This rank's part of an adapter of the whole model (name, generation and ranks kept).
std::shared_ptr<const LoraAdapter> shard_adapter(const LoraAdapter& adapter, const ModelConfig& cfg,
                                                 const TpShard& shard);

}  // namespace polylora
