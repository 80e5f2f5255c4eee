// tests/kernels/elementwise_test.cc: cpu::{silu_and_mul, gpt_oss_swiglu, rms_norm, rope, embedding} against
// their references over odd sizes, strides and in-place use, on the SIMD and the scalar path.
// Tolerances: activations atol 1e-6 + rtol 1e-5 (vectorised exp, ~2 ulp); rms_norm atol 1e-6 + rtol 1e-5
// (summation order); rope atol 1e-6 + rtol 1e-5 (FMA contraction); embedding exact (conversion only).
#include <gtest/gtest.h>

#include <string>

#include "kernel_test_util.h"
#include "kernels/activation/activation.h"
#include "kernels/embedding/embedding.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"

namespace polylora::kernels {
namespace {

std::string shape(int64_t m, int64_t n) {
  return "m=" + std::to_string(m) + " n=" + std::to_string(n);
}

TEST(ActivationCpu, SiluAndMul) {
  for (int64_t m : {1, 3, 64}) {
    for (int64_t n : {1, 7, 8, 17, 255}) {
      int64_t ld = n + 3;
      std::vector<float> g = test::random_vec(static_cast<size_t>(m * ld), 1, -20.0f, 20.0f);
      std::vector<float> u = test::random_vec(static_cast<size_t>(m * ld), 2, -3.0f, 3.0f);
      std::vector<float> ref(static_cast<size_t>(m * ld), 5.0f);
      SiluAndMulArgs a{.gate = g.data(),
                       .ld_gate = ld,
                       .up = u.data(),
                       .ld_up = ld,
                       .out = ref.data(),
                       .ld_out = ld,
                       .m = m,
                       .n = n};
      ref::silu_and_mul(a);
      test::for_each_isa([&](const char* isa) {
        std::vector<float> out(ref.size(), 5.0f);
        SiluAndMulArgs f = a;
        f.out = out.data();
        cpu::silu_and_mul(f);
        test::expect_close(out, ref, 1e-6f, 1e-5f, std::string(isa) + " " + shape(m, n));
      });
    }
  }
}

TEST(ActivationCpu, GptOssSwiglu) {
  for (int64_t m : {1, 5, 64}) {
    for (int64_t n : {1, 7, 8, 33, 255}) {
      std::vector<float> in = test::random_vec(static_cast<size_t>(m * 2 * n), 3, -12.0f, 12.0f);
      std::vector<float> ref(static_cast<size_t>(m * n));
      GptOssSwigluArgs a{
          .gate_up = in.data(), .ld_in = 2 * n, .out = ref.data(), .ld_out = n, .m = m, .n = n};
      ref::gpt_oss_swiglu(a);
      test::for_each_isa([&](const char* isa) {
        std::vector<float> out(ref.size());
        GptOssSwigluArgs f = a;
        f.out = out.data();
        cpu::gpt_oss_swiglu(f);
        test::expect_close(out, ref, 1e-6f, 1e-5f, std::string(isa) + " " + shape(m, n));
      });
    }
  }
}

TEST(RmsNormCpu, StridesAndInPlace) {
  for (int64_t m : {1, 4, 300}) {
    for (int64_t n : {1, 3, 17, 128, 1025}) {
      int64_t ld = n + 2;
      std::vector<float> x = test::random_vec(static_cast<size_t>(m * ld), 4, -4.0f, 4.0f);
      std::vector<float> w = test::random_vec(static_cast<size_t>(n), 5);
      std::vector<float> ref(x.size(), 0.0f);
      RmsNormArgs a{
          .x = x.data(), .ldx = ld, .y = ref.data(), .ldy = ld, .m = m, .n = n, .w = w.data(), .eps = 1e-6f};
      ref::rms_norm(a);
      test::for_each_isa([&](const char* isa) {
        std::vector<float> y(x.size(), 0.0f);
        RmsNormArgs f = a;
        f.y = y.data();
        cpu::rms_norm(f);
        test::expect_close(y, ref, 1e-6f, 1e-5f, std::string(isa) + " " + shape(m, n));
        std::vector<float> inplace = x;
        f.x = inplace.data();
        f.y = inplace.data();
        cpu::rms_norm(f);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = n; j < ld; ++j) inplace[i * ld + j] = 0.0f;  // padding is not written by either
        }
        test::expect_close(inplace, ref, 1e-6f, 1e-5f, std::string(isa) + " in place " + shape(m, n));
      });
    }
  }
}

TEST(RopeCpu, HeadsPositionsScaling) {
  for (int64_t m : {1, 5, 77}) {
    for (int64_t heads : {1, 3, 8}) {
      for (int64_t d : {2, 6, 64, 128}) {
        int64_t ldx = heads * d + 4;
        std::vector<float> x = test::random_vec(static_cast<size_t>(m * ldx), 6);
        std::vector<int32_t> pos(static_cast<size_t>(m));
        for (int64_t t = 0; t < m; ++t) pos[t] = static_cast<int32_t>((t * 37) % 5000);
        std::vector<float> inv_freq(static_cast<size_t>(d / 2));
        for (int64_t i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / d);
        std::vector<float> ref = x;
        RopeArgs a{.x = ref.data(),
                   .ldx = ldx,
                   .m = m,
                   .num_heads = heads,
                   .head_dim = d,
                   .positions = pos.data(),
                   .inv_freq = inv_freq.data(),
                   .attention_scaling = 1.25f};
        ref::rope(a);
        test::for_each_isa([&](const char* isa) {
          std::vector<float> got = x;
          RopeArgs f = a;
          f.x = got.data();
          cpu::rope(f);
          test::expect_close(got, ref, 1e-6f, 1e-5f,
                             std::string(isa) + " " + shape(m, heads) + " d=" + std::to_string(d));
        });
      }
    }
  }
}

TEST(EmbeddingCpu, AllDtypesExact) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t hidden : {1, 7, 16, 129}) {
      test::TestWeight table = test::make_weight(50, hidden, dtype, 7);
      std::vector<int32_t> ids = {0, 49, 3, 3, 17, 0, 8, 9, 10, 11, 12, 13, 14};
      int64_t m = static_cast<int64_t>(ids.size()), ld = hidden + 1;
      std::vector<float> ref(static_cast<size_t>(m * ld), 2.0f);
      EmbeddingArgs a{.ids = ids.data(), .m = m, .table = table.view, .out = ref.data(), .ld_out = ld};
      ref::embedding(a);
      test::for_each_isa([&](const char* isa) {
        std::vector<float> out(ref.size(), 2.0f);
        EmbeddingArgs f = a;
        f.out = out.data();
        cpu::embedding(f);
        test::expect_close(
            out, ref, 0.0f, 0.0f,
            std::string(isa) + " " + test::dtype_str(dtype) + " hidden=" + std::to_string(hidden));
      });
    }
  }
}

// A vocabulary shard (tensor parallelism): the table holds ids [100, 100 + rows); every other id reads zeros,
// the ids inside read their row (id - 100), on the reference and on the fast path.
TEST(EmbeddingCpu, VocabularyShard) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t rows = 11, hidden = 19, ld = hidden + 2;
    test::TestWeight table = test::make_weight(rows, hidden, dtype, 4);
    const std::vector<int32_t> ids = {99, 100, 105, 110, 111, 0, 107, 5000};
    const int64_t m = static_cast<int64_t>(ids.size());
    std::vector<float> expect(static_cast<size_t>(m * ld), 7.0f);
    for (int64_t t = 0; t < m; ++t) {
      const int64_t row = ids[t] - 100;
      for (int64_t c = 0; c < hidden; ++c)
        expect[t * ld + c] = row >= 0 && row < rows ? table.view.at(row, c) : 0.0f;
    }
    for (bool fast : {false, true}) {
      std::vector<float> out(expect.size(), 7.0f);
      EmbeddingArgs a{.ids = ids.data(),
                      .m = m,
                      .table = table.view,
                      .out = out.data(),
                      .ld_out = ld,
                      .id_begin = 100,
                      .id_rows = rows};
      fast ? cpu::embedding(a) : ref::embedding(a);
      test::expect_close(out, expect, 0.0f, 0.0f,
                         std::string(fast ? "cpu " : "ref ") + test::dtype_str(dtype));
    }
  }
}

}  // namespace
}  // namespace polylora::kernels
