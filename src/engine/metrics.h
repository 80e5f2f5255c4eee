// engine/metrics.h: request-level serving metrics (histograms of time to first token, inter-token
// latency, end-to-end latency, queue / prefill / decode / inference time, prompt and generation lengths,
// tokens per engine step, request parameters), with Prometheus' cumulative buckets and vLLM's bounds.
// Recorded by the engine thread; read as snapshots. Must not: format HTTP responses.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace polylora {

struct HistogramSnapshot {
  std::vector<double> bounds;           // upper bounds, ascending (+Inf implied)
  std::vector<uint64_t> bucket_counts;  // [bounds.size() + 1], not cumulative
  double sum = 0;
  uint64_t count = 0;
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  const HistogramSnapshot& snapshot() const { return h_; }

 private:
  HistogramSnapshot h_;
};

struct MetricsSnapshot {
  HistogramSnapshot ttft, itl, e2e, prompt_tokens, generation_tokens;
  // Per request, as vLLM's: queue = first scheduled - arrival, prefill = first token - first scheduled,
  // decode = last token - first token, inference = last token - first scheduled.
  HistogramSnapshot queue_time, prefill_time, decode_time, inference_time;
  HistogramSnapshot iteration_tokens;  // prompt + generation tokens of each engine step
  HistogramSnapshot params_n, params_max_tokens;
  std::map<std::string, uint64_t> finished_by_reason;  // "stop", "length", "abort"
};

class Metrics {
 public:
  Metrics();
  Histogram ttft, itl, e2e, prompt_tokens, generation_tokens;
  Histogram queue_time, prefill_time, decode_time, inference_time;
  Histogram iteration_tokens;
  Histogram params_n, params_max_tokens;
  std::map<std::string, uint64_t> finished_by_reason;
  MetricsSnapshot snapshot() const;
};

}  // namespace polylora
