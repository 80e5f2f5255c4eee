// bench/device_bench.cc: `polylora_bench device`: a full-size model from config.json alone (dummy
// weights) on a chosen backend, driven through the Engine like a server: load time, memory, and prefill /
// decode tokens per second at several batch sizes (B greedy requests of --prompt-len tokens; prefill is
// the steps until each has its first token, decode the next --decode-tokens - 1 steps, all B running),
// with the GPU time inside a decode step and its share of the step's wall time. Used on the GPU machine
// beside bench/hf_compare.py (Hugging Face transformers on the same config and batches, same GPU, same
// run) by scripts/gpu_bench.sh.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_command.h"
#include "common/error.h"
#include "engine/engine.h"
#include "greedy_run.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "random_adapter.h"

namespace polylora::bench {
namespace {

int run_device_bench(int argc, char** argv) {
  CLI::App app{"Full-size dummy-weight model throughput on a backend", "polylora_bench device"};
  std::string config_dir, device = "cuda", dtype = "bfloat16", json_path, batches_text = "1,32";
  int64_t prompt_len = 512, decode_tokens = 32, max_batch_tokens = 8192;
  app.add_option("--config", config_dir, "Folder with config.json")->required();
  app.add_option("--device", device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", dtype, "bfloat16 | float32")->check(CLI::IsMember({"bfloat16", "float32"}));
  std::string quantization = "none";
  app.add_option("--quantization", quantization,
                 "none | int8 (the dense and expert matrices as INT8, docs/quantization.md)")
      ->check(CLI::IsMember({"none", "int8"}));
  app.add_option("--batches", batches_text, "Comma-separated batch sizes");
  app.add_option("--prompt-len", prompt_len, "Prompt tokens per sequence");
  app.add_option("--decode-tokens", decode_tokens,
                 "Generated tokens per sequence (the first by the prefill, the rest timed as decode)");
  app.add_option("--max-batch-tokens", max_batch_tokens,
                 "Token budget of an engine step (--max-num-batched-tokens)");
  app.add_option("--json-out", json_path, "Write the results as JSON here");
  bool enforce_eager = false;
  app.add_flag("--enforce-eager", enforce_eager, "Decode without CUDA graphs (the engine's --enforce-eager)");
  bool host_argmax = false;
  app.add_flag("--host-argmax", host_argmax,
               "Ask for logprobs, so every decode step's logits come to the host and the CPU sampler "
               "takes the argmax");
  bool no_async = false;
  app.add_flag("--no-async-scheduling", no_async,
               "Complete each step before planning the next (the engine's --no-async-scheduling)");
  int64_t loras = 0, lora_rank = 16;
  app.add_option("--loras", loras,
                 "Also time each batch with this many random adapters (q/k/v/o and the experts, as "
                 "../shared/peers/gen_adapters.py makes them), the requests round-robin over them; the "
                 "base model runs beside it in the same engine")
      ->check(CLI::Range(int64_t{0}, int64_t{1024}));
  app.add_option("--lora-rank", lora_rank, "Rank of the --loras adapters")->check(CLI::Range(1, 512));
  std::string kv_cache_dtype = "auto";
  app.add_option("--kv-cache-dtype", kv_cache_dtype, "auto (float32) | bfloat16 (CUDA), as `polylora serve`")
      ->check(CLI::IsMember({"auto", "bfloat16"}));
  bool lora_no_experts = false;
  app.add_flag("--lora-no-experts", lora_no_experts, "The --loras adapters adapt q/k/v/o only");
  int tp = 1;
  app.add_option("--tensor-parallel-size", tp,
                 "Ranks the model is split over (-tp, as `polylora serve`; threads of this process; with "
                 "--device cuda one GPU per rank, collectives over NCCL)")
      ->check(CLI::PositiveNumber);
  bool ep = false;
  app.add_flag("--enable-expert-parallel", ep,
               "Under -tp N > 1, whole experts per rank with all-to-all dispatch (-ep, as `polylora serve`)");
  try {
    // vLLM's multi-letter short flags, as `polylora serve` takes them.
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) {  // CLI11 takes a vector last argument first
      const std::string a = argv[i];
      args.push_back(a == "-tp" ? "--tensor-parallel-size" : a == "-ep" ? "--enable-expert-parallel" : a);
    }
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<int64_t> batches;
  std::stringstream ss(batches_text);
  for (std::string item; std::getline(ss, item, ',');) batches.push_back(std::stoll(item));
  if (batches.empty() || *std::min_element(batches.begin(), batches.end()) < 1 || prompt_len < 1)
    fail("--batches needs sizes >= 1 and --prompt-len >= 1");

  BackendOptions bo;
  bo.device = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  bo.weight_dtype = dtype == "float32" ? DType::kF32 : DType::kBF16;
  std::shared_ptr<Backend> backend = make_backend(bo);
  auto t0 = std::chrono::steady_clock::now();
  ModelLoadOptions lo;
  lo.load_format = LoadFormat::kDummy;
  if (quantization == "int8") lo.quantization = WeightQuantization::kInt8;
  lo.tensor_parallel_size = tp;
  lo.enable_expert_parallel = ep;
  std::shared_ptr<Model> model = Model::load(config_dir, lo, backend);
  backend->synchronize();
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = model->config();
  // Which weights ran: the backend's dense dtype, and the experts' format (MXFP4 where the config's
  // quantization_config says so, e.g. tests/data/configs/gpt-oss-20b; its bf16 twin is gpt-oss-20b-bf16).
  // (dummy weights on the CPU are bf16; on CUDA the --dtype)
  // (--quantization int8: the linear and expert matrices are INT8, the embedding and LM head as the dtype)
  const std::string dense_format =
      lo.quantization == WeightQuantization::kInt8
          ? "int8"
          : (bo.device == DeviceKind::kCuda && bo.weight_dtype == DType::kF32 ? "f32" : "bf16");
  const bool any_mxfp4 =
      std::find(c.mxfp4_experts.begin(), c.mxfp4_experts.end(), true) != c.mxfp4_experts.end();
  const std::string weight_format =
      c.is_moe() ? fmt::format("dense {}, experts {}", dense_format, any_mxfp4 ? "mxfp4" : dense_format)
                 : dense_format;
  nlohmann::json out = {{"weight_format", weight_format},
                        {"engine", "polylora"},
                        {"backend", backend->name()},
                        {"model", c.model_type},
                        {"params_billions", static_cast<double>(c.num_parameters()) / 1e9},
                        {"load_seconds", load_s},
                        {"weight_bytes", model->weights().num_bytes},
                        {"prompt_len", prompt_len},
                        {"decode_tokens", decode_tokens},
                        {"tensor_parallel_size", tp},
                        {"kv_cache_dtype", kv_cache_dtype == "bfloat16" ? "bfloat16" : "float32"},
                        {"expert_parallel", ep && tp > 1},
                        {"runs", nlohmann::json::array()}};
  const std::string ranks =
      tp > 1 ? fmt::format(", {} tensor-parallel ranks{}", tp, ep ? " (experts whole per rank)" : "") : "";
  std::fprintf(stderr, "loaded %s (%s) on %s in %.1f s (%.2f GB of weights)%s\n", c.model_type.c_str(),
               weight_format.c_str(), backend->name().c_str(), load_s,
               static_cast<double>(model->weights().num_bytes) / 1e9, ranks.c_str());
  // One engine for every batch size: no prefix caching (each run computes its prompts), a KV cache of
  // exactly what the largest batch needs, CUDA graphs of the batch sizes (recorded at start) unless
  // --enforce-eager, covering every context of the run.
  const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
  const int64_t decode_steps = std::max<int64_t>(1, decode_tokens - 1);  // the first token is prefill's
  const int64_t max_tokens = greedy_run_max_tokens(max_batch, prompt_len, max_batch_tokens, decode_steps);
  EngineConfig ec;
  ec.cache.block_size = 16;
  ec.cache.enable_prefix_caching = false;
  ec.cache.kv_cache_dtype = kv_cache_dtype == "bfloat16" ? DType::kBF16 : DType::kF32;
  ec.scheduler.max_model_len = prompt_len + max_tokens;
  ec.cache.num_kv_blocks = max_batch * ((ec.scheduler.max_model_len + 15) / 16);
  ec.scheduler.max_num_seqs = max_batch;
  ec.scheduler.max_num_batched_tokens = max_batch_tokens;
  ec.execution.enforce_eager = enforce_eager;
  ec.execution.async_scheduling = !no_async && bo.device == DeviceKind::kCuda;
  if (host_argmax) ec.execution.device_sampling = false;  // logprobs rows go to the CPU sampler
  ec.execution.cuda_graph_sizes = batches;
  ec.execution.cuda_graph_max_context =
      std::max(ec.execution.cuda_graph_max_context, ec.scheduler.max_model_len);
  if (loras > 0) {
    ec.lora.max_loras = loras;
    ec.lora.max_lora_rank = lora_rank;
    ec.lora.max_cpu_loras = std::max<int64_t>(loras, ec.lora.max_cpu_loras);
    ec.lora.reserve_on_device = true;  // as --enable-lora: slots reserved and graphs captured with LoRA
  }
  Engine engine(model, ec, nullptr);
  std::vector<std::string> adapter_names;
  for (int64_t i = 0; i < loras; ++i) {
    adapter_names.push_back(fmt::format("a{}", i + 1));
    engine.add_adapter(random_adapter(c, adapter_names.back(), static_cast<uint64_t>(1000 + i), lora_rank,
                                      !lora_no_experts));
  }
  if (loras > 0) {
    out["loras"] = loras;
    out["lora_rank"] = lora_rank;
    out["lora_targets"] = lora_no_experts ? "q/k/v/o" : "q/k/v/o + experts";
  }
  out["cuda_graphs"] = model->graphs_enabled();
  model->set_gpu_timing(true);
  std::string mode_text = std::string(" (") + (model->graphs_enabled() ? "graphs" : "eager") +
                          (host_argmax ? ", host argmax" : "") +
                          (*ec.execution.async_scheduling ? ", async" : ", sync") + ")";
  const char* mode = mode_text.c_str();
  for (int64_t b : batches) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < b; ++i) {
      std::vector<int32_t> p(static_cast<size_t>(prompt_len));
      for (int64_t k = 0; k < prompt_len; ++k)
        p[k] = static_cast<int32_t>((k * 7919 + i * 104729 + 17) % c.vocab_size);
      prompts.push_back(std::move(p));
    }
    run_greedy_batch(engine, *model, prompts, decode_steps, host_argmax);  // warm-up
    GreedyRunTiming t = run_greedy_batch(engine, *model, prompts, decode_steps, host_argmax);
    GreedyRunTiming tl;
    if (loras > 0) {
      run_greedy_batch(engine, *model, prompts, decode_steps, host_argmax, adapter_names);  // uploads
      tl = run_greedy_batch(engine, *model, prompts, decode_steps, host_argmax, adapter_names);
    }
    const double prefill_tps = static_cast<double>(b * prompt_len) / t.prefill_seconds;
    const double decode_tps = static_cast<double>(t.decode_tokens) / t.decode_seconds;
    const double step_s = t.decode_seconds / static_cast<double>(t.decode_steps);
    const double gpu_s = t.decode_gpu_seconds / static_cast<double>(t.decode_steps);
    const double busy = step_s > 0 ? gpu_s / step_s : 0.0;
    const double gap_s =
        t.decode_steps > 1 ? t.decode_gap_seconds / static_cast<double>(t.decode_steps - 1) : 0.0;
    std::fprintf(stderr,
                 "batch %ld%s: decode step %.3f ms, GPU time in it %.3f ms (%.1f%%), host %.3f ms, GPU idle "
                 "between steps %.1f us\n",
                 static_cast<long>(b), mode, 1e3 * step_s, 1e3 * gpu_s, 100 * busy, 1e3 * (step_s - gpu_s),
                 1e6 * gap_s);
    std::fprintf(stderr, "batch %ld%s: prefill %.0f tok/s, decode %.1f tok/s (%.2f ms/step)\n",
                 static_cast<long>(b), mode, prefill_tps, decode_tps, 1e3 * step_s);
    nlohmann::json run = {{"batch", b},
                          {"prefill_tok_per_s", prefill_tps},
                          {"prefill_steps", t.prefill_steps},
                          {"decode_tok_per_s", decode_tps},
                          {"decode_steps", t.decode_steps},
                          {"decode_ms_per_step", 1e3 * step_s},
                          {"decode_gpu_ms_per_step", 1e3 * gpu_s},
                          {"decode_gpu_busy_fraction", busy},
                          {"decode_gpu_idle_us_between_steps", 1e6 * gap_s}};
    if (loras > 0) {
      const double l_tps = static_cast<double>(tl.decode_tokens) / tl.decode_seconds;
      const double l_step = tl.decode_seconds / static_cast<double>(tl.decode_steps);
      const double l_prefill = static_cast<double>(b * prompt_len) / tl.prefill_seconds;
      std::fprintf(stderr,
                   "batch %ld%s with %ld adapters: prefill %.0f tok/s, decode %.1f tok/s (%.3f ms/step, %.3f "
                   "ms more than the base model; ratio %.3f)\n",
                   static_cast<long>(b), mode, static_cast<long>(loras), l_prefill, l_tps, 1e3 * l_step,
                   1e3 * (l_step - step_s), l_tps / decode_tps);
      run["lora_prefill_tok_per_s"] = l_prefill;
      run["lora_decode_tok_per_s"] = l_tps;
      run["lora_decode_ms_per_step"] = 1e3 * l_step;
      run["lora_decode_gpu_ms_per_step"] = 1e3 * tl.decode_gpu_seconds / static_cast<double>(tl.decode_steps);
      run["lora_decode_ratio"] = l_tps / decode_tps;
    }
    out["runs"].push_back(std::move(run));
  }
  out["backend_allocated_bytes_peak"] = backend->allocated_bytes();
  std::printf("%s\n", out.dump(2).c_str());
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  return 0;
}

BenchRegistrar reg("device",
                   "Full-size dummy-weight model on cpu or cuda: load, memory, prefill/decode tok/s",
                   run_device_bench);

}  // namespace
}  // namespace polylora::bench
