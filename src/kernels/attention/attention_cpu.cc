// kernels/attention/attention_cpu.cc: CPU fast path of the paged attention and the KV-cache write.
// One task per (query token, KV head): every key of the context window is read once and scored against
// all query heads of its GQA group (SIMD dot products), softmax per head (vectorised exp, sinks joining
// the denominator), then the values are accumulated. Tasks run in parallel with OpenMP.
// Must not: allocate per call beyond thread-local score scratch; nest OpenMP regions.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/cpu_simd.h"

namespace polylora::kernels::cpu {
namespace {

// Attention of one query token t (row qi of sequence s) for the query heads of KV head kvh.
void attend(const AttentionArgs& a, int64_t s, int64_t t, int64_t kvh, std::vector<float>& scores) {
  const KvCacheView& c = a.cache;
  int64_t d = c.head_dim, bs = c.block_size;
  int64_t group = a.num_heads / c.num_kv_heads;
  int64_t kv_row = c.num_kv_heads * d;
  int64_t q_begin = a.query_start[s];
  int64_t q_len = a.query_start[s + 1] - q_begin;
  int64_t pos = a.context_lens[s] - q_len + (t - q_begin);
  int64_t first = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
  int64_t len = pos - first + 1;
  const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
  scores.resize(static_cast<size_t>(group * len));
  const float* q = a.q + t * a.ldq + kvh * group * d;
  for (int64_t j = first; j <= pos; ++j) {
    const float* k = c.kf() + (table[j / bs] * bs + j % bs) * kv_row + kvh * d;
    for (int64_t g = 0; g < group; ++g) scores[g * len + (j - first)] = simd::dot(q + g * d, k, d) * a.scale;
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sc = scores.data() + g * len;
    int64_t h = kvh * group + g;
    float mx = simd::max_of(sc, len);
    if (a.sinks) mx = std::max(mx, a.sinks[h]);
    float denom = simd::exp_shift_sum(sc, len, mx) + (a.sinks ? std::exp(a.sinks[h] - mx) : 0.0f);
    float inv = 1.0f / denom;
    for (int64_t j = 0; j < len; ++j) sc[j] *= inv;
    std::memset(a.out + t * a.ldo + h * d, 0, static_cast<size_t>(d) * sizeof(float));
  }
  float* o = a.out + t * a.ldo + kvh * group * d;
  for (int64_t j = first; j <= pos; ++j) {
    const float* v = c.vf() + (table[j / bs] * bs + j % bs) * kv_row + kvh * d;
    for (int64_t g = 0; g < group; ++g) simd::axpy(scores[g * len + (j - first)], v, o + g * d, d);
  }
}

}  // namespace

void write_kv(const KvWriteArgs& a) {
  check_f32_cache(a.cache, "write_kv");
  int64_t row = a.cache.num_kv_heads * a.cache.head_dim;
  bool parallel = a.m > 1 && a.m * row >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < a.m; ++t) {
    int64_t slot = a.slot_mapping[t];
    if (slot < 0) continue;
    std::memcpy(a.cache.kf() + slot * row, a.k + t * a.ldk, static_cast<size_t>(row) * sizeof(float));
    std::memcpy(a.cache.vf() + slot * row, a.v + t * a.ldv, static_cast<size_t>(row) * sizeof(float));
  }
}

void attention(const AttentionArgs& a) {
  if (a.num_seqs <= 0) return;
  check_f32_cache(a.cache, "attention");
  int64_t num_tokens = a.query_start[a.num_seqs];
  int64_t num_kv = a.cache.num_kv_heads;
  int64_t num_tasks = num_tokens * num_kv;
  bool parallel = num_tasks > 1 && !omp_in_parallel();
#pragma omp parallel if (parallel)
  {
    thread_local std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      int64_t t = task / num_kv, kvh = task % num_kv;
      // The sequence owning token t: the last s with query_start[s] <= t.
      int64_t s = std::upper_bound(a.query_start, a.query_start + a.num_seqs + 1, static_cast<int32_t>(t)) -
                  a.query_start - 1;
      attend(a, s, t, kvh, scores);
    }
  }
}

}  // namespace polylora::kernels::cpu
