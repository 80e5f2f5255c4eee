// bench/model_bench.cc: `polylora_bench model`: CPU prefill and decode throughput and peak memory of whole
// models (the fixture models and a larger one with dummy weights from a config), set against the
// machine's limits measured in the same run: OpenBLAS sgemm FLOP rate for prefill (compute bound) and
// memory bandwidth for decode (weight-read bound). Each model is driven through an Engine with greedy
// requests (bench/greedy_run.h). Reports measured numbers only.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_command.h"
#include "engine/engine.h"
#include "greedy_run.h"
#include "machine_limits.h"
#include "model/model.h"

namespace polylora::bench {
namespace {

namespace fs = std::filesystem;

// Peak resident memory (VmHWM) in bytes; reset_peak() restarts it (Linux clear_refs 5).
int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}
void reset_peak() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// Weight bytes one token reads at batch 1: everything but the embedding table (one row) and the experts
// not routed to (top-k of E per MoE layer).
double active_weight_bytes(const ModelConfig& c, double bytes_per_param) {
  double h = static_cast<double>(c.hidden_size);
  double params = static_cast<double>(c.vocab_size) * h;  // LM head
  for (int64_t l = 0; l < c.num_layers; ++l) {
    params += h * static_cast<double>(c.q_size()) * 2 + h * static_cast<double>(c.kv_size()) * 2;
    if (c.moe_layers[l])
      params += static_cast<double>(c.num_experts) * h + static_cast<double>(c.num_experts_per_tok) * 3 * h *
                                                             static_cast<double>(c.moe_intermediate_size);
    else
      params += 3 * h * static_cast<double>(c.intermediate_size);
  }
  return params * bytes_per_param;
}

// FLOPs of a forward over n tokens of one sequence (matrix products + attention scores).
double prefill_flops(const ModelConfig& c, int64_t n) {
  double per_token = active_weight_bytes(c, 1.0) * 2.0;  // 2 FLOPs per active parameter
  double attn = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    int64_t w = c.layer_window(l);
    double avg_ctx = w > 0 ? std::min<double>(static_cast<double>(w), static_cast<double>(n) / 2)
                           : static_cast<double>(n) / 2;
    attn += 4.0 * static_cast<double>(c.num_heads * c.head_dim) * avg_ctx;
  }
  return (per_token + attn) * static_cast<double>(n);
}

struct Row {
  std::string name;
  double params_m = 0, load_s = 0, prefill_tok_s = 0, prefill_gflops = 0, decode_tok_s = 0, decode_gbs = 0,
         decode8_tok_s = 0, peak_mb = 0;
  int64_t prefill_len = 0;
};

Row bench_model(const std::string& name, const std::string& dir, bool dummy, int64_t prefill_len,
                int64_t decode_len) {
  reset_peak();
  Row row;
  row.name = name;
  auto t0 = std::chrono::steady_clock::now();
  ModelLoadOptions opts;
  opts.load_format = dummy ? LoadFormat::kDummy : LoadFormat::kSafetensors;
  std::shared_ptr<Model> model = Model::load(dir, opts);
  row.load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const ModelConfig& c = model->config();
  row.params_m = static_cast<double>(c.num_parameters()) / 1e6;
  // Prefill: one prompt of prefill_len tokens; decode: batches of 1 and 8 after a 16-token prompt.
  constexpr int64_t kDecodePrompt = 16, kMaxBatch = 8, kBudget = 8192;
  EngineConfig ec;
  ec.cache.block_size = 16;
  ec.cache.enable_prefix_caching = false;
  ec.scheduler.max_num_seqs = kMaxBatch;
  ec.scheduler.max_num_batched_tokens = kBudget;
  ec.scheduler.max_model_len =
      std::max(prefill_len + greedy_run_max_tokens(1, prefill_len, kBudget, 0),
               kDecodePrompt + greedy_run_max_tokens(kMaxBatch, kDecodePrompt, kBudget, decode_len));
  ec.cache.num_kv_blocks = kMaxBatch * ((ec.scheduler.max_model_len + 15) / 16);
  Engine engine(model, ec, nullptr);
  auto prompt = [&](int64_t n, int64_t seed) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      p[i] = static_cast<int32_t>((i * 7919 + seed * 104729 + 13) % c.vocab_size);
    return p;
  };
  // Prefill: the steps until the prompt's first token (sampling it included).
  const std::vector<std::vector<int32_t>> pre = {prompt(prefill_len, 1)};
  run_greedy_batch(engine, *model, pre, 0, false);  // warm-up (page in weights)
  GreedyRunTiming pt = run_greedy_batch(engine, *model, pre, 0, false);
  row.prefill_len = prefill_len;
  row.prefill_tok_s = static_cast<double>(prefill_len) / pt.prefill_seconds;
  row.prefill_gflops = prefill_flops(c, prefill_len) / pt.prefill_seconds / 1e9;
  // Decode: decode_len steps at batch 1 and 8 once every prompt has its first token.
  for (int64_t batch : {int64_t{1}, kMaxBatch}) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t b = 0; b < batch; ++b) prompts.push_back(prompt(kDecodePrompt, b + 2));
    GreedyRunTiming t = run_greedy_batch(engine, *model, prompts, decode_len, false);
    double tok_s = static_cast<double>(t.decode_tokens) / t.decode_seconds;
    if (batch == 1) {
      row.decode_tok_s = tok_s;
      row.decode_gbs = tok_s * active_weight_bytes(c, 2.0) / 1e9;
    } else {
      row.decode8_tok_s = tok_s;
    }
  }
  row.peak_mb = static_cast<double>(peak_rss_bytes()) / 1e6;
  return row;
}

int run_model_bench(int argc, char** argv) {
  CLI::App app{"Whole-model CPU throughput against the machine's limits", "polylora_bench model"};
  std::string data = std::string(POLYLORA_SOURCE_DIR) + "/tests/data";
  std::string big = data + "/configs/qwen3-moe-1.6b";
  bool json_out = false, skip_big = false;
  int64_t big_prefill = 256, decode_len = 16;
  std::string json_path;
  app.add_option("--data", data, "Folder with models/<name>/ fixtures");
  app.add_option("--dummy-config", big, "Folder with a config.json for the dummy-weight model");
  app.add_option("--big-prefill", big_prefill, "Prompt length for the dummy-weight model");
  app.add_option("--decode-tokens", decode_len, "Decode steps per measurement");
  app.add_flag("--skip-big", skip_big, "Only the fixture models");
  app.add_flag("--json", json_out, "Print JSON instead of a table");
  app.add_option("--json-out", json_path, "Also write the JSON to this file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::fprintf(stderr, "measuring machine limits...\n");
  double gflops = measure_sgemm_gflops();
  double bandwidth = measure_memory_bandwidth_gbs();
  std::vector<Row> rows;
  for (const char* name : {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny"}) {
    std::fprintf(stderr, "benchmarking %s...\n", name);
    rows.push_back(bench_model(name, data + "/models/" + name, false, 256, decode_len));
  }
  if (!skip_big) {
    std::fprintf(stderr, "benchmarking %s (dummy weights)...\n", big.c_str());
    rows.push_back(
        bench_model(fs::path(big).filename().string() + " (dummy)", big, true, big_prefill, decode_len));
  }
  nlohmann::json j = {{"machine", {{"sgemm_gflops", gflops}, {"memory_bandwidth_gbs", bandwidth}}},
                      {"models", {}}};
  for (const Row& r : rows) {
    j["models"].push_back({{"name", r.name},
                           {"params_millions", r.params_m},
                           {"load_seconds", r.load_s},
                           {"prefill_tokens", r.prefill_len},
                           {"prefill_tok_per_s", r.prefill_tok_s},
                           {"prefill_gflops", r.prefill_gflops},
                           {"prefill_fraction_of_sgemm", r.prefill_gflops / gflops},
                           {"decode_batch1_tok_per_s", r.decode_tok_s},
                           {"decode_batch1_weight_gbs", r.decode_gbs},
                           {"decode_fraction_of_bandwidth", r.decode_gbs / bandwidth},
                           {"decode_batch8_tok_per_s", r.decode8_tok_s},
                           {"peak_rss_mb", r.peak_mb}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << j.dump(2) << "\n";
  if (json_out) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("machine: OpenBLAS sgemm %.1f GFLOP/s, memory bandwidth %.1f GB/s\n\n", gflops, bandwidth);
  std::printf("%-26s %8s %7s %10s %9s %7s %10s %8s %7s %10s %8s\n", "model", "params M", "load s",
              "prefill t/s", "GFLOP/s", "%sgemm", "decode t/s", "GB/s", "%bw", "dec8 t/s", "peak MB");
  for (const Row& r : rows)
    std::printf("%-26s %8.1f %7.2f %10.0f %9.1f %6.1f%% %10.1f %8.2f %6.1f%% %10.1f %8.0f\n", r.name.c_str(),
                r.params_m, r.load_s, r.prefill_tok_s, r.prefill_gflops, 100 * r.prefill_gflops / gflops,
                r.decode_tok_s, r.decode_gbs, 100 * r.decode_gbs / bandwidth, r.decode8_tok_s, r.peak_mb);
  return 0;
}

BenchRegistrar reg("model", "Whole-model CPU prefill/decode throughput and peak memory vs machine limits",
                   run_model_bench);

}  // namespace
}  // namespace polylora::bench
