// tests/kernels/attention_test.cc: cpu::attention and cpu::write_kv against the references: block sizes
// 1 and 16, ragged context lengths, decode and prefill rows mixed, one head, GQA groups, sliding window
// and sinks on and off, shuffled block tables.
// Tolerance: atol 1e-5 + rtol 1e-4 (online-free two-pass softmax with a vectorised exp; summation order).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>

#include "kernel_test_util.h"
#include "kernels/attention/attention.h"

namespace polylora::kernels {
namespace {

struct Case {
  int64_t block_size;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  std::vector<int32_t> q_lens;
  std::vector<int32_t> ctx_lens;
  int64_t window;
  bool sinks;
};

void run_case(const Case& cs) {
  int64_t num_seqs = static_cast<int64_t>(cs.q_lens.size());
  int64_t bs = cs.block_size, d = cs.head_dim;
  int64_t max_ctx = *std::max_element(cs.ctx_lens.begin(), cs.ctx_lens.end());
  int64_t max_blocks = (max_ctx + bs - 1) / bs;
  int64_t num_blocks = max_blocks * num_seqs + 3;
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
  std::vector<int32_t> tables(static_cast<size_t>(num_seqs * max_blocks));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];
  int64_t kv_row = cs.num_kv_heads * d;
  std::vector<float> kc = test::random_vec(static_cast<size_t>(num_blocks * bs * kv_row), 1);
  std::vector<float> vc = test::random_vec(static_cast<size_t>(num_blocks * bs * kv_row), 2);
  std::vector<int32_t> qs(static_cast<size_t>(num_seqs + 1), 0);
  for (int64_t s = 0; s < num_seqs; ++s) qs[s + 1] = qs[s] + cs.q_lens[s];
  int64_t tokens = qs[num_seqs];
  int64_t ldq = cs.num_heads * d + 3;
  std::vector<float> q =
      test::random_vec(static_cast<size_t>(std::max<int64_t>(tokens, 1) * ldq), 3, -2.0f, 2.0f);
  std::vector<float> sinks = test::random_vec(static_cast<size_t>(cs.num_heads), 4, -1.0f, 3.0f);
  AttentionArgs a{.q = q.data(),
                  .ldq = ldq,
                  .out = nullptr,
                  .ldo = ldq,
                  .num_seqs = num_seqs,
                  .query_start = qs.data(),
                  .context_lens = cs.ctx_lens.data(),
                  .block_tables = tables.data(),
                  .max_blocks_per_seq = max_blocks,
                  .num_heads = cs.num_heads,
                  .scale = 1.0f / std::sqrt(float(d)),
                  .window = cs.window,
                  .sinks = cs.sinks ? sinks.data() : nullptr,
                  .cache = {.k = kc.data(),
                            .v = vc.data(),
                            .num_blocks = num_blocks,
                            .block_size = bs,
                            .num_kv_heads = cs.num_kv_heads,
                            .head_dim = d}};
  std::vector<float> ref(q.size(), 9.0f);
  a.out = ref.data();
  ref::attention(a);
  std::string what = "bs=" + std::to_string(bs) + " heads=" + std::to_string(cs.num_heads) + "/" +
                     std::to_string(cs.num_kv_heads) + " d=" + std::to_string(d) +
                     " window=" + std::to_string(cs.window) + (cs.sinks ? " sinks" : "");
  test::for_each_isa([&](const char* isa) {
    std::vector<float> out(q.size(), 9.0f);
    AttentionArgs f = a;
    f.out = out.data();
    cpu::attention(f);
    test::expect_close(out, ref, 1e-5f, 1e-4f, std::string(isa) + " " + what);
  });
}

TEST(AttentionCpu, PagedShapes) {
  for (int64_t bs : {1, 16}) {
    for (auto [h, kvh] : {std::pair<int64_t, int64_t>{1, 1}, {4, 4}, {8, 2}, {6, 1}}) {
      for (int64_t d : {3, 64}) {
        for (int64_t window : {0, 5}) {
          for (bool sinks : {false, true}) {
            // decode rows (q_len 1), a prefill, a chunked prefill continuing a context, one-token context.
            run_case({bs, h, kvh, d, {1, 1, 23, 7, 1}, {1, 40, 23, 30, 17}, window, sinks});
          }
        }
      }
    }
  }
}

TEST(AttentionCpu, EmptySequenceRowsAndOneSeq) {
  run_case({16, 8, 2, 128, {0, 3, 0}, {5, 3, 9}, 0, false});
  run_case({16, 8, 8, 128, {1}, {1}, 0, true});
}

TEST(WriteKvCpu, SlotsAndPadding) {
  int64_t kvh = 2, d = 5, bs = 4, nb = 6, m = 9, ld = kvh * d + 2;
  std::vector<float> k = test::random_vec(static_cast<size_t>(m * ld), 1), v = test::random_vec(k.size(), 2);
  std::vector<int64_t> slots = {0, 5, -1, 23, 7, 8, -1, 12, 1};
  std::vector<float> kc_ref(static_cast<size_t>(nb * bs * kvh * d), 0.5f), vc_ref = kc_ref;
  KvWriteArgs a{.k = k.data(),
                .ldk = ld,
                .v = v.data(),
                .ldv = ld,
                .m = m,
                .slot_mapping = slots.data(),
                .cache = {.k = kc_ref.data(),
                          .v = vc_ref.data(),
                          .num_blocks = nb,
                          .block_size = bs,
                          .num_kv_heads = kvh,
                          .head_dim = d}};
  ref::write_kv(a);
  std::vector<float> kc(kc_ref.size(), 0.5f), vc = kc;
  a.cache.k = kc.data();
  a.cache.v = vc.data();
  cpu::write_kv(a);
  EXPECT_EQ(kc, kc_ref);
  EXPECT_EQ(vc, vc_ref);
}

}  // namespace
}  // namespace polylora::kernels
