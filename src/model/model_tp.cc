// model/model_tp.cc: tensor parallelism of a Model on the CPU backend (model.h, docs/tensor-parallel.md):
// splitting the loaded model over the ranks, running one step on every rank at once, the ranks' KV caches
// and adapter shards, and the sum over the ranks. The forward pass itself (decoder.cc) is the same on
// every rank; it calls all_reduce_sum and lm_head_parallel, which do nothing special at -tp 1.
#include <tuple>

#include "common/error.h"
#include "common/log.h"
#include "model/model.h"
#include "runtime/rank_threads.h"

namespace polylora {

namespace k = kernels;

void Model::split_tensor_parallel(const TpLayout& layout) {
  const int size = layout.size;
  CHECK(backend_->kind() == DeviceKind::kCpu);
  tp_threads_ = std::make_unique<RankThreads>(size);
  full_weights_ = std::make_unique<ModelWeights>(std::move(weights_));
  for (int r = 0; r < size; ++r) {
    Model* m = this;
    if (r > 0) {
      tp_ranks_.push_back(std::unique_ptr<Model>(new Model()));
      m = tp_ranks_.back().get();
      m->config_ = config_;
      m->backend_ = std::shared_ptr<Backend>(make_cpu_backend());
      m->rope_ = rope_;
      m->inv_freq_ = m->backend_->vector_from_host(rope_.inv_freq.data(), rope_.inv_freq.size());
      m->init_workspace();
    }
    m->tp_ = make_tp_shard(config_, r, layout);
    m->shard_cfg_ = shard_config(config_, m->tp_);
    m->weights_ = shard_weights(*full_weights_, config_, m->tp_, *m->backend_);
    m->comm_ = &tp_threads_->communicator(r);
  }
  spdlog::info("tensor parallelism: {} ranks (CPU threads), {} attention heads and {} KV heads each{}{}",
               size, shard_cfg_.num_heads, shard_cfg_.num_kv_heads,
               tp_.expert_parallel
                   ? fmt::format(", {} whole experts each (expert parallelism)", tp_.num_local_experts)
                   : "",
               tp_.fully_sharded_loras ? ", fully sharded LoRA" : "");
}

void Model::launch_tensor_parallel(const ForwardBatch& b, std::span<const k::KvCacheView> kv,
                                   std::span<const LoraAdapter* const> adapters, const TokenFeed& feed) {
  for (const k::KvCacheView& v : kv)
    if (v.num_kv_heads != shard_cfg_.num_kv_heads)
      fail(
          "the KV cache has {} KV heads per layer, but each of the {} tensor-parallel ranks holds {} "
          "(allocate "
          "it for Model::kv_config())",
          v.num_kv_heads, tp_.size, shard_cfg_.num_kv_heads);
  // Token ids fed from the previous step's samples (host memory on the CPU) become plain inputs, which
  // every rank reads.
  ForwardBatch fed;
  const ForwardBatch* batch = &b;
  if (!feed.empty()) {
    fed = b;
    for (size_t i = 0; i < feed.pairs.size(); i += 2)
      fed.token_ids[feed.pairs[i]] = feed.src[feed.pairs[i + 1]];
    batch = &fed;
  }
  tp_threads_->run([&](int rank) {
    Model& m = rank == 0 ? *this : *tp_ranks_[static_cast<size_t>(rank - 1)];
    m.run_eager(*batch, rank == 0 ? kv : m.mirror_kv(kv), adapters, {});
  });
}

std::span<const k::KvCacheView> Model::mirror_kv(std::span<const k::KvCacheView> like) {
  const k::KvCacheView key = like.empty() ? k::KvCacheView{} : like.front();
  if (kv_mirror_.size() == like.size() && kv_mirror_of_.k == key.k && kv_mirror_of_.dtype == key.dtype &&
      kv_mirror_of_.num_blocks == key.num_blocks && kv_mirror_of_.block_size == key.block_size)
    return kv_mirror_;
  for (const k::KvCacheView& v : kv_mirror_) {
    backend_->free(v.k);
    backend_->free(v.v);
  }
  kv_mirror_.clear();
  for (const k::KvCacheView& l : like) {
    const auto bytes =
        static_cast<size_t>(l.num_blocks * l.block_size * l.num_kv_heads * l.head_dim) * l.elem_bytes();
    kv_mirror_.push_back({.k = backend_->alloc(bytes),
                          .v = backend_->alloc(bytes),
                          .num_blocks = l.num_blocks,
                          .block_size = l.block_size,
                          .num_kv_heads = l.num_kv_heads,
                          .head_dim = l.head_dim,
                          .dtype = l.dtype});
  }
  kv_mirror_of_ = key;
  return kv_mirror_;
}

void Model::all_reduce_sum(float* x, int64_t n) {
  if (comm_) comm_->all_reduce(x, x, static_cast<size_t>(n), DType::kF32, ReduceOp::kSum);
}

const LoraAdapter& Model::rank_adapter(int32_t slot, const LoraAdapter& adapter) {
  if (!comm_) return adapter;
  if (adapter_shards_.size() <= static_cast<size_t>(slot))
    adapter_shards_.resize(static_cast<size_t>(slot) + 1);
  AdapterShard& s = adapter_shards_[static_cast<size_t>(slot)];
  if (s.shard && s.source == &adapter && s.generation == adapter.generation && adapter.generation != 0)
    return *s.shard;
  // Made while the slot's previous shard still lives, so the stacks never meet a new shard at the address
  // of the one they hold.
  std::shared_ptr<const LoraAdapter> fresh = shard_adapter(adapter, config_, tp_);
  std::shared_ptr<const FullyShardedLora> fully_sharded;
  if (tp_.fully_sharded_loras) std::tie(fresh, fully_sharded) = split_fully_sharded(*fresh, config_, tp_);
  s = {&adapter, adapter.generation, std::move(fresh), std::move(fully_sharded)};
  return *s.shard;
}

}  // namespace polylora
