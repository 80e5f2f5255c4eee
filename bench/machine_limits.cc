// bench/machine_limits.cc: memory-bandwidth and sgemm measurements (see machine_limits.h).
// Must not: depend on polylora code.
#include "machine_limits.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace polylora::bench {
namespace {

#if defined(__x86_64__)
__attribute__((target("avx2"))) float sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  float s = 0.0f;
  for (float l : lanes) s += l;
  for (; i < n; ++i) s += p[i];
  return s;
}
#endif

float sum_portable(const float* p, size_t n) {
  float a[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) a[j] += p[i + j];
  }
  float s = 0.0f;
  for (float v : a) s += v;
  for (; i < n; ++i) s += p[i];
  return s;
}

float sum(const float* p, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return sum_avx2(p, n);
#endif
  return sum_portable(p, n);
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

}  // namespace

double measure_memory_bandwidth_gbs() {
  constexpr size_t kBytes = size_t{1} << 30;
  constexpr size_t kFloats = kBytes / sizeof(float);
  std::unique_ptr<float, FreeDeleter> buf(static_cast<float*>(std::aligned_alloc(64, kBytes)));
  float* p = buf.get();
  int threads = omp_get_max_threads();
  size_t chunk = (kFloats / threads + 31) / 32 * 32;
#pragma omp parallel for schedule(static)  // first touch by the thread that will read it
  for (int t = 0; t < threads; ++t) {
    size_t b = std::min(kFloats, t * chunk), e = std::min(kFloats, b + chunk);
    std::fill(p + b, p + e, 1.0f);
  }
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int pass = 0; pass < 4; ++pass) {
    float total = 0.0f;
    double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int t = 0; t < threads; ++t) {
      size_t b = std::min(kFloats, t * chunk), e = std::min(kFloats, b + chunk);
      total += sum(p + b, e - b);
    }
    double dt = omp_get_wtime() - t0;
    sink = total;
    best = std::max(best, static_cast<double>(kBytes) / dt / 1e9);
  }
  (void)sink;
  return best;
}

double measure_sgemm_gflops() {
  constexpr int kN = 2048;
  std::vector<float> a(size_t{kN} * kN, 0.5f), b(size_t{kN} * kN, 0.25f), c(size_t{kN} * kN);
  int saved = openblas_get_num_threads();
  openblas_set_num_threads(omp_get_max_threads());
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, kN, kN, kN, 1.0f, a.data(), kN, b.data(), kN, 0.0f,
                c.data(), kN);
  };
  run();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) best = std::min(best, time_per_call(run, 0.0, 1));
  openblas_set_num_threads(saved);
  return 2.0 * kN * double(kN) * kN / best / 1e9;
}

}  // namespace polylora::bench
