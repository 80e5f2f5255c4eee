// tests/gpu/int8_gpu_test.cc: INT8 weight-only matrices (--quantization int8) on the CUDA backend against
// the CPU references:
// - the device quantizer (backend/cuda/device_ops.cu) gives the CPU quantizer's bytes exactly (BF16, F16 and
//   F32 sources, a row of zeros, K not a multiple of 8);
// - linear_int8 (kernels/linear/linear_int8_cuda.cu): the weight-streaming kernel (m <= 16) and the
//   tensor-core GEMM (m > 16) vs kernels::ref::linear on the same INT8 views over awkward shapes (batch 1,
//   K = 1, K not a multiple of 8, 16 or 32, N off the tiles, strided x and y whose padding must stay put);
// - INT8 experts in kernels::cuda::moe_experts (the GEMV path and the grouped GEMM) vs ref::moe_experts:
//   fused gate_up and separate gate/up, one expert with every token, an expert with no token, top_k 1, one
//   token and 300;
// under the f32 backend and the bf16 hi+lo / rounded modes. The codes are exact in bf16, so only the
// activations' rounding differs: tolerances of gpu_test_util.h (hi+lo: kBf16SplitTol, also for the f32
// backend, whose large INT8 products run on the tensor cores with the split; rounded: kBf16Tol).
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "common/int8.h"
#include "gpu_test_util.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;

struct HostInt8 {
  std::vector<int8_t> codes;
  std::vector<float> scales;
};

// A random [rows, cols] matrix quantized on the host; `host` views it there, `dev` on the device.
void make_int8(Arena& ar, std::vector<HostInt8>& store, int64_t rows, int64_t cols, uint32_t seed,
               k::WeightView& host, k::WeightView& dev) {
  std::vector<float> w = k::test::random_vec(static_cast<size_t>(rows * cols), seed, -0.3f, 0.3f);
  HostInt8 h;
  h.codes.resize(w.size());
  h.scales.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    h.scales[r] = int8_quantize_row(w.data() + r * cols, cols, h.codes.data() + r * cols);
  store.push_back(std::move(h));
  const HostInt8& s = store.back();
  host = {s.codes.data(), DType::kI8, rows, cols};
  host.row_scales = s.scales.data();
  dev = {ar.up(s.codes), DType::kI8, rows, cols};
  dev.row_scales = ar.up(s.scales);
}

Mode int8_tol_mode(const Mode& m) {
  return m.dtype == DType::kF32 ? kBf16Mode : m;
}

TEST(GpuInt8, QuantizeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  Backend& gpu = backend(DType::kBF16);
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {64, 2880}, {300, 7}}) {
      k::test::TestWeight w = k::test::make_weight(rows, cols, dt, static_cast<uint32_t>(rows + cols), 0.5f);
      if (rows > 1) {  // row 1 all zero
        const size_t es = dtype_size(dt);
        std::memset(static_cast<char*>(const_cast<void*>(w.view.data)) + cols * es, 0,
                    static_cast<size_t>(cols) * es);
      }
      Arena ar(gpu);
      const k::WeightView dev = ar.raw_weight(w.view);
      const k::WeightView qc = cpu->quantize_int8(w.view);
      const k::WeightView qg = gpu.quantize_int8(dev);
      ASSERT_TRUE(qg.int8());
      std::vector<int8_t> codes(static_cast<size_t>(rows * cols));
      std::vector<float> scales(static_cast<size_t>(rows));
      gpu.copy_to_host(codes.data(), qg.data, codes.size());
      gpu.copy_to_host(scales.data(), qg.row_scales, scales.size() * sizeof(float));
      const auto* cc = static_cast<const int8_t*>(qc.data);
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(scales[r], qc.row_scales[r]) << dtype_name(dt) << " row " << r;
      for (size_t i = 0; i < codes.size(); ++i)
        ASSERT_EQ(codes[i], cc[i]) << dtype_name(dt) << " element " << i;
      if (rows > 1) {
        EXPECT_EQ(scales[1], 0.0f);
      }
      gpu.free(const_cast<void*>(qg.data));
      cpu->free(const_cast<void*>(qc.data));
    }
}

void run_linear(const Mode& md, int64_t m, int64_t n, int64_t kk, bool bias) {
  Arena ar(backend(md));
  std::vector<HostInt8> store;
  k::WeightView hw, dw;
  make_int8(ar, store, n, kk, static_cast<uint32_t>(m * 31 + n * 7 + kk), hw, dw);
  const int64_t ldx = kk + 3, ldy = n + 2;
  std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * ldx), 5, -2.0f, 2.0f);
  std::vector<float> b = k::test::random_vec(static_cast<size_t>(n), 6);
  std::vector<float> ref(static_cast<size_t>(m * ldy), 3.0f);
  k::LinearArgs a{.x = x.data(),
                  .m = m,
                  .ldx = ldx,
                  .w = hw,
                  .bias = bias ? b.data() : nullptr,
                  .y = ref.data(),
                  .ldy = ldy};
  k::ref::linear(a);
  float* y = ar.up(std::vector<float>(ref.size(), 3.0f));
  a.x = ar.up(x);
  a.w = dw;
  a.bias = bias ? ar.up(b) : nullptr;
  a.y = y;
  ar.be().linear(a);
  expect_close_for(int8_tol_mode(md), ar.down(y, ref.size()), ref,
                   "int8 linear " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(kk) +
                       (bias ? " bias" : ""));  // incl. y's padding columns
}

TEST(GpuInt8, LinearMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    for (int64_t m : {1, 3, 8, 16})  // weight-streaming kernel (K % 16 == 0: vector loads, else scalar)
      for (auto [n, kk] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {130, 288}, {257, 100}, {64, 2880}})
        run_linear(md, m, n, kk, m % 2 == 1);
    for (int64_t m : {17, 64, 130})  // tensor-core GEMM (K % 8 == 0: 8-byte loads, else element loads)
      for (auto [n, kk] : {std::pair<int64_t, int64_t>{1, 1}, {5, 33}, {130, 288}, {257, 100}, {200, 2880}})
        run_linear(md, m, n, kk, m != 64);
  }
}

struct Int8MoeCase {
  int64_t m = 1, hidden = 72, inter = 40, num_experts = 6, top_k = 2;
  Mode mode = kF32Mode;
  bool fused = true;
  bool every_token_to_expert_2 = false;
};

void run_moe(const Int8MoeCase& c) {
  Arena ar(backend(c.mode));
  const int64_t H = c.hidden, I = c.inter, E = c.num_experts, K = c.top_k, m = c.m;
  std::vector<HostInt8> store;
  store.reserve(static_cast<size_t>(3 * E));
  std::vector<std::vector<float>> biases;
  std::vector<k::ExpertView> experts(static_cast<size_t>(E)), dexperts(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const auto seed = static_cast<uint32_t>(100 + 10 * e);
    if (c.fused) {
      make_int8(ar, store, 2 * I, H, seed, experts[e].gate_up, dexperts[e].gate_up);
      biases.push_back(k::test::random_vec(static_cast<size_t>(2 * I), seed + 5));
      experts[e].gate_up_bias = biases.back().data();
      dexperts[e].gate_up_bias = ar.up(biases.back());
    } else {
      make_int8(ar, store, I, H, seed + 1, experts[e].gate, dexperts[e].gate);
      make_int8(ar, store, I, H, seed + 2, experts[e].up, dexperts[e].up);
    }
    make_int8(ar, store, H, I, seed + 3, experts[e].down, dexperts[e].down);
  }
  std::mt19937 rng(11);
  std::vector<float> x = k::test::random_vec(static_cast<size_t>(m * (H + 2)), 1, -2.0f, 2.0f);
  std::vector<int32_t> ids(static_cast<size_t>(m * K));
  std::vector<float> w = k::test::random_vec(static_cast<size_t>(m * K), 2, 0.0f, 1.0f);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    if (K < E) order.erase(std::find(order.begin(), order.end(), 0));  // expert 0 gets no token
    if (c.every_token_to_expert_2) {
      order.erase(std::find(order.begin(), order.end(), 2));
      order.insert(order.begin(), 2);
    }
    for (int64_t kk = 0; kk < K; ++kk) ids[t * K + kk] = order[kk];
  }
  const int64_t ldo = H + 1;
  k::MoeExpertsArgs a{.x = x.data(),
                      .ldx = H + 2,
                      .m = m,
                      .hidden = H,
                      .inter = I,
                      .num_experts = E,
                      .top_k = K,
                      .ids = ids.data(),
                      .weights = w.data(),
                      .experts = experts.data(),
                      .experts_int8 = true,
                      .act = c.fused ? k::ExpertAct::kGptOssSwiglu : k::ExpertAct::kSiluGate,
                      .lora_stack = {},
                      .out = nullptr,
                      .ldo = ldo};
  std::vector<float> ref(static_cast<size_t>(m * ldo), 3.0f);
  a.out = ref.data();
  k::ref::moe_experts(a);
  std::vector<float> init(ref.size(), 3.0f);
  float* out = ar.up(init);
  a.x = ar.up(x);
  a.ids = ar.up(ids);
  a.weights = ar.up(w);
  a.experts = ar.up(dexperts);
  a.out = out;
  ar.be().moe_experts(a);
  const std::string what = "int8 moe m=" + std::to_string(m) + " H=" + std::to_string(H) +
                           " I=" + std::to_string(I) + " K=" + std::to_string(K) +
                           (c.fused ? " fused" : " gate/up") + (c.every_token_to_expert_2 ? " all->2" : "");
  expect_close_for(int8_tol_mode(c.mode), ar.down(out, init.size()), ref, what);  // incl. the padding column
}

TEST(GpuInt8, MoeExpertsMatchReference) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes)
    for (int64_t m : {1, 3, 13, 40, 300})  // 300 tokens x 2: past the GEMV limit, the grouped GEMM
      for (bool fused : {true, false})
        run_moe({.m = m, .mode = md, .fused = fused, .every_token_to_expert_2 = m == 13 || m == 300});
}

TEST(GpuInt8, MoeAwkwardShapes) {
  SKIP_WITHOUT_GPU();
  for (const Mode& md : kModes) {
    for (int64_t kk : {int64_t{1}, int64_t{6}}) run_moe({.m = 9, .top_k = kk, .mode = md});
    // K not a multiple of 8 (element loads in both paths), GEMV and GEMM.
    for (int64_t m : {5, 400}) run_moe({.m = m, .hidden = 100, .inter = 36, .mode = md, .fused = false});
    // GPT-OSS-20B's hidden size (several activation chunks), GEMV and GEMM.
    for (int64_t m : {2, 300})
      run_moe({.m = m,
               .hidden = 2880,
               .inter = 64,
               .num_experts = 8,
               .top_k = 3,
               .mode = md,
               .every_token_to_expert_2 = true});
  }
}

}  // namespace
}  // namespace polylora::gpu_test
