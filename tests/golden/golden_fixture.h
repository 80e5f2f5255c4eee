// tests/golden/golden_fixture.h: a fixture model with its adapters and Hugging Face reference
// (tests/data/models/<name>/reference.{json,safetensors}), and the comparison rules of the fixtures'
// README: log-probs within a tolerance, greedy tokens equal up to the first step whose reference margin
// is below a threshold, and vLLM's "close logprobs" rule for bf16.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "worker/generator.h"

namespace polylora::golden {

inline const std::vector<std::string>& fixture_models() {
  static const std::vector<std::string> names = {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny",
                                                 "mixtral-tiny"};
  return names;
}

struct Fixture {
  std::string dir;
  nlohmann::json meta;
  std::unique_ptr<SafetensorsFile> ref;
  std::unique_ptr<Model> model;
  std::vector<std::shared_ptr<LoraAdapter>> adapters;
  std::vector<const LoraAdapter*> slots;
  std::vector<std::string> variants;  // "base" or an adapter name

  explicit Fixture(const std::string& name, std::shared_ptr<Backend> backend = nullptr)
      : dir(std::string(POLYLORA_TEST_DATA) + "/models/" + name) {
    std::ifstream in(dir + "/reference.json");
    meta = nlohmann::json::parse(in);
    static const DType kRefTypes[] = {DType::kF32, DType::kI32};
    ref = SafetensorsFile::open(dir + "/reference.safetensors", kRefTypes);
    model = Model::load(dir, {}, std::move(backend));
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
  std::vector<int32_t> ints(const std::string& key) const {
    const TensorInfo* t = ref->find(key);
    if (!t) return {};
    const auto* p = static_cast<const int32_t*>(t->data);
    return {p, p + t->numel()};
  }
  std::vector<int32_t> prompt(size_t i) const { return ints("prompt." + std::to_string(i)); }
  std::vector<int32_t> greedy(const std::string& variant, size_t i) const {
    return ints(variant + ".greedy." + std::to_string(i));
  }
  size_t num_prompts() const { return meta["prompts"].size(); }
  int64_t generate_tokens() const { return meta["generate_tokens"].get<int64_t>(); }
  GenerateRequest request(const std::string& variant, size_t i, bool prompt_logits = true) const {
    GenerateRequest req;
    req.prompt = prompt(i);
    req.adapter_slot = slot_of(variant);
    req.max_tokens = generate_tokens();
    req.prompt_logits = prompt_logits;
    return req;
  }
};

inline std::vector<float> log_softmax(const float* row, int64_t n) {
  double mx = row[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max<double>(mx, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(row[i] - mx);
  double lse = mx + std::log(sum);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(row[i] - lse);
  return out;
}

// Max |Δ logprob| between r's prompt logits (requested with prompt_logits) and the reference's at every
// prompt position of variant's prompt i; INFINITY when the reference has no log-probs for it.
inline double max_prompt_logprob_diff(const Fixture& f, const std::string& variant, size_t i,
                                      const GenerateResult& r) {
  const TensorInfo* lp = f.ref->find(variant + ".logprobs." + std::to_string(i));
  if (!lp) return INFINITY;
  const int64_t vocab = f.model->config().vocab_size;
  const float* ref_lp = static_cast<const float*>(lp->data);
  double max_diff = 0;
  for (size_t p = 0; p < f.prompt(i).size(); ++p) {
    std::vector<float> ours = log_softmax(r.prompt_logits.data() + p * vocab, vocab);
    for (int64_t v = 0; v < vocab; ++v)
      max_diff = std::max(max_diff, std::fabs(double(ours[v]) - ref_lp[p * vocab + v]));
  }
  return max_diff;
}

// Log-probs within `tolerance` at every prompt position and greedy tokens equal up to the first step
// whose reference margin is below `margin_threshold`. Returns the max |Δ logprob|.
inline double check_against_reference(const Fixture& f, const std::string& variant, size_t i,
                                      const GenerateResult& r, double tolerance, double margin_threshold) {
  const TensorInfo* lp = f.ref->find(variant + ".logprobs." + std::to_string(i));
  const TensorInfo* margin = f.ref->find(variant + ".margin." + std::to_string(i));
  std::vector<int32_t> g = f.greedy(variant, i);
  EXPECT_TRUE(lp && margin && !g.empty());
  if (!lp || !margin || g.empty()) return INFINITY;
  double max_diff = max_prompt_logprob_diff(f, variant, i, r);
  EXPECT_LE(max_diff, tolerance) << variant << " prompt " << i << ": max |Δ logprob| = " << max_diff;
  const auto* m = static_cast<const float*>(margin->data);
  EXPECT_EQ(r.output.size(), g.size());
  for (size_t s = 0; s < g.size() && s < r.output.size(); ++s) {
    if (m[s] < margin_threshold) break;  // a near-tie: this step and all after may differ
    EXPECT_EQ(r.output[s], g[s]) << variant << " prompt " << i << " greedy step " << s << " (ref margin "
                                 << m[s] << ")";
    if (r.output[s] != g[s]) break;
  }
  return max_diff;
}

// vLLM's close-logprobs rule: at each greedy step the tokens are equal, or each is among the other
// side's top-5, after which the sequence is not compared further. ref_top: the reference's top-5 ids at
// each step of its greedy continuation.
inline void check_close_logprobs(const std::string& what, const std::vector<int32_t>& ref_tokens,
                                 const std::vector<std::vector<int32_t>>& ref_top, const GenerateResult& ours,
                                 const float* ref_margins = nullptr) {
  ASSERT_EQ(ours.step_top_ids.size(), ours.output.size()) << what;
  for (size_t s = 0; s < ref_tokens.size() && s < ours.output.size(); ++s) {
    if (ours.output[s] == ref_tokens[s]) continue;
    auto in = [](int32_t id, const std::vector<int32_t>& v) {
      return std::find(v.begin(), v.end(), id) != v.end();
    };
    EXPECT_TRUE(in(ours.output[s], ref_top[s]) && in(ref_tokens[s], ours.step_top_ids[s]))
        << what << " step " << s << ": ours " << ours.output[s] << " (margin " << ours.margins[s]
        << "), reference " << ref_tokens[s] << " (margin " << (ref_margins ? ref_margins[s] : -1.0f) << ")";
    return;
  }
}

}  // namespace polylora::golden
