// kernels/rope/rope_cpu.cc: CPU fast path of RoPE: cos/sin computed once per token (not per head, with
// the reference's double-precision cos/sin of the fp32 angle) into thread-local scratch, then applied to
// every head with AVX2 (scalar fallback), parallel over tokens. rope_kv_write: per token, the same table
// and rotations on q in place and on k as it is stored into the cache (after cpu::rms_norm_row per head when
// q/k norms are given), so it is bit-identical to cpu::rms_norm, cpu::rope twice and cpu::write_kv.
// Must not: allocate per call beyond the thread-local table; nest OpenMP regions.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu_simd.h"
#include "kernels/norm/rms_norm.h"
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

// cos/sin of token position `pos` for every frequency, times the scaling: c = cs[0, half), s = cs[half,
// 2·half).
void cos_sin_table(float pos, const float* inv_freq, float scaling, int64_t half, std::vector<float>& cs) {
  cs.resize(static_cast<size_t>(2 * half));
  float* c = cs.data();
  float* s = cs.data() + half;
  for (int64_t i = 0; i < half; ++i) {
    float angle = pos * inv_freq[i];
    c[i] = static_cast<float>(std::cos(static_cast<double>(angle))) * scaling;
    s[i] = static_cast<float>(std::sin(static_cast<double>(angle))) * scaling;
  }
}

void rotate(float* x, const float* c, const float* s, int64_t half) {
#if POLYLORA_X86
  if (simd::has_avx2()) return rotate_avx2(x, c, s, half);
#endif
  rotate_scalar(x, c, s, half);
}

void rope_token(const RopeArgs& a, int64_t t, std::vector<float>& cs) {
  int64_t half = a.head_dim / 2;
  cos_sin_table(static_cast<float>(a.positions[t]), a.inv_freq, a.attention_scaling, half, cs);
  for (int64_t h = 0; h < a.num_heads; ++h)
    rotate(a.x + t * a.ldx + h * a.head_dim, cs.data(), cs.data() + half, half);
}

void rope_kv_token(const RopeKvWriteArgs& a, int64_t t, std::vector<float>& cs) {
  const int64_t d = a.head_dim, half = d / 2, kv_row = a.num_kv_heads * d;
  cos_sin_table(static_cast<float>(a.positions[t]), a.inv_freq, a.attention_scaling, half, cs);
  const float* c = cs.data();
  const float* s = cs.data() + half;
  for (int64_t h = 0; h < a.num_heads; ++h) {
    float* qh = a.q + t * a.ldq + h * d;
    if (a.q_norm) cpu::rms_norm_row(qh, qh, a.q_norm, d, a.eps);
    rotate(qh, c, s, half);
  }
  const int64_t slot = a.slot_mapping[t];
  if (slot < 0) return;
  for (int64_t h = 0; h < a.num_kv_heads; ++h) {
    const float* kh = a.k + t * a.ldk + h * d;
    float* dst = a.cache.kf() + slot * kv_row + h * d;
    if (a.k_norm)
      cpu::rms_norm_row(kh, dst, a.k_norm, d, a.eps);
    else
      std::memcpy(dst, kh, static_cast<size_t>(d) * sizeof(float));
    rotate(dst, c, s, half);
  }
  std::memcpy(a.cache.vf() + slot * kv_row, a.v + t * a.ldv, static_cast<size_t>(kv_row) * sizeof(float));
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

void rope_kv_write(const RopeKvWriteArgs& a) {
  if (a.lora_q.active() || a.lora_k.active() || a.lora_v.active())
    return rope_kv_write(ref::apply_lora_terms(a).args);
  check_f32_cache(a.cache, "rope_kv_write");
  CHECK_MSG(a.cache.num_kv_heads == a.num_kv_heads && a.cache.head_dim == a.head_dim,
            "rope_kv_write: cache of {} heads x {} for k/v of {} heads x {}", a.cache.num_kv_heads,
            a.cache.head_dim, a.num_kv_heads, a.head_dim);
  CHECK_MSG((a.q_norm == nullptr) == (a.k_norm == nullptr), "rope_kv_write: q_norm and k_norm go together");
  const int64_t work = a.m * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim * 2;
  bool parallel = a.m > 1 && work >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel if (parallel)
  {
    thread_local std::vector<float> cs;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < a.m; ++t) rope_kv_token(a, t, cs);
  }
}

}  // namespace polylora::kernels::cpu
