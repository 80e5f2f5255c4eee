// model/model_tp.cc: tensor parallelism of a Model (model.h, docs/tensor-parallel.md):
// splitting the loaded model over the ranks, running one step on every rank at once, the ranks' KV caches
// and adapter shards, and the sum over the ranks. The forward pass itself (decoder.cc) is the same on
// every rank; it calls all_reduce_sum and lm_head_parallel, which do nothing special at -tp 1.
#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <string>
#include <tuple>

#include <fmt/ranges.h>

#include "common/error.h"
#include "common/log.h"
#include "model/arch/arch.h"
#include "model/model.h"
#include "model/model_step.h"
#include "model/quantize.h"
#include "model/staged_communicator.h"
#include "runtime/rank_threads.h"
#ifdef POLYLORA_HAVE_NCCL
#include "runtime/cuda/nccl_communicator.h"
#endif

namespace polylora {

namespace k = kernels;

// Rank 0's GPU-side state of tensor parallelism: each rank's GPU and its communicator over device memory
// (NCCL where every rank has a GPU of its own and NCCL is built; else collectives staged through host
// memory on the CPU group of the rank threads).
struct Model::TpDevices {
  std::vector<int> devices;  // [rank]
  bool capturable = false;   // the collectives can be recorded in CUDA graphs (NCCL)
#ifdef POLYLORA_HAVE_NCCL
  std::unique_ptr<NcclCommunicatorGroup> nccl;
#endif
  std::vector<std::unique_ptr<StagedCommunicator>> staged;  // [rank], without NCCL
};

namespace {

// The GPU of each rank: `chosen` (ModelLoadOptions::tp_devices, or POLYLORA_TP_DEVICES when that is empty)
// or first + r.
std::vector<int> rank_devices(int size, int first, std::vector<int> chosen) {
  const int visible = cuda_device_count();
  std::string source = "ModelLoadOptions::tp_devices";
  if (chosen.empty())
    if (const char* env = std::getenv("POLYLORA_TP_DEVICES"); env && *env) {
      source = fmt::format("POLYLORA_TP_DEVICES={}", env);
      std::stringstream in(env);
      std::string item;
      while (std::getline(in, item, ',')) {
        char* end = nullptr;
        const long d = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0')
          fail("{}: '{}' is not a GPU index (0 to {})", source, item, visible - 1);
        chosen.push_back(static_cast<int>(d));
      }
    }
  if (!chosen.empty()) {
    for (int d : chosen)
      if (d < 0 || d >= visible) fail("{}: '{}' is not a GPU index (0 to {})", source, d, visible - 1);
    if (static_cast<int>(chosen.size()) != size)
      fail("{} names {} GPUs for --tensor-parallel-size {} (one per rank)", source, chosen.size(), size);
    if (chosen[0] != first)
      fail("{}: rank 0 must be on the backend's GPU {} (--device cuda's), not {}", source, first, chosen[0]);
    return chosen;
  }
  if (first + size > visible)
    fail(
        "--tensor-parallel-size {} on --device cuda needs {} GPUs (one per rank, from GPU {} on); {} visible "
        "(POLYLORA_TP_DEVICES=0,0,... puts ranks on GPUs of your choice, several on one GPU for tests)",
        size, size, first, visible);
  std::vector<int> devices;
  for (int r = 0; r < size; ++r) devices.push_back(first + r);
  return devices;
}

}  // namespace

void Model::split_tensor_parallel(const TpLayout& layout, const ModelLoadOptions& options,
                                  std::shared_ptr<Backend> host, bool dummy) {
  const int size = layout.size;
  const bool gpu = backend_->kind() != DeviceKind::kCpu;
  CHECK(gpu == (host != nullptr || dummy));
  tp_threads_ = std::make_unique<RankThreads>(size);
  full_weights_ = std::make_unique<ModelWeights>(std::move(weights_));
  if (gpu) {
    tp_devices_ = std::make_shared<TpDevices>();
    tp_devices_->devices = rank_devices(size, backend_->device_index(), options.tp_devices);
  }
  for (int r = 1; r < size; ++r) {
    tp_ranks_.push_back(std::unique_ptr<Model>(new Model()));
    Model* m = tp_ranks_.back().get();
    m->config_ = config_;
    m->backend_ =
        std::shared_ptr<Backend>(backend_->make_peer(gpu ? tp_devices_->devices[static_cast<size_t>(r)] : 0));
    m->rope_ = rope_;
    m->inv_freq_ = m->backend_->vector_from_host(rope_.inv_freq.data(), rope_.inv_freq.size());
    m->init_workspace();
  }
  // Every rank's shard at once: views into the loaded weights on the CPU; on GPUs the shard is made in host
  // memory (views, and copies where it takes columns) and copied to the rank's GPU, or (dummy weights) made
  // on the rank's GPU in its shard's shapes, with the same seed on every rank (so the replicated router and
  // norms, and the vocabulary table the ranks take their rows of, are the same everywhere).
  tp_threads_->run([&](int r) {
    Model* m = r == 0 ? this : tp_ranks_[static_cast<size_t>(r - 1)].get();
    m->tp_ = make_tp_shard(config_, r, layout);
    m->shard_cfg_ = shard_config(config_, m->tp_);
    m->ep_by_mask_ = gpu || options.expert_parallel_by_mask;
    if (dummy) {
      m->weights_ = ModelWeights{};
      WeightLoader loader(nullptr, *m->backend_, m->weights_, options.seed);
      arch::bind(m->shard_cfg_, loader, m->weights_);
      loader.finish();
      if (options.quantization == WeightQuantization::kInt8)
        quantize_weights_int8(m->weights_, loader, *m->backend_);
      trim_rank_weights(m->weights_, config_, m->tp_, *m->backend_, options.seed);
      m->backend_->synchronize();
      return;
    }
    if (!gpu) {
      m->weights_ = shard_weights(*full_weights_, config_, m->tp_, *m->backend_);
      return;
    }
    std::unique_ptr<Backend> scratch = make_cpu_backend();  // the shard's host copies, freed after the upload
    const ModelWeights shard = shard_weights(*full_weights_, config_, m->tp_, *scratch);
    m->weights_ = copy_weights(shard, m->shard_cfg_, *m->backend_);
    m->backend_->synchronize();
  });
  if (gpu) {
    size_t bytes = 0;
    for_each_rank([&](Model& m) { bytes += m.weights_.num_bytes; });
    full_weights_.reset();  // the GPUs hold the shards; the host model (and its checkpoint mapping) goes
    host.reset();
    weights_.num_bytes = bytes;  // weights() is rank 0's shard now; its size counts every rank's
    TpDevices& d = *tp_devices_;
    std::vector<int> sorted = d.devices;
    std::sort(sorted.begin(), sorted.end());
    const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    const bool force_staged = options.tp_staged_collectives;
#ifdef POLYLORA_HAVE_NCCL
    if (distinct && !force_staged) {
      std::vector<cudaStream_t> streams;
      for_each_rank(
          [&](Model& m) { streams.push_back(static_cast<cudaStream_t>(m.backend_->queue_handle())); });
      d.nccl = std::make_unique<NcclCommunicatorGroup>(d.devices, streams);
      d.capturable = true;
      for (int r = 0; r < size; ++r) {
        Model& m = r == 0 ? *this : *tp_ranks_[static_cast<size_t>(r - 1)];
        m.comm_ = &d.nccl->communicator(r);
      }
      NcclCommunicatorGroup* group = d.nccl.get();
      tp_threads_->set_abort_hook([group](const std::string& reason) { group->shutdown(reason); });
    }
#endif
    if (!d.capturable) {
      for (int r = 0; r < size; ++r) {
        Model& m = r == 0 ? *this : *tp_ranks_[static_cast<size_t>(r - 1)];
        d.staged.push_back(std::make_unique<StagedCommunicator>(tp_threads_->communicator(r), *m.backend_));
        m.comm_ = d.staged.back().get();
      }
    }
    spdlog::info(
        "tensor parallelism: {} ranks on GPUs {} ({}), {} attention heads and {} KV heads each{}; weights "
        "{:.2f} GB in all",
        size, fmt::join(d.devices, ","),
        d.capturable
            ? "NCCL"
            : (distinct ? "collectives through host memory: NCCL is not built, or tp_staged_collectives"
                        : "several ranks on one GPU: collectives through host memory, no CUDA graphs"),
        shard_cfg_.num_heads, shard_cfg_.num_kv_heads,
        tp_.expert_parallel
            ? fmt::format(", {} whole experts each (expert parallelism)", tp_.num_local_experts)
            : "",
        static_cast<double>(bytes) / 1e9);
    return;
  }
  for (int r = 0; r < size; ++r) {
    Model& m = r == 0 ? *this : *tp_ranks_[static_cast<size_t>(r - 1)];
    m.comm_ = &tp_threads_->communicator(r);
  }
  spdlog::info("tensor parallelism: {} ranks (CPU threads), {} attention heads and {} KV heads each{}{}",
               size, shard_cfg_.num_heads, shard_cfg_.num_kv_heads,
               tp_.expert_parallel
                   ? fmt::format(", {} whole experts each (expert parallelism), {}", tp_.num_local_experts,
                                 ep_by_mask_ ? "each rank's experts over every token" : "all-to-all dispatch")
                   : "",
               tp_.fully_sharded_loras ? ", fully sharded LoRA" : "");
}

bool Model::tp_collectives_capturable() const {
  return tp_devices_ && tp_devices_->capturable;
}

int Model::ranks_sharing_memory() const {
  if (!tp_devices_) return tp_.size;
  return static_cast<int>(
      std::count(tp_devices_->devices.begin(), tp_devices_->devices.end(), tp_devices_->devices[0]));
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
  const bool gpu = tp_devices_ != nullptr;
  // Token ids fed from the previous step's samples stay where rank 0's sampler wrote them (its GPU, or host
  // memory): each step broadcasts them to the other ranks first (on GPUs in order with the sampling that
  // wrote them, on the ranks' queues), and every rank feeds its own copy.
  size_t feed_count = 0;
  for (size_t i = 1; i < feed.pairs.size(); i += 2)
    feed_count = std::max(feed_count, static_cast<size_t>(feed.pairs[i]) + 1);
  // Every rank takes the same path (graph or eager) as rank 0; both run the same collectives in the same
  // order, so a rank whose graph must be recorded again stays in step with the others.
  const bool graph = gpu && graphs_enabled_ && graph_eligible(b, adapters);
  tp_threads_->run([&](int rank) {
    Model& m = rank == 0 ? *this : *tp_ranks_[static_cast<size_t>(rank - 1)];
    const std::span<const k::KvCacheView> rank_kv = rank == 0 ? kv : m.mirror_kv(kv);
    TokenFeed rank_feed;
    if (feed_count > 0) {
      rank_feed.pairs = feed.pairs;
      uint64_t unused_epoch = 0;  // read before a graph runs, never by one
      int32_t* src = rank == 0
                         ? const_cast<int32_t*>(feed.src)
                         : ensure_buffer<int32_t>(*m.backend_, m.ws_->feed_src, feed_count, unused_epoch);
      m.comm_->broadcast(src, feed_count, DType::kI32, 0);
      rank_feed.src = src;
    }
    if (graph && m.graphs_enabled_)
      m.launch_graph(b, rank_kv, adapters, rank_feed);
    else
      m.run_eager(b, rank_kv, adapters, rank_feed);
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
  // (A dry run, which sizes buffers before a graph is recorded, runs no collective: every rank skips them.)
  if (comm_ && !backend_->dry_run())
    comm_->all_reduce(x, x, static_cast<size_t>(n), DType::kF32, ReduceOp::kSum);
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
  if (tp_.fully_sharded_loras)
    std::tie(fresh, fully_sharded) = split_fully_sharded(*fresh, config_, tp_, *backend_);
  s = {&adapter, adapter.generation, std::move(fresh), std::move(fully_sharded)};
  return *s.shard;
}

}  // namespace polylora
