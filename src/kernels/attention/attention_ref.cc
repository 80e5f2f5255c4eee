// kernels/attention/attention_ref.cc: reference paged attention (one query row at a time, fp32, two passes).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/attention/attention.h"

namespace polylora::kernels {

void check_f32_cache(const KvCacheView& c, const char* op) {
  if (c.dtype != DType::kF32)
    fail("{}: the CPU kernels keep an f32 KV cache, not {} (--kv-cache-dtype bfloat16 needs --device cuda)",
         op, dtype_name(c.dtype));
}

}  // namespace polylora::kernels

namespace polylora::kernels::ref {

void write_kv(const KvWriteArgs& a) {
  check_f32_cache(a.cache, "write_kv");
  int64_t row = a.cache.num_kv_heads * a.cache.head_dim;
  for (int64_t t = 0; t < a.m; ++t) {
    int64_t slot = a.slot_mapping[t];
    if (slot < 0) continue;
    std::memcpy(a.cache.kf() + slot * row, a.k + t * a.ldk, static_cast<size_t>(row) * sizeof(float));
    std::memcpy(a.cache.vf() + slot * row, a.v + t * a.ldv, static_cast<size_t>(row) * sizeof(float));
  }
}

void attention(const AttentionArgs& a) {
  check_f32_cache(a.cache, "attention");
  const KvCacheView& c = a.cache;
  int64_t d = c.head_dim;
  int64_t group = a.num_heads / c.num_kv_heads;
  int64_t kv_row = c.num_kv_heads * d;
  std::vector<float> scores;
  for (int64_t s = 0; s < a.num_seqs; ++s) {
    int64_t q_begin = a.query_start[s];
    int64_t q_len = a.query_start[s + 1] - q_begin;
    int64_t ctx = a.context_lens[s];
    const int32_t* table = a.block_tables + s * a.max_blocks_per_seq;
    for (int64_t qi = 0; qi < q_len; ++qi) {
      int64_t pos = ctx - q_len + qi;
      int64_t first = a.window > 0 ? std::max<int64_t>(0, pos - a.window + 1) : 0;
      for (int64_t h = 0; h < a.num_heads; ++h) {
        const float* q = a.q + (q_begin + qi) * a.ldq + h * d;
        int64_t kvh = h / group;
        scores.assign(static_cast<size_t>(pos - first + 1), 0.0f);
        float max_score = a.sinks ? a.sinks[h] : -std::numeric_limits<float>::infinity();
        for (int64_t j = first; j <= pos; ++j) {
          const float* k =
              c.kf() + (table[j / c.block_size] * c.block_size + j % c.block_size) * kv_row + kvh * d;
          float dot = 0.0f;
          for (int64_t i = 0; i < d; ++i) dot += q[i] * k[i];
          scores[j - first] = dot * a.scale;
          max_score = std::max(max_score, scores[j - first]);
        }
        float denom = a.sinks ? std::exp(a.sinks[h] - max_score) : 0.0f;
        for (float& sc : scores) {
          sc = std::exp(sc - max_score);
          denom += sc;
        }
        float* o = a.out + (q_begin + qi) * a.ldo + h * d;
        std::fill(o, o + d, 0.0f);
        for (int64_t j = first; j <= pos; ++j) {
          const float* v =
              c.vf() + (table[j / c.block_size] * c.block_size + j % c.block_size) * kv_row + kvh * d;
          float p = scores[j - first] / denom;
          for (int64_t i = 0; i < d; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

}  // namespace polylora::kernels::ref
