// model/model.h: a loaded decoder model and its forward pass, on one backend (CPU or CUDA).
// Owns: the weights (weights.h) in backend memory, RoPE tables, the slot-stacked copies of the adapters
// in its slots (lora_stacks.h), and a workspace reused across calls (grown when a larger batch arrives).
// The forward pass is written once for all architectures (decoder.cc) with calls into Backend.
// Tensor parallelism (--tensor-parallel-size N > 1; model_tp.cc, docs/tensor-parallel.md): this Model is
// rank 0 of N and owns the other ranks (Models of their own shards on their own backends: CPU backends, or
// one GPU each on CUDA, each rank with a worker thread) and their communicators (the CPU group; NCCL on
// GPUs); every forward pass runs on all ranks at once with the same batch, and rank 0 gathers the logits.
// The ranks' KV caches mirror the views the caller passes (its blocks, this rank's heads: kv_config()).
// Must not: own request state or KV-cache block allocation (the caller passes the cache views).
#pragma once

#include <exception>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/model_config.h"
#include "kernels/attention/attention.h"
#include "lora/adapter.h"
#include "lora/adapter_batch.h"
#include "lora/adapter_slots.h"
#include "model/expert_parallel.h"
#include "model/forward_batch.h"
#include "model/fully_sharded_lora.h"
#include "model/lora_dense_ext.h"
#include "model/lora_stacks.h"
#include "model/tp_shard.h"
#include "model/weight_loader.h"
#include "model/weights.h"

namespace polylora {

struct ModelLoadOptions {
  LoadFormat load_format = LoadFormat::kAuto;  // auto: safetensors
  uint64_t seed = 0;                           // dummy weights
  WeightUploadOptions upload;                  // how checkpoint bytes reach the backend (weight_upload.h)
  WeightQuantization quantization = WeightQuantization::kNone;  // --quantization (model/quantize.h)
  // --tensor-parallel-size: ranks the model is split over (threads of this process; on CUDA one GPU each,
  // from the backend's GPU on; model/tp_shard.h says how). A split the model's heads or sizes do not
  // allow is an Error, and so is a GPU count that does not cover the ranks (tp_devices below).
  int tensor_parallel_size = 1;
  // --enable-expert-parallel: with tensor_parallel_size N > 1, each rank owns E / N whole experts of every
  // MoE layer (and their LoRA) instead of a slice of every expert; the token-expert pairs travel to the
  // owners and back (model/expert_parallel.cc). N must divide the number of experts. No effect at N = 1.
  bool enable_expert_parallel = false;
  // --fully-sharded-loras: with tensor_parallel_size N > 1, the dense modules' LoRA is sharded further
  // (A's rank rows of column-parallel modules, B's output rows of row-parallel ones) with a collective
  // on the shrinks (model/fully_sharded_lora.h). The hidden size must divide by N. No effect at N = 1.
  bool fully_sharded_loras = false;
  // Tensor parallelism on GPUs: the GPU of each rank (empty: the backend's GPU and the ones after it;
  // the environment variable POLYLORA_TP_DEVICES=0,1,... sets it when empty). Several ranks may share a
  // GPU (tests of the sharded path on one GPU): their collectives then go through host memory.
  std::vector<int> tp_devices;
  // Tensor parallelism on GPUs: collectives through host memory even where NCCL could run them
  // (model/staged_communicator.h; no CUDA graphs then).
  bool tp_staged_collectives = false;
  // Expert parallelism on the CPU by masking (each rank's experts over every token, as on GPUs) instead of
  // the all-to-all dispatch (tests of the GPUs' way on the CPU). GPUs always mask.
  bool expert_parallel_by_mask = false;
};

// RoPE frequencies for a config: inv_freq [rotary_dim / 2] and the cos/sin scale (YaRN's mscale).
struct RopeTable {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
  static RopeTable from_config(const ModelConfig& cfg);
};

// Token ids of a step that come from the previous step's device-side samples instead of the host:
// token row pairs[2i] of the batch takes src[pairs[2i + 1]] (src: backend memory, e.g. the sampler's ids).
struct TokenFeed {
  std::vector<int32_t> pairs;
  const int32_t* src = nullptr;
  bool empty() const { return pairs.empty(); }
};

// CUDA graphs of decode steps (ignored on backends without graphs).
struct GraphOptions {
  bool enabled = false;
  std::vector<int64_t> sizes;      // batch sizes (sequences of one token each) captured; a step pads up
  int64_t max_blocks_per_seq = 0;  // block-table width of every graph; longer contexts run eagerly
  int64_t warmup_tokens = 0;       // an eager prefill of this many tokens first sizes every buffer
  int64_t warmup_logits_rows = 1;  // logits rows of that warm-up
  // Record each graph right after a dry run of its step (Backend::set_dry_run) instead of after running it
  // eagerly; a recording that fails falls back to the eager run. POLYLORA_GRAPH_DRY_SIZING=0 in the
  // environment turns it off (cold-start comparisons).
  bool dry_run_sizing = true;
};
// vLLM's default capture sizes: 1, 2, 4, then multiples of 8 up to max_num_seqs.
std::vector<int64_t> default_graph_sizes(int64_t max_num_seqs);

class RankThreads;
class Communicator;

class Model : public AdapterDevice {
 public:
  // Reads <dir>/config.json and the checkpoint (or makes dummy weights) into `backend` (nullptr: a CPU
  // backend owned by the model). Errors name the first problem.
  static std::unique_ptr<Model> load(const std::string& dir, const ModelLoadOptions& options = {},
                                     std::shared_ptr<Backend> backend = nullptr);
  static std::unique_ptr<Model> from_config(const ModelConfig& config, const Checkpoint* checkpoint,
                                            const ModelLoadOptions& options,
                                            std::shared_ptr<Backend> backend);
  ~Model();

  const ModelConfig& config() const { return config_; }
  // Waits for weights still being read and copied (ModelLoadOptions::upload.background: load() returned
  // with them in flight) and rethrows the load's error; at once otherwise. Every step that runs kernels
  // waits here first (dry runs and CUDA graph recordings do not: they need the weights' memory, not
  // their values); the engine calls it at the end of its start-up, so a load error is a start-up error.
  void wait_for_weights();
  // The whole model's weights (under tensor parallelism on the CPU the ranks' shards are views into them;
  // on GPUs, where no rank holds the whole model, rank 0's shard, its num_bytes counting every rank's).
  const ModelWeights& weights() const { return full_weights_ ? *full_weights_ : weights_; }
  // The layout the KV-cache views passed to forward() must have: this rank's KV heads (config() at -tp 1).
  const ModelConfig& kv_config() const { return shard_cfg_; }
  int tensor_parallel_size() const { return tp_.size; }
  // Ranks whose KV caches share the memory of this rank's (the KV budget is split between them): every
  // rank on the CPU, the ranks on this rank's GPU on CUDA (1 with one GPU per rank).
  int ranks_sharing_memory() const;
  bool expert_parallel() const { return tp_.expert_parallel; }
  bool fully_sharded_loras() const { return tp_.fully_sharded_loras; }
  const std::string& source() const { return source_; }
  Backend& backend() const { return *backend_; }

  // One forward pass. kv: per layer cache views (backend memory); adapters[slot] is the adapter of that
  // slot (nullptr for unused slots). logits: host memory [batch.logits_rows.size(), vocab] f32, written.
  void forward(const ForwardBatch& batch, std::span<const kernels::KvCacheView> kv,
               std::span<const LoraAdapter* const> adapters, float* logits);
  // The same pass, greedy: ids[r] = argmax of logits row r, computed where the logits are (on the GPU
  // only the ids come back). ids: host memory [batch.logits_rows.size()].
  void forward_argmax(const ForwardBatch& batch, std::span<const kernels::KvCacheView> kv,
                      std::span<const LoraAdapter* const> adapters, int32_t* ids);
  // Asynchronous steps. launch() queues a forward pass on the backend and returns without waiting: its
  // inputs go through one of two page-locked staging buffers (so the next launch can be staged while
  // this one runs), `feed` patches token ids from the previous step's device-side samples, and the
  // logits rows stay in device memory (device_logits(), [batch.logits_rows.size(), vocab]) until the
  // next launch. The caller queues its sampling after it, then end_step(); once the host has waited for
  // that step's results it calls step_completed() (timing). forward() / forward_argmax() are launch()
  // plus a synchronous read.
  void launch(const ForwardBatch& batch, std::span<const kernels::KvCacheView> kv,
              std::span<const LoraAdapter* const> adapters, const TokenFeed& feed = {});
  const float* device_logits() const;
  void end_step();
  void step_completed();
  // The device tier (lora/adapter_slots.h): copies an adapter into slot s of the stacks, or frees slot s
  // (no step in flight reads it). A step's adapters[s] should be the adapter uploaded to slot s; one that
  // is not (direct callers of forward()) is uploaded when the step is staged, growing the stacks when the
  // slot or its rank does not fit (which invalidates captured graphs: they are recorded again).
  void upload_adapter(int32_t slot, const LoraAdapter& adapter) override;
  void free_adapter_slot(int32_t slot) override;
  // With asynchronous uploads on (set_async_uploads), begin_upload queues the copy on the stacks' upload
  // thread (LoraStacks::begin_upload) while steps run; otherwise it copies now.
  void begin_upload(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  bool upload_done(int32_t slot) override;
  void finish_upload(int32_t slot) override;
  UploadTiming upload_timing() const override;
  void set_async_uploads(bool on);
  // Tests: every asynchronous copy waits this long before it starts (a slow upload).
  void set_upload_delay_for_tests(int ms);
  // Reserves the stacks for `slots` adapters of rank up to `max_rank` (--max-loras, --max-lora-rank) now,
  // so that their memory is counted before the KV cache is sized and graphs are captured with LoRA.
  void reserve_adapters(int64_t slots, int64_t max_rank);
  // Stacks reserved on first use take at least this many slots (--max-loras), so that they do not grow
  // slot by slot.
  void set_adapter_slots(int64_t slots);
  // Bytes of the stacks (0 before the first adapter or reservation; rank 0's under tensor parallelism).
  size_t adapter_bytes() const { return (lora_ ? lora_->bytes() : 0) + (lora_ext_ ? lora_ext_->bytes() : 0); }
  // Captures a graph per decode batch size (largest first, after a warm-up prefill). From then on a step
  // whose sequences each compute one token, without adapters, whose logits are wanted for every token and
  // whose block tables fit max_blocks_per_seq replays the graph of its padded size; other steps run
  // eagerly. A graph is recorded again at its next use when a buffer it holds moved (a larger eager step)
  // or the KV cache changed; the output is identical to running the same padded step eagerly. With an
  // empty `kv`, nothing is captured now: each graph is recorded at its first use.
  void prepare_graphs(std::span<const kernels::KvCacheView> kv, const GraphOptions& options);
  // An eager prefill of `tokens` dummy tokens (no KV written; one block read) that sizes every workspace
  // buffer for the largest step, so memory can be measured (and graphs captured) after it. `dry`: a dry run
  // of it on every rank's backend (Backend::set_dry_run: the same workspace reserved, no kernel run).
  void warm_up(std::span<const kernels::KvCacheView> kv, int64_t tokens, int64_t logits_rows,
               bool dry = false);
  bool graphs_enabled() const { return graphs_enabled_; }
  // Graphs recorded so far (this rank's): after a dry run sized the buffers, or after an eager run of the
  // step (the fallback where a recording after a dry run failed, or GraphOptions::dry_run_sizing off).
  struct GraphRecordings {
    int64_t after_dry_run = 0;
    int64_t after_eager_run = 0;
  };
  GraphRecordings graph_recordings() const { return graph_recordings_; }
  // With timing on, each step measures (events) the GPU time from its first input copy to end_step()
  // (its sampling included), and the idle gap on the GPU between the previous step's end and this
  // step's start (host time the GPU waited for; ~0 when the step was queued ahead), for benchmarks.
  void set_gpu_timing(bool on) { gpu_timing_ = on; }
  double last_step_gpu_seconds() const { return last_gpu_seconds_; }
  double last_step_gap_seconds() const { return last_gap_seconds_; }

 private:
  Model();
  struct Workspace;
  struct StepInputs;
  struct Graph;
  class ForwardPass;  // forward.cc: run_layers' block builders
  // Makes sure slot `slot` of this rank's stacks holds (its share of) `adapter` (growing them when needed).
  void ensure_uploaded(int32_t slot, const LoraAdapter& adapter);
  // Grows the stacks when `slot` or the adapter's rank does not fit them.
  void fit_stacks(int32_t slot, const LoraAdapter& adapter);
  // This rank's part of reserve_adapters() / begin_upload() (the public calls run them on every rank).
  void reserve_local(int64_t slots, int64_t max_rank);
  void begin_upload_local(int32_t slot, std::shared_ptr<const LoraAdapter> adapter);
  // This rank's share of an adapter (the adapter itself at -tp 1), kept per slot while it is the same.
  const LoraAdapter& rank_adapter(int32_t slot, const LoraAdapter& adapter);
  // Runs f on this Model and every other rank (model_tp.cc), one after the other on the calling thread.
  template <typename F>
  void for_each_rank(const F& f);
  // Tensor parallelism (model_tp.cc): splits the loaded weights over `size` ranks; one step on every rank;
  // a rank's KV cache for the caller's views; a sum over the ranks; the LM head over the vocabulary shards.
  // On GPUs (backend_ not the CPU), `host` holds the loaded model: each rank's shard is copied to its GPU and
  // the host copy is dropped; or, with `dummy`, nothing was loaded and each rank makes dummy weights of its
  // shard's shapes on its GPU (options' seed and quantization).
  void split_tensor_parallel(const TpLayout& layout, const ModelLoadOptions& options,
                             std::shared_ptr<Backend> host = nullptr, bool dummy = false);
  // This rank's part of prepare_graphs (the warm-up done).
  void prepare_graphs_local(std::span<const kernels::KvCacheView> kv, const GraphOptions& options);
  void launch_tensor_parallel(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv,
                              std::span<const LoraAdapter* const> adapters, const TokenFeed& feed);
  std::span<const kernels::KvCacheView> mirror_kv(std::span<const kernels::KvCacheView> like);
  void all_reduce_sum(float* x, int64_t n);
  void lm_head_parallel(const float* in, int64_t rows, float* logits);
  // Expert parallelism (expert_parallel.cc): the MoE experts of `moe` (its m tokens, top_k routes over all
  // experts) on the ranks that own them: this rank's block of tokens goes out to the owners of their
  // experts (all_to_all_v), the owners run their local experts (moe.experts, moe.num_experts of them) and
  // send the rows back; moe.out gets this rank's tokens' weighted sums and zeros in the other rows (the
  // caller's all_reduce completes it). token_slots: the host copy of moe.token_slots (empty: none).
  void moe_expert_parallel(const kernels::MoeExpertsArgs& moe, std::span<const int32_t> token_slots);
  // Fully sharded LoRA (fully_sharded_lora.cc): the step's adapters' `module` of `layer` on x [T, in] (row
  // stride ldx), added into y [T, out of this rank] (row stride ldy), with its collective; called by every
  // rank where the step has the module (si.adapters.dense), in the same order. rows: the staged token rows
  // of the step's slots (backend memory; StepInputs::fs_rows says where each slot's are).
  void fully_sharded_lora(int64_t layer, LoraModule module, const float* x, int64_t ldx, int64_t T, float* y,
                          int64_t ldy, const StepInputs& si, const int32_t* rows);
  void init_workspace();
  // stage + copy + run_layers: one rank's part of an eager step.
  void run_eager(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv,
                 std::span<const LoraAdapter* const> adapters, const TokenFeed& feed);
  // Packs a step's inputs into the host staging buffer (feed pairs last).
  StepInputs stage(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters,
                   std::span<const int32_t> feed_pairs = {});
  // Copies the staged inputs to `dst` through the next page-locked buffer, then applies the feed.
  void upload_inputs(std::byte* dst, const StepInputs& si, const TokenFeed& feed);
  // Every op of the forward pass, reading the staged inputs at `inputs` (backend memory); logits in ws.
  void run_layers(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv, const StepInputs& si,
                  std::byte* inputs);
  bool graph_eligible(const ForwardBatch& b, std::span<const LoraAdapter* const> adapters) const;
  ForwardBatch pad_for_graph(const ForwardBatch& b, int64_t size) const;
  // logits or ids (one of them non-null) receive the output rows.
  void forward_impl(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv,
                    std::span<const LoraAdapter* const> adapters, float* logits, int32_t* ids);
  // Replays (or records) the graph of the step's padded size; with LoRA kernels when the step has adapters
  // or `with_lora` (capture at start-up, where `run` false records without running the dummy step).
  void launch_graph(const ForwardBatch& b, std::span<const kernels::KvCacheView> kv,
                    std::span<const LoraAdapter* const> adapters, const TokenFeed& feed,
                    bool with_lora = false, bool run = true);
  void* record(const ForwardBatch& p, std::span<const kernels::KvCacheView> kv, const StepInputs& si,
               std::byte* inputs);
  // Copies the first `rows` logits rows, or their argmax ids, to the host.
  void read_output(int64_t rows, float* logits, int32_t* ids);

  ModelConfig config_;
  std::shared_ptr<Backend> backend_;
  ModelWeights weights_;  // what this rank's forward reads (its shard under tensor parallelism)
  RopeTable rope_;
  const float* inv_freq_ = nullptr;  // rope_.inv_freq in backend memory
  std::string source_;
  std::unique_ptr<Workspace> ws_;
  std::unique_ptr<WeightsInFlight> weights_in_flight_;  // background load, until wait_for_weights()
  std::exception_ptr weights_error_;                    // the background load's error, thrown by every step
  std::unique_ptr<LoraStacks> lora_;
  // The q/k/v and o LoRA as extra K columns of their products (prefill; made with the stacks where the
  // backend would take it; destroyed before the stacks).
  std::unique_ptr<LoraDenseExt> lora_ext_;
  int64_t adapter_slots_hint_ = 1;
  bool async_uploads_ = false;
  int upload_delay_ms_ = 0;
  bool graphs_enabled_ = false;
  GraphRecordings graph_recordings_;
  bool gpu_timing_ = false;
  double last_gpu_seconds_ = 0, last_gap_seconds_ = 0;
  struct StepTimer;
  std::unique_ptr<StepTimer> timer_;
  std::vector<int64_t> graph_sizes_;  // ascending
  int64_t graph_max_blocks_ = 0;
  std::map<std::pair<int64_t, bool>, Graph> graphs_;  // by (batch size, with the LoRA kernels)
  // Tensor parallelism. shard_cfg_: this rank's counts (config_ at -tp 1); tp_: its shard; comm_: its
  // communicator (nullptr at -tp 1).
  ModelConfig shard_cfg_;
  TpShard tp_;
  Communicator* comm_ = nullptr;
  struct AdapterShard {
    const LoraAdapter* source = nullptr;
    uint64_t generation = 0;
    std::shared_ptr<const LoraAdapter> shard;
    std::shared_ptr<const FullyShardedLora> fully_sharded;  // --fully-sharded-loras: the dense modules
  };
  std::vector<AdapterShard> adapter_shards_;  // [slot]
  ExpertParallelScratch ep_;  // expert parallelism's host buffers (reused across layers and steps)
  // Expert parallelism by masking instead of the all-to-all dispatch: every rank has every token already
  // (the hidden states are replicated), so each runs its own experts over all tokens (RouteArgs::id_begin:
  // the others' pairs skipped) and the layer's all_reduce sums the ranks (vLLM's EP without data
  // parallelism). GPUs always; the CPU with ModelLoadOptions::expert_parallel_by_mask, else the all-to-all.
  bool ep_by_mask_ = false;
  bool graph_dry_sizing_ = true;  // GraphOptions::dry_run_sizing of the last prepare_graphs
  // Ranks 1..N-1 (a KV cache of their own, mirroring rank 0's views: kv_mirror_, keyed by kv_mirror_of_).
  std::vector<kernels::KvCacheView> kv_mirror_;
  kernels::KvCacheView kv_mirror_of_;
  // Rank 0: the whole model's weights (the shards' views point into them), the other ranks, their threads.
  std::unique_ptr<ModelWeights> full_weights_;
  std::vector<std::unique_ptr<Model>> tp_ranks_;
  std::unique_ptr<RankThreads> tp_threads_;
  // Rank 0 on GPUs: the ranks' GPUs and device communicators (model_tp.cc); destroyed before the ranks.
  struct TpDevices;
  std::shared_ptr<TpDevices> tp_devices_;
  bool tp_collectives_capturable() const;  // NCCL: CUDA graphs can hold the collectives
};

template <typename F>
void Model::for_each_rank(const F& f) {
  f(*this);
  for (const std::unique_ptr<Model>& r : tp_ranks_) f(*r);
}

}  // namespace polylora
