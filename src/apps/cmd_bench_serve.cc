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
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "apps/command.h"
#include "bench_client/runner.h"
#include "common/error.h"
#include "config/hf_cache.h"

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

// KEY=VALUE items (--header, --metadata): split at the first '='.
std::vector<std::pair<std::string, std::string>> parse_key_values(const std::vector<std::string>& items,
                                                                  const char* flag) {
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) fail("{}: '{}' must be KEY=VALUE", flag, item);
    auto trim = [](std::string text) {
      size_t begin = text.find_first_not_of(" \t"), end = text.find_last_not_of(" \t");
      return begin == std::string::npos ? std::string() : text.substr(begin, end - begin + 1);
    };
    pairs.emplace_back(trim(item.substr(0, eq)), trim(item.substr(eq + 1)));
  }
  return pairs;
}

// A one-line progress bar on stderr (a terminal only), redrawn as requests finish, as vLLM's tqdm.
void draw_progress(size_t done, size_t total) {
  constexpr int kWidth = 40;
  int filled = total ? static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * kWidth) : kWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r%3zu%%|%s| %zu/%zu", total ? done * 100 / total : 100, bar.c_str(), done, total);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

std::string default_result_filename(const bench_client::BenchReport& report) {
  const auto& d = report.description;
  std::string rate = std::isinf(d.request_rate) ? "inf" : fmt::format("{}", d.request_rate);
  std::string concurrency = d.max_concurrency > 0 ? fmt::format("-concurrency{}", d.max_concurrency) : "";
  std::string model = d.model_id.substr(d.model_id.find_last_of('/') + 1);
  std::string label = d.label.empty() ? d.backend : d.label;
  return fmt::format("{}-{}qps{}-{}-{}.json", label, rate, concurrency, model, d.date);
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
  bool append_result = false, disable_tqdm = false;
  std::string backend = "vllm", ramp_up_strategy, label;
  std::vector<std::string> goodput, headers, metadata;
  std::optional<int64_t> sharegpt_output_len;
  auto& ds = config.datasets;

  app.add_option("--base-url", base_url,
                 "Server URL (default http://<host>:<port>); routes are appended to it");
  app.add_option("--host", host, "Server host when --base-url is not given")->capture_default_str();
  app.add_option("--port", port, "Server port when --base-url is not given")->capture_default_str();
  app.add_option("--backend", backend,
                 "vllm or openai: POST /v1/completions; openai-chat: POST /v1/chat/completions with messages")
      ->capture_default_str()
      ->check(CLI::IsMember({"vllm", "openai", "openai-chat"}));
  auto* endpoint_option = app.add_option(
      "--endpoint", config.client.endpoint,
      "API route (default: /v1/completions, or /v1/chat/completions for --backend openai-chat)");
  app.add_option("--model", config.model, "The model (default: the first id of GET /v1/models)");
  app.add_option("--served-model-name", config.served_model_name,
                 "The request's \"model\" field when it differs from --model");
  app.add_option("--tokenizer", config.tokenizer,
                 "tokenizer.json or model folder to count and make prompt tokens with (default: the server's "
                 "POST /tokenize)");
  app.add_option("--dataset-name", dataset_name,
                 "random, sharegpt, custom, sonnet, prefix_repetition or burstgpt (hf is refused: it downloads)")
      ->capture_default_str()
      ->check(CLI::IsMember({"random", "sharegpt", "custom", "sonnet", "prefix_repetition", "burstgpt", "hf"}));
  app.add_option("--dataset-path", ds.path,
                 "The dataset file (sharegpt: JSON, custom: JSONL, sonnet: text, burstgpt: the BurstGPT CSV)");
  // vLLM flags with nothing to do here (the tokenizer is tokenizer.json; readiness is the initial test).
  std::string ignored_value;
  bool ignored_switch = false;
  app.add_option("--tokenizer-mode", ignored_value, "(vLLM; accepted: tokenizer.json is always used)");
  app.add_flag("--trust-remote-code", ignored_switch, "(vLLM; accepted: no remote code)");
  app.add_option("--ready-check-timeout-sec", ignored_value,
                 "(vLLM; accepted: the first request, sent alone, checks the server)");
  app.add_option("--sharegpt-output-len", sharegpt_output_len,
                 "Output tokens per ShareGPT request (default: the gpt turn's length)");
  app.add_option("--custom-output-len", ds.custom_output_len, "Output tokens per custom request")
      ->capture_default_str();
  app.add_flag("--custom-skip-chat-template", ds.custom_skip_chat_template,
               "Send custom prompts as they are (default: the --tokenizer's chat template, as vLLM)");
  app.add_option("--sonnet-input-len", ds.sonnet_input_len, "Input tokens per sonnet request")
      ->capture_default_str();
  app.add_option("--sonnet-output-len", ds.sonnet_output_len, "Output tokens per sonnet request")
      ->capture_default_str();
  app.add_option("--sonnet-prefix-len", ds.sonnet_prefix_len, "Tokens of the shared sonnet prefix")
      ->capture_default_str();
  app.add_option("--prefix-repetition-prefix-len", ds.prefix_repetition_prefix_len, "Tokens per shared prefix")
      ->capture_default_str();
  app.add_option("--prefix-repetition-suffix-len", ds.prefix_repetition_suffix_len, "Tokens per unique suffix")
      ->capture_default_str();
  app.add_option("--prefix-repetition-num-prefixes", ds.prefix_repetition_num_prefixes, "Distinct prefixes")
      ->capture_default_str();
  app.add_option("--prefix-repetition-output-len", ds.prefix_repetition_output_len, "Output tokens per request")
      ->capture_default_str();
  app.add_option("--random-prefix-len", config.dataset.prefix_len,
                 "Tokens of a random prefix shared by every random prompt (before the drawn length)")
      ->capture_default_str();
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
  app.add_option("--ramp-up-strategy", ramp_up_strategy,
                 "linear or exponential: the rate ramps from --ramp-up-start-rps to --ramp-up-end-rps "
                 "(instead of --request-rate)")
      ->check(CLI::IsMember({"linear", "exponential"}));
  app.add_option("--ramp-up-start-rps", config.ramp_up_start_rps, "Requests per second at the start");
  app.add_option("--ramp-up-end-rps", config.ramp_up_end_rps, "Requests per second at the end");
  app.add_option("--goodput", goodput,
                 "SLOs as KEY:VALUE in ms (ttft, tpot, e2el), e.g. --goodput ttft:200 tpot:50")
      ->expected(1, -1);
  app.add_option("--num-warmups", config.num_warmups, "Warm-up requests before the run (not measured)")
      ->capture_default_str();
  app.add_option("--header", headers, "KEY=VALUE HTTP header sent on every request (repeatable)")
      ->expected(1, -1);
  app.add_option("--label", label, "The result's label and file-name prefix (default: the backend)");
  app.add_option("--metadata", metadata, "KEY=VALUE pairs saved in the result JSON")->expected(1, -1);
  app.add_flag("--append-result", append_result, "Append the result to the file as one JSON line");
  app.add_flag("--disable-tqdm", disable_tqdm, "No progress bar (shown only when stderr is a terminal)");
  app.add_option("--top-p", config.client.top_p, "top_p sent with every request");
  app.add_option("--top-k", config.client.top_k, "top_k sent with every request");
  app.add_option("--min-p", config.client.min_p, "min_p sent with every request");
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
      "Send ignore_eos (vLLM's extension) so every output runs to its max_tokens (default off, as vLLM)");
  app.add_option("--temperature", config.client.temperature, "Sampling temperature")->capture_default_str();
  std::string extra_body;
  app.add_option("--extra-body", extra_body,
                 "JSON object merged into every request body (vLLM's flag), e.g. "
                 "'{\"response_format\": {\"type\": \"json_schema\", ...}}'");
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

  config.backend = backend;
  if (!extra_body.empty()) config.client.extra_body = bench_client::parse_extra_body(extra_body);
  if (endpoint_option->count() == 0)
    config.client.endpoint = backend == "openai-chat" ? "/v1/chat/completions" : "/v1/completions";
  auto kind = bench_client::endpoint_kind(config.client.endpoint);
  if (backend == "openai-chat" && kind != bench_client::EndpointKind::kChatCompletions)
    fail("--backend openai-chat needs an --endpoint ending in chat/completions (got {})", config.client.endpoint);
  if (backend != "openai-chat" && kind != bench_client::EndpointKind::kCompletions)
    fail("--backend {} needs an --endpoint ending in /completions (got {}); use --backend openai-chat for chat",
         backend, config.client.endpoint);
  if (dataset_name == "hf")
    fail("--dataset-name hf loads a Hugging Face dataset with Python's `datasets` library, which polylora bench "
         "does not have (and it downloads); export the prompts to a JSONL file of {{\"prompt\": ...}} lines and "
         "use --dataset-name custom, or a ShareGPT JSON with --dataset-name sharegpt");
  if (!config.tokenizer.empty() && !std::filesystem::exists(config.tokenizer))  // a hub id, from the local cache
    config.tokenizer = resolve_model_path(config.tokenizer, "main", "tokenizer");
  ds.name = dataset_name;
  ds.sharegpt_output_len = sharegpt_output_len;
  config.goodput = bench_client::parse_goodput(goodput);
  config.client.headers = parse_key_values(headers, "--header");
  if (!ramp_up_strategy.empty()) {
    config.ramp_up = bench_client::parse_ramp_up(ramp_up_strategy);
    if (app.get_option("--ramp-up-start-rps")->count() == 0 || app.get_option("--ramp-up-end-rps")->count() == 0)
      fail("--ramp-up-strategy needs --ramp-up-start-rps and --ramp-up-end-rps");
  } else if (app.get_option("--ramp-up-start-rps")->count() || app.get_option("--ramp-up-end-rps")->count()) {
    fail("--ramp-up-start-rps and --ramp-up-end-rps need --ramp-up-strategy");
  }
  if (!disable_tqdm && isatty(STDERR_FILENO)) config.progress = draw_progress;
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
  report.description.label = label;
  for (const auto& [key, value] : parse_key_values(metadata, "--metadata")) report.description.metadata[key] = value;
  std::string summary = bench_client::format_summary(report.description, report.metrics, report.duration_s,
                                                     config.selected_metrics);
  std::fwrite(summary.data(), 1, summary.size(), stdout);
  std::map<std::string, size_t> errors;
  for (const auto& outcome : report.outcomes) {
    if (!outcome.success) ++errors[outcome.error];
  }
  for (const auto& [error, count] : errors) std::printf("failed x%zu: %s\n", count, error.c_str());

  if (save_result || append_result || !result_filename.empty()) {
    std::string path = result_filename.empty() ? default_result_filename(report) : result_filename;
    if (!result_dir.empty()) path = result_dir + "/" + path;
    nlohmann::json result =
        bench_client::result_json(report.description, report.metrics, report.duration_s, report.outcomes,
                                  config.selected_metrics, save_detailed);
    // --append-result: one JSON document per line (vLLM writes a newline first when the file is not empty).
    std::ifstream existing(path, std::ios::binary | std::ios::ate);
    bool non_empty = append_result && existing && existing.tellg() > 0;
    std::ofstream out(path, append_result ? std::ios::app : std::ios::trunc);
    if (!out) fail("--result-filename: cannot write {}", path);
    if (append_result) {
      out << (non_empty ? "\n" : "") << result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } else {
      out << result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    }
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
