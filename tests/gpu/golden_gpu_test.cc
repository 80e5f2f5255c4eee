// tests/gpu/golden_gpu_test.cc: the foundation's golden cases on the CUDA backend, through the Engine.
// --dtype float32 (f32 weights and activations): log-probs within 2e-3 and the greedy margin rule at 2e-3.
// bf16 (the default): vLLM's close-logprobs rule on every greedy continuation; the reference's top-5 at
// each step comes from the CPU engine (which matches Hugging Face within 1e-5, see tests/golden) run on
// the prompt plus the reference's own greedy tokens (their prompt logprobs). Mixed batches (all variants
// interleaved) too. The prompt log-probs' max |Δ| from the reference is printed (not a criterion in bf16:
// a router near-tie may move it by whole units).
#include "golden/golden_fixture.h"

namespace polylora::golden {
namespace {

std::shared_ptr<Backend> cuda_backend(DType weights) {
  BackendOptions o;
  o.device = DeviceKind::kCuda;
  o.weight_dtype = weights;
  return make_cuda_backend(o);
}

class GoldenGpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GoldenGpuTest, Float32MatchesReference) {
  Fixture f(GetParam(), cuda_backend(DType::kF32));
  std::vector<EngineRequest> reqs;
  std::vector<std::pair<std::string, size_t>> owner;
  for (const std::string& variant : f.variants)
    for (size_t i = 0; i < f.num_prompts(); ++i) {
      EngineRun r = f.run(f.request(variant, i));
      double d = check_against_reference(f, variant, i, r, 2e-3, 2e-3);
      std::printf("[golden-gpu f32] %s %s prompt %zu: max |Δ logprob| = %.2e\n", GetParam().c_str(),
                  variant.c_str(), i, d);
      reqs.push_back(f.request(variant, i));
      owner.emplace_back(variant, i);
    }
  // All variants in one batch.
  auto mixed = f.run(reqs);
  for (size_t j = 0; j < reqs.size(); ++j)
    check_against_reference(f, owner[j].first, owner[j].second, mixed[j], 2e-3, 2e-3);
}

// bf16 weights, the KV cache in kv_dtype: vLLM's close-logprobs rule against the CPU engine's top-5.
// lora_ext: every step takes the dense LoRA as extra K columns of the q/k/v and o products
// (model/lora_dense_ext.h; x as one bf16 in every product, no split LoRA).
void check_bf16_close_logprobs(const std::string& model, DType kv_dtype, bool lora_ext = false) {
  Fixture cpu(model);
  std::shared_ptr<Backend> be;
  if (lora_ext) {
    BackendOptions o;
    o.device = DeviceKind::kCuda;
    o.weight_dtype = DType::kBF16;
    o.bf16_split_max_rows = 0;
    be = make_cuda_backend(o);
    be->set_split_dense_lora_max_rows(0);
    be->set_dense_lora_ext_min_rows(1);
  } else {
    be = cuda_backend(DType::kBF16);
  }
  Fixture f(model, be);
  f.kv_cache_dtype = kv_dtype;
  std::vector<EngineRequest> reqs;
  std::vector<std::pair<std::string, size_t>> owner;
  for (const std::string& variant : f.variants)
    for (size_t i = 0; i < f.num_prompts(); ++i) {
      reqs.push_back(f.request(variant, i, 5, -1));  // top-5 at each generated step, no prompt logprobs
      owner.emplace_back(variant, i);
    }
  double worst = 0;
  for (size_t j = 0; j < reqs.size(); ++j) {
    EngineRequest r = f.request(owner[j].first, owner[j].second);
    r.sampling.max_tokens = 1;  // prompt log-probs (and the first token's) only
    worst = std::max(worst, max_prompt_logprob_diff(f, owner[j].first, owner[j].second, f.run(std::move(r))));
  }
  std::printf("[golden-gpu bf16%s] %s: max |Δ prompt logprob| over all variants = %.2e\n",
              kv_dtype == DType::kBF16 ? ", bf16 KV cache" : "", model.c_str(), worst);
  auto alone_and_mixed = [&](bool mixed) {
    std::vector<EngineRun> out;
    if (mixed) return f.run(reqs);
    for (const auto& r : reqs) out.push_back(f.run(r));
    return out;
  };
  for (bool mixed : {false, true}) {
    auto results = alone_and_mixed(mixed);
    for (size_t j = 0; j < reqs.size(); ++j) {
      const auto& [variant, i] = owner[j];
      std::vector<int32_t> ref_tokens = f.greedy(variant, i);
      // Reference top-5 at each step: teacher-force the reference continuation through the CPU engine.
      EngineRequest tf = cpu.request(variant, i, 5, 5);
      tf.prompt_ids.insert(tf.prompt_ids.end(), ref_tokens.begin(), ref_tokens.end() - 1);
      tf.sampling.max_tokens = 1;
      EngineRun forced = cpu.run(std::move(tf));
      size_t plen = f.prompt(i).size();
      size_t forced_len = plen + ref_tokens.size() - 1;
      std::vector<std::vector<int32_t>> ref_top;
      for (size_t s = 0; s < ref_tokens.size(); ++s) {
        const LogprobEntry* e = row_entry(forced, forced_len, plen - 1 + s);
        ASSERT_TRUE(e) << "no logprobs at step " << s;
        std::vector<int32_t> ids;
        for (const auto& t : e->top) ids.push_back(t.id);
        ref_top.push_back(std::move(ids));
      }
      check_close_logprobs(model + " " + variant + " prompt " + std::to_string(i) +
                               (mixed ? " (mixed)" : "") +
                               (kv_dtype == DType::kBF16 ? " (bf16 KV cache)" : ""),
                           ref_tokens, ref_top, results[j], f.ref_margins(variant, i));
    }
  }
}

TEST_P(GoldenGpuTest, Bfloat16CloseLogprobs) {
  check_bf16_close_logprobs(GetParam(), DType::kF32);
}

// The same rule with the q/k/v and o LoRA as extra K columns of their products on every step (the
// prefill path of lora_dense_ext_min_rows, forced down to one token).
TEST_P(GoldenGpuTest, Bfloat16LoraExtCloseLogprobs) {
  check_bf16_close_logprobs(GetParam(), DType::kF32, true);
}

// --kv-cache-dtype bfloat16: the same rule with the KV cache stored in bf16.
TEST_P(GoldenGpuTest, Bfloat16CacheCloseLogprobs) {
  check_bf16_close_logprobs(GetParam(), DType::kBF16);
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenGpuTest, ::testing::ValuesIn(fixture_models()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

}  // namespace
}  // namespace polylora::golden
