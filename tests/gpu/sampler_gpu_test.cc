// tests/gpu/sampler_gpu_test.cc: DeviceSampler on the CUDA backend (kernels/sampling/sampling_cuda.cu)
// against the CPU Sampler (tests/unit/sampler/device_sampler_cases.h: greedy, seeded draws under every
// filter, ties, processors flipping the argmax, forced rows, batch invariance, double buffering, draw
// distributions by frequency bounds and chi-square), and against the op's host version on the CPU backend
// (kernels::ref::sample), which must agree exactly: same tokens, ranks and top ids, log-probs within 1e-6.
// Tolerances: log-probs 1e-4 against the CPU Sampler; seeded tokens equal on >= 99% of the rows (the rest:
// rounding at a draw or top_p boundary).
#include <random>
#include <string>

#include "gpu_test_util.h"
#include "unit/sampler/device_sampler_cases.h"

namespace polylora::gpu_test {
namespace {

namespace sc = sampler_cases;

Backend& cpu() {
  static std::unique_ptr<Backend> be = make_cpu_backend();
  return *be;
}

TEST(GpuSampler, GreedyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t vocab : {3, 1000, 2049, 32000, 151936, 201088}) sc::greedy_matches(backend(), vocab, 20);
  sc::greedy_matches(backend(), 201088, 300);
}

TEST(GpuSampler, SeededMatchesCpu) {
  SKIP_WITHOUT_GPU();
  sc::seeded_matches(backend(), 4096, 512, false, 0.99);
  sc::seeded_matches(backend(), 201088, 140, false, 0.99);
  sc::seeded_matches(backend(), 151936, 64, true, 0.99);
  sc::seeded_matches(backend(), 4096, 512, true, 0.99);
}

// The CUDA kernels (fused and one per phase) and the host version of the same algorithm: identical
// results at several batch sizes (the CUDA chunking changes with the batch; the integer sums must not).
TEST(GpuSampler, KernelsEqualHostVersion) {
  SKIP_WITHOUT_GPU();
  for (int64_t vocab : {1000, 201088}) {
    for (int64_t rows : {1, 7, 64, 300}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool tied = variant & 1, fused = variant < 2;
        const auto logits =
            tied ? sc::tied_logits(rows, vocab, 81 + rows) : sc::normal_logits(rows, vocab, 82 + rows);
        auto cases = sc::seeded_cases(rows, vocab, 83 + rows);
        for (int64_t r = 0; r < rows; r += 5) cases[r].params.temperature = 0.0;
        for (int64_t r = 2; r < rows; r += 11) cases[r].forced = static_cast<int32_t>(r * 131 % vocab);
        sc::DeviceRows dev_gpu(backend(), logits), dev_cpu(cpu(), logits);
        DeviceSampler gpu(backend(), vocab, rows, 20), host(cpu(), vocab, rows, 20);
        gpu.set_fused_kernel(fused);
        const auto a = sc::device_results(gpu, dev_gpu.get(), cases);
        const auto b = sc::device_results(host, dev_cpu.get(), cases);
        const std::string what = "vocab " + std::to_string(vocab) + " rows " + std::to_string(rows) +
                                 (tied ? " tied" : "") + (fused ? " fused" : " per phase");
        ASSERT_EQ(a.size(), b.size());
        for (size_t r = 0; r < a.size(); ++r) {
          ASSERT_EQ(a[r].token, b[r].token) << what << " row " << r;
          EXPECT_EQ(a[r].rank, b[r].rank) << what << " row " << r;
          EXPECT_NEAR(a[r].logprob, b[r].logprob, 1e-6) << what << " row " << r;
          ASSERT_EQ(a[r].top.size(), b[r].top.size()) << what << " row " << r;
          for (size_t j = 0; j < a[r].top.size(); ++j) {
            EXPECT_EQ(a[r].top[j].id, b[r].top[j].id) << what << " row " << r << " top " << j;
            EXPECT_NEAR(a[r].top[j].logprob, b[r].top[j].logprob, 1e-6) << what << " row " << r;
          }
        }
      }
    }
  }
}

TEST(GpuSampler, BatchInvariant) {
  SKIP_WITHOUT_GPU();
  sc::batch_invariant(backend(), 201088);
  sc::batch_invariant(backend(), 5000);
}

TEST(GpuSampler, ProcessorsMatchCpu) {
  SKIP_WITHOUT_GPU();
  sc::processors_match(backend(), 4096);
  sc::processors_match(backend(), 201088);
}

TEST(GpuSampler, ForcedRowsMatchPromptLogprob) {
  SKIP_WITHOUT_GPU();
  sc::forced_match(backend(), 4096);
  sc::forced_match(backend(), 201088);
}

TEST(GpuSampler, DoubleBuffered) {
  SKIP_WITHOUT_GPU();
  sc::double_buffered(backend(), 201088);
}

TEST(GpuSampler, DistributionMatchesSoftmax) {
  SKIP_WITHOUT_GPU();
  sc::distributions_match(backend());
}

// Structured-output bitmasks applied on the device (kernels/sampling prepare phase): the CPU Sampler's
// tokens (allowed by the masks), and exactly the host version's results with the fused and per-phase
// kernels at several batch sizes.
TEST(GpuSampler, GrammarMasksMatchCpu) {
  SKIP_WITHOUT_GPU();
  sc::grammar_masks_match(backend(), 4099, 60, 0.95);
  sc::grammar_masks_match(backend(), 201088, 64, 0.95);
  for (int64_t vocab : {4099, 201088}) {
    for (int64_t rows : {1, 13, 64, 130}) {
      const auto logits = sc::normal_logits(rows, vocab, 95 + rows);
      const auto cases = sc::masked_cases(rows, vocab, logits, 96 + static_cast<uint64_t>(rows));
      for (bool fused : {true, false}) {
        sc::DeviceRows dev_gpu(backend(), logits), dev_cpu(cpu(), logits);
        DeviceSampler gpu(backend(), vocab, rows, 20), host(cpu(), vocab, rows, 20);
        gpu.set_fused_kernel(fused);
        const auto a = sc::device_results(gpu, dev_gpu.get(), cases);
        const auto b = sc::device_results(host, dev_cpu.get(), cases);
        const std::string what = "masks vocab " + std::to_string(vocab) + " rows " + std::to_string(rows) +
                                 (fused ? " fused" : " per phase");
        ASSERT_EQ(a.size(), b.size());
        for (size_t r = 0; r < a.size(); ++r) {
          ASSERT_EQ(a[r].token, b[r].token) << what << " row " << r;
          EXPECT_EQ(a[r].rank, b[r].rank) << what << " row " << r;
          EXPECT_NEAR(a[r].logprob, b[r].logprob, 1e-6) << what << " row " << r;
          ASSERT_EQ(a[r].top.size(), b[r].top.size()) << what << " row " << r;
          for (size_t j = 0; j < a[r].top.size(); ++j) EXPECT_EQ(a[r].top[j].id, b[r].top[j].id) << what;
        }
      }
    }
  }
}

TEST(GpuSampler, DegenerateRowsMatchCpu) {
  SKIP_WITHOUT_GPU();
  sc::degenerate_rows_match(backend());
}

}  // namespace
}  // namespace polylora::gpu_test
