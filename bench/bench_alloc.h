// bench/bench_alloc.h: what the device kernel benchmarks (moe-lora, tune) share: deterministic random
// values, host tensors in F32 or BF16, backend allocations freed at the end, and small helpers.
// Must not: hold benchmark logic of its own op.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/dtype.h"

namespace polylora::bench {

// splitmix64: fast deterministic values for the ~100 M LoRA and activation numbers.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform with mean 0 and standard deviation `stddev`.
  float uniform(float stddev) {
    float u = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (2.0f * u - 1.0f) * 1.7320508f * stddev;
  }
};

// A host tensor in F32 or BF16.
struct HostTensor {
  DType dtype = DType::kBF16;
  std::vector<float> f;
  std::vector<uint16_t> h;
  HostTensor(DType d, size_t n, float stddev, uint64_t seed) : dtype(d) {
    Rng rng(seed);
    if (d == DType::kBF16) {
      h.resize(n);
      for (auto& v : h) v = f32_to_bf16(rng.uniform(stddev));
    } else {
      f.resize(n);
      for (auto& v : f) v = rng.uniform(stddev);
    }
  }
  const void* data() const {
    return dtype == DType::kBF16 ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
  }
  size_t bytes() const { return (dtype == DType::kBF16 ? h.size() : f.size()) * dtype_size(dtype); }
};

// Backend allocations of the benchmark, freed at the end.
class Device {
 public:
  explicit Device(Backend& be) : be_(be) {}
  ~Device() {
    be_.synchronize();
    for (void* p : ptrs_) be_.free(p);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  void* up(const void* src, size_t bytes) {
    void* p = be_.alloc(std::max<size_t>(bytes, 1));
    ptrs_.push_back(p);
    be_.copy_to_device(p, src, bytes);
    return p;
  }
  template <typename T>
  T* up(const std::vector<T>& v) {
    return static_cast<T*>(up(v.data(), v.size() * sizeof(T)));
  }
  float* zeros(size_t n) {
    void* p = be_.alloc(std::max<size_t>(n, 1) * sizeof(float));
    ptrs_.push_back(p);
    return static_cast<float*>(p);
  }

 private:
  Backend& be_;
  std::vector<void*> ptrs_;
};

inline double rms(const std::vector<float>& v) {
  double sq = 0;
  for (float x : v) sq += double(x) * x;
  return v.empty() ? 0.0 : std::sqrt(sq / static_cast<double>(v.size()));
}

inline std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace polylora::bench
