// engine/metrics.cc: histograms with vLLM's bucket boundaries.
#include "engine/metrics.h"

#include <algorithm>

namespace polylora {

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
      e2e({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
           30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
      prompt_tokens({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      generation_tokens({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}) {
}

MetricsSnapshot Metrics::snapshot() const {
  return {ttft.snapshot(),
          itl.snapshot(),
          e2e.snapshot(),
          prompt_tokens.snapshot(),
          generation_tokens.snapshot(),
          finished_by_reason};
}

}  // namespace polylora
