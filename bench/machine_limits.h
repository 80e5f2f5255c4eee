// bench/machine_limits.h: the machine's own limits, measured in the same run as the benchmarks that are
// judged against them: streaming-read memory bandwidth and multi-threaded OpenBLAS sgemm throughput.
// Must not: depend on polylora code (pure machine measurements).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace polylora::bench {

// Multi-threaded (OpenMP default threads) streaming read and sum over a 1 GiB buffer; best of several
// passes, in GB/s (1e9 bytes per second).
double measure_memory_bandwidth_gbs();

// OpenBLAS sgemm 2048×2048×2048 with OpenMP's default number of threads; best of several runs, in
// GFLOP/s. OpenBLAS's thread count is restored afterwards. Run it before OpenMP work (spinning threads).
double measure_sgemm_gflops();

// Seconds per call of fn: one warm-up call, then calls timed one by one until min_seconds or max_iters;
// the median, so that time slices lost to other processes on a shared machine do not skew it.
template <typename Fn>
double time_per_call(Fn&& fn, double min_seconds = 0.2, int max_iters = 1000) {
  using Clock = std::chrono::steady_clock;
  fn();
  std::vector<double> times;
  auto start = Clock::now();
  do {
    auto t0 = Clock::now();
    fn();
    auto t1 = Clock::now();
    times.push_back(std::chrono::duration<double>(t1 - t0).count());
  } while (std::chrono::duration<double>(Clock::now() - start).count() < min_seconds &&
           static_cast<int>(times.size()) < max_iters);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace polylora::bench
