// tests/gpu/linear_gpu_test.cc: the CUDA linear (cuBLAS) against ref::linear on odd shapes (1×1×1, one
// row, k = 4096, n = 3001), row strides ldx/ldy wider than the matrix, bias on and off, F32 and BF16
// backends (BF16 with hi + lo activations, stacked for few rows (m <= 64) and two GEMMs for more, and with
// rounded activations). Weights scaled by 1/√k so outputs are O(1). Tolerances: gpu_test_util.h (F32
// 1e-4 + 1e-4·|ref|, BF16 hi+lo 5e-4·max(1, rms(ref)) + 5e-4·|ref|, BF16 rounded 2e-2 likewise; the
// reference sees the same bf16 weights).
#include <cmath>
#include <string>

#include "gpu_test_util.h"
#include "kernels/tuning.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;

TEST(GpuLinear, MatchesReference) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t m, kk, n;
  };
  for (const Mode& mode : kModes) {
    const DType dt = mode.dtype;
    Arena ar(backend(mode));
    for (Shape s : {Shape{1, 1, 1}, Shape{1, 33, 17}, Shape{7, 64, 129}, Shape{130, 257, 65},
                    Shape{3, 4096, 5}, Shape{2, 64, 3001}, Shape{65, 200, 33}}) {
      for (bool bias : {false, true}) {
        int64_t ldx = s.kk + 3, ldy = s.n + 5;
        k::test::TestWeight w =
            k::test::make_weight(s.n, s.kk, dt, 61, 1.0f / std::sqrt(static_cast<float>(s.kk)));
        std::vector<float> x = k::test::random_vec(static_cast<size_t>(s.m * ldx), 62);
        std::vector<float> b = k::test::random_vec(static_cast<size_t>(s.n), 63);
        std::vector<float> ref(static_cast<size_t>(s.m * ldy), 0.0f);
        k::ref::linear({.x = x.data(),
                        .m = s.m,
                        .ldx = ldx,
                        .w = w.view,
                        .bias = bias ? b.data() : nullptr,
                        .y = ref.data(),
                        .ldy = ldy});
        float* y = ar.zeros<float>(ref.size());
        ar.be().linear({.x = ar.up(x),
                        .m = s.m,
                        .ldx = ldx,
                        .w = ar.weight(w.view),
                        .bias = bias ? ar.up(b) : nullptr,
                        .y = y,
                        .ldy = ldy});
        expect_close_for(mode, ar.down(y, ref.size()), ref,
                         std::string(k::test::dtype_str(dt)) + " m=" + std::to_string(s.m) +
                             " k=" + std::to_string(s.kk) + " n=" + std::to_string(s.n));
      }
    }
  }
}

// Few rows (m <= 8) of BF16 weights with 16-byte rows and activation rows take the weight-streaming kernel
// (linear_cuda.cu's linear_stream_kernel, f32 activations): every m bucket (1, 2, 3-4, 5-8), every K-slice
// count (n = 5000: 1, 4096 / 3001: 2, 1100: 4, 513 and below: 8), widths that are and are not multiples of a
// CTA's rows, K that is not a multiple of the load step or of 8 slices (24: slices past K are empty), wide y
// strides, bias on and off. Poisoned output: every element must be written, the padding columns untouched.
struct StreamShape {
  int64_t m, kk, n;
};

void check_streamed(const std::vector<StreamShape>& shapes) {
  Arena ar(backend(kBf16Mode));
  for (StreamShape s : shapes) {
    for (bool bias : {false, true}) {
      const int64_t ldx = s.kk + 4, ldy = s.n + 5;
      k::test::TestWeight w =
          k::test::make_weight(s.n, s.kk, DType::kBF16, 81, 1.0f / std::sqrt(static_cast<float>(s.kk)));
      std::vector<float> x = k::test::random_vec(static_cast<size_t>(s.m * ldx), 82 + s.m);
      std::vector<float> b = k::test::random_vec(static_cast<size_t>(s.n), 83);
      std::vector<float> ref(static_cast<size_t>(s.m * ldy), -7.0f);
      k::ref::linear({.x = x.data(),
                      .m = s.m,
                      .ldx = ldx,
                      .w = w.view,
                      .bias = bias ? b.data() : nullptr,
                      .y = ref.data(),
                      .ldy = ldy});
      float* y = ar.up(std::vector<float>(ref.size(), -7.0f));
      ar.be().linear({.x = ar.up(x),
                      .m = s.m,
                      .ldx = ldx,
                      .w = ar.weight(w.view),
                      .bias = bias ? ar.up(b) : nullptr,
                      .y = y,
                      .ldy = ldy});
      const std::string what = "streamed m=" + std::to_string(s.m) + " k=" + std::to_string(s.kk) +
                               " n=" + std::to_string(s.n) + (bias ? " bias" : "");
      std::vector<float> got = ar.down(y, ref.size());
      for (int64_t i = 0; i < s.m; ++i)
        for (int64_t j = s.n; j < ldy; ++j) ASSERT_EQ(got[i * ldy + j], -7.0f) << what << " wrote padding";
      expect_close_for(kBf16Mode, got, ref, what);
    }
  }
}

TEST(GpuLinear, FewRowsStreamBf16Weights) {
  SKIP_WITHOUT_GPU();
  check_streamed({{1, 8, 1},
                  {1, 2880, 4096},
                  {2, 1032, 17},
                  {3, 2888, 513},
                  {4, 64, 32},
                  {5, 4104, 33},
                  {8, 2880, 3001},
                  {7, 24, 100},
                  {2, 2880, 1100},
                  {1, 2880, 5000}});
}

// With linear_stream_max_rows 16 (the tuning field; 8 by default), 9 to 16 rows take the 16-row passes.
TEST(GpuLinear, StreamSixteenRowPasses) {
  SKIP_WITHOUT_GPU();
  k::KernelTuning t;
  t.linear_stream_max_rows = 16;
  k::override_kernel_tuning(t);
  check_streamed(
      {{9, 2880, 4096}, {16, 1032, 17}, {12, 2888, 513}, {16, 24, 100}, {13, 2880, 1100}, {16, 2880, 5000}});
  k::override_kernel_tuning(std::nullopt);
}

// Products of one x in one launch (Backend::linear_group, linear_stream_kernel over a table of products;
// past the streamed rows, cuBLAS products from one cast of x):
// q/k/v-like groups of 2 and 3 products with different widths (rows that do not fill a CTA's block, a product
// boundary inside a block), different y strides and biases, every m bucket, against ref::linear per product;
// poisoned padding columns must stay untouched. A group that cannot fuse (two x) runs product by product.
// Run with and without the shared cast (KernelTuning::linear_group_shared_cast).
void group_of_products_sharing_the_input() {
  Arena ar(backend(kBf16Mode));
  struct Group {
    int64_t m, kk;
    std::vector<int64_t> n;
  };
  // m = 40 and 300: past the streamed rows, the products through cuBLAS from one cast of x (stacked halves
  // folded at 40, two GEMMs per product at 300).
  for (const Group& g : {Group{1, 2880, {4096, 512, 512}}, Group{3, 1032, {100, 17, 33}},
                         Group{8, 2888, {513, 64}}, Group{16, 64, {7, 9, 1}}, Group{5, 24, {40, 40, 40}},
                         Group{40, 1032, {100, 17, 33}}, Group{300, 2880, {4096, 512, 512}}}) {
    const int64_t ldx = g.kk + 4;
    std::vector<float> x = k::test::random_vec(static_cast<size_t>(g.m * ldx), 90 + g.m);
    float* dx = ar.up(x);
    std::vector<k::LinearArgs> args;
    std::vector<std::vector<float>> refs;
    std::vector<float*> ys;
    std::vector<int64_t> ldys;
    for (size_t i = 0; i < g.n.size(); ++i) {
      const int64_t n = g.n[i], ldy = n + 3 + static_cast<int64_t>(i);
      k::test::TestWeight w = k::test::make_weight(n, g.kk, DType::kBF16, 91 + static_cast<uint64_t>(i),
                                                   1.0f / std::sqrt(static_cast<float>(g.kk)));
      std::vector<float> b = k::test::random_vec(static_cast<size_t>(n), 95 + i);
      const bool bias = i != 1;
      std::vector<float> ref(static_cast<size_t>(g.m * ldy), -7.0f);
      k::ref::linear({.x = x.data(),
                      .m = g.m,
                      .ldx = ldx,
                      .w = w.view,
                      .bias = bias ? b.data() : nullptr,
                      .y = ref.data(),
                      .ldy = ldy});
      float* y = ar.up(std::vector<float>(ref.size(), -7.0f));
      args.push_back({.x = dx,
                      .m = g.m,
                      .ldx = ldx,
                      .w = ar.weight(w.view),
                      .bias = bias ? ar.up(b) : nullptr,
                      .y = y,
                      .ldy = ldy});
      refs.push_back(std::move(ref));
      ys.push_back(y);
      ldys.push_back(ldy);
    }
    ar.be().linear_group(args);
    for (size_t i = 0; i < g.n.size(); ++i) {
      const std::string what = "group m=" + std::to_string(g.m) + " k=" + std::to_string(g.kk) + " product " +
                               std::to_string(i) + " n=" + std::to_string(g.n[i]);
      std::vector<float> got = ar.down(ys[i], refs[i].size());
      for (int64_t t = 0; t < g.m; ++t)
        for (int64_t j = g.n[i]; j < ldys[i]; ++j)
          ASSERT_EQ(got[t * ldys[i] + j], -7.0f) << what << " wrote padding";
      expect_close_for(kBf16Mode, got, refs[i], what);
    }
  }
  // Two inputs: not fused, each product still right.
  const int64_t m = 2, kk = 64, n = 48;
  std::vector<float> x0 = k::test::random_vec(static_cast<size_t>(m * kk), 97);
  std::vector<float> x1 = k::test::random_vec(static_cast<size_t>(m * kk), 98);
  k::test::TestWeight w = k::test::make_weight(n, kk, DType::kBF16, 99, 0.125f);
  std::vector<float> r0(static_cast<size_t>(m * n)), r1(static_cast<size_t>(m * n));
  k::ref::linear({.x = x0.data(), .m = m, .ldx = kk, .w = w.view, .bias = nullptr, .y = r0.data(), .ldy = n});
  k::ref::linear({.x = x1.data(), .m = m, .ldx = kk, .w = w.view, .bias = nullptr, .y = r1.data(), .ldy = n});
  float* y0 = ar.zeros<float>(r0.size());
  float* y1 = ar.zeros<float>(r1.size());
  const k::WeightView dw = ar.weight(w.view);
  const k::LinearArgs two[2] = {
      {.x = ar.up(x0), .m = m, .ldx = kk, .w = dw, .bias = nullptr, .y = y0, .ldy = n},
      {.x = ar.up(x1), .m = m, .ldx = kk, .w = dw, .bias = nullptr, .y = y1, .ldy = n}};
  ar.be().linear_group(two);
  expect_close_for(kBf16Mode, ar.down(y0, r0.size()), r0, "unfused group, first x");
  expect_close_for(kBf16Mode, ar.down(y1, r1.size()), r1, "unfused group, second x");
}

TEST(GpuLinear, GroupOfProductsSharingTheInput) {
  SKIP_WITHOUT_GPU();
  for (int shared_cast : {0, 1}) {
    SCOPED_TRACE("linear_group_shared_cast " + std::to_string(shared_cast));
    k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
    t.linear_group_shared_cast = shared_cast;
    k::override_kernel_tuning(t);
    group_of_products_sharing_the_input();
  }
  k::override_kernel_tuning(std::nullopt);
}

// The default backend splits activations for products of up to CudaContext::kBf16SplitMaxRowsDefault rows
// (hi + lo tolerance there) and rounds them to one bf16 above (the rounded tolerance).
TEST(GpuLinear, DefaultSplitsUpToTheRowLimit) {
  SKIP_WITHOUT_GPU();
  auto be = make_cuda_backend({.device = DeviceKind::kCuda});
  Arena ar(*be);
  const int64_t limit = k::CudaContext::kBf16SplitMaxRowsDefault, kk = 96, n = 40;
  for (int64_t m : {int64_t{1}, limit, limit + 1}) {
    k::test::TestWeight w =
        k::test::make_weight(n, kk, DType::kBF16, 71, 1.0f / std::sqrt(static_cast<float>(kk)));
    std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * kk), 72);
    std::vector<float> ref(static_cast<size_t>(m * n), 0.0f);
    k::ref::linear(
        {.x = x.data(), .m = m, .ldx = kk, .w = w.view, .bias = nullptr, .y = ref.data(), .ldy = n});
    float* y = ar.zeros<float>(ref.size());
    ar.be().linear(
        {.x = ar.up(x), .m = m, .ldx = kk, .w = ar.weight(w.view), .bias = nullptr, .y = y, .ldy = n});
    expect_close_for(m <= limit ? kBf16Mode : kBf16RoundMode, ar.down(y, ref.size()), ref,
                     "default backend m=" + std::to_string(m));
  }
}

}  // namespace
}  // namespace polylora::gpu_test
