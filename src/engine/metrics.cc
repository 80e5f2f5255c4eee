// engine/metrics.cc: histograms with vLLM's bucket boundaries.
#include "engine/metrics.h"

#include <algorithm>

namespace polylora {

namespace {

// vLLM's request_latency_buckets (e2e, queue, prefill, decode, inference).
std::vector<double> latency_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

// vLLM's build_1_2_5_buckets, up to 100000 tokens.
std::vector<double> buckets_1_2_5() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) {
  h_.bounds = std::move(bounds);
  h_.bucket_counts.assign(h_.bounds.size() + 1, 0);
}

void Histogram::observe(double value) {
  size_t i =
      static_cast<size_t>(std::lower_bound(h_.bounds.begin(), h_.bounds.end(), value) - h_.bounds.begin());
  ++h_.bucket_counts[i];
  h_.sum += value;
  ++h_.count;
}

Metrics::Metrics()
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
            1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
           40.0, 80.0}),
      e2e(latency_buckets()),
      prompt_tokens(buckets_1_2_5()),
      generation_tokens(buckets_1_2_5()),
      queue_time(latency_buckets()),
      prefill_time(latency_buckets()),
      decode_time(latency_buckets()),
      inference_time(latency_buckets()),
      iteration_tokens({1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}),
      params_n({1, 2, 5, 10, 20}),
      params_max_tokens(buckets_1_2_5()) {}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot s;
  s.ttft = ttft.snapshot();
  s.itl = itl.snapshot();
  s.e2e = e2e.snapshot();
  s.prompt_tokens = prompt_tokens.snapshot();
  s.generation_tokens = generation_tokens.snapshot();
  s.queue_time = queue_time.snapshot();
  s.prefill_time = prefill_time.snapshot();
  s.decode_time = decode_time.snapshot();
  s.inference_time = inference_time.snapshot();
  s.iteration_tokens = iteration_tokens.snapshot();
  s.params_n = params_n.snapshot();
  s.params_max_tokens = params_max_tokens.snapshot();
  s.finished_by_reason = finished_by_reason;
  return s;
}

}  // namespace polylora
