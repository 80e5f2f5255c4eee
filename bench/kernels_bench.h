// bench/kernels_bench.h: what `polylora_bench kernels` (kernels_bench.cc, the CPU kernels) shares with its
// CUDA entries (kernels_bench_device.cc, --device cuda): one result row, the random inputs, the device run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace polylora::bench {

// One row of the table (or the JSON).
struct KernelResult {
  std::string name;
  std::string shape;
  double ms = 0.0;     // per call, fast path
  double value = 0.0;  // throughput in `unit`
  std::string unit;
  double pct = -1.0;      // of the machine limit (−1: not applicable)
  double speedup = -1.0;  // reference time / fast time (−1: not measured)
};

// Uniform in [−1, 1) from seed.
std::vector<float> random_floats(size_t n, uint32_t seed);
// bf16 bits of uniform values in [−0.05, 0.05).
std::vector<uint16_t> random_bf16(size_t n, uint32_t seed);
// `polylora_bench kernels --device cuda [--json]`.
int run_device_kernels(bool json);

}  // namespace polylora::bench
