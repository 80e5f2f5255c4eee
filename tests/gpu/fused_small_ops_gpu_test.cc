// tests/gpu/fused_small_ops_gpu_test.cc: the CUDA backend's fused small ops of the decode path against
// their references (and add_rms_norm against the CUDA op pair it replaces):
// - add_rms_norm: x += delta, y = rms_norm(x)·w, over m = 1, 7, 300 and 4096 rows, n from 1 to 4097 (the
//   warp-per-row kernel up to 1024, the block-per-row one above; 16-byte loads for dense rows of
//   n % 4 == 0, scalar ones for odd n and strides or a misaligned delta), y aliasing delta.
// - rope_kv_write: q/k per-head RMSNorm (qk_norm) + RoPE on q and k + the paged KV-cache write, at
//   GPT-OSS-20B's (64 q / 8 kv heads of 64) and Qwen3-30B-A3B's (32 / 4 of 128, qk_norm) shapes, odd head
//   counts, odd and tiny head_dim, head_dim 256; m = 1, 5, 300 and 2048; slots scattered over the blocks in
//   reverse order with padding tokens (slot −1); positions up to ~105000; attention_scaling (YaRN) 1.3.
// Tolerances: x exact (f32 adds); add_rms_norm's y atol 1e-6 + rtol 1e-5 against the reference (the
// rms_norm test's: sums of squares in another order) and bit-identical to add_inplace then rms_norm on the
// device where both take the same load width (same kernels, same thread-to-element map, same reduction);
// rope_kv_write's q and cached k atol 1e-5 + rtol 1e-5 (the rope test's: cos/sin in double as the
// reference, FMA contraction, plus the norm's summation order), the cached v and every slot no token maps to
// exact (copies; sentinels), k's input unchanged.
#include <cmath>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/rope_kv_test_util.h"
#include "kernels/tuning.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;
using k::test::expect_bitwise;
using k::test::expect_close;
using k::test::random_vec;

struct AddNormCase {
  int64_t m, n, ldx, ld_delta, ldy;
  bool y_is_delta;  // y written over delta (ldy == ld_delta)
};

void run_add_rms_norm(Arena& ar, const AddNormCase& c) {
  const std::string what = "add_rms_norm m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) +
                           " ld=" + std::to_string(c.ldx) + "/" + std::to_string(c.ld_delta) + "/" +
                           std::to_string(c.ldy) + (c.y_is_delta ? " y=delta" : "");
  const std::vector<float> x0 = random_vec(static_cast<size_t>(c.m * c.ldx), 61, -3.0f, 3.0f);
  const std::vector<float> delta = random_vec(static_cast<size_t>(c.m * c.ld_delta), 62, -3.0f, 3.0f);
  const std::vector<float> w = random_vec(static_cast<size_t>(c.n), 63, 0.5f, 1.5f);
  // y's padding (and, with y = delta, delta's own padding) must come back unchanged.
  const std::vector<float> y0 =
      c.y_is_delta ? delta : std::vector<float>(static_cast<size_t>(c.m * c.ldy), 7.0f);

  std::vector<float> x_ref = x0, y_ref = y0;
  k::ref::add_rms_norm({.x = x_ref.data(),
                        .ldx = c.ldx,
                        .delta = delta.data(),
                        .ld_delta = c.ld_delta,
                        .y = y_ref.data(),
                        .ldy = c.ldy,
                        .m = c.m,
                        .n = c.n,
                        .w = w.data(),
                        .eps = 1e-5f});

  float* dx = ar.up(x0);
  float* dd = ar.up(delta);
  float* dy = c.y_is_delta ? dd : ar.up(y0);
  const float* dw = ar.up(w);
  ar.be().add_rms_norm({.x = dx,
                        .ldx = c.ldx,
                        .delta = dd,
                        .ld_delta = c.ld_delta,
                        .y = dy,
                        .ldy = c.ldy,
                        .m = c.m,
                        .n = c.n,
                        .w = dw,
                        .eps = 1e-5f});
  expect_bitwise(ar.down(dx, x0.size()), x_ref, "x (= x + delta) " + what);
  const std::vector<float> y = ar.down(dy, y0.size());
  expect_close(y, y_ref, 1e-6f, 1e-5f, "y vs ref " + what);

  // The op pair it replaces, on the device: add_inplace row by row (strided rows), then rms_norm.
  if (c.y_is_delta) return;
  float* dx2 = ar.up(x0);
  float* dy2 = ar.up(y0);
  for (int64_t i = 0; i < c.m; ++i) ar.be().add_inplace(dx2 + i * c.ldx, dd + i * c.ld_delta, c.n);
  ar.be().rms_norm(
      {.x = dx2, .ldx = c.ldx, .y = dy2, .ldy = c.ldy, .m = c.m, .n = c.n, .w = dw, .eps = 1e-5f});
  // The kernels take 16-byte loads when n and the strides allow (the buffers are 256-byte aligned); the
  // fused op also needs delta's stride to. Only the same load width gives the same summation order.
  const bool vec_pair = c.n % 4 == 0 && c.ldx % 4 == 0 && c.ldy % 4 == 0;
  const bool vec_fused = vec_pair && c.ld_delta % 4 == 0;
  if (vec_pair == vec_fused)
    expect_bitwise(y, ar.down(dy2, y0.size()), "y vs add_inplace + rms_norm " + what);
}

TEST(GpuFusedOps, AddRmsNorm) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  for (int64_t n : {1, 33, 64, 1000, 1024, 1025, 2880, 4097}) {
    for (int64_t m : {1, 7, 300}) {
      if (n % 4 == 0) {
        run_add_rms_norm(ar, {m, n, n, n, n, false});          // dense: 16-byte loads
        run_add_rms_norm(ar, {m, n, n, n + 1, n + 4, false});  // delta misaligned: scalar loads
      } else {
        run_add_rms_norm(ar, {m, n, n + 5, n + 3, n + 2, false});
      }
      run_add_rms_norm(ar, {m, n, n + 2, n + 1, n + 1, true});
    }
  }
  run_add_rms_norm(ar, {4096, 2880, 2880, 2880, 2880, false});  // a long prefill chunk at GPT-OSS's width
}

void run_rope_kv_write(Arena& ar, const k::test::RopeKvCase& c) {
  const k::test::RopeKvData d(c);
  const std::string what = "rope_kv_write " + c.name();
  std::vector<float> q_ref = d.q, ck_ref = d.cache_k, cv_ref = d.cache_v;
  k::ref::rope_kv_write(d.args(c, q_ref.data(), ck_ref.data(), cv_ref.data()));

  float* dq = ar.up(d.q);
  float* dck = ar.up(d.cache_k);
  float* dcv = ar.up(d.cache_v);
  k::RopeKvWriteArgs a = d.args(c, dq, dck, dcv);
  float* dk = ar.up(d.k);
  a.k = dk;
  a.v = ar.up(d.v);
  a.positions = ar.up(d.pos);
  a.inv_freq = ar.up(d.inv_freq);
  if (c.qk_norm) {
    a.q_norm = ar.up(d.q_norm);
    a.k_norm = ar.up(d.k_norm);
  }
  a.slot_mapping = ar.up(d.slots);
  ar.be().rope_kv_write(a);

  expect_close(ar.down(dq, d.q.size()), q_ref, 1e-5f, 1e-5f, "q " + what);
  const std::vector<float> ck = ar.down(dck, d.cache_k.size()), cv = ar.down(dcv, d.cache_v.size());
  expect_close(ck, ck_ref, 1e-5f, 1e-5f, "cache k " + what);
  expect_bitwise(cv, cv_ref, "cache v " + what);
  k::test::expect_cache_layout(c, d, ck, cv, what);
  expect_bitwise(ar.down(dk, d.k.size()), d.k, "k input left as it was " + what);
}

// The same into a BF16 cache (--kv-cache-dtype bfloat16): q as with an f32 cache; every cached element the
// f32 reference's value rounded to bf16 (k within one bf16 step of it: the f32 sums may differ in the last
// bits, which can move a rounding; v exactly), untouched slots unchanged.
void run_rope_kv_write_bf16(Arena& ar, const k::test::RopeKvCase& c) {
  const k::test::RopeKvData d(c);
  const std::string what = "rope_kv_write bf16 cache " + c.name();
  std::vector<float> q_ref = d.q, ck_ref = d.cache_k, cv_ref = d.cache_v;
  k::ref::rope_kv_write(d.args(c, q_ref.data(), ck_ref.data(), cv_ref.data()));
  auto to16 = [](const std::vector<float>& x) {
    std::vector<uint16_t> r;
    r.reserve(x.size());
    for (float f : x) r.push_back(f32_to_bf16(f));
    return r;
  };
  float* dq = ar.up(d.q);
  uint16_t* dck = ar.up(to16(d.cache_k));
  uint16_t* dcv = ar.up(to16(d.cache_v));
  k::RopeKvWriteArgs a = d.args(c, dq, nullptr, nullptr);
  a.cache.k = dck;
  a.cache.v = dcv;
  a.cache.dtype = DType::kBF16;
  a.k = ar.up(d.k);
  a.v = ar.up(d.v);
  a.positions = ar.up(d.pos);
  a.inv_freq = ar.up(d.inv_freq);
  if (c.qk_norm) {
    a.q_norm = ar.up(d.q_norm);
    a.k_norm = ar.up(d.k_norm);
  }
  a.slot_mapping = ar.up(d.slots);
  ar.be().rope_kv_write(a);
  expect_close(ar.down(dq, d.q.size()), q_ref, 1e-5f, 1e-5f, "q " + what);
  std::vector<float> ck, cv;
  for (uint16_t h : ar.down(dck, d.cache_k.size())) ck.push_back(bf16_to_f32(h));
  for (uint16_t h : ar.down(dcv, d.cache_v.size())) cv.push_back(bf16_to_f32(h));
  std::vector<float> ck_round, cv_round;
  for (float f : ck_ref) ck_round.push_back(bf16_to_f32(f32_to_bf16(f)));
  for (float f : cv_ref) cv_round.push_back(bf16_to_f32(f32_to_bf16(f)));
  expect_close(ck, ck_round, 1e-5f, 8e-3f, "cache k " + what);
  expect_bitwise(cv, cv_round, "cache v " + what);
}

TEST(GpuFusedOps, RopeKvWriteBf16Cache) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  run_rope_kv_write_bf16(ar, {5, 64, 8, 64, false, 1.3f});    // GPT-OSS-20B
  run_rope_kv_write_bf16(ar, {300, 32, 4, 128, true, 1.0f});  // Qwen3-30B-A3B, qk_norm
  run_rope_kv_write_bf16(ar, {5, 6, 3, 7, true, 1.0f});       // odd head_dim
}

TEST(GpuFusedOps, RopeKvWrite) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  struct Shape {
    int64_t heads, kv_heads, d;
    bool qk_norm;
  };
  const Shape shapes[] = {
      {64, 8, 64, false},  // GPT-OSS-20B
      {32, 4, 128, true},  // Qwen3-30B-A3B
      {32, 4, 128, false}, {3, 1, 6, true},   {6, 3, 7, true},   {6, 3, 7, false},
      {1, 1, 2, false},    {5, 5, 256, true}, {37, 3, 64, false}};  // plain heads of 64 in batches of 4 with
                                                                    // a ragged tail
  for (const Shape& s : shapes)
    for (int64_t m : {1, 5, 300})
      for (float scaling : {1.0f, 1.3f})
        run_rope_kv_write(ar, {m, s.heads, s.kv_heads, s.d, s.qk_norm, scaling});
  run_rope_kv_write(ar, {2048, 64, 8, 64, false, 1.3f});  // a prefill chunk
  run_rope_kv_write(ar, {2048, 32, 4, 128, true, 1.0f});
  // m = 300 and 2,048 above take one CTA per token (rope_kv_write_loop_min_rows, default 256); the small
  // steps the same way, and the prefill chunk a CTA per 4 heads.
  for (int64_t from : {1, 0}) {
    k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
    t.rope_kv_write_loop_min_rows = from;
    k::override_kernel_tuning(t);
    for (const Shape& s : shapes) run_rope_kv_write(ar, {5, s.heads, s.kv_heads, s.d, s.qk_norm, 1.3f});
    run_rope_kv_write(ar, {2048, 64, 8, 64, false, 1.3f});
  }
  k::override_kernel_tuning(std::nullopt);
}

// The CPU test's hand-worked case on the device: head_dim 2, inv_freq 1, scaling 2; token 0 at position 0
// to slot 5, token 1 at position 1 (a rotation by 1 radian) to slot 2.
TEST(GpuFusedOps, RopeKvWriteKnownRotation) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  const std::vector<float> q0 = {1.0f, 0.0f, 1.0f, 0.0f}, kv_k = {0.0f, 1.0f, 0.0f, 1.0f},
                           kv_v = {3.0f, 4.0f, 5.0f, 6.0f}, inv = {1.0f}, sentinel(16, -9.0f);
  const std::vector<int32_t> pos = {0, 1};
  const std::vector<int64_t> slots = {5, 2};
  float* dq = ar.up(q0);
  float* dck = ar.up(sentinel);
  float* dcv = ar.up(sentinel);
  ar.be().rope_kv_write(
      {.q = dq,
       .ldq = 2,
       .k = ar.up(kv_k),
       .ldk = 2,
       .v = ar.up(kv_v),
       .ldv = 2,
       .m = 2,
       .num_heads = 1,
       .num_kv_heads = 1,
       .head_dim = 2,
       .positions = ar.up(pos),
       .inv_freq = ar.up(inv),
       .attention_scaling = 2.0f,
       .slot_mapping = ar.up(slots),
       .cache = {.k = dck, .v = dcv, .num_blocks = 2, .block_size = 4, .num_kv_heads = 1, .head_dim = 2}});
  const float c1 = 2.0f * static_cast<float>(std::cos(1.0)), s1 = 2.0f * static_cast<float>(std::sin(1.0));
  const std::vector<float> q = ar.down(dq, 4), ck = ar.down(dck, 16), cv = ar.down(dcv, 16);
  std::vector<float> want_ck = sentinel, want_cv = sentinel;
  want_ck[10] = 0.0f, want_ck[11] = 2.0f, want_ck[4] = -s1, want_ck[5] = c1;
  want_cv[10] = 3.0f, want_cv[11] = 4.0f, want_cv[4] = 5.0f, want_cv[5] = 6.0f;
  expect_close(q, {2.0f, 0.0f, c1, s1}, 1e-6f, 1e-6f, "q");
  expect_close(ck, want_ck, 1e-6f, 1e-6f, "cache k");
  expect_bitwise(cv, want_cv, "cache v");
}

}  // namespace
}  // namespace polylora::gpu_test
