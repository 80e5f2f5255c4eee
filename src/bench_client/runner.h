// bench_client/runner.h: runs a serving benchmark end to end: resolves the model, builds the random
// workload (token-id prompts when the server has /tokenize), sends it on the arrival schedule with at
// most max_concurrency requests in flight, and computes the metrics.
// Owns: the dispatch loop and its worker threads (one per in-flight request, reused when idle).
// Must not: print or write files itself (it reports through the log callback; apps/ prints and saves).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_client/metrics.h"
#include "bench_client/openai_client.h"
#include "bench_client/workload.h"

namespace polylora::bench_client {

struct BenchConfig {
  ClientOptions client;
  std::string backend = "vllm";  // vllm | openai (completions) | openai-chat; for the report
  std::string model;  // empty: the first id of GET /v1/models
  std::string served_model_name;  // --served-model-name: the "model" field sent (default: model)
  std::string tokenizer;  // --tokenizer: a tokenizer.json or model folder; empty: the server's /tokenize
  RandomDatasetConfig dataset;
  DatasetOptions datasets;  // name and the options of the non-random datasets (num_prompts, seed copied)
  GoodputSlos goodput;      // --goodput
  int64_t num_warmups = 0;  // --num-warmups: copies of the first request sent before the run
  std::optional<RampUp> ramp_up;  // --ramp-up-strategy (replaces --request-rate)
  double ramp_up_start_rps = 0, ramp_up_end_rps = 0;
  std::function<void(size_t done, size_t total)> progress;  // called as requests finish (serialized)
  std::vector<std::string> lora_modules;  // non-empty: each request's "model" is one of these
  AdapterAssignment lora_assignment = AdapterAssignment::kRoundRobin;
  double request_rate = INFINITY;  // requests per second; inf sends everything at once
  double burstiness = 1.0;         // gamma shape of the inter-arrival gaps (1: Poisson)
  int64_t max_concurrency = 0;     // 0: unlimited
  std::vector<std::string> selected_metrics = {"ttft", "tpot", "itl", "e2el"};
  std::vector<double> percentiles = {99};
  bool use_tokenize = true;  // token-id prompts when the server has POST /tokenize (completions only)
  bool initial_test = true;  // send the first request alone first and stop if it fails (as vLLM does)
};

struct BenchReport {
  BenchDescription description;
  std::vector<RequestOutcome> outcomes;  // in request order
  BenchMetrics metrics;
  double duration_s = 0;
};

using LogFn = std::function<void(const std::string& line)>;

// Sends requests[i] at arrivals[i] seconds after the start (later if max_concurrency requests are in
// flight); returns the outcomes in request order and sets duration_s to the wall time of the whole run.
// on_done(num_done) is called after each request finishes (from worker threads, serialized).
std::vector<RequestOutcome> run_requests(const ClientOptions& client,
                                         const std::vector<BenchRequest>& requests,
                                         const std::vector<double>& arrivals, int64_t max_concurrency,
                                         double& duration_s,
                                         const std::function<void(size_t num_done)>& on_done = {});

// The whole benchmark. Fails (polylora::Error) on bad configuration, an unreachable server, or a failed
// initial test request; failures during the run are counted in the report instead.
BenchReport run_benchmark(const BenchConfig& config, const LogFn& log);

}  // namespace polylora::bench_client
