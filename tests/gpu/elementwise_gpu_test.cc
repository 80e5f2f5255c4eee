// tests/gpu/elementwise_gpu_test.cc: the CUDA backend's memory and small ops against the references:
// embedding (F32/F16/BF16 tables), rms_norm (n from 1 to 4097, strides, in place), rope (one head, odd head
// counts, big positions, YaRN scaling), silu_and_mul, gpt_oss_swiglu (clamps hit), add_inplace,
// gather_rows, matrix_from_host conversions and random_matrix statistics.
// Tolerances: exact for copies and conversions; 1e-6 + 1e-5·|ref| for norm/activations (expf, sums in
// another order); rope 1e-5 + 1e-5·|ref| (cos/sin in double as the reference).
#include <cmath>
#include <numeric>
#include <string>

#include "gpu_test_util.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;
using k::test::expect_close;
using k::test::random_vec;

TEST(GpuElementwise, NoGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_THROW(make_cuda_backend({.device = DeviceKind::kCuda}), Error);
}

TEST(GpuElementwise, BackendBasics) {
  SKIP_WITHOUT_GPU();
  Backend& be = backend();
  EXPECT_EQ(be.kind(), DeviceKind::kCuda);
  EXPECT_NE(be.name().find("cuda:0"), std::string::npos);
  Arena ar(be);
  float* z = ar.zeros<float>(1000);
  std::vector<float> host = ar.down(z, 1000);
  for (float v : host) ASSERT_EQ(v, 0.0f);
}

TEST(GpuElementwise, Embedding) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t m : {1, 9}) {
      int64_t vocab = 37, hidden = 45, ld = hidden + 3;
      k::test::TestWeight table = k::test::make_weight(vocab, hidden, dt, 5);
      std::vector<int32_t> ids(static_cast<size_t>(m));
      for (int64_t t = 0; t < m; ++t) ids[t] = static_cast<int32_t>((t * 7 + 36) % vocab);
      std::vector<float> ref(static_cast<size_t>(m * ld), 0.0f);
      k::ref::embedding({.ids = ids.data(), .m = m, .table = table.view, .out = ref.data(), .ld_out = ld});
      float* out = ar.zeros<float>(ref.size());
      ar.be().embedding(
          {.ids = ar.up(ids), .m = m, .table = ar.raw_weight(table.view), .out = out, .ld_out = ld});
      expect_close(ar.down(out, ref.size()), ref, 0.0f, 0.0f,
                   std::string("embedding ") + k::test::dtype_str(dt));
      // The same table as a vocabulary shard holding ids [20, 20 + vocab) (tensor parallelism): ids below
      // or past it read zeros.
      std::vector<int32_t> global(ids.size());
      for (size_t t = 0; t < ids.size(); ++t) global[t] = t % 3 == 1 ? static_cast<int32_t>(t) : ids[t] + 20;
      const k::EmbeddingArgs shard{.ids = global.data(),
                                   .m = m,
                                   .table = table.view,
                                   .out = ref.data(),
                                   .ld_out = ld,
                                   .id_begin = 20,
                                   .id_rows = vocab};
      k::ref::embedding(shard);
      k::EmbeddingArgs on_device = shard;
      on_device.ids = ar.up(global);
      on_device.table = ar.raw_weight(table.view);
      on_device.out = ar.zeros<float>(ref.size());
      ar.be().embedding(on_device);
      expect_close(ar.down(on_device.out, ref.size()), ref, 0.0f, 0.0f,
                   std::string("embedding shard ") + k::test::dtype_str(dt));
    }
  }
}

TEST(GpuElementwise, RmsNorm) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  // Odd strides (scalar loads) and, with pad 0, dense rows of n % 4 == 0 (16-byte loads); n up to 1024 runs
  // the warp-per-row kernel (m = 300 fills several blocks of 8 rows), longer rows the block-per-row one.
  for (int64_t n : {1, 33, 64, 128, 1000, 1024, 1025, 2048, 4097}) {
    for (int64_t m : {1, 7, 300}) {
      for (bool in_place : {false, true}) {
        const int64_t pad = n % 4 == 0 ? 0 : 5;
        int64_t ldx = n + pad, ldy = in_place ? ldx : n + (pad == 0 ? 4 : 2);
        std::vector<float> x = random_vec(static_cast<size_t>(m * ldx), 11, -3.0f, 3.0f);
        std::vector<float> w = random_vec(static_cast<size_t>(n), 12, 0.5f, 1.5f);
        std::vector<float> ref = in_place ? x : std::vector<float>(static_cast<size_t>(m * ldy), 0.0f);
        k::ref::rms_norm({.x = x.data(),
                          .ldx = ldx,
                          .y = ref.data(),
                          .ldy = ldy,
                          .m = m,
                          .n = n,
                          .w = w.data(),
                          .eps = 1e-5f});
        float* dx = ar.up(x);
        float* dy = in_place ? dx : ar.zeros<float>(ref.size());
        ar.be().rms_norm(
            {.x = dx, .ldx = ldx, .y = dy, .ldy = ldy, .m = m, .n = n, .w = ar.up(w), .eps = 1e-5f});
        expect_close(ar.down(dy, ref.size()), ref, 1e-6f, 1e-5f, "rms_norm n=" + std::to_string(n));
      }
    }
  }
}

TEST(GpuElementwise, Rope) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  for (int64_t heads : {1, 3}) {
    for (int64_t d : {2, 64, 128}) {
      for (float scaling : {1.0f, 1.3f}) {
        int64_t m = 5, ldx = heads * d + 4;
        std::vector<float> x = random_vec(static_cast<size_t>(m * ldx), 21, -2.0f, 2.0f);
        std::vector<int32_t> pos = {0, 1, 17, 4095, 100000};
        std::vector<float> inv(static_cast<size_t>(d / 2));
        for (int64_t i = 0; i < d / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / static_cast<float>(d));
        std::vector<float> ref = x;
        k::RopeArgs a{.x = ref.data(),
                      .ldx = ldx,
                      .m = m,
                      .num_heads = heads,
                      .head_dim = d,
                      .positions = pos.data(),
                      .inv_freq = inv.data(),
                      .attention_scaling = scaling};
        k::ref::rope(a);
        float* dx = ar.up(x);
        a.x = dx;
        a.positions = ar.up(pos);
        a.inv_freq = ar.up(inv);
        ar.be().rope(a);
        expect_close(ar.down(dx, x.size()), ref, 1e-5f, 1e-5f, "rope d=" + std::to_string(d));
      }
    }
  }
}

TEST(GpuElementwise, Activations) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  for (int64_t m : {1, 3}) {
    int64_t n = 77;
    std::vector<float> g = random_vec(static_cast<size_t>(m * (n + 1)), 31, -10.0f, 10.0f);
    std::vector<float> u = random_vec(static_cast<size_t>(m * (n + 2)), 32, -10.0f, 10.0f);
    std::vector<float> ref(static_cast<size_t>(m * (n + 3)), 0.0f);
    k::SiluAndMulArgs a{.gate = g.data(),
                        .ld_gate = n + 1,
                        .up = u.data(),
                        .ld_up = n + 2,
                        .out = ref.data(),
                        .ld_out = n + 3,
                        .m = m,
                        .n = n};
    k::ref::silu_and_mul(a);
    float* out = ar.zeros<float>(ref.size());
    a.gate = ar.up(g);
    a.up = ar.up(u);
    a.out = out;
    ar.be().silu_and_mul(a);
    expect_close(ar.down(out, ref.size()), ref, 1e-6f, 1e-5f, "silu_and_mul");

    std::vector<float> gu = random_vec(static_cast<size_t>(m * (2 * n + 1)), 33, -10.0f, 10.0f);
    std::vector<float> ref2(static_cast<size_t>(m * (n + 3)), 0.0f);
    k::GptOssSwigluArgs s{.gate_up = gu.data(),
                          .ld_in = 2 * n + 1,
                          .out = ref2.data(),
                          .ld_out = n + 3,
                          .m = m,
                          .n = n,
                          .alpha = 1.702f,
                          .limit = 7.0f};
    k::ref::gpt_oss_swiglu(s);
    float* out2 = ar.zeros<float>(ref2.size());
    s.gate_up = ar.up(gu);
    s.out = out2;
    ar.be().gpt_oss_swiglu(s);
    expect_close(ar.down(out2, ref2.size()), ref2, 1e-6f, 1e-5f, "gpt_oss_swiglu");
  }
}

TEST(GpuElementwise, AddAndGather) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  int64_t n = 100003;
  std::vector<float> y = random_vec(static_cast<size_t>(n), 41), x = random_vec(static_cast<size_t>(n), 42);
  float* dy = ar.up(y);
  ar.be().add_inplace(dy, ar.up(x), n);
  std::vector<float> ref(y.size());
  for (size_t i = 0; i < y.size(); ++i) ref[i] = y[i] + x[i];
  expect_close(ar.down(dy, ref.size()), ref, 0.0f, 0.0f, "add_inplace");

  int64_t cols = 129;
  std::vector<float> src = random_vec(static_cast<size_t>(10 * cols), 43);
  std::vector<int32_t> rows = {9, 0, 4};
  float* dst = ar.zeros<float>(rows.size() * cols);
  ar.be().gather_rows(ar.up(src), ar.up(rows), 3, cols, dst);
  std::vector<float> want;
  for (int32_t r : rows) want.insert(want.end(), src.begin() + r * cols, src.begin() + (r + 1) * cols);
  expect_close(ar.down(dst, want.size()), want, 0.0f, 0.0f, "gather_rows");
}

TEST(GpuElementwise, MatrixFromHostConverts) {
  SKIP_WITHOUT_GPU();
  for (DType target : {DType::kBF16, DType::kF32}) {
    Arena ar(backend(target));
    for (DType src : {DType::kF32, DType::kF16, DType::kBF16}) {
      k::test::TestWeight w = k::test::make_weight(13, 31, src, 51);
      k::WeightView d = ar.weight(w.view);
      ASSERT_EQ(d.dtype, target);
      size_t n = 13 * 31;
      std::vector<float> got(n), want(n);
      if (target == DType::kF32) {
        got = ar.down(static_cast<const float*>(d.data), n);
      } else {
        std::vector<uint16_t> bits = ar.down(static_cast<const uint16_t*>(d.data), n);
        for (size_t i = 0; i < n; ++i) got[i] = bf16_to_f32(bits[i]);
      }
      for (size_t i = 0; i < n; ++i) {
        float v = w.view.at(static_cast<int64_t>(i / 31), static_cast<int64_t>(i % 31));
        want[i] = target == DType::kF32 ? v : bf16_to_f32(f32_to_bf16(v));
      }
      expect_close(got, want, 0.0f, 0.0f, std::string("matrix_from_host ") + k::test::dtype_str(src));
    }
  }
}

TEST(GpuElementwise, RandomMatrix) {
  SKIP_WITHOUT_GPU();
  for (DType target : {DType::kBF16, DType::kF32}) {
    Backend& be = backend(target);
    k::WeightView w = be.random_matrix(300, 1001, 0.02f, 7);
    k::WeightView w2 = be.random_matrix(300, 1001, 0.02f, 7);
    size_t n = 300 * 1001;
    std::vector<float> v(n), v2(n);
    auto fetch = [&](const k::WeightView& m, std::vector<float>& out) {
      if (target == DType::kF32) {
        be.copy_to_host(out.data(), m.data, n * 4);
      } else {
        std::vector<uint16_t> bits(n);
        be.copy_to_host(bits.data(), m.data, n * 2);
        for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(bits[i]);
      }
    };
    fetch(w, v);
    fetch(w2, v2);
    EXPECT_EQ(v, v2) << "same seed, same matrix";
    double sum = 0, sq = 0, mx = 0;
    for (float f : v) {
      sum += f;
      sq += double(f) * f;
      mx = std::max(mx, std::fabs(double(f)));
    }
    double mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 1e-4);
    EXPECT_NEAR(sd, 0.02, 5e-4);
    EXPECT_LE(mx, 0.02 * 1.7320508 * 1.01);
    be.free(const_cast<void*>(w.data));
    be.free(const_cast<void*>(w2.data));
  }
}

}  // namespace
}  // namespace polylora::gpu_test
