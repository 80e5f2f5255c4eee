// apps/engine_flags.h: the one place command-line flags become configuration: model loading flags
// (--model, --tokenizer, --device, --dtype, --load-format, --quantization, adapters) and the engine flags (vLLM's names),
// shared by `generate` and `serve`, plus building the Engine from them.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/engine_config.h"
#include "engine/engine.h"

namespace polylora::apps {

struct ModelFlags {
  std::string model_dir;      // --model or the positional MODEL: a directory or a hub id (org/name)
  std::string model_tag;      // the positional MODEL (vLLM's `serve MODEL`); wins over --model
  std::string revision = "main";  // --revision: the hub revision (ref or commit hash) of a hub id
  std::string tokenizer_dir;  // empty: the model directory when it has a tokenizer
  std::string device = "auto";
  std::string dtype = "auto";
  std::string load_format = "auto";
  std::string quantization = "none";  // --quantization / -q: none | int8 | mxfp4 (docs/quantization.md)
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype: auto | bfloat16 (docs/vllm-flags.md)
  int tensor_parallel_size = 1;       // --tensor-parallel-size / -tp (docs/tensor-parallel.md)
  bool enable_expert_parallel = false;  // --enable-expert-parallel / -ep: whole experts per rank under -tp
  bool fully_sharded_loras = false;  // --fully-sharded-loras: LoRA A of column-parallel modules sharded too
  std::vector<std::string> loras;  // NAME=DIR or vLLM's JSON {"name": ..., "path": ..., "base_model_name": ...}
  std::string max_model_len;         // --max-model-len (human-readable: 32k, 32K, auto)
  std::string max_num_batched_tokens;  // --max-num-batched-tokens (human-readable)
  std::optional<int64_t> max_cpu_loras;  // --max-cpu-loras (unset: --max-loras, as vLLM)
  std::optional<uint64_t> seed;       // --seed
  std::optional<int64_t> max_logprobs;  // --max-logprobs (-1: SamplingParams::kLogprobsLimit)
  bool enable_lora = false;           // --enable-lora (LoRA is always on here)
  bool chunked_prefill = true;        // --enable-chunked-prefill[=false] / --no-enable-chunked-prefill
  std::string generation_config = "auto";  // --generation-config auto | vllm | DIR
  std::string override_generation_config;  // --override-generation-config JSON
};

// One --lora-modules entry.
struct LoraModuleSpec {
  std::string name;
  std::string path;  // a directory or a hub id
  std::string base_model_name;
};
// --kv-cache-dtype's value as the cache's element type (auto: F32; bfloat16: BF16 on CUDA backends); any
// other value (fp8, ...), or bfloat16 on the CPU, throws polylora::Error naming the flag.
DType kv_cache_dtype_from_flag(const std::string& value, bool cuda);
// Parses `name=path` or vLLM's JSON form; throws polylora::Error naming the flag.
LoraModuleSpec parse_lora_module(const std::string& spec);
// The flag values that need the parsed command line (sizes, defaults depending on other flags, hub ids)
// applied to the engine config and the flags themselves: call after parsing, before load_engine.
void finish_model_flags(ModelFlags& flags, EngineConfig& config);

void add_model_flags(CLI::App& app, ModelFlags& flags, bool model_required);
void add_engine_flags(CLI::App& app, EngineConfig& config, ModelFlags& flags);

struct LoadedEngine {
  std::shared_ptr<Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;  // may be null
  std::unique_ptr<Engine> engine;
};
// --quantization's value for the model in `model_dir`; throws polylora::Error naming the accepted values
// for an unknown one, and for mxfp4 on a checkpoint that is not MXFP4.
WeightQuantization quantization_from_flag(const std::string& value, const std::string& model_dir);
// Loads the model, tokenizer and adapters and builds the engine; logs what it did.
LoadedEngine load_engine(const ModelFlags& flags, const EngineConfig& config);

}  // namespace polylora::apps
