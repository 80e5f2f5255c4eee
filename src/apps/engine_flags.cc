// apps/engine_flags.cc: flag definitions and engine construction shared by the subcommands.
#include "apps/engine_flags.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <exception>
#include <filesystem>
#include <future>
#include <thread>
#include <nlohmann/json.hpp>

#include "api/sampling_params.h"
#include "apps/backend_flags.h"
#include "common/error.h"
#include "common/log.h"
#include "config/cli_values.h"
#include "config/hf_cache.h"
#include "lora/adapter.h"

namespace polylora::apps {

void add_model_flags(CLI::App& app, ModelFlags& f, bool model_required) {
  auto* m = app.add_option("--model", f.model_dir,
                           "Model: a Hugging Face model directory (config.json + safetensors) or a hub id "
                           "(org/name) in the local Hugging Face cache");
  if (model_required) m->required();
  app.add_option("--revision", f.revision, "Hub revision of a hub-id --model: a ref (branch, tag) or a commit")
      ->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer_dir,
                 "Tokenizer directory or hub id (default: the model directory)");
  app.add_option("--device", f.device, "cpu | cuda | auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", f.dtype,
                 "auto | bfloat16 | float32 | float | half | float16 (GPU weights and GEMMs; auto: bfloat16 "
                 "on the GPU; half/float16 run as bfloat16, with a warning; the CPU computes in float32)")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32", "float", "half", "float16"}));
  app.add_option("--load-format", f.load_format,
                 "auto | safetensors | dummy (random weights from config.json)")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app.add_option("--quantization", f.quantization,
                 "none | int8 (weight-only INT8 made at load: per-output-channel scales of the linear and "
                 "expert matrices, bf16/f32 activations) | mxfp4 (the checkpoint's own, GPT-OSS; read from "
                 "config.json either way); -q is the same")
      ->capture_default_str();
  app.add_option("--kv-cache-dtype", f.kv_cache_dtype,
                 "auto | bfloat16: the KV cache's element type (auto: float32 for now; bfloat16 halves its "
                 "bytes, CUDA only; no fp8 KV cache)")
      ->capture_default_str();
  app.add_option("--tensor-parallel-size", f.tensor_parallel_size,
                 "Ranks the model is split over (-tp; threads of this process; with --device cuda one GPU "
                 "per rank, collectives over NCCL)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag(
      "--enable-expert-parallel,!--no-enable-expert-parallel", f.enable_expert_parallel,
      "Under --tensor-parallel-size N > 1, each rank holds E/N whole experts of every MoE layer (and "
      "their LoRA) and the tokens travel to them (all-to-all), instead of a slice of every expert "
      "(-ep; N must divide the number of experts)");
  app.add_flag(
      "--fully-sharded-loras,!--no-fully-sharded-loras", f.fully_sharded_loras,
      "Under --tensor-parallel-size N > 1, shard the dense modules' LoRA fully (vLLM's meaning): A's "
      "rank rows of q/k/v/gate/up with an all-gather of the shrinks, B's output rows of o/down with an "
      "all-reduce of the shrinks (default: A replicated, B sharded; the numbers are the same)");
  app.add_option("--lora,--lora-modules", f.loras,
                 "LoRA adapters to load: NAME=PATH or JSON {\"name\", \"path\", \"base_model_name\"} "
                 "(PATH a directory or a hub id; repeatable, several per flag)");
}

void add_engine_flags(CLI::App& app, EngineConfig& c, ModelFlags& f) {
  app.add_option("--block-size", c.cache.block_size, "Tokens per KV-cache block")->capture_default_str();
  app.add_option("--num-kv-blocks,--num-gpu-blocks-override", c.cache.num_kv_blocks,
                 "KV-cache blocks (overrides the computed capacity)");
  app.add_option("--kv-cache-memory", c.cache.kv_cache_memory, "KV-cache bytes on the CPU backend")
      ->capture_default_str();
  app.add_option("--gpu-memory-utilization", c.cache.gpu_memory_utilization,
                 "Fraction of GPU memory for weights, activations and KV cache")
      ->capture_default_str();
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", c.cache.enable_prefix_caching,
               "Reuse KV blocks of identical prefixes (default on)");
  app.add_option("--max-num-batched-tokens", f.max_num_batched_tokens,
                 "Token budget per step (8192; 8k, 8K forms as vLLM)");
  app.add_option("--max-num-seqs", c.scheduler.max_num_seqs, "Sequences per step")->capture_default_str();
  app.add_option("--max-logprobs", f.max_logprobs,
                 "Most log-probs a request may ask for per token (logprobs, top_logprobs, prompt_logprobs; "
                 "default 20, at most 1024; -1: 1024)");
  app.add_option("--max-model-len", f.max_model_len,
                 "Context length (default: the model's; 32k = 32000, 32K = 32768, auto or -1: the model's)");
  app.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.chunked_prefill,
               "Split long prompts over steps within the token budget (default on; =false turns it off)");
  app.add_option("--scheduling-policy", c.scheduler.policy,
                 "fcfs | priority | fair (an equal share of the token budget per adapter, docs/adapters.md)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, SchedulingPolicy>{
          {"fcfs", SchedulingPolicy::kFcfs},
          {"priority", SchedulingPolicy::kPriority},
          {"fair", SchedulingPolicy::kFair}}));
  app.add_option("--fair-prefill-weight", c.scheduler.fair_prefill_weight,
                 "--scheduling-policy fair: service charged per prompt token computed")
      ->capture_default_str();
  app.add_option("--fair-decode-weight", c.scheduler.fair_decode_weight,
                 "--scheduling-policy fair: service charged per token generated")
      ->capture_default_str();
  app.add_option("--max-waiting-requests", c.scheduler.max_waiting,
                 "Waiting-queue bound (overload answers 503)")
      ->capture_default_str();
  app.add_option("--max-loras", c.lora.max_loras, "Device slots for adapters (so distinct adapters in one step)")
      ->capture_default_str();
  app.add_option("--lora-max-wait-steps", c.lora.max_wait_steps,
                 "Steps a request whose adapter is ready may be passed over for resident adapters")
      ->capture_default_str();
  app.add_option("--lora-resolver-dir", c.lora.resolver_dir,
                 "Adapters not registered are loaded on first use from DIR/<name>/ (vLLM's filesystem resolver)");
  app.add_option("--max-lora-rank", c.lora.max_lora_rank, "Largest LoRA rank accepted")
      ->capture_default_str();
  app.add_option("--max-cpu-loras", f.max_cpu_loras,
                 "Adapters held in host memory, LRU; the rest reload from disk (default: --max-loras, as vLLM)");
  app.add_flag("--enforce-eager,!--no-enforce-eager", c.execution.enforce_eager,
               "Run every step eagerly (no CUDA graphs)");
  app.add_option("--cuda-graph-sizes", c.execution.cuda_graph_sizes,
                 "Decode batch sizes captured as CUDA graphs (default: 1 2 4 8 16 ... --max-num-seqs); one "
                 "value N: 1 2 4 and the multiples of 8 up to N, as vLLM")
      ->delimiter(',');
  app.add_flag_function(
      "--async-scheduling,!--no-async-scheduling",
      [&c](int64_t n) { c.execution.async_scheduling = n > 0; },
      "Plan and queue the next step while the current one runs (default: on with --device cuda)");
  app.add_option("--cuda-graph-max-context", c.execution.cuda_graph_max_context,
                 "Decode steps with longer contexts run eagerly")
      ->capture_default_str();
}

LoraModuleSpec parse_lora_module(const std::string& spec) {
  LoraModuleSpec m;
  std::string s = spec;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  if (!s.empty() && s.front() == '{') {
    auto j = nlohmann::json::parse(s, nullptr, false);
    if (j.is_discarded() || !j.is_object()) fail("--lora-modules '{}': not a valid JSON object", spec);
    for (const auto& [key, value] : j.items()) {
      if (key != "name" && key != "path" && key != "base_model_name")
        fail("--lora-modules '{}': unknown field '{}' (expected name, path, base_model_name)", spec, key);
      if (!value.is_string()) fail("--lora-modules '{}': '{}' must be a string", spec, key);
    }
    if (!j.contains("name") || !j.contains("path"))
      fail("--lora-modules '{}': the JSON form needs \"name\" and \"path\"", spec);
    m.name = j["name"].get<std::string>();
    m.path = j["path"].get<std::string>();
    if (j.contains("base_model_name")) m.base_model_name = j["base_model_name"].get<std::string>();
  } else {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("--lora-modules '{}': expected NAME=PATH or a JSON object", spec);
    m.name = spec.substr(0, eq);
    m.path = spec.substr(eq + 1);
  }
  if (m.name.empty() || m.path.empty()) fail("--lora-modules '{}': empty name or path", spec);
  return m;
}

void finish_model_flags(ModelFlags& f, EngineConfig& c) {
  if (!f.model_tag.empty()) {
    if (!f.model_dir.empty() && f.model_dir != f.model_tag)
      spdlog::warn("both the positional model '{}' and --model '{}' given: serving '{}' (as vLLM)", f.model_tag,
                   f.model_dir, f.model_tag);
    f.model_dir = f.model_tag;
  }
  if (!f.max_model_len.empty()) {
    if (f.max_model_len == "auto") {
      c.scheduler.max_model_len = 0;
    } else {
      int64_t v = parse_human_int(f.max_model_len, "--max-model-len");
      if (v < -1 || v == 0) fail("--max-model-len must be positive (or -1 / auto: the model's), got {}", v);
      c.scheduler.max_model_len = v == -1 ? 0 : v;
    }
  }
  if (f.max_logprobs) {
    // vLLM's -1 is the whole vocabulary; the samplers report at most SamplingParams::kLogprobsLimit.
    if (*f.max_logprobs == -1) {
      spdlog::warn("--max-logprobs -1: requests may ask for up to {} log-probs per token (polylora's limit)",
                   SamplingParams::kLogprobsLimit);
      c.max_logprobs = SamplingParams::kLogprobsLimit;
    } else {
      c.max_logprobs = *f.max_logprobs;
    }
  }
  if (!f.max_num_batched_tokens.empty())
    c.scheduler.max_num_batched_tokens = parse_human_int(f.max_num_batched_tokens, "--max-num-batched-tokens");
  c.scheduler.enable_chunked_prefill = f.chunked_prefill;
  // vLLM's --cuda-graph-sizes: one value N is the largest size, captured as 1, 2, 4 and the multiples of 8
  // up to N; several values are the sizes themselves.
  if (c.execution.cuda_graph_sizes.size() == 1) {
    const int64_t n = c.execution.cuda_graph_sizes.front();
    if (n < 1) fail("--cuda-graph-sizes: sizes must be positive, got {}", n);
    std::vector<int64_t> sizes;
    for (int64_t v : {1, 2, 4})
      if (v <= n) sizes.push_back(v);
    for (int64_t v = 8; v <= n; v += 8) sizes.push_back(v);
    c.execution.cuda_graph_sizes = std::move(sizes);
  }
  if (f.max_cpu_loras) {
    c.lora.max_cpu_loras = *f.max_cpu_loras;
  } else {
    // vLLM: max_cpu_loras defaults to max_loras; adapters beyond it stay on disk until used.
    c.lora.max_cpu_loras = c.lora.max_loras;
  }
  if (f.dtype == "half" || f.dtype == "float16") {
    spdlog::warn("--dtype {}: polylora computes in bfloat16 or float32, not float16; using bfloat16 (the same "
                 "size, with float32's range)",
                 f.dtype);
    f.dtype = "bfloat16";
  } else if (f.dtype == "float") {
    f.dtype = "float32";
  }
}

WeightQuantization quantization_from_flag(const std::string& value, const std::string& model_dir) {
  if (value == "none") return WeightQuantization::kNone;
  if (value == "int8") return WeightQuantization::kInt8;
  if (value == "mxfp4") {
    // MXFP4 is read as shipped, never made: the checkpoint must be one.
    const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
    if (ModelConfig::from_file(path).quant_method != QuantMethod::kMxfp4)
      fail(
          "--quantization mxfp4: {} is not an MXFP4 checkpoint (its config.json has no quantization_config "
          "with quant_method mxfp4); polylora serves MXFP4 checkpoints as shipped and does not quantize to "
          "MXFP4 (--quantization int8 makes a smaller model from bf16/f32 weights)",
          model_dir);
    return WeightQuantization::kNone;
  }
  fail(
      "--quantization {}: polylora cannot honour this value: it makes INT8 weight-only models at load and "
      "serves GPT-OSS's MXFP4 checkpoints as shipped (accepted: none, int8, mxfp4)",
      value);
}

DType kv_cache_dtype_from_flag(const std::string& value, bool cuda) {
  if (value == "auto") return DType::kF32;
  if (value == "bfloat16") {
    if (!cuda)
      fail(
          "--kv-cache-dtype bfloat16: polylora cannot honour this value on the CPU backend: its kernels keep "
          "the KV cache in float32 (use --device cuda, or auto)");
    return DType::kBF16;
  }
  fail("--kv-cache-dtype {}: polylora cannot honour this value: there is no fp8 KV cache (accepted: auto, "
       "bfloat16)",
       value);
}

LoadedEngine load_engine(const ModelFlags& f, const EngineConfig& config) {
  namespace fs = std::filesystem;
  LoadedEngine le;
  ModelLoadOptions opts;
  opts.load_format = f.load_format == "dummy" ? LoadFormat::kDummy : LoadFormat::kSafetensors;
  std::shared_ptr<Backend> backend = make_backend(backend_options(f.device, f.dtype));
  std::string model_dir = resolve_model_path(f.model_dir, f.revision, "model");
  if (model_dir != f.model_dir) spdlog::info("model '{}' (revision {}): {}", f.model_dir, f.revision, model_dir);
  opts.quantization = quantization_from_flag(f.quantization, model_dir);
  opts.tensor_parallel_size = f.tensor_parallel_size;
  opts.enable_expert_parallel = f.enable_expert_parallel;
  opts.fully_sharded_loras = f.fully_sharded_loras;
  if (f.enable_expert_parallel && f.tensor_parallel_size == 1)
    spdlog::info(
        "--enable-expert-parallel: no effect with --tensor-parallel-size 1 (one rank holds every expert)");
  std::string tok_dir =
      f.tokenizer_dir.empty() ? model_dir : resolve_model_path(f.tokenizer_dir, "main", "tokenizer");
  bool has_tok =
      fs::exists(fs::path(tok_dir) / "tokenizer.json") || fs::exists(fs::path(tok_dir) / "tokenizer.json.gz");
  if (!f.tokenizer_dir.empty() && !has_tok) fail("--tokenizer {}: no tokenizer.json there", f.tokenizer_dir);
  // The tokenizer is read while the weights load and the engine starts (cold start: each takes about a
  // second for GPT-OSS); the weights are read and copied in the background while the engine sizes its
  // workspace and KV cache and records its CUDA graphs (POLYLORA_BACKGROUND_WEIGHTS=0: before).
  std::shared_future<std::shared_ptr<const tokenizer::Tokenizer>> tok;
  if (has_tok)
    tok = std::async(std::launch::async, [tok_dir] {
            return std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::load(tok_dir));
          }).share();
  else
    tok = std::async(std::launch::deferred, [] {
            return std::shared_ptr<const tokenizer::Tokenizer>();
          }).share();
  const char* bg_env = std::getenv("POLYLORA_BACKGROUND_WEIGHTS");
  opts.upload.background = !(bg_env && std::string(bg_env) == "0");
  le.model = Model::load(model_dir, opts, backend);
  spdlog::info("loaded {} ({}, {} layers, {:.1f} MB of parameters{}) on {}", le.model->source(),
               le.model->config().model_type, le.model->config().num_layers,
               static_cast<double>(le.model->weights().num_bytes) / 1e6,
               opts.quantization == WeightQuantization::kInt8 ? ", INT8 weights" : "", backend->name());
  if (!has_tok)
    spdlog::warn("no tokenizer.json in {}: text prompts, detokenized output and stop strings are unavailable",
                 tok_dir);
  EngineConfig ec = config;
  ec.cache.kv_cache_dtype = kv_cache_dtype_from_flag(f.kv_cache_dtype, backend->kind() == DeviceKind::kCuda);
  ec.lora.reserve_on_device = ec.lora.reserve_on_device || f.enable_lora || !f.loras.empty();
  le.engine = std::make_unique<Engine>(le.model, ec, tok);
  le.tokenizer = tok.get();
  // --lora-modules: read in parallel (each read converts the whole file), registered in the given order;
  // the first failing module (in that order) is the start-up error.
  std::vector<std::pair<std::string, std::string>> modules;  // name, path
  for (const std::string& spec : f.loras) {
    LoraModuleSpec m = parse_lora_module(spec);
    modules.emplace_back(m.name, resolve_model_path(m.path, "main", "adapter"));
  }
  std::vector<std::shared_ptr<LoraAdapter>> loaded(modules.size());
  std::vector<std::exception_ptr> errors(modules.size());
  std::atomic<size_t> next{0};
  auto read_modules = [&] {
    for (size_t i; (i = next.fetch_add(1)) < modules.size();) {
      try {
        loaded[i] = load_peft_adapter(modules[i].second, modules[i].first, le.model->config(),
                                      {config.lora.max_lora_rank});
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  const size_t readers = std::min<size_t>({modules.size(), 8, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> threads;
  for (size_t k = 1; k < readers; ++k) threads.emplace_back(read_modules);
  read_modules();
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < modules.size(); ++i) {
    if (errors[i]) std::rethrow_exception(errors[i]);
    const auto& [name, path] = modules[i];
    const auto& adapter = loaded[i];
    spdlog::info("loaded adapter '{}' from {} (rank {}, {:.1f} MB){}", name, path, adapter->max_rank,
                 static_cast<double>(adapter->num_bytes()) / 1e6,
                 adapter->has_expert_lora ? " with expert LoRA" : "");
    le.engine->add_adapter(std::move(loaded[i]));
  }
  return le;
}

}  // namespace polylora::apps
