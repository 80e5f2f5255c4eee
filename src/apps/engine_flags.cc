// apps/engine_flags.cc: flag definitions and engine construction shared by the subcommands.
#include "apps/engine_flags.h"

#include <filesystem>

#include "apps/backend_flags.h"
#include "common/error.h"
#include "common/log.h"
#include "lora/adapter.h"

namespace polylora::apps {

void add_model_flags(CLI::App& app, ModelFlags& f, bool model_required) {
  auto* m =
      app.add_option("--model", f.model_dir, "Hugging Face model directory (config.json + safetensors)");
  if (model_required) m->required();
  app.add_option("--tokenizer", f.tokenizer_dir, "Tokenizer directory (default: the model directory)");
  app.add_option("--device", f.device, "cpu | cuda | auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", f.dtype,
                 "auto | bfloat16 | float32 (weights and GEMMs on the GPU; the CPU computes in "
                 "float32)")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32"}));
  app.add_option("--load-format", f.load_format,
                 "auto | safetensors | dummy (random weights from config.json)")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app.add_option("--lora,--lora-modules", f.loras, "LoRA adapters to load, NAME=DIR (repeatable)");
}

void add_engine_flags(CLI::App& app, EngineConfig& c) {
  app.add_option("--block-size", c.cache.block_size, "Tokens per KV-cache block")->capture_default_str();
  app.add_option("--num-kv-blocks", c.cache.num_kv_blocks,
                 "KV-cache blocks (overrides the computed capacity)");
  app.add_option("--kv-cache-memory", c.cache.kv_cache_memory, "KV-cache bytes on the CPU backend")
      ->capture_default_str();
  app.add_option("--gpu-memory-utilization", c.cache.gpu_memory_utilization,
                 "Fraction of GPU memory for weights, activations and KV cache")
      ->capture_default_str();
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", c.cache.enable_prefix_caching,
               "Reuse KV blocks of identical prefixes (default on)");
  app.add_option("--max-num-batched-tokens", c.scheduler.max_num_batched_tokens, "Token budget per step")
      ->capture_default_str();
  app.add_option("--max-num-seqs", c.scheduler.max_num_seqs, "Sequences per step")->capture_default_str();
  app.add_option("--max-model-len", c.scheduler.max_model_len, "Context length (default: the model's)");
  app.add_option("--scheduling-policy", c.scheduler.policy, "fcfs | priority")
      ->transform(CLI::CheckedTransformer(std::map<std::string, SchedulingPolicy>{
          {"fcfs", SchedulingPolicy::kFcfs}, {"priority", SchedulingPolicy::kPriority}}));
  app.add_option("--max-waiting-requests", c.scheduler.max_waiting,
                 "Waiting-queue bound (overload answers 503)")
      ->capture_default_str();
  app.add_option("--max-loras", c.lora.max_loras, "Distinct adapters in one step")->capture_default_str();
  app.add_option("--max-lora-rank", c.lora.max_lora_rank, "Largest LoRA rank accepted")
      ->capture_default_str();
  app.add_option("--max-cpu-loras", c.lora.max_cpu_loras, "Adapters kept loaded")->capture_default_str();
  app.add_flag("--enforce-eager", c.execution.enforce_eager, "Run every step eagerly (no CUDA graphs)");
  app.add_option("--cuda-graph-sizes", c.execution.cuda_graph_sizes,
                 "Decode batch sizes captured as CUDA graphs (default: 1 2 4 8 16 ... --max-num-seqs)")
      ->delimiter(',');
  app.add_flag_function(
      "--async-scheduling,!--no-async-scheduling",
      [&c](int64_t n) { c.execution.async_scheduling = n > 0; },
      "Plan and queue the next step while the current one runs (default: on with --device cuda)");
  app.add_option("--cuda-graph-max-context", c.execution.cuda_graph_max_context,
                 "Decode steps with longer contexts run eagerly")
      ->capture_default_str();
}

LoadedEngine load_engine(const ModelFlags& f, const EngineConfig& config) {
  namespace fs = std::filesystem;
  LoadedEngine le;
  ModelLoadOptions opts;
  opts.load_format = f.load_format == "dummy" ? LoadFormat::kDummy : LoadFormat::kSafetensors;
  std::shared_ptr<Backend> backend = make_backend(backend_options(f.device, f.dtype));
  le.model = Model::load(f.model_dir, opts, backend);
  spdlog::info("loaded {} ({}, {} layers, {:.1f} MB of parameters) on {}", le.model->source(),
               le.model->config().model_type, le.model->config().num_layers,
               static_cast<double>(le.model->weights().num_bytes) / 1e6, backend->name());
  std::string tok_dir = f.tokenizer_dir.empty() ? f.model_dir : f.tokenizer_dir;
  bool has_tok =
      fs::exists(fs::path(tok_dir) / "tokenizer.json") || fs::exists(fs::path(tok_dir) / "tokenizer.json.gz");
  if (!f.tokenizer_dir.empty() && !has_tok) fail("--tokenizer {}: no tokenizer.json there", f.tokenizer_dir);
  if (has_tok)
    le.tokenizer = std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tok_dir));
  else
    spdlog::warn("no tokenizer.json in {}: text prompts, detokenized output and stop strings are unavailable",
                 tok_dir);
  le.engine = std::make_unique<Engine>(le.model, config, le.tokenizer);
  for (const std::string& spec : f.loras) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("--lora '{}': expected NAME=DIR", spec);
    std::string name = spec.substr(0, eq);
    auto adapter =
        load_peft_adapter(spec.substr(eq + 1), name, le.model->config(), {config.lora.max_lora_rank});
    spdlog::info("loaded adapter '{}' (rank {}, {:.1f} MB){}", name, adapter->max_rank,
                 static_cast<double>(adapter->num_bytes()) / 1e6,
                 adapter->has_expert_lora ? " with expert LoRA" : "");
    le.engine->add_adapter(std::move(adapter));
  }
  return le;
}

}  // namespace polylora::apps
