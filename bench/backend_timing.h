// bench/backend_timing.h: timing ops queued on a Backend, and the backend's own copy bandwidth and bf16 GEMM
// rate measured in the same run (what the GPU benchmarks judge their bytes and FLOPs per second against).
// Must not: hold benchmark logic of its own op.
#pragma once

#include <functional>

#include "backend/backend.h"

namespace polylora::bench {

struct OpTiming {
  double seconds = 0;  // per call
  bool graph = false;  // timed as CUDA-graph replays
  int iters = 0;       // calls per timed batch
};

// Seconds per call of `fn` (ops queued on `be`). CUDA: three warm-up calls, then `fn` captured into one
// graph (when use_graphs and the backend supports it; else queued directly) and replayed `iters` times
// between two events, the median of 5 such batches. CPU (ops run at once): the wall-clock median of calls
// (machine_limits.h time_per_call, at most `iters` calls in about a second).
OpTiming time_backend_op(Backend& be, const std::function<void()>& fn, int iters, bool use_graphs);

// Device-to-device copy bandwidth of the backend in GB/s (1e9 bytes per second, read + write bytes): its
// gather_rows kernel over identity rows of 1 GiB (CUDA; 256 MiB on the CPU), best of 5.
double measure_backend_copy_gbs(Backend& be);

// The backend's dense bf16 product rate in TFLOP/s (1e12 multiply-adds × 2 per second): Backend::linear of
// an f32 [n, n] input by a BF16 [n, n] weight of random values (CUDA: the input cast to bf16, then cuBLAS
// with f32 accumulation; n above the hi + lo split's row bound), best of 3 timings (CUDA-graph replays).
// The GEMM peak the GPU benchmarks judge their tensor-core kernels against, measured in the same run; the
// cast is included, so it is a slight underestimate of cuBLAS's own rate.
double measure_backend_gemm_tflops(Backend& be, int64_t n = 8192);

}  // namespace polylora::bench
