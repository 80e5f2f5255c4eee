// tests/gpu/lora_gpu_test.cc: the CUDA lora_apply against ref::lora_apply: ranks 1, 5, 16 and 200 (more
// than one shrink chunk), odd in/out sizes, all rows (rows == nullptr) or a scattered subset, row strides.
// Tolerance: 1e-5 + 1e-4·|ref| (fp32 throughout, another summation order).
#include <string>

#include "gpu_test_util.h"

namespace polylora::gpu_test {
namespace {

namespace k = kernels;

TEST(GpuLora, MatchesReference) {
  SKIP_WITHOUT_GPU();
  Arena ar(backend());
  for (int64_t rank : {1, 5, 16, 200}) {
    for (auto [in, out] : {std::pair<int64_t, int64_t>{33, 17}, {64, 130}}) {
      for (bool subset : {false, true}) {
        int64_t total = 11, ldx = in + 2, ldy = out + 3;
        std::vector<int32_t> rows = {10, 0, 3, 7};
        int64_t num_rows = subset ? static_cast<int64_t>(rows.size()) : total;
        std::vector<float> x = k::test::random_vec(static_cast<size_t>(total * ldx), 71);
        std::vector<float> y = k::test::random_vec(static_cast<size_t>(total * ldy), 72);
        std::vector<float> a = k::test::random_vec(static_cast<size_t>(rank * in), 73);
        std::vector<float> b = k::test::random_vec(static_cast<size_t>(out * rank), 74);
        k::LoraApplyArgs args{
            .x = x.data(),
            .ldx = ldx,
            .y = nullptr,
            .ldy = ldy,
            .rows = subset ? rows.data() : nullptr,
            .num_rows = num_rows,
            .lora = {.a = a.data(), .b = b.data(), .rank = rank, .in = in, .out = out, .scale = 0.7f}};
        std::vector<float> ref = y;
        args.y = ref.data();
        k::ref::lora_apply(args);
        float* dy = ar.up(y);
        args.x = ar.up(x);
        args.y = dy;
        args.rows = subset ? ar.up(rows) : nullptr;
        args.lora.a = ar.up(a);
        args.lora.b = ar.up(b);
        ar.be().lora_apply(args);
        k::test::expect_close(ar.down(dy, ref.size()), ref, 1e-5f, 1e-4f,
                              "lora rank=" + std::to_string(rank) + " in=" + std::to_string(in));
      }
    }
  }
}

}  // namespace
}  // namespace polylora::gpu_test
