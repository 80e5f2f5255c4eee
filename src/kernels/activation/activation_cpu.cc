// kernels/activation/activation_cpu.cc: CPU fast path of the gated activations (AVX2 with a vectorised
// exp, scalar fallback), parallel over rows for large inputs.
// Must not: allocate; nest OpenMP regions.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/activation/activation.h"
#include "kernels/cpu_simd.h"

namespace polylora::kernels::cpu {
namespace {

void silu_row_scalar(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t j = 0; j < n; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
}

void swiglu_row_scalar(const float* in, float* o, int64_t n, float alpha, float limit) {
  for (int64_t j = 0; j < n; ++j) {
    float g = std::min(in[2 * j], limit);
    float u = std::clamp(in[2 * j + 1], -limit, limit);
    o[j] = (u + 1.0f) * (g / (1.0f + std::exp(-g * alpha)));
  }
}

#if POLYLORA_X86
POLYLORA_AVX2 void silu_row_avx2(const float* g, const float* u, float* o, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 gv = _mm256_loadu_ps(g + j);
    __m256 e = simd::exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
    __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(o + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
  }
  silu_row_scalar(g + j, u + j, o + j, n - j);
}

POLYLORA_AVX2 void swiglu_row_avx2(const float* in, float* o, int64_t n, float alpha, float limit) {
  const __m256 one = _mm256_set1_ps(1.0f), lim = _mm256_set1_ps(limit), nlim = _mm256_set1_ps(-limit);
  const __m256 nalpha = _mm256_set1_ps(-alpha);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 a = _mm256_loadu_ps(in + 2 * j), b = _mm256_loadu_ps(in + 2 * j + 8);
    // Deinterleave [g0 u0 g1 u1 ...]: shuffle within 128-bit lanes, then fix the lane order.
    __m256 g = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    __m256 u = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
    g = _mm256_min_ps(g, lim);
    u = _mm256_min_ps(_mm256_max_ps(u, nlim), lim);
    __m256 e = simd::exp256(_mm256_mul_ps(g, nalpha));
    __m256 glu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_add_ps(u, one), glu));
  }
  swiglu_row_scalar(in + 2 * j, o + j, n - j, alpha, limit);
}
#endif

void silu_row(const float* g, const float* u, float* o, int64_t n) {
#if POLYLORA_X86
  if (simd::has_avx2()) return silu_row_avx2(g, u, o, n);
#endif
  silu_row_scalar(g, u, o, n);
}

void swiglu_row(const float* in, float* o, int64_t n, float alpha, float limit) {
#if POLYLORA_X86
  if (simd::has_avx2()) return swiglu_row_avx2(in, o, n, alpha, limit);
#endif
  swiglu_row_scalar(in, o, n, alpha, limit);
}

bool go_parallel(int64_t m, int64_t n) {
  return m > 1 && m * n * 16 >= simd::kMinParallelWork && !omp_in_parallel();
}

}  // namespace

void silu_and_mul(const SiluAndMulArgs& a) {
#pragma omp parallel for schedule(static) if (go_parallel(a.m, a.n))
  for (int64_t i = 0; i < a.m; ++i)
    silu_row(a.gate + i * a.ld_gate, a.up + i * a.ld_up, a.out + i * a.ld_out, a.n);
}

void gpt_oss_swiglu(const GptOssSwigluArgs& a) {
#pragma omp parallel for schedule(static) if (go_parallel(a.m, a.n))
  for (int64_t i = 0; i < a.m; ++i)
    swiglu_row(a.gate_up + i * a.ld_in, a.out + i * a.ld_out, a.n, a.alpha, a.limit);
}

}  // namespace polylora::kernels::cpu
