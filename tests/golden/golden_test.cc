// tests/golden/golden_test.cc: every fixture model × variant (base and each adapter) × prompt reproduces
// Hugging Face transformers + PEFT: log-probs at every prompt position within 1e-3 absolute, and greedy
// tokens equal up to the first step whose reference margin (top-1 minus top-2 logit) is below 1e-3.
// Also: all variants in one mixed batch (adapters interleaved) give the same numbers as alone.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lora/adapter.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "worker/generator.h"

namespace polylora {
namespace {

constexpr double kLogprobTolerance = 1e-3;
constexpr double kMarginThreshold = 1e-3;

struct Fixture {
  std::string dir;
  nlohmann::json meta;
  std::unique_ptr<SafetensorsFile> ref;
  std::unique_ptr<Model> model;
  std::vector<std::shared_ptr<LoraAdapter>> adapters;
  std::vector<const LoraAdapter*> slots;
  std::vector<std::string> variants;  // "base" or adapter name; slot = index − 1

  explicit Fixture(const std::string& name) : dir(std::string(POLYLORA_TEST_DATA) + "/models/" + name) {
    std::ifstream in(dir + "/reference.json");
    meta = nlohmann::json::parse(in);
    static const DType kRefTypes[] = {DType::kF32, DType::kI32};
    ref = SafetensorsFile::open(dir + "/reference.safetensors", kRefTypes);
    model = Model::load(dir);
    for (const auto& v : meta["variants"]) {
      std::string variant = v.get<std::string>();
      variants.push_back(variant);
      if (variant == "base") continue;
      std::string path = dir + "/" + meta["adapters"][variant].get<std::string>();
      adapters.push_back(load_peft_adapter(path, variant, model->config(), {64}));
      slots.push_back(adapters.back().get());
    }
  }
  int32_t slot_of(const std::string& variant) const {
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i]->name == variant) return static_cast<int32_t>(i);
    return -1;
  }
  std::vector<int32_t> prompt(size_t i) const {
    const TensorInfo* t = ref->find("prompt." + std::to_string(i));
    const auto* p = static_cast<const int32_t*>(t->data);
    return {p, p + t->numel()};
  }
  size_t num_prompts() const { return meta["prompts"].size(); }
};

std::vector<float> log_softmax(const float* row, int64_t n) {
  double mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max<double>(mx, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
  double lse = mx + std::log(sum);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(row[i] - lse);
  return out;
}

// Compares one result with the reference; returns the max |Δ logprob|.
double check_against_reference(const Fixture& f, const std::string& variant, size_t i, const GenerateResult& r) {
  int64_t vocab = f.model->config().vocab_size;
  std::vector<int32_t> prompt = f.prompt(i);
  const TensorInfo* lp = f.ref->find(variant + ".logprobs." + std::to_string(i));
  const TensorInfo* greedy = f.ref->find(variant + ".greedy." + std::to_string(i));
  const TensorInfo* margin = f.ref->find(variant + ".margin." + std::to_string(i));
  EXPECT_TRUE(lp && greedy && margin);
  if (!lp || !greedy || !margin) return INFINITY;
  const float* ref_lp = static_cast<const float*>(lp->data);
  double max_diff = 0;
  for (size_t p = 0; p < prompt.size(); ++p) {
    std::vector<float> ours = log_softmax(r.prompt_logits.data() + p * vocab, vocab);
    for (int64_t v = 0; v < vocab; ++v) max_diff = std::max(max_diff, std::fabs(double(ours[v]) - ref_lp[p * vocab + v]));
  }
  EXPECT_LE(max_diff, kLogprobTolerance) << variant << " prompt " << i << ": max |Δ logprob| = " << max_diff;
  const auto* g = static_cast<const int32_t*>(greedy->data);
  const auto* m = static_cast<const float*>(margin->data);
  int64_t steps = greedy->numel();
  EXPECT_EQ(static_cast<int64_t>(r.output.size()), steps);
  for (int64_t s = 0; s < steps && s < static_cast<int64_t>(r.output.size()); ++s) {
    if (m[s] < kMarginThreshold) break;  // a near-tie: this step and all after may differ
    EXPECT_EQ(r.output[s], g[s]) << variant << " prompt " << i << " greedy step " << s << " (ref margin " << m[s]
                                 << ")";
    if (r.output[s] != g[s]) break;
  }
  return max_diff;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, EachVariantAloneMatchesReference) {
  Fixture f(GetParam());
  Generator gen(*f.model);
  for (const std::string& variant : f.variants) {
    for (size_t i = 0; i < f.num_prompts(); ++i) {
      GenerateRequest req;
      req.prompt = f.prompt(i);
      req.adapter_slot = f.slot_of(variant);
      req.max_tokens = f.meta["generate_tokens"].get<int64_t>();
      req.prompt_logits = true;
      auto results = gen.run({req}, f.slots);
      double d = check_against_reference(f, variant, i, results[0]);
      std::printf("[golden] %s %s prompt %zu (len %zu): max |Δ logprob| = %.2e\n", GetParam().c_str(),
                  variant.c_str(), i, req.prompt.size(), d);
    }
  }
}

TEST_P(GoldenTest, MixedBatchMatchesReferenceAndSingleRuns) {
  Fixture f(GetParam());
  Generator gen(*f.model);
  std::vector<GenerateRequest> reqs;
  std::vector<std::pair<std::string, size_t>> owner;
  // Interleave adapters: prompt-major, so neighbouring sequences use different variants.
  for (size_t i = 0; i < f.num_prompts(); ++i) {
    for (const std::string& variant : f.variants) {
      GenerateRequest req;
      req.prompt = f.prompt(i);
      req.adapter_slot = f.slot_of(variant);
      req.max_tokens = f.meta["generate_tokens"].get<int64_t>();
      req.prompt_logits = true;
      reqs.push_back(req);
      owner.emplace_back(variant, i);
    }
  }
  auto mixed = gen.run(reqs, f.slots);
  for (size_t j = 0; j < reqs.size(); ++j) {
    check_against_reference(f, owner[j].first, owner[j].second, mixed[j]);
    auto alone = gen.run({reqs[j]}, f.slots)[0];
    ASSERT_EQ(alone.prompt_logits.size(), mixed[j].prompt_logits.size());
    double d = 0;
    for (size_t k = 0; k < alone.prompt_logits.size(); ++k)
      d = std::max(d, std::fabs(double(alone.prompt_logits[k]) - mixed[j].prompt_logits[k]));
    EXPECT_LE(d, 1e-4) << owner[j].first << " prompt " << owner[j].second << ": mixed batch differs from alone";
    EXPECT_EQ(alone.output, mixed[j].output) << owner[j].first << " prompt " << owner[j].second;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenTest,
                         ::testing::Values("llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace polylora
