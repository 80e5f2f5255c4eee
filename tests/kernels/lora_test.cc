// tests/kernels/lora_test.cc: cpu::lora_apply against ref::lora_apply: rank 1 and larger, odd in/out,
// all rows or a subset of rows (few rows: dot path; many: sgemm path), strided x and y.
// Tolerance: atol 1e-5 + rtol 1e-4 (summation order).
#include <gtest/gtest.h>

#include <string>

#include "kernel_test_util.h"
#include "kernels/lora/lora.h"

namespace polylora::kernels {
namespace {

void check_lora(int64_t total_rows, std::vector<int32_t> rows, int64_t num_rows, int64_t rank, int64_t in,
                int64_t out) {
  int64_t ldx = in + 3, ldy = out + 1;
  std::vector<float> x = test::random_vec(static_cast<size_t>(total_rows * ldx), 1);
  std::vector<float> la = test::random_vec(static_cast<size_t>(rank * in), 2);
  std::vector<float> lb = test::random_vec(static_cast<size_t>(out * rank), 3);
  std::vector<float> y0 = test::random_vec(static_cast<size_t>(total_rows * ldy), 4);
  std::vector<float> ref = y0;
  LoraApplyArgs a{
      .x = x.data(),
      .ldx = ldx,
      .y = ref.data(),
      .ldy = ldy,
      .rows = rows.empty() ? nullptr : rows.data(),
      .num_rows = num_rows,
      .lora = {.a = la.data(), .b = lb.data(), .rank = rank, .in = in, .out = out, .scale = 0.75f}};
  ref::lora_apply(a);
  test::for_each_isa([&](const char* isa) {
    std::vector<float> y = y0;
    LoraApplyArgs f = a;
    f.y = y.data();
    cpu::lora_apply(f);
    test::expect_close(y, ref, 1e-5f, 1e-4f,
                       std::string(isa) + " rows=" + std::to_string(num_rows) +
                           (rows.empty() ? "" : " (subset)") + " rank=" + std::to_string(rank) +
                           " in=" + std::to_string(in) + " out=" + std::to_string(out));
  });
}

TEST(LoraCpu, RanksShapesAndRowSubsets) {
  for (int64_t rank : {1, 4, 16}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{1, 1}, {17, 3}, {129, 255}}) {
      for (int64_t n : {1, 3, 5, 70, 150}) {
        check_lora(n, {}, n, rank, in, out);
        std::vector<int32_t> subset;
        for (int32_t r = 0; r < 2 * n; r += 2) subset.push_back(r == 0 ? 1 : r);  // distinct, unsorted start
        check_lora(2 * n + 1, subset, n, rank, in, out);
      }
    }
  }
}

TEST(LoraCpu, EmptyViewAndNoRowsAreNoOps) {
  std::vector<float> x(4, 1.0f), y(4, 2.0f);
  cpu::lora_apply(
      {.x = x.data(), .ldx = 4, .y = y.data(), .ldy = 4, .rows = nullptr, .num_rows = 1, .lora = {}});
  std::vector<float> a(4, 1.0f), b(4, 1.0f);
  cpu::lora_apply({.x = x.data(),
                   .ldx = 4,
                   .y = y.data(),
                   .ldy = 4,
                   .rows = nullptr,
                   .num_rows = 0,
                   .lora = {.a = a.data(), .b = b.data(), .rank = 1, .in = 4, .out = 4}});
  EXPECT_EQ(y, std::vector<float>(4, 2.0f));
}

}  // namespace
}  // namespace polylora::kernels
