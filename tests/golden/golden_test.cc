// tests/golden/golden_test.cc: on the CPU, every fixture model × variant (base and each adapter) × prompt
// reproduces Hugging Face transformers + PEFT: log-probs at every prompt position within 1e-3 absolute,
// and greedy tokens equal up to the first step whose reference margin is below 1e-3. All variants in one
// mixed batch (adapters interleaved) give the same numbers as each sequence alone.
#include "golden/golden_fixture.h"

namespace polylora::golden {
namespace {

constexpr double kLogprobTolerance = 1e-3;
constexpr double kMarginThreshold = 1e-3;

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EachVariantAloneMatchesReference) {
  Fixture f(GetParam());
  Generator gen(*f.model);
  for (const std::string& variant : f.variants) {
    for (size_t i = 0; i < f.num_prompts(); ++i) {
      auto results = gen.run({f.request(variant, i)}, f.slots);
      double d = check_against_reference(f, variant, i, results[0], kLogprobTolerance, kMarginThreshold);
      std::printf("[golden] %s %s prompt %zu (len %zu): max |Δ logprob| = %.2e\n", GetParam().c_str(),
                  variant.c_str(), i, f.prompt(i).size(), d);
    }
  }
}

TEST_P(GoldenTest, MixedBatchMatchesReferenceAndSingleRuns) {
  Fixture f(GetParam());
  Generator gen(*f.model);
  std::vector<GenerateRequest> reqs;
  std::vector<std::pair<std::string, size_t>> owner;
  // Prompt-major order, so neighbouring sequences use different variants.
  for (size_t i = 0; i < f.num_prompts(); ++i) {
    for (const std::string& variant : f.variants) {
      reqs.push_back(f.request(variant, i));
      owner.emplace_back(variant, i);
    }
  }
  auto mixed = gen.run(reqs, f.slots);
  for (size_t j = 0; j < reqs.size(); ++j) {
    check_against_reference(f, owner[j].first, owner[j].second, mixed[j], kLogprobTolerance,
                            kMarginThreshold);
    auto alone = gen.run({reqs[j]}, f.slots)[0];
    ASSERT_EQ(alone.prompt_logits.size(), mixed[j].prompt_logits.size());
    double d = 0;
    for (size_t k = 0; k < alone.prompt_logits.size(); ++k)
      d = std::max(d, std::fabs(double(alone.prompt_logits[k]) - mixed[j].prompt_logits[k]));
    EXPECT_LE(d, 1e-4) << owner[j].first << " prompt " << owner[j].second
                       << ": mixed batch differs from alone";
    EXPECT_EQ(alone.output, mixed[j].output) << owner[j].first << " prompt " << owner[j].second;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest, ::testing::ValuesIn(fixture_models()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
}  // namespace polylora::golden
