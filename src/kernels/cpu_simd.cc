// kernels/cpu_simd.cc: the shared CPU vector routines of cpu_simd.h (AVX2 path and scalar fallback).
// Must not: allocate, or start threads (callers own the parallelism).
#include "kernels/cpu_simd.h"

#include <cblas.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

namespace polylora::kernels::simd {
namespace {

std::atomic<bool> g_force_scalar{false};

#if POLYLORA_X86
POLYLORA_AVX2 void to_f32_avx2(const uint16_t* s, bool bf16, int64_t n, float* d) {
  int64_t i = 0;
  if (bf16) {
    for (; i + 16 <= n; i += 16) {
      _mm256_storeu_ps(d + i, load_bf16(s + i));
      _mm256_storeu_ps(d + i + 8, load_bf16(s + i + 8));
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, load_bf16(s + i));
    for (; i < n; ++i) d[i] = bf16_to_f32(s[i]);
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, load_f16(s + i));
    for (; i < n; ++i) d[i] = f16_to_f32(s[i]);
  }
}

POLYLORA_AVX2 float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  if (i < n) {
    __m256i m = tail_mask(n - i);
    s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
  }
  return hsum(_mm256_add_ps(s0, s1));
}

POLYLORA_AVX2 void axpy_avx2(float alpha, const float* x, float* y, int64_t n) {
  __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) {
    __m256i m = tail_mask(n - i);
    __m256 r = _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m));
    _mm256_maskstore_ps(y + i, m, r);
  }
}

POLYLORA_AVX2 float exp_shift_sum_avx2(float* v, int64_t n, float shift) {
  __m256 vs = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(v + i), vs));
    _mm256_storeu_ps(v + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) sum += v[i] = std::exp(v[i] - shift);
  return sum;
}

POLYLORA_AVX2 float max_of_avx2(const float* v, int64_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(v + i));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r = v[i] > r ? v[i] : r;
  return r;
}
#endif

}  // namespace

bool has_avx2() {
#if POLYLORA_X86
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok && !g_force_scalar.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

void force_scalar_for_testing(bool on) {
  g_force_scalar = on;
}

void blas_single_threaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

void to_f32(const void* src, DType dtype, int64_t n, float* dst) {
#if POLYLORA_X86
  if ((dtype == DType::kBF16 || dtype == DType::kF16) && has_avx2()) {
    to_f32_avx2(static_cast<const uint16_t*>(src), dtype == DType::kBF16, n, dst);
    return;
  }
#endif
  convert_to_f32(src, dtype, static_cast<size_t>(n), dst);
}

float dot(const float* a, const float* b, int64_t n) {
#if POLYLORA_X86
  if (has_avx2()) return dot_avx2(a, b, n);
#endif
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
#if POLYLORA_X86
  if (has_avx2()) return axpy_avx2(alpha, x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

float exp_shift_sum(float* v, int64_t n, float shift) {
#if POLYLORA_X86
  if (has_avx2()) return exp_shift_sum_avx2(v, n, shift);
#endif
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += v[i] = std::exp(v[i] - shift);
  return sum;
}

float max_of(const float* v, int64_t n) {
#if POLYLORA_X86
  if (has_avx2()) return max_of_avx2(v, n);
#endif
  float r = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) r = v[i] > r ? v[i] : r;
  return r;
}

}  // namespace polylora::kernels::simd
