// kernels/norm/rms_norm_cpu.cc: CPU fast path of RMSNorm (AVX2 sum of squares and scaling, scalar
// fallback), parallel over rows for large inputs. In-place use (x == y) is allowed. add_rms_norm: per row,
// the residual add, then the same row kernel (bit-identical to the add followed by rms_norm).
// Must not: allocate (but for the copy of delta an optional LoRA term needs); nest OpenMP regions.
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu_simd.h"
#include "kernels/norm/rms_norm.h"

namespace polylora::kernels::cpu {
namespace {

void norm_row_scalar(const float* x, float* y, const float* w, int64_t n, float eps) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += x[j] * x[j];
  float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = w[j] * (x[j] * inv);
}

#if POLYLORA_X86
POLYLORA_AVX2 void norm_row_avx2(const float* x, float* y, const float* w, int64_t n, float eps) {
  float sum = simd::dot(x, x, n);
  float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  __m256 vi = _mm256_set1_ps(inv);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(y + j, _mm256_mul_ps(_mm256_loadu_ps(w + j), _mm256_mul_ps(_mm256_loadu_ps(x + j), vi)));
  }
  for (; j < n; ++j) y[j] = w[j] * (x[j] * inv);
}
#endif

void norm_row(const float* x, float* y, const float* w, int64_t n, float eps) {
#if POLYLORA_X86
  if (simd::has_avx2()) return norm_row_avx2(x, y, w, n, eps);
#endif
  norm_row_scalar(x, y, w, n, eps);
}

}  // namespace

void rms_norm_row(const float* x, float* y, const float* w, int64_t n, float eps) {
  norm_row(x, y, w, n, eps);
}

void rms_norm(const RmsNormArgs& a) {
  bool parallel = a.m > 1 && a.m * a.n * 4 >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < a.m; ++i) norm_row(a.x + i * a.ldx, a.y + i * a.ldy, a.w, a.n, a.eps);
}

void add_rms_norm(const AddRmsNormArgs& a) {
  if (a.lora_delta.active()) return add_rms_norm(ref::apply_lora_term(a).args);
  bool parallel = a.m > 1 && a.m * a.n * 4 >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t i = 0; i < a.m; ++i) {
    float* x = a.x + i * a.ldx;
    const float* d = a.delta + i * a.ld_delta;
#pragma omp simd
    for (int64_t j = 0; j < a.n; ++j) x[j] += d[j];
    norm_row(x, a.y + i * a.ldy, a.w, a.n, a.eps);
  }
}

}  // namespace polylora::kernels::cpu
