// config/engine_config.h: the engine's settings, one aggregate per concern, with vLLM's flag names and
// defaults in one place. Parsed from flags by apps/ only; validate() names the first bad value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace polylora {

enum class SchedulingPolicy { kFcfs, kPriority, kFair };

struct CacheConfig {
  int64_t block_size = 16;                     // --block-size
  bool enable_prefix_caching = true;           // --enable-prefix-caching / --no-enable-prefix-caching
  int64_t num_kv_blocks = 0;                   // --num-kv-blocks (0: from memory)
  int64_t kv_cache_memory = int64_t{2} << 30;  // --kv-cache-memory (CPU backend, bytes)
  double gpu_memory_utilization = 0.9;         // --gpu-memory-utilization (CUDA backend)
  // --kv-cache-dtype: the KV cache's element type, F32 (auto, for now) or BF16 (bfloat16; CUDA backends).
  DType kv_cache_dtype = DType::kF32;
};

struct SchedulerConfig {
  int64_t max_num_seqs = 256;             // --max-num-seqs
  int64_t max_num_batched_tokens = 8192;  // --max-num-batched-tokens (token budget per step)
  int64_t max_model_len = 0;              // --max-model-len (0: the model's max_position_embeddings)
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;  // --scheduling-policy fcfs|priority|fair
  bool enable_chunked_prefill = true;
  int64_t max_waiting = 4096;  // bounded waiting queue (the server answers 503 beyond it)
  // --scheduling-policy fair: the service a tenant (adapter) is charged per prompt token computed and per
  // token generated (w_p and w_q of the virtual token counter, Sheng et al., OSDI 2024; theirs: 1 and 2).
  int64_t fair_prefill_weight = 1;  // --fair-prefill-weight
  int64_t fair_decode_weight = 2;   // --fair-decode-weight
};

struct LoraConfig {
  int64_t max_loras = 8;       // --max-loras: device slots (so also distinct adapters in one step)
  int64_t max_lora_rank = 64;  // --max-lora-rank
  int64_t max_cpu_loras = 64;  // --max-cpu-loras: adapters held in host memory (LRU; the rest on disk)
  // --lora-max-wait-steps: a waiting request whose adapter is ready is passed over for requests whose
  // adapters are on the device for at most this many steps.
  int64_t max_wait_steps = 16;
  bool load_thread = true;      // adapters read from disk on a loader thread (false: inline, for tests)
  std::string resolver_dir;     // --lora-resolver-dir: adapters not registered load from DIR/<name>/
  // --enable-lora or --lora-modules: on the GPU the adapters' slot-stacked device memory (max_loras slots of
  // rank max_lora_rank) is reserved at start-up, before the KV cache is sized, and CUDA graphs are captured
  // with LoRA too; otherwise it is reserved when the first adapter is used.
  bool reserve_on_device = false;
  // Adapters are copied into device slots on an upload thread while steps run (a request waits until
  // its adapter's copy is done; others keep running). Unset: on for the GPU, off for the CPU (copies are
  // then made when the adapter is prefetched, synchronously). POLYLORA_SYNC_ADAPTER_UPLOADS=1 turns it off.
  std::optional<bool> async_uploads;
};

// How the GPU runs steps (vLLM's compilation settings).
struct ExecutionConfig {
  bool enforce_eager = false;             // --enforce-eager: no CUDA graphs
  std::vector<int64_t> cuda_graph_sizes;  // --cuda-graph-sizes (empty: 1, 2, 4, 8, 16, ... max-num-seqs)
  int64_t cuda_graph_max_context = 8192;  // --cuda-graph-max-context: longer contexts decode eagerly
  // --async-scheduling / --no-async-scheduling: the engine plans and queues step N+1 while step N runs
  // (a request that stops at step N has one more token computed and discarded). Unset: on for the GPU,
  // off for the CPU (where ops run synchronously, so it gains nothing; set, it runs the same logic).
  std::optional<bool> async_scheduling;
  // Sampling where the logits are (worker/device_sampler.h) for every row it covers; the CPU sampler (the
  // reference) for the rest. Unset: on for the GPU, off for the CPU (a config field for tests: the device
  // sampler's host version runs the same algorithm on the CPU).
  std::optional<bool> device_sampling;
  // The start-up's profiling step (the largest prefill, sizing every workspace before the KV cache takes
  // what is left) as a dry run (Backend::set_dry_run: ops reserve their workspace, no kernel runs) instead
  // of a real one: a shorter cold start (H200, GPT-OSS-20B bf16, session 40: first token served 2.53 s
  // after start against 2.78). POLYLORA_PROFILE_DRY_RUN=0/1 overrides (cold-start comparisons).
  bool dry_run_profiling = true;
};

struct EngineConfig {
  CacheConfig cache;
  SchedulerConfig scheduler;
  LoraConfig lora;
  ExecutionConfig execution;
  // --generation-config: EOS ids of generation_config.json added to the model's (config.json, tokenizer).
  std::vector<int64_t> extra_eos_token_ids;
  // --seed: seeds the generators of requests that give no seed of their own (unset: random per request),
  // so a server started with the same seed answers the same unseeded request sequence the same way.
  std::optional<uint64_t> seed;
  // --max-logprobs: the most alternatives a request may ask for per token (logprobs, top_logprobs,
  // prompt_logprobs), 0 .. SamplingParams::kLogprobsLimit; vLLM's -1 (the whole vocabulary) is read as that
  // limit. The device sampler's buffers are sized for it.
  int64_t max_logprobs = 20;
  // Throws polylora::Error naming the flag.
  void validate() const;
};

}  // namespace polylora
