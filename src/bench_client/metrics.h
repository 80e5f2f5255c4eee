// bench_client/metrics.h: per-request outcomes of a serving benchmark and the aggregate metrics computed
// from them, with vLLM's `vllm bench serve` definitions, summary table and result-JSON keys.
// Owns: TTFT/TPOT/ITL/E2EL statistics (mean, median, std, percentiles as numpy's linear interpolation),
// throughputs, peak per-second rates, the printed summary and the JSON document.
// Must not: do I/O beyond formatting strings (the caller prints and writes files) or know about HTTP.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace polylora::bench_client {

// What happened to one request (vLLM's RequestFuncOutput). Times are seconds; start_time is measured from
// the benchmark start, the others from the request's own start.
struct RequestOutcome {
  bool success = false;
  std::string error;           // why it failed (HTTP status and body, transport error, bad stream)
  std::string generated_text;  // concatenated streamed text
  std::string model;           // the "model" field that was sent
  int64_t prompt_len = 0;      // input tokens: usage.prompt_tokens when the server sent it, else planned
  int64_t output_tokens = 0;   // usage.completion_tokens, else the number of content chunks
  double start_time = 0;       // when the request was sent, relative to the benchmark start
  double ttft = 0;             // request start → first content chunk
  double latency = 0;          // request start → last content chunk (end-to-end latency)
  std::vector<double> itl;     // gaps between consecutive content chunks
};

// Mean, median, standard deviation and the requested percentiles of one latency metric, in ms.
struct LatencyStats {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (percentile in [0, 100], value)
};

struct BenchMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0;       // completed requests / duration
  double output_throughput = 0;        // output tokens / duration
  double total_token_throughput = 0;   // (input + output tokens) / duration
  double max_output_tokens_per_s = 0;  // busiest one-second bucket of content chunks
  double max_concurrent_requests = 0;  // most requests in flight within one second bucket
  std::optional<double> request_goodput;  // --goodput: completed requests meeting every SLO / duration
  LatencyStats ttft;
  LatencyStats tpot;  // per request: (e2el - ttft) / (output_tokens - 1), requests with > 1 token
  LatencyStats itl;   // every inter-chunk gap of every request
  LatencyStats e2el;
};

// numpy.percentile(values, p) with linear interpolation; 0 for an empty list (vLLM's `values or 0`).
double percentile(std::vector<double> values, double p);

// Statistics of values (seconds) in ms.
LatencyStats latency_stats(const std::vector<double>& values_s, const std::vector<double>& percentiles);

// vLLM's --goodput SLOs: metric ("ttft", "tpot", "e2el") → limit in ms.
using GoodputSlos = std::map<std::string, double>;

// Parses vLLM's --goodput items ("ttft:200", "tpot:50", "e2el:1000"); fails on unknown metrics or
// values that are not non-negative numbers.
GoodputSlos parse_goodput(const std::vector<std::string>& items);

// With non-empty slos, request_goodput counts the completed requests whose ttft, tpot (0 for a single
// output token, as vLLM) and e2el are all within their limits (<=), divided by the duration.
BenchMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                             const std::vector<double>& percentiles, const GoodputSlos& slos = {});

// The metrics the summary and the JSON report on ("ttft", "tpot", "itl", "e2el").
bool is_known_metric(const std::string& name);

// What the benchmark was, for the summary and the JSON header.
struct BenchDescription {
  std::string backend;  // "openai" (completions) or "openai-chat"
  std::string model_id;
  std::string endpoint;
  int64_t num_prompts = 0;
  double request_rate = 0;  // inf for all at once
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0: unlimited
  std::vector<std::string> lora_modules;
  std::string lora_assignment;
  std::string date;  // YYYYmmdd-HHMMSS
  std::string label;         // --label (default: the backend)
  std::string tokenizer_id;  // --tokenizer, else the model id
  std::string ramp_up_strategy;  // "" when no ramp-up
  double ramp_up_start_rps = 0, ramp_up_end_rps = 0;
  nlohmann::json metadata = nlohmann::json::object();  // --metadata KEY=VALUE, merged into the JSON
};

// vLLM's summary table ("============ Serving Benchmark Result ============" ...), newline-terminated.
std::string format_summary(const BenchDescription& description, const BenchMetrics& metrics,
                           double duration_s, const std::vector<std::string>& selected_metrics);

// vLLM's result JSON: description keys, duration, completed, total_input_tokens, total_output_tokens,
// request_throughput, output_throughput, total_token_throughput, and {mean,median,std,pNN}_<metric>_ms for
// each selected metric; with detailed, also input_lens, output_lens, ttfts, itls, generated_texts, errors.
nlohmann::json result_json(const BenchDescription& description, const BenchMetrics& metrics,
                           double duration_s, const std::vector<RequestOutcome>& outcomes,
                           const std::vector<std::string>& selected_metrics, bool detailed);

// "99" for 99.0, "99.9" for 99.9 (vLLM's p_word).
std::string percentile_word(double p);

}  // namespace polylora::bench_client
