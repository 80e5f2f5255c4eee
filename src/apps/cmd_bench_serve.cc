// apps/cmd_bench_serve.cc: `polylora bench <benchmark>`; today `polylora bench serve`, a load generator for
// any OpenAI-compatible server with vLLM's `vllm bench serve` flags, summary and result JSON.
// Must not: hold benchmark logic (bench_client/ owns workload, HTTP, metrics; this turns flags into calls).
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "apps/command.h"
#include "bench_client/runner.h"
#include "common/error.h"

namespace polylora::apps {
namespace {

using bench_client::BenchConfig;

std::vector<std::string> split_csv(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    size_t begin = item.find_first_not_of(" \t"), end = item.find_last_not_of(" \t");
    if (begin != std::string::npos) items.push_back(item.substr(begin, end - begin + 1));
  }
  return items;
}

std::vector<double> parse_percentiles(const std::string& text) {
  std::vector<double> percentiles;
  for (const auto& item : split_csv(text)) {
    try {
      size_t used = 0;
      double p = std::stod(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      percentiles.push_back(p);
    } catch (const std::exception&) {
      fail("--metric-percentiles: '{}' is not a number (expected e.g. 50,90,99)", item);
    }
  }
  // The summary always reports P99, as vLLM's default does; the requested ones come in addition.
  if (std::find(percentiles.begin(), percentiles.end(), 99.0) == percentiles.end())
    percentiles.push_back(99.0);
  std::sort(percentiles.begin(), percentiles.end());
  return percentiles;
}

std::string default_result_filename(const bench_client::BenchReport& report) {
  const auto& d = report.description;
  std::string rate = std::isinf(d.request_rate) ? "inf" : fmt::format("{}", d.request_rate);
  std::string concurrency = d.max_concurrency > 0 ? fmt::format("-concurrency{}", d.max_concurrency) : "";
  std::string model = d.model_id.substr(d.model_id.find_last_of('/') + 1);
  return fmt::format("polylora-{}qps{}-{}-{}.json", rate, concurrency, model, d.date);
}

int run_serve(int argc, char** argv) {
  CLI::App app{
      "Benchmark the online serving throughput and latency of an OpenAI-compatible server "
      "(polylora, vLLM, ...), as `vllm bench serve` does",
      "polylora bench serve"};
  app.get_formatter()->column_width(40);
  BenchConfig config;
  std::string base_url, host = "127.0.0.1", dataset_name = "random", lora_assignment = "round-robin";
  std::string percentile_metrics = "ttft,tpot,itl,e2el", metric_percentiles = "99";
  std::string result_filename, result_dir;
  int port = 8000;
  std::string request_rate = "inf";
  bool save_result = false, save_detailed = false, no_tokenize = false, skip_initial_test = false;

  app.add_option("--base-url", base_url,
                 "Server URL (default http://<host>:<port>); routes are appended to it");
  app.add_option("--host", host, "Server host when --base-url is not given")->capture_default_str();
  app.add_option("--port", port, "Server port when --base-url is not given")->capture_default_str();
  app.add_option("--endpoint", config.client.endpoint, "API route: /v1/completions or /v1/chat/completions")
      ->capture_default_str();
  app.add_option("--model", config.model, "The request's model (default: the first id of GET /v1/models)");
  app.add_option("--dataset-name", dataset_name, "Dataset; only 'random' is supported")
      ->capture_default_str()
      ->check(CLI::IsMember({"random"}));
  app.add_option("--num-prompts", config.dataset.num_prompts, "Number of requests")->capture_default_str();
  app.add_option("--random-input-len", config.dataset.input_len, "Input tokens per request")
      ->capture_default_str();
  app.add_option("--random-output-len", config.dataset.output_len, "Output tokens per request (max_tokens)")
      ->capture_default_str();
  app.add_option("--random-range-ratio", config.dataset.range_ratio,
                 "Lengths are drawn from [len*(1-r), len*(1+r)], r in [0, 1)")
      ->capture_default_str();
  app.add_option("--request-rate", request_rate,
                 "Requests per second, Poisson arrivals (gamma with --burstiness); inf sends all at once")
      ->capture_default_str();
  app.add_option("--burstiness", config.burstiness, "Gamma shape of the arrival gaps; 1 is a Poisson process")
      ->capture_default_str();
  app.add_option("--max-concurrency", config.max_concurrency,
                 "Most requests in flight at once (default: no limit)");
  app.add_option("--seed", config.dataset.seed, "Random seed (prompts, lengths, arrivals, adapters)")
      ->capture_default_str();
  app.add_option("--lora-modules", config.lora_modules,
                 "LoRA adapter names; each request's model is one of them (see --lora-assignment)")
      ->expected(1, -1);
  app.add_option("--lora-assignment", lora_assignment, "How requests get adapters: round-robin or random")
      ->capture_default_str()
      ->check(CLI::IsMember({"round-robin", "random"}));
  app.add_option("--api-key", config.client.api_key, "Bearer token (default: $OPENAI_API_KEY)");
  app.add_flag(
      "--ignore-eos,!--no-ignore-eos", config.client.ignore_eos,
      "Send ignore_eos (vLLM's extension) so every output has --random-output-len tokens (default on)");
  app.add_option("--temperature", config.client.temperature, "Sampling temperature")->capture_default_str();
  app.add_option("--request-timeout", config.client.timeout_s, "Seconds a request may wait for data")
      ->capture_default_str();
  app.add_option("--percentile-metrics", percentile_metrics, "Metrics to report: any of ttft,tpot,itl,e2el")
      ->capture_default_str();
  app.add_option("--metric-percentiles", metric_percentiles,
                 "Percentiles to report besides mean and median "
                 "(P99 is always reported), e.g. 50,90,99")
      ->capture_default_str();
  app.add_flag("--save-result", save_result, "Write the result JSON");
  app.add_flag("--save-detailed", save_detailed,
               "Also save per-request lengths, TTFTs, ITLs, texts and errors");
  app.add_option("--result-filename", result_filename,
                 "Result file (default: polylora-<rate>qps-<model>-<date>.json)");
  app.add_option("--result-dir", result_dir, "Folder for the result file (default: the current folder)");
  app.add_flag("--no-tokenize", no_tokenize,
               "Use random-word prompts even when the server has POST /tokenize");
  app.add_flag("--skip-initial-test", skip_initial_test,
               "Do not send the first request alone before the run");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  config.client.base_url = base_url.empty() ? fmt::format("http://{}:{}", host, port) : base_url;
  if (config.client.api_key.empty()) {
    if (const char* key = std::getenv("OPENAI_API_KEY")) config.client.api_key = key;
  }
  try {
    size_t used = 0;
    config.request_rate = std::stod(request_rate, &used);
    if (used != request_rate.size()) throw std::invalid_argument(request_rate);
  } catch (const std::exception&) {
    fail("--request-rate: '{}' is not a number or inf", request_rate);
  }
  config.lora_assignment = *bench_client::parse_adapter_assignment(lora_assignment);
  config.selected_metrics = split_csv(percentile_metrics);
  config.percentiles = parse_percentiles(metric_percentiles);
  config.use_tokenize = !no_tokenize;
  config.initial_test = !skip_initial_test;

  auto log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  bench_client::BenchReport report = bench_client::run_benchmark(config, log);
  std::string summary = bench_client::format_summary(report.description, report.metrics, report.duration_s,
                                                     config.selected_metrics);
  std::fwrite(summary.data(), 1, summary.size(), stdout);
  std::map<std::string, size_t> errors;
  for (const auto& outcome : report.outcomes) {
    if (!outcome.success) ++errors[outcome.error];
  }
  for (const auto& [error, count] : errors) std::printf("failed x%zu: %s\n", count, error.c_str());

  if (save_result || !result_filename.empty()) {
    std::string path = result_filename.empty() ? default_result_filename(report) : result_filename;
    if (!result_dir.empty()) path = result_dir + "/" + path;
    nlohmann::json result =
        bench_client::result_json(report.description, report.metrics, report.duration_s, report.outcomes,
                                  config.selected_metrics, save_detailed);
    std::ofstream out(path);
    if (!out) fail("--result-filename: cannot write {}", path);
    out << result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!out) fail("--result-filename: writing {} failed", path);
    std::printf("Saved the result to %s\n", path.c_str());
  }
  return report.metrics.completed > 0 ? 0 : 1;
}

// `polylora bench <benchmark> ...`: the benchmarks by name; add one here to extend `bench`.
struct Benchmark {
  const char* name;
  const char* help;
  int (*run)(int argc, char** argv);
};
constexpr Benchmark kBenchmarks[] = {
    {"serve", "Load-test an OpenAI-compatible server (vLLM's `bench serve`)", run_serve},
};

int run_bench(int argc, char** argv) {
  if (argc >= 2) {
    for (const auto& benchmark : kBenchmarks) {
      if (!std::strcmp(argv[1], benchmark.name)) return benchmark.run(argc - 1, argv + 1);
    }
  }
  bool help = argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"));
  if (argc >= 2 && !help) std::fprintf(stderr, "polylora bench: unknown benchmark '%s'\n\n", argv[1]);
  std::fprintf(help ? stdout : stderr, "usage: polylora bench <benchmark> [options]\n\nbenchmarks:\n");
  for (const auto& benchmark : kBenchmarks) {
    std::fprintf(help ? stdout : stderr, "  %-10s %s\n", benchmark.name, benchmark.help);
  }
  return help ? 0 : 2;
}

const Registrar kRegistrar("bench", "Benchmarks: `bench serve` load-tests an OpenAI-compatible server",
                           run_bench);

}  // namespace
}  // namespace polylora::apps
