// tests/gpu/attention_gpu_test.cc: the CUDA write_kv and paged attention against the references: block
// sizes 1 and 16, ragged contexts mixing decode rows, a prefill and a chunked prefill, sequences with no
// query rows, one head, GQA groups, head_dim 3/64/96/128/256, sliding window and sinks on and off, shuffled
// block tables; each kernel (flash prefill, split decode, generic) over these; write_kv with padding slots.
// Tolerance: attention 1e-5 + 1e-4·|ref| (online softmax, fp32, another order); write_kv exact. The bf16
// tensor-core prefill (tuning attention_prefill_mma) over the prefill shapes at 2e-2 + 2e-2·|ref|. A BF16
// cache (--kv-cache-dtype bfloat16) through every kernel and write_kv.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "gpu_test_util.h"
#include "kernels/tuning.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;

struct Case {
  int64_t block_size, num_heads, num_kv_heads, head_dim;
  std::vector<int32_t> q_lens, ctx_lens;
  int64_t window;
  bool sinks;
};

// weight_dtype picks the backend (the default, BF16, is also the one whose prefill may take the tensor-core
// kernel); atol / rtol the tolerance; kv_dtype the cache's element type (BF16: the reference reads the same
// values, rounded to bf16, as f32).
void run_case(const Case& cs, DType weight_dtype = DType::kBF16, float atol = 1e-5f, float rtol = 1e-4f,
              DType kv_dtype = DType::kF32) {
  Arena ar(backend(weight_dtype));
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
  std::vector<float> kc = k::test::random_vec(static_cast<size_t>(num_blocks * bs * kv_row), 1);
  std::vector<float> vc = k::test::random_vec(static_cast<size_t>(num_blocks * bs * kv_row), 2);
  std::vector<uint16_t> kc16, vc16;
  if (kv_dtype == DType::kBF16) {
    for (float& x : kc) kc16.push_back(f32_to_bf16(x)), x = bf16_to_f32(kc16.back());
    for (float& x : vc) vc16.push_back(f32_to_bf16(x)), x = bf16_to_f32(vc16.back());
  }
  std::vector<int32_t> qs(static_cast<size_t>(num_seqs + 1), 0);
  for (int64_t s = 0; s < num_seqs; ++s) qs[s + 1] = qs[s] + cs.q_lens[s];
  int64_t tokens = qs[num_seqs];
  int64_t ldq = cs.num_heads * d + 3;
  std::vector<float> q =
      k::test::random_vec(static_cast<size_t>(std::max<int64_t>(tokens, 1) * ldq), 3, -2.0f, 2.0f);
  std::vector<float> sinks = k::test::random_vec(static_cast<size_t>(cs.num_heads), 4, -1.0f, 3.0f);
  k::AttentionArgs a{.q = q.data(),
                     .ldq = ldq,
                     .out = nullptr,
                     .ldo = ldq,
                     .num_seqs = num_seqs,
                     .num_tokens = tokens,
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
  k::ref::attention(a);
  std::string what = "bs=" + std::to_string(bs) + " heads=" + std::to_string(cs.num_heads) + "/" +
                     std::to_string(cs.num_kv_heads) + " d=" + std::to_string(d) +
                     " window=" + std::to_string(cs.window) + (cs.sinks ? " sinks" : "") +
                     (kv_dtype == DType::kBF16 ? " bf16 cache" : "");
  std::vector<float> init(q.size(), 9.0f);
  float* out = ar.up(init);
  a.q = ar.up(q);
  a.out = out;
  a.query_start = ar.up(qs);
  a.context_lens = ar.up(cs.ctx_lens);
  a.block_tables = ar.up(tables);
  a.sinks = cs.sinks ? ar.up(sinks) : nullptr;
  if (kv_dtype == DType::kBF16) {
    a.cache.k = ar.up(kc16);
    a.cache.v = ar.up(vc16);
    a.cache.dtype = DType::kBF16;
  } else {
    a.cache.k = ar.up(kc);
    a.cache.v = ar.up(vc);
  }
  ar.be().attention(a);
  k::test::expect_close(ar.down(out, init.size()), ref, atol, rtol, what);
}

// The f32 kernels at the f32 tolerance on the BF16 backend: the tensor-core prefill (on by default there,
// tuning attention_prefill_mma) is held to the bf16 tolerance by TensorCorePrefill, so these pin it off.
struct F32PrefillKernel {
  F32PrefillKernel() {
    k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
    t.attention_prefill_mma = 0;
    k::override_kernel_tuning(t);
  }
  ~F32PrefillKernel() { k::override_kernel_tuning(std::nullopt); }
};

TEST(GpuAttention, PagedShapes) {
  SKIP_WITHOUT_GPU();
  F32PrefillKernel f32_prefill;
  for (int64_t bs : {1, 16}) {
    for (auto [h, kvh] : {std::pair<int64_t, int64_t>{1, 1}, {4, 4}, {8, 2}, {6, 1}}) {
      for (int64_t d : {3, 64, 128}) {
        for (int64_t window : {0, 5}) {
          for (bool sinks : {false, true}) {
            run_case({bs, h, kvh, d, {1, 1, 23, 7, 1}, {1, 40, 23, 30, 17}, window, sinks});
            run_case(
                {bs, h, kvh, d, {1, 1, 1, 0, 1}, {1, 40, 23, 30, 17}, window, sinks});  // decode rows only
          }
        }
      }
    }
  }
}

TEST(GpuAttention, EmptySequenceRowsLongContextAndBigHeads) {
  SKIP_WITHOUT_GPU();
  F32PrefillKernel f32_prefill;
  run_case({16, 8, 2, 128, {0, 3, 0}, {5, 3, 9}, 0, false});
  run_case({16, 8, 8, 128, {1}, {1}, 0, true});
  run_case({16, 4, 2, 256, {2, 1}, {9, 33}, 0, true});
  run_case({16, 64, 8, 64, {1, 1, 130}, {3000, 129, 400}, 128, true});
  run_case({16, 32, 4, 128, {1, 64}, {4097, 64}, 0, false});
  // Flash prefill: several query blocks per sequence, chunked prefill, window, sinks.
  run_case({16, 32, 4, 128, {200, 70, 1}, {700, 70, 33}, 100, true});
  run_case({16, 8, 1, 64, {129, 64}, {129, 300}, 0, false});
  // Split decode (flash decoding): long contexts, few rows, head_dim 64/96/128/256.
  run_case({16, 32, 4, 128, {1, 1, 1}, {3000, 129, 4097}, 0, false});
  run_case({16, 64, 8, 64, {1, 1, 0, 1}, {3000, 2, 5, 700}, 128, true});
  run_case({16, 4, 2, 256, {1, 2}, {1500, 999}, 0, true});
  run_case({16, 6, 3, 96, {1, 1}, {777, 64}, 300, false});
}

// The prefill on bf16 tensor cores (attention_mma_cuda.cu; tuning attention_prefill_mma, on by default on
// BF16 backends since session 40): head_dim 64 and 128, one head, GQA groups (64 / 8 as GPT-OSS), block sizes
// 1 and 16, several query blocks per sequence and a block's rows past the sequence's end, chunked prefill
// (contexts longer than the query rows), a decode row in the batch, sliding windows and sinks, several key
// tiles. Tolerance: queries, keys, values and probabilities in bf16 (2e-2 + 2e-2·|ref|; a fragment layout
// mistake is off by the values' own size). The F32 backend keeps the f32 kernel with the field set (f32
// tolerance).
TEST(GpuAttention, TensorCorePrefill) {
  SKIP_WITHOUT_GPU();
  k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
  t.attention_prefill_mma = 1;
  k::override_kernel_tuning(t);
  for (int64_t bs : {1, 16}) {
    for (auto [h, kvh] : {std::pair<int64_t, int64_t>{1, 1}, {8, 2}, {64, 8}}) {
      for (int64_t d : {64, 128}) {
        for (int64_t window : {0, 5}) {
          for (bool sinks : {false, true})
            run_case({bs, h, kvh, d, {70, 1, 23, 130}, {70, 40, 50, 300}, window, sinks}, DType::kBF16, 2e-2f,
                     2e-2f);
        }
      }
    }
  }
  run_case({16, 32, 4, 128, {200, 70, 1}, {700, 70, 33}, 100, true}, DType::kBF16, 2e-2f, 2e-2f);
  run_case({16, 8, 1, 64, {129, 64}, {129, 300}, 0, false}, DType::kBF16, 2e-2f, 2e-2f);
  run_case({16, 8, 2, 128, {70, 1}, {70, 30}, 0, true}, DType::kF32);
  // A BF16 cache (its values widened exactly as the tiles are rounded again: the same products).
  run_case({16, 64, 8, 64, {70, 1, 23, 130}, {70, 40, 50, 300}, 5, true}, DType::kBF16, 2e-2f, 2e-2f,
           DType::kBF16);
  run_case({1, 8, 2, 128, {129, 64}, {129, 300}, 0, false}, DType::kBF16, 2e-2f, 2e-2f, DType::kBF16);
  k::override_kernel_tuning(std::nullopt);
}

// A BF16 KV cache (--kv-cache-dtype bfloat16) through every f32 kernel (flash prefill, split decode,
// generic head_dim): the reference reads the same bf16 values widened to f32, so the f32 tolerance holds.
TEST(GpuAttention, Bf16Cache) {
  SKIP_WITHOUT_GPU();
  F32PrefillKernel f32_prefill;
  for (int64_t bs : {1, 16}) {
    for (auto [h, kvh] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}}) {
      for (int64_t d : {3, 64, 128}) {
        run_case({bs, h, kvh, d, {1, 1, 23, 7, 1}, {1, 40, 23, 30, 17}, 5, true}, DType::kBF16, 1e-5f, 1e-4f,
                 DType::kBF16);
        run_case({bs, h, kvh, d, {1, 1, 1, 0, 1}, {1, 40, 23, 30, 17}, 0, false}, DType::kBF16, 1e-5f, 1e-4f,
                 DType::kBF16);
      }
    }
  }
  run_case({16, 32, 4, 128, {200, 70, 1}, {700, 70, 33}, 100, true}, DType::kBF16, 1e-5f, 1e-4f,
           DType::kBF16);
  run_case({16, 32, 4, 128, {1, 1, 1}, {3000, 129, 4097}, 0, false}, DType::kBF16, 1e-5f, 1e-4f,
           DType::kBF16);
  run_case({16, 64, 8, 64, {1, 1, 0, 1}, {3000, 2, 5, 700}, 128, true}, DType::kBF16, 1e-5f, 1e-4f,
           DType::kBF16);
  run_case({16, 4, 2, 256, {1, 2}, {1500, 999}, 0, true}, DType::kBF16, 1e-5f, 1e-4f, DType::kBF16);
  run_case({16, 6, 3, 96, {1, 1}, {777, 64}, 300, false}, DType::kBF16, 1e-5f, 1e-4f, DType::kBF16);
}

// The GQA decode kernel (attention_decode_gqa_kernel; tuning attention_decode_gqa, from 32 query rows by
// default since session 40; 1 here: every call): groups of 8 (GPT-OSS's 64 / 8), 4 and 2 query heads per KV
// head (8 / 2, 6 / 3), head_dim 64 and 128, one split and several (long contexts), a sliding window, sinks, a
// sequence with no query row, block sizes 1 and 16, both cache dtypes; the f32 tolerance (the same f32 sums
// in another order).
TEST(GpuAttention, DecodeGqa) {
  SKIP_WITHOUT_GPU();
  k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
  t.attention_decode_gqa = 1;
  k::override_kernel_tuning(t);
  for (DType kv : {DType::kF32, DType::kBF16}) {
    for (int64_t bs : {1, 16}) {
      for (auto [h, kvh] : {std::pair<int64_t, int64_t>{64, 8}, {8, 2}, {6, 3}}) {
        for (int64_t d : {64, 128}) {
          run_case({bs, h, kvh, d, {1, 1, 1, 0, 1}, {1, 40, 23, 30, 17}, 0, true}, DType::kBF16, 1e-5f, 1e-4f,
                   kv);
          run_case({bs, h, kvh, d, {1, 1, 1}, {3000, 129, 700}, 128, false}, DType::kBF16, 1e-5f, 1e-4f, kv);
        }
      }
    }
    run_case({16, 32, 4, 128, {1, 1, 1}, {3000, 129, 4097}, 0, true}, DType::kBF16, 1e-5f, 1e-4f, kv);
  }
  k::override_kernel_tuning(std::nullopt);
}

// More, shorter decode splits (tuning attention_decode_ctas_per_sm / attention_decode_split_keys: up to 64
// splits of as few as 8 keys, many of them empty for short contexts), with the plain and the GQA decode
// kernels, merged by the combine kernel and by the split that finishes last (attention_decode_fused_combine:
// its counters must be zero again after every call, so the cases after the first check that too): the
// merge equals the reference within the f32 tolerance.
TEST(GpuAttention, DecodeManyShortSplits) {
  SKIP_WITHOUT_GPU();
  for (int64_t fused : {0, 1}) {
    for (int64_t gqa : {0, 1}) {
      k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
      t.attention_decode_gqa = gqa;
      t.attention_decode_ctas_per_sm = 32;
      t.attention_decode_split_keys = 8;
      t.attention_decode_fused_combine = fused;
      k::override_kernel_tuning(t);
      for (int64_t bs : {1, 16}) {
        run_case({bs, 64, 8, 64, {1}, {1}, 0, true}, DType::kBF16, 1e-5f, 1e-4f);
        run_case({bs, 64, 8, 64, {1}, {513}, 0, true}, DType::kBF16, 1e-5f, 1e-4f);
        run_case({bs, 64, 8, 64, {1, 1, 0, 1}, {3000, 2, 5, 700}, 128, true}, DType::kBF16, 1e-5f, 1e-4f);
        run_case({bs, 32, 4, 128, {1, 1}, {4097, 9}, 0, false}, DType::kBF16, 1e-5f, 1e-4f);
        run_case({bs, 6, 3, 96, {1, 1}, {777, 64}, 300, false}, DType::kBF16, 1e-5f, 1e-4f);
      }
      k::override_kernel_tuning(std::nullopt);
    }
  }
}

TEST(GpuWriteKv, SlotsAndPadding) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  int64_t kvh = 2, d = 5, bs = 4, nb = 6, m = 9, ld = kvh * d + 2;
  std::vector<float> kk = k::test::random_vec(static_cast<size_t>(m * ld), 1),
                     v = k::test::random_vec(kk.size(), 2);
  std::vector<int64_t> slots = {0, 5, -1, 23, 7, 8, -1, 12, 1};
  std::vector<float> kc_ref(static_cast<size_t>(nb * bs * kvh * d), 0.5f), vc_ref = kc_ref;
  k::KvWriteArgs a{.k = kk.data(),
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
  k::ref::write_kv(a);
  std::vector<float> init(kc_ref.size(), 0.5f);
  float* dk = ar.up(init);
  float* dv = ar.up(init);
  a.k = ar.up(kk);
  a.v = ar.up(v);
  a.slot_mapping = ar.up(slots);
  a.cache.k = dk;
  a.cache.v = dv;
  ar.be().write_kv(a);
  EXPECT_EQ(ar.down(dk, init.size()), kc_ref);
  EXPECT_EQ(ar.down(dv, init.size()), vc_ref);
  // A BF16 cache: each written element rounded to nearest even, the rest untouched.
  std::vector<uint16_t> init16(init.size(), f32_to_bf16(0.5f)), kc16_ref, vc16_ref;
  for (float x : kc_ref) kc16_ref.push_back(f32_to_bf16(x));
  for (float x : vc_ref) vc16_ref.push_back(f32_to_bf16(x));
  uint16_t* dk16 = ar.up(init16);
  uint16_t* dv16 = ar.up(init16);
  a.cache.k = dk16;
  a.cache.v = dv16;
  a.cache.dtype = DType::kBF16;
  ar.be().write_kv(a);
  EXPECT_EQ(ar.down(dk16, init16.size()), kc16_ref);
  EXPECT_EQ(ar.down(dv16, init16.size()), vc16_ref);
}

}  // namespace
}  // namespace polylora::gpu_test
