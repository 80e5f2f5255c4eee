// tests/unit/sampler/device_sampler_test.cc: DeviceSampler on the CPU backend, which runs the sampling op's
// host version (kernels::ref::sample: the same rounds, keys and fixed-point sums as the CUDA kernels),
// against the CPU Sampler: the threshold search (top-N, top_k, top_p with ties), the draw, the edits and
// the staging, without a GPU. Cases and tolerances: device_sampler_cases.h. Also the op's pure helpers
// (keys, the ported exp and RNG, selector rounds).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/error.h"
#include "device_sampler_cases.h"
#include "kernels/sampling/sampling_math.h"

namespace polylora {
namespace {

namespace sc = sampler_cases;
namespace ks = kernels::sampling;

Backend& cpu() {
  static std::unique_ptr<Backend> be = make_cpu_backend();
  return *be;
}

TEST(DeviceSamplerMath, OrderKeysSortLikeFloats) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {-inf, -1e30f, -2.5f, -1e-40f, -0.0f, 0.0f, 1e-40f, 1.0f, 3.5f, 1e30f, inf};
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(ks::key_float(ks::order_key(v[i])), v[i] == 0 ? 0.0f : v[i]);
    EXPECT_GT(ks::order_key(v[i]), 0u);
    for (size_t j = 0; j < v.size(); ++j) {
      EXPECT_EQ(v[i] < v[j], ks::order_key(v[i]) < ks::order_key(v[j])) << v[i] << " " << v[j];
      EXPECT_EQ(v[i] == v[j], ks::order_key(v[i]) == ks::order_key(v[j])) << v[i] << " " << v[j];
    }
  }
}

TEST(DeviceSamplerMath, UniformIsTheSamplersUniform) {
  for (uint64_t seed : {0ull, 1ull, 42ull, 0xdeadbeefcafef00dull})
    for (int64_t step : {0, 1, 7, 100000})
      EXPECT_EQ(ks::uniform_of_bits(ks::uniform_bits(seed, step)), sampler_uniform(seed, step));
  // The draw target is floor(u * total) exactly.
  const uint64_t h = ks::uniform_bits(5, 3);
  const uint64_t total = (uint64_t{1} << 44) * 3 + 12345;
  const long double exact =
      static_cast<long double>(h >> 11) * static_cast<long double>(total) / 9007199254740992.0L;
  EXPECT_EQ(ks::draw_target(h, total), static_cast<uint64_t>(exact));
}

TEST(DeviceSamplerMath, ExpMatchesLogSumExpOfTheSampler) {
  // log_sum_exp sums exp_nonpositive(l - max) in double: one term per logit.
  for (float x : {0.0f, -1e-7f, -0.5f, -1.0f, -10.25f, -86.9f, -87.0f, -87.5f, -1000.0f}) {
    const std::vector<float> row = {0.0f, x};
    const double lse = log_sum_exp(row.data(), 2);
    EXPECT_NEAR(std::log(1.0 + static_cast<double>(ks::exp_nonpositive(x))), lse, 1e-12) << x;
    if (x >= -87.0f) {
      EXPECT_NEAR(ks::exp_nonpositive(x), std::exp(static_cast<double>(x)), 2e-7 * std::exp(x) + 1e-38) << x;
    } else {
      EXPECT_EQ(ks::exp_nonpositive(x), 0.0f) << x;
    }
  }
  EXPECT_EQ(ks::exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
}

TEST(DeviceSamplerMath, DigitsCoverTheCompositeKey) {
  for (int64_t vocab : {2, 1000, 2048, 2049, 151936, 201088, 262144}) {
    const int32_t id_bits = kernels::sample_id_bits(vocab);
    EXPECT_GE(int64_t{1} << id_bits, vocab);
    int32_t shift = 32 + id_bits, rounds = 0;
    while (shift > 0) {
      const int32_t lo = ks::next_low_bit(shift, id_bits);
      EXPECT_LT(lo, shift);
      EXPECT_LE(shift - lo, 11);
      shift = lo;
      ++rounds;
    }
    EXPECT_LE(rounds, 5) << vocab;
    EXPECT_GE(kernels::sample_mass_shift(vocab) + id_bits, 0);
    EXPECT_LE(kernels::sample_mass_shift(vocab) + id_bits, 63);
  }
}

TEST(DeviceSamplerCpu, GreedyMatches) {
  sc::greedy_matches(cpu(), 4096, 20);
  sc::greedy_matches(cpu(), 201088, 3);
  sc::greedy_matches(cpu(), 3, 5);
}

TEST(DeviceSamplerCpu, SeededMatches) {
  sc::seeded_matches(cpu(), 4096, 140, false, 1.0);
  sc::seeded_matches(cpu(), 50000, 28, false, 1.0);
}

TEST(DeviceSamplerCpu, SeededMatchesWithTies) {
  sc::seeded_matches(cpu(), 4096, 140, true, 1.0);
  sc::seeded_matches(cpu(), 30000, 28, true, 1.0);
}

TEST(DeviceSamplerCpu, TopPAndTopKKeptSetsMatchTheFilter) {
  // Flat and quantised rows where the kept set hangs on tie-breaking: with a fixed uniform, every row must
  // draw the same token as the CPU sampler.
  std::vector<sc::Case> cases;
  std::vector<float> logits;
  constexpr int64_t kVocab = 3000;
  for (int i = 0; i < 40; ++i) {
    sc::Case c;
    c.params.top_p = 0.1 + 0.02 * i;
    c.params.top_k = i % 2 ? 7 + i : -1;
    c.params.min_p = i % 3 == 0 ? 0.05 : 0.0;
    c.seed = 99 + static_cast<uint64_t>(i);
    cases.push_back(c);
    for (int64_t t = 0; t < kVocab; ++t)
      logits.push_back(i % 4 == 0 ? 0.0f : static_cast<float>((t * 37 + i) % 9) * 0.25f);
  }
  sc::check_cases(cpu(), kVocab, logits, cases, 1.0, "flat and quantised");
}

TEST(DeviceSamplerCpu, BatchInvariant) {
  sc::batch_invariant(cpu(), 5000);
}

TEST(DeviceSamplerCpu, ProcessorsMatch) {
  sc::processors_match(cpu(), 4096);
}

TEST(DeviceSamplerCpu, ForcedRowsMatchPromptLogprob) {
  sc::forced_match(cpu(), 4096);
}

TEST(DeviceSamplerCpu, DoubleBuffered) {
  sc::double_buffered(cpu(), 1000);
}

TEST(DeviceSamplerCpu, DistributionMatchesSoftmax) {
  sc::distributions_match(cpu());
}

TEST(DeviceSamplerCpu, DegenerateRowsMatch) {
  sc::degenerate_rows_match(cpu());
}

TEST(DeviceSamplerCpu, GrammarMasksMatch) {
  sc::grammar_masks_match(cpu(), 1000, 60, 0.95);
  sc::grammar_masks_match(cpu(), 4099, 30, 0.95);  // a partial last mask word
}

TEST(DeviceSamplerCpu, BadInputsAreErrors) {
  DeviceSampler ds(cpu(), 100, 4, 5);
  std::vector<float> logits(100, 0.0f);
  SamplingParams p;
  p.logit_bias = {{42, 1.0}, {100, 1.0}};
  DeviceSampleRow row{&p, {}, {}, {}, 0, {}, {}};
  EXPECT_THROW(ds.launch(logits.data(), std::span<const DeviceSampleRow>(&row, 1)), Error);
  SamplingParams many;
  many.logprobs = 6;
  row.params = &many;
  EXPECT_THROW(ds.launch(logits.data(), std::span<const DeviceSampleRow>(&row, 1)), Error);
  // After an error the sampler still works (its scratch index was restored).
  SamplingParams ok;
  ok.temperature = 0.0;
  ok.logit_bias = {{42, 1.0}};
  row.params = &ok;
  ds.launch(logits.data(), std::span<const DeviceSampleRow>(&row, 1));
  EXPECT_EQ(ds.wait().at(0).token, 42);
}

}  // namespace
}  // namespace polylora
