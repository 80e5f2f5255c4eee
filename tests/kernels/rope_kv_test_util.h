// tests/kernels/rope_kv_test_util.h: shared inputs and checks of the rope_kv_write tests (CPU in
// tests/kernels/, CUDA in tests/gpu/): a case's shapes, its host data (padded strides, a paged cache of
// sentinel values, scattered slots with padding tokens), the kernel-free checks of the cache layout, and a
// bitwise comparison. Must not: call a fast kernel (the tests do; this only builds and checks data).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/attention/attention.h"
#include "kernels/rope/rope.h"

namespace polylora::kernels::test {

// Expects got and want equal bit for bit.
inline void expect_bitwise(const std::vector<float>& got, const std::vector<float>& want,
                           const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " elements differ in their bits, first [" << first << "] got "
                     << got[first] << " want " << want[first];
}

// One rope_kv_write case: token rows with padded strides, a paged cache whose every slot starts as a
// sentinel value, slots scattered over the blocks in reverse order with some tokens padding (slot −1).
struct RopeKvCase {
  int64_t m, num_heads, num_kv_heads, head_dim;
  bool qk_norm;
  float scaling;

  std::string name() const {
    return "m=" + std::to_string(m) + " heads=" + std::to_string(num_heads) + "/" +
           std::to_string(num_kv_heads) + " d=" + std::to_string(head_dim) + (qk_norm ? " qk_norm" : "") +
           " scaling=" + std::to_string(scaling);
  }
};

struct RopeKvData {
  static constexpr int64_t kBlockSize = 4;
  int64_t ldq, ldk, ldv, kv_row, num_blocks;
  std::vector<float> q, k, v, inv_freq, q_norm, k_norm, cache_k, cache_v;
  std::vector<int32_t> pos;
  std::vector<int64_t> slots;

  explicit RopeKvData(const RopeKvCase& c) {
    const int64_t d = c.head_dim;
    ldq = c.num_heads * d + 3;
    ldk = c.num_kv_heads * d + 1;
    ldv = c.num_kv_heads * d + 5;
    kv_row = c.num_kv_heads * d;
    num_blocks = (c.m + kBlockSize - 1) / kBlockSize + 2;
    q = random_vec(static_cast<size_t>(c.m * ldq), 11, -2.0f, 2.0f);
    k = random_vec(static_cast<size_t>(c.m * ldk), 12, -2.0f, 2.0f);
    v = random_vec(static_cast<size_t>(c.m * ldv), 13, -2.0f, 2.0f);
    q_norm = random_vec(static_cast<size_t>(d), 14, 0.5f, 1.5f);
    k_norm = random_vec(static_cast<size_t>(d), 15, 0.5f, 1.5f);
    inv_freq.resize(static_cast<size_t>(d / 2));
    for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / static_cast<float>(d));
    const size_t cache_n = static_cast<size_t>(num_blocks * kBlockSize * kv_row);
    cache_k = random_vec(cache_n, 16, 50.0f, 60.0f);  // sentinels: far from any written value
    cache_v = random_vec(cache_n, 17, 50.0f, 60.0f);
    pos.resize(static_cast<size_t>(c.m));
    slots.resize(static_cast<size_t>(c.m));
    for (int64_t t = 0; t < c.m; ++t) {
      pos[t] = static_cast<int32_t>(t == 0 ? 0 : (t * 37 + 5) % 5000 + (t % 3 == 0 ? 100000 : 0));
      // Token t in block (num_blocks − 1 − t / block_size), offset t % block_size; every fifth token padding
      // (never the only one).
      slots[t] = (t % 5 == 3) ? -1 : (num_blocks - 1 - t / kBlockSize) * kBlockSize + t % kBlockSize;
    }
  }

  RopeKvWriteArgs args(const RopeKvCase& c, float* q_out, float* ck, float* cv) const {
    return {.q = q_out,
            .ldq = ldq,
            .k = k.data(),
            .ldk = ldk,
            .v = v.data(),
            .ldv = ldv,
            .m = c.m,
            .num_heads = c.num_heads,
            .num_kv_heads = c.num_kv_heads,
            .head_dim = c.head_dim,
            .positions = pos.data(),
            .inv_freq = inv_freq.data(),
            .attention_scaling = c.scaling,
            .q_norm = c.qk_norm ? q_norm.data() : nullptr,
            .k_norm = c.qk_norm ? k_norm.data() : nullptr,
            .eps = 1e-6f,
            .slot_mapping = slots.data(),
            .cache = {.k = ck,
                      .v = cv,
                      .num_blocks = num_blocks,
                      .block_size = kBlockSize,
                      .num_kv_heads = c.num_kv_heads,
                      .head_dim = c.head_dim}};
  }
};

// Checks of the cache that need no kernel: v stored unchanged at each token's slot, and every slot no
// token maps to (including those of padding tokens) still holding its sentinel, in both arrays.
inline void expect_cache_layout(const RopeKvCase& c, const RopeKvData& d, const std::vector<float>& ck,
                                const std::vector<float>& cv, const std::string& what) {
  std::vector<bool> written(static_cast<size_t>(d.num_blocks * RopeKvData::kBlockSize), false);
  int bad = 0;
  for (int64_t t = 0; t < c.m; ++t) {
    if (d.slots[t] < 0) continue;
    written[static_cast<size_t>(d.slots[t])] = true;
    for (int64_t i = 0; i < d.kv_row; ++i)
      if (cv[d.slots[t] * d.kv_row + i] != d.v[t * d.ldv + i] && bad++ < 3)
        ADD_FAILURE() << what << ": v of token " << t << " [" << i << "] not stored unchanged";
  }
  for (size_t s = 0; s < written.size(); ++s) {
    if (written[s]) continue;
    for (int64_t i = 0; i < d.kv_row; ++i) {
      const size_t at = s * static_cast<size_t>(d.kv_row) + static_cast<size_t>(i);
      if ((ck[at] != d.cache_k[at] || cv[at] != d.cache_v[at]) && bad++ < 3)
        ADD_FAILURE() << what << ": slot " << s << " no token maps to was written";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

}  // namespace polylora::kernels::test
