// kernels/rope/rope_cpu.cc: CPU fast path of RoPE: cos/sin computed once per token (not per head, with
// the reference's double-precision cos/sin of the fp32 angle) into thread-local scratch, then applied to
// every head with AVX2 (scalar fallback), parallel over tokens.
// Must not: allocate per call beyond the thread-local table; nest OpenMP regions.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu_simd.h"
#include "kernels/rope/rope.h"

namespace polylora::kernels::cpu {
namespace {

void rotate_scalar(float* x, const float* c, const float* s, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i] + x1 * s[i];
  }
}

#if POLYLORA_X86
POLYLORA_AVX2 void rotate_avx2(float* x, const float* c, const float* s, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + i + half);
    __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
    _mm256_storeu_ps(x + i, _mm256_fmsub_ps(x1, cv, _mm256_mul_ps(x2, sv)));
    _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(x2, cv, _mm256_mul_ps(x1, sv)));
  }
  for (; i < half; ++i) {
    float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * c[i] - x2 * s[i];
    x[i + half] = x2 * c[i] + x1 * s[i];
  }
}
#endif

void rope_token(const RopeArgs& a, int64_t t, std::vector<float>& cs) {
  int64_t half = a.head_dim / 2;
  cs.resize(static_cast<size_t>(2 * half));
  float* c = cs.data();
  float* s = cs.data() + half;
  float pos = static_cast<float>(a.positions[t]);
  for (int64_t i = 0; i < half; ++i) {
    float angle = pos * a.inv_freq[i];
    c[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * a.attention_scaling;
    s[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * a.attention_scaling;
  }
  bool avx2 = simd::has_avx2();
  for (int64_t h = 0; h < a.num_heads; ++h) {
    float* x = a.x + t * a.ldx + h * a.head_dim;
#if POLYLORA_X86
    if (avx2) {
      rotate_avx2(x, c, s, half);
      continue;
    }
#endif
    (void)avx2;
    rotate_scalar(x, c, s, half);
  }
}

}  // namespace

void rope(const RopeArgs& a) {
  bool parallel =
      a.m > 1 && a.m * a.num_heads * a.head_dim * 2 >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel if (parallel)
  {
    thread_local std::vector<float> cs;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < a.m; ++t) rope_token(a, t, cs);
  }
}

}  // namespace polylora::kernels::cpu
