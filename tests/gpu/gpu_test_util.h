// tests/gpu/gpu_test_util.h: shared helpers of the GPU op tests: the CUDA backends (BF16 and F32 weights),
// uploads and downloads through the Backend interface, and the per-dtype tolerances.
// Tolerances (atol + rtol·|ref|): F32 weights kF32Tol (fp32 products in another summation order);
// BF16 weights with atol multiplied by max(1, rms(ref)) (the reference gets the same bf16 weights; the
// error scales with the size of the terms, not with |ref| of one element, which may cancel to ~0):
// kBf16SplitTol when activations enter as hi + lo bf16 pairs (the default; up to 2^-17 relative per term),
// kBf16Tol when they are rounded to one bf16 (up to 2^-9 per term).
// Must not: hold test logic of its own op.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"
#include "kernels/kernel_test_util.h"

namespace polylora::gpu_test {

struct Tol {
  float atol, rtol;
};
constexpr Tol kF32Tol{1e-4f, 1e-4f};
constexpr Tol kBf16Tol{2e-2f, 2e-2f};
constexpr Tol kBf16SplitTol{5e-4f, 5e-4f};

// A backend configuration the weight-product tests run under.
struct Mode {
  DType dtype;  // weight dtype
  bool split;   // BF16: every product splits activations (hi + lo) or none does
  const char* name;
};
constexpr Mode kF32Mode{DType::kF32, true, "f32"};
constexpr Mode kBf16Mode{DType::kBF16, true, "bf16 (hi+lo)"};
constexpr Mode kBf16RoundMode{DType::kBF16, false, "bf16 (rounded)"};
constexpr Mode kModes[] = {kF32Mode, kBf16Mode, kBf16RoundMode};

inline Tol tol_for(const Mode& m) {
  if (m.dtype == DType::kF32) return kF32Tol;
  return m.split ? kBf16SplitTol : kBf16Tol;
}

// expect_close with the tolerance of the backend configuration (see above).
inline void expect_close_for(const Mode& mode, const std::vector<float>& got, const std::vector<float>& ref,
                             const std::string& what) {
  Tol t = tol_for(mode);
  if (mode.dtype != DType::kF32) {
    double sq = 0;
    for (float v : ref) sq += double(v) * v;
    float rms = ref.empty() ? 0.0f : static_cast<float>(std::sqrt(sq / ref.size()));
    t.atol *= std::max(1.0f, rms);
  }
  kernels::test::expect_close(got, ref, t.atol, t.rtol,
                              std::string(mode.name) + " " + what + " (atol " + std::to_string(t.atol) + ")");
}

#define SKIP_WITHOUT_GPU() \
  if (::polylora::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine"

// One backend per configuration for the whole test binary.
inline Backend& backend(DType weight_dtype = DType::kBF16, bool bf16_split = true) {
  static std::map<std::pair<DType, bool>, std::unique_ptr<Backend>> backends;
  auto& be = backends[{weight_dtype, bf16_split}];
  if (!be)
    be = make_cuda_backend({.device = DeviceKind::kCuda,
                            .device_index = 0,
                            .weight_dtype = weight_dtype,
                            .bf16_split_max_rows = bf16_split ? INT64_MAX : 0});
  return *be;
}
inline Backend& backend(const Mode& m) {
  return backend(m.dtype, m.split);
}

// Device allocations of one test, freed at scope end.
class Arena {
 public:
  explicit Arena(Backend& be) : be_(be) {}
  ~Arena() {
    be_.synchronize();
    for (void* p : ptrs_) be_.free(p);
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  template <typename T>
  T* up(const std::vector<T>& v) {
    void* p = be_.alloc(std::max<size_t>(1, v.size()) * sizeof(T));
    ptrs_.push_back(p);
    be_.copy_to_device(p, v.data(), v.size() * sizeof(T));
    return static_cast<T*>(p);
  }
  template <typename T>
  T* zeros(size_t n) {
    void* p = be_.alloc(std::max<size_t>(1, n) * sizeof(T));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> down(const T* p, size_t n) {
    std::vector<T> v(n);
    be_.copy_to_host(v.data(), p, n * sizeof(T));
    return v;
  }
  // Raw copy of a host weight (no conversion): the kernels read any float dtype.
  kernels::WeightView raw_weight(const kernels::WeightView& w) {
    size_t bytes = static_cast<size_t>(w.rows * w.cols) * dtype_size(w.dtype);
    void* p = be_.alloc(bytes);
    ptrs_.push_back(p);
    be_.copy_to_device(p, w.data, bytes);
    return {p, w.dtype, w.rows, w.cols};
  }
  // Through the backend (converted to its weight dtype); freed with the arena.
  kernels::WeightView weight(const kernels::WeightView& w) {
    kernels::WeightView d = be_.matrix_from_host(w);
    ptrs_.push_back(const_cast<void*>(d.data));
    return d;
  }
  Backend& be() { return be_; }

 private:
  Backend& be_;
  std::vector<void*> ptrs_;
};

}  // namespace polylora::gpu_test
