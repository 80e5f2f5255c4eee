// kernels/cpu_simd.h: shared helpers of the CPU fast paths: run-time ISA detection, AVX2/FMA inline
// primitives (horizontal sum, bf16/f16 loads, a vectorised exp), row conversion and small vector routines
// with a portable scalar fallback, and the one-time OpenBLAS threading setup.
// Must not: be included outside src/kernels/ (internal), hold state beyond the cached CPU features.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POLYLORA_X86 1
#define POLYLORA_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define POLYLORA_X86 0
#define POLYLORA_AVX2
#endif

namespace polylora::kernels::simd {

// True when the CPU runs AVX2 + FMA + F16C (checked once, at run time) and the scalar path is not forced.
bool has_avx2();
// Tests: run the portable scalar paths even on an AVX2 machine.
void force_scalar_for_testing(bool on);

// OpenBLAS is called single-threaded from inside our own OpenMP loops; this sets it once.
void blas_single_threaded();

// Below this many multiply-adds an op runs on the calling thread (an OpenMP region costs a few µs).
constexpr int64_t kMinParallelWork = 1 << 15;

// dst[n] = src[n] (F32, F16 or BF16) as f32.
void to_f32(const void* src, DType dtype, int64_t n, float* dst);
// Σ a[i]·b[i].
float dot(const float* a, const float* b, int64_t n);
// y[i] += alpha·x[i].
void axpy(float alpha, const float* x, float* y, int64_t n);
// v[i] = exp(v[i] − shift); returns Σ v[i].
float exp_shift_sum(float* v, int64_t n, float shift);
// Largest v[i] (−inf when n == 0).
float max_of(const float* v, int64_t n);

#if POLYLORA_X86
POLYLORA_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

POLYLORA_AVX2 inline __m256 load_bf16(const uint16_t* p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

POLYLORA_AVX2 inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// exp(x) for x in float range (inputs clamped to ±88.37), relative error ~2 ulp (Cephes polynomial).
POLYLORA_AVX2 inline __m256 exp256(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.37f));
  __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  __m256 x2 = _mm256_mul_ps(x, x);
  y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Mask selecting the first n (0..8) lanes, for tail loads/stores.
POLYLORA_AVX2 inline __m256i tail_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

}  // namespace polylora::kernels::simd
