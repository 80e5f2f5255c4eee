// config/engine_config.cc: validation of engine settings.
#include "config/engine_config.h"

#include "common/error.h"

namespace polylora {

void EngineConfig::validate() const {
  if (cache.block_size < 1 || cache.block_size > 1024)
    fail("--block-size must be in [1, 1024], got {}", cache.block_size);
  if (cache.num_kv_blocks < 0) fail("--num-kv-blocks must be >= 0, got {}", cache.num_kv_blocks);
  if (cache.kv_cache_memory < 0) fail("--kv-cache-memory must be >= 0, got {}", cache.kv_cache_memory);
  if (!(cache.gpu_memory_utilization > 0 && cache.gpu_memory_utilization <= 1))
    fail("--gpu-memory-utilization must be in (0, 1], got {}", cache.gpu_memory_utilization);
  if (scheduler.max_num_seqs < 1) fail("--max-num-seqs must be at least 1, got {}", scheduler.max_num_seqs);
  if (scheduler.max_num_batched_tokens < 1)
    fail("--max-num-batched-tokens must be at least 1, got {}", scheduler.max_num_batched_tokens);
  if (scheduler.max_model_len < 0) fail("--max-model-len must be >= 0, got {}", scheduler.max_model_len);
  if (scheduler.fair_prefill_weight < 0 || scheduler.fair_decode_weight < 0 ||
      scheduler.fair_prefill_weight + scheduler.fair_decode_weight < 1)
    fail("--fair-prefill-weight ({}) and --fair-decode-weight ({}) must be >= 0 and not both 0",
         scheduler.fair_prefill_weight, scheduler.fair_decode_weight);
  if (lora.max_loras < 1) fail("--max-loras must be at least 1, got {}", lora.max_loras);
  for (int64_t size : execution.cuda_graph_sizes)
    if (size < 1 || size > 4096) fail("--cuda-graph-sizes: each size must be in [1, 4096], got {}", size);
  if (execution.cuda_graph_max_context < 1)
    fail("--cuda-graph-max-context must be at least 1, got {}", execution.cuda_graph_max_context);
  if (lora.max_lora_rank < 1) fail("--max-lora-rank must be at least 1, got {}", lora.max_lora_rank);
  // 1024: SamplingParams::kLogprobsLimit (api/ is above config/), what the samplers report at most.
  if (max_logprobs < 0 || max_logprobs > 1024)
    fail("--max-logprobs must be in [0, 1024] (or -1: 1024), got {}", max_logprobs);
  if (lora.max_cpu_loras < lora.max_loras)
    fail("--max-cpu-loras ({}) must be at least --max-loras ({})", lora.max_cpu_loras, lora.max_loras);
}

}  // namespace polylora
