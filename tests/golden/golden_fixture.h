// tests/golden/golden_fixture.h: a fixture model with its adapters and Hugging Face reference
// (tests/data/models/<name>/reference.{json,safetensors}), an engine over it, and the comparison rules
// of the fixtures' README: log-probs within a tolerance, greedy tokens equal up to the first step whose
// reference margin is below a threshold, and vLLM's "close logprobs" rule for bf16.
// Everything is generated through the public Engine API (greedy requests with logprobs and
// prompt_logprobs). The engine returns at most kGoldenTopLogprobs alternatives per position (vLLM's
// max_logprobs), not whole rows, so a row [vocab] of the reference is compared where we have numbers:
// the logprob of the prompt (or generated) token and the top alternatives, each against the reference's
// value for that id; and every id in the reference's own top alternatives that we left out must lie
// within the tolerance below our last alternative (a lower bound on its |Δ|).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/engine.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "unit/engine_run.h"

namespace polylora::golden {

using testing_util::EngineRun;

// The most alternatives the engine returns per position (SamplingParams::validate's limit).
inline constexpr int64_t kGoldenTopLogprobs = 20;

inline const std::vector<std::string>& fixture_models() {
  static const std::vector<std::string> names = {"llama-tiny", "qwen3-moe-tiny", "gpt-oss-tiny",
                                                 "mixtral-tiny", "gpt-oss-mxfp4-tiny"};
  return names;
}

struct Fixture {
  std::string dir;
  nlohmann::json meta;
  std::unique_ptr<SafetensorsFile> ref;
  std::shared_ptr<Model> model;
  std::vector<std::shared_ptr<LoraAdapter>> adapters;
  std::vector<std::string> variants;   // "base" or an adapter name
  DType kv_cache_dtype = DType::kF32;  // the engine's KV cache (BF16: CUDA backends), set before engine()

  explicit Fixture(const std::string& name, std::shared_ptr<Backend> backend = nullptr,
                   const ModelLoadOptions& options = {})
      : dir(std::string(POLYLORA_TEST_DATA) + "/models/" + name) {
    std::ifstream in(dir + "/reference.json");
    meta = nlohmann::json::parse(in);
    static const DType kRefTypes[] = {DType::kF32, DType::kI32};
    ref = SafetensorsFile::open(dir + "/reference.safetensors", kRefTypes);
    model = Model::load(dir, options, std::move(backend));
    for (const auto& v : meta["variants"]) {
      std::string variant = v.get<std::string>();
      variants.push_back(variant);
      if (variant == "base") continue;
      std::string path = dir + "/" + meta["adapters"][variant].get<std::string>();
      adapters.push_back(load_peft_adapter(path, variant, model->config(), {64}));
    }
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
  // The reference log-probs [prompt len, vocab] and greedy margins [generate_tokens] (nullptr if absent).
  const float* ref_logprobs(const std::string& variant, size_t i) const {
    const TensorInfo* t = ref->find(variant + ".logprobs." + std::to_string(i));
    return t ? static_cast<const float*>(t->data) : nullptr;
  }
  const float* ref_margins(const std::string& variant, size_t i) const {
    const TensorInfo* t = ref->find(variant + ".margin." + std::to_string(i));
    return t ? static_cast<const float*>(t->data) : nullptr;
  }
  size_t num_prompts() const { return meta["prompts"].size(); }
  int64_t generate_tokens() const { return meta["generate_tokens"].get<int64_t>(); }
  int64_t vocab_size() const { return model->config().vocab_size; }

  // The engine over this fixture's model with every adapter added (made at first use; one per fixture,
  // since a model's CUDA graphs are recorded against one KV cache).
  // --max-loras of the engine (set before its first use; <= 0: the test default).
  int64_t max_loras = 0;
  Engine& engine() {
    if (!engine_) {
      EngineConfig config = testing_util::test_engine_config();
      config.cache.kv_cache_dtype = kv_cache_dtype;
      if (max_loras > 0) config.lora.max_loras = max_loras;
      engine_ = std::make_unique<Engine>(model, config, nullptr);
      for (const auto& a : adapters) engine_->add_adapter(a);
    }
    return *engine_;
  }
  // Greedy over variant's prompt i for the reference's number of tokens, with `top` alternatives per
  // generated token and (when prompt_top >= 0) per prompt token.
  EngineRequest request(const std::string& variant, size_t i, int64_t top = kGoldenTopLogprobs,
                        int64_t prompt_top = kGoldenTopLogprobs) const {
    EngineRequest r =
        testing_util::greedy_request(prompt(i), generate_tokens(), variant == "base" ? "" : variant);
    r.sampling.logprobs = top;
    if (prompt_top >= 0) r.sampling.prompt_logprobs = prompt_top;
    return r;
  }
  std::vector<EngineRun> run(std::vector<EngineRequest> requests) {
    return testing_util::run_to_completion(engine(), std::move(requests));
  }
  EngineRun run(EngineRequest request) { return testing_util::run_one(engine(), std::move(request)); }

 private:
  std::unique_ptr<Engine> engine_;
};

// The log-probs of logits row `row` of a run (the row after prompt position `row`, or after the
// generated tokens beyond the prompt): prompt_logprobs[row + 1] inside the prompt, then the generated
// tokens' logprobs. nullptr when the run did not return it.
inline const LogprobEntry* row_entry(const EngineRun& r, size_t prompt_len, size_t row) {
  if (row + 1 < prompt_len)
    return row + 1 < r.prompt_logprobs.size() && r.prompt_logprobs[row + 1] ? &*r.prompt_logprobs[row + 1]
                                                                            : nullptr;
  size_t step = row + 1 - prompt_len;
  return step < r.logprobs.size() ? &r.logprobs[step] : nullptr;
}

// Top-1 minus top-2 log-prob (= logit margin) of an entry with at least two alternatives.
inline double margin_of(const LogprobEntry& e) {
  return e.top.size() >= 2 ? e.top[0].logprob - e.top[1].logprob : INFINITY;
}

// Max |Δ logprob| between an entry and a full reference row [vocab] (see the header comment).
inline double entry_vs_row(const LogprobEntry& e, const float* ref_row, int64_t vocab) {
  double d = std::fabs(double(e.logprob) - ref_row[e.id]);
  std::map<int32_t, float> ours = {{e.id, e.logprob}};
  for (const auto& t : e.top) {
    d = std::max(d, std::fabs(double(t.logprob) - ref_row[t.id]));
    ours[t.id] = t.logprob;
  }
  if (e.top.empty()) return d;
  const double last = e.top.back().logprob;
  const auto k = static_cast<int64_t>(e.top.size());
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) idx[v] = static_cast<int32_t>(v);
  std::partial_sort(idx.begin(), idx.begin() + std::min(k, vocab), idx.end(),
                    [&](int32_t a, int32_t b) { return ref_row[a] > ref_row[b]; });
  for (int64_t j = 0; j < std::min(k, vocab); ++j)
    if (!ours.count(idx[j])) d = std::max(d, double(ref_row[idx[j]]) - last);
  return d;
}

// Max |Δ logprob| between two entries of the same token (INFINITY when the tokens differ): the token's
// logprob, the alternatives both have, and for an alternative only one has, how far it lies above the
// other's last alternative.
inline double entry_vs_entry(const LogprobEntry& a, const LogprobEntry& b) {
  if (a.id != b.id) return INFINITY;
  double d = std::fabs(double(a.logprob) - b.logprob);
  auto one_way = [&](const LogprobEntry& x, const LogprobEntry& y) {
    std::map<int32_t, float> known = {{y.id, y.logprob}};
    for (const auto& t : y.top) known[t.id] = t.logprob;
    for (const auto& t : x.top) {
      auto it = known.find(t.id);
      if (it != known.end())
        d = std::max(d, std::fabs(double(t.logprob) - it->second));
      else if (!y.top.empty())
        d = std::max(d, double(t.logprob) - y.top.back().logprob);
      else
        d = INFINITY;
    }
  };
  one_way(a, b);
  one_way(b, a);
  return d;
}

// Max |Δ logprob| between r and the reference at every prompt position of variant's prompt i (rows 0 ..
// len - 1: the prompt logprobs and the first generated token's); INFINITY when either side lacks one.
inline double max_prompt_logprob_diff(const Fixture& f, const std::string& variant, size_t i,
                                      const EngineRun& r) {
  const float* ref_lp = f.ref_logprobs(variant, i);
  if (!ref_lp) return INFINITY;
  const int64_t vocab = f.vocab_size();
  const size_t len = f.prompt(i).size();
  double max_diff = 0;
  for (size_t p = 0; p < len; ++p) {
    const LogprobEntry* e = row_entry(r, len, p);
    if (!e) return INFINITY;
    max_diff = std::max(max_diff, entry_vs_row(*e, ref_lp + p * vocab, vocab));
  }
  return max_diff;
}

// Log-probs within `tolerance` at every prompt position and greedy tokens equal up to the first step
// whose reference margin is below `margin_threshold`. Returns the max |Δ logprob|.
inline double check_against_reference(const Fixture& f, const std::string& variant, size_t i,
                                      const EngineRun& r, double tolerance, double margin_threshold) {
  const float* m = f.ref_margins(variant, i);
  std::vector<int32_t> g = f.greedy(variant, i);
  EXPECT_TRUE(f.ref_logprobs(variant, i) && m && !g.empty());
  if (!f.ref_logprobs(variant, i) || !m || g.empty()) return INFINITY;
  double max_diff = max_prompt_logprob_diff(f, variant, i, r);
  EXPECT_LE(max_diff, tolerance) << variant << " prompt " << i << ": max |Δ logprob| = " << max_diff;
  EXPECT_EQ(r.output.size(), g.size());
  for (size_t s = 0; s < g.size() && s < r.output.size(); ++s) {
    if (m[s] < margin_threshold) break;  // a near-tie: this step and all after may differ
    EXPECT_EQ(r.output[s], g[s]) << variant << " prompt " << i << " greedy step " << s << " (ref margin "
                                 << m[s] << ")";
    if (r.output[s] != g[s]) break;
  }
  return max_diff;
}

// Max |Δ logprob| between two runs of the same request at every row both returned (prompt positions
// and generated steps); INFINITY when they returned different rows.
inline double max_run_diff(const EngineRun& a, const EngineRun& b) {
  if (a.prompt_logprobs.size() != b.prompt_logprobs.size() || a.logprobs.size() != b.logprobs.size())
    return INFINITY;
  double d = 0;
  for (size_t p = 0; p < a.prompt_logprobs.size(); ++p) {
    if (a.prompt_logprobs[p].has_value() != b.prompt_logprobs[p].has_value()) return INFINITY;
    if (a.prompt_logprobs[p]) d = std::max(d, entry_vs_entry(*a.prompt_logprobs[p], *b.prompt_logprobs[p]));
  }
  for (size_t s = 0; s < a.logprobs.size(); ++s)
    d = std::max(d, entry_vs_entry(a.logprobs[s], b.logprobs[s]));
  return d;
}

// vLLM's close-logprobs rule: at each greedy step the tokens are equal, or each is among the other
// side's top-5, after which the sequence is not compared further. ref_top: the reference's top-5 ids at
// each step of its greedy continuation; ours must carry logprobs with (at least) 5 alternatives.
inline void check_close_logprobs(const std::string& what, const std::vector<int32_t>& ref_tokens,
                                 const std::vector<std::vector<int32_t>>& ref_top, const EngineRun& ours,
                                 const float* ref_margins = nullptr) {
  ASSERT_EQ(ours.logprobs.size(), ours.output.size()) << what;
  for (size_t s = 0; s < ref_tokens.size() && s < ours.output.size(); ++s) {
    if (ours.output[s] == ref_tokens[s]) continue;
    auto in = [](int32_t id, const std::vector<int32_t>& v) {
      return std::find(v.begin(), v.end(), id) != v.end();
    };
    std::vector<int32_t> our_top;
    for (size_t k = 0; k < ours.logprobs[s].top.size() && k < 5; ++k)
      our_top.push_back(ours.logprobs[s].top[k].id);
    EXPECT_TRUE(in(ours.output[s], ref_top[s]) && in(ref_tokens[s], our_top))
        << what << " step " << s << ": ours " << ours.output[s] << " (margin " << margin_of(ours.logprobs[s])
        << "), reference " << ref_tokens[s] << " (margin " << (ref_margins ? ref_margins[s] : -1.0f) << ")";
    return;
  }
}

}  // namespace polylora::golden
