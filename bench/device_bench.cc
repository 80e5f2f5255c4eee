// bench/device_bench.cc: `polylora_bench device`: a full-size model from config.json alone (dummy
// weights) on a chosen backend: load time, memory, and prefill / decode tokens per second at several
// batch sizes. Used on the GPU machine beside bench/hf_compare.py (Hugging Face transformers on the same
// config and batches, same GPU, same run) by scripts/gpu_bench.sh.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_command.h"
#include "model/model.h"
#include "worker/generator.h"

namespace polylora::bench {
namespace {

int run_device_bench(int argc, char** argv) {
  CLI::App app{"Full-size dummy-weight model throughput on a backend", "polylora_bench device"};
  std::string config_dir, device = "cuda", dtype = "bfloat16", json_path, batches_text = "1,32";
  int64_t prompt_len = 512, decode_tokens = 32, max_batch_tokens = 8192;
  app.add_option("--config", config_dir, "Folder with config.json")->required();
  app.add_option("--device", device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", dtype, "bfloat16 | float32")->check(CLI::IsMember({"bfloat16", "float32"}));
  app.add_option("--batches", batches_text, "Comma-separated batch sizes");
  app.add_option("--prompt-len", prompt_len, "Prompt tokens per sequence");
  app.add_option("--decode-tokens", decode_tokens, "Generated tokens per sequence");
  app.add_option("--max-batch-tokens", max_batch_tokens, "Tokens per prefill forward pass");
  app.add_option("--json-out", json_path, "Write the results as JSON here");
  bool enforce_eager = false;
  app.add_flag("--enforce-eager", enforce_eager, "Decode without CUDA graphs");
  bool host_argmax = false;
  app.add_flag("--host-argmax", host_argmax,
               "Copy every decode step's logits to the host and take the argmax there");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<int64_t> batches;
  std::stringstream ss(batches_text);
  for (std::string item; std::getline(ss, item, ',');) batches.push_back(std::stoll(item));

  BackendOptions bo;
  bo.device = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  bo.weight_dtype = dtype == "float32" ? DType::kF32 : DType::kBF16;
  std::shared_ptr<Backend> backend = make_backend(bo);
  auto t0 = std::chrono::steady_clock::now();
  ModelLoadOptions lo;
  lo.load_format = LoadFormat::kDummy;
  auto model = Model::load(config_dir, lo, backend);
  backend->synchronize();
  double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = model->config();
  nlohmann::json out = {
      {"engine", "polylora"},           {"backend", backend->name()},
      {"model", c.model_type},          {"params_billions", static_cast<double>(c.num_parameters()) / 1e9},
      {"load_seconds", load_s},         {"weight_bytes", model->weights().num_bytes},
      {"prompt_len", prompt_len},       {"decode_tokens", decode_tokens},
      {"runs", nlohmann::json::array()}};
  std::fprintf(stderr, "loaded %s on %s in %.1f s (%.2f GB of weights)\n", c.model_type.c_str(),
               backend->name().c_str(), load_s, static_cast<double>(model->weights().num_bytes) / 1e9);
  if (!enforce_eager) {
    // Decode steps (no adapters) replay CUDA graphs, recorded at their first use.
    GraphOptions go;
    go.enabled = true;
    go.sizes = batches;
    go.max_blocks_per_seq = (prompt_len + decode_tokens + 15) / 16;
    model->prepare_graphs({}, go);
  }
  out["cuda_graphs"] = model->graphs_enabled();
  model->set_gpu_timing(true);
  Generator gen(*model,
                {.block_size = 16, .max_batch_tokens = max_batch_tokens, .device_argmax = !host_argmax});
  for (int64_t b : batches) {
    std::vector<GenerateRequest> reqs;
    for (int64_t i = 0; i < b; ++i) {
      GenerateRequest r;
      r.prompt.resize(static_cast<size_t>(prompt_len));
      for (int64_t p = 0; p < prompt_len; ++p)
        r.prompt[p] = static_cast<int32_t>((p * 7919 + i * 104729 + 17) % c.vocab_size);
      r.max_tokens = decode_tokens;
      reqs.push_back(std::move(r));
    }
    gen.run(reqs, {});  // warm-up
    gen.run(reqs, {});
    double prefill_tps = static_cast<double>(b * prompt_len) / gen.last_prefill_seconds();
    double decode_tps = static_cast<double>(b * gen.last_decode_steps()) / gen.last_decode_seconds();
    const double step_s = gen.last_decode_seconds() / static_cast<double>(gen.last_decode_steps());
    const double gpu_s = gen.last_decode_gpu_seconds() / static_cast<double>(gen.last_decode_steps());
    std::fprintf(
        stderr, "batch %ld%s: decode step %.3f ms, GPU time in it %.3f ms (%.1f%%), host %.3f ms\n",
        static_cast<long>(b),
        model->graphs_enabled() ? (host_argmax ? " (graphs, host argmax)" : " (graphs)") : " (eager)",
        1e3 * step_s, 1e3 * gpu_s, step_s > 0 ? 100 * gpu_s / step_s : 0.0, 1e3 * (step_s - gpu_s));
    std::fprintf(stderr, "batch %ld%s: prefill %.0f tok/s, decode %.1f tok/s (%.2f ms/step)\n",
                 static_cast<long>(b), model->graphs_enabled() ? " (graphs)" : " (eager)", prefill_tps,
                 decode_tps, 1e3 * gen.last_decode_seconds() / static_cast<double>(gen.last_decode_steps()));
    out["runs"].push_back({{"batch", b},
                           {"prefill_tok_per_s", prefill_tps},
                           {"decode_tok_per_s", decode_tps},
                           {"decode_ms_per_step", 1e3 * step_s},
                           {"decode_gpu_ms_per_step", 1e3 * gpu_s}});
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
