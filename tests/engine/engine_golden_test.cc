// tests/engine/engine_golden_test.cc: every fixture variant and prompt submitted to one engine, adapters
// interleaved, arrivals staggered, with a small block size, a small token budget (chunked prefill) and a
// small KV cache (preemption): greedy outputs equal the reference (the fixtures' margin rule) and prompt
// log-probs are within 1e-3. The same with the model split over 2 tensor-parallel ranks (CPU threads,
// docs/tensor-parallel.md), and over 2 ranks with --fully-sharded-loras and, for the MoE models,
// --enable-expert-parallel.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"
#include "golden/golden_fixture.h"

namespace polylora::golden {
namespace {

struct EngineGoldenCase {
  std::string model;
  int tensor_parallel_size = 1;
  bool expert_parallel = false;
  bool fully_sharded_loras = false;
};

void PrintTo(const EngineGoldenCase& c, std::ostream* os) {
  *os << c.model << " -tp " << c.tensor_parallel_size << (c.expert_parallel ? " -ep" : "")
      << (c.fully_sharded_loras ? " --fully-sharded-loras" : "");
}

class EngineGoldenTest : public ::testing::TestWithParam<EngineGoldenCase> {};

TEST_P(EngineGoldenTest, AllVariantsStaggeredWithChunkingAndPreemption) {
  ModelLoadOptions options;
  options.tensor_parallel_size = GetParam().tensor_parallel_size;
  options.enable_expert_parallel = GetParam().expert_parallel;
  options.fully_sharded_loras = GetParam().fully_sharded_loras;
  Fixture f(GetParam().model, nullptr, options);
  ASSERT_EQ(f.model->tensor_parallel_size(), options.tensor_parallel_size);
  ASSERT_EQ(f.model->expert_parallel(), options.enable_expert_parallel);
  ASSERT_EQ(f.model->fully_sharded_loras(), options.fully_sharded_loras);
  EngineConfig ec;
  ec.cache.block_size = 4;
  ec.scheduler.max_num_batched_tokens = 24;  // < the 40-token prompt: chunked prefill
  // Room for about two full sequences (40 + 24 tokens = 16 blocks each) while ~9 run: preemption.
  ec.cache.num_kv_blocks = 40;
  ec.lora.max_loras = 2;  // fewer than the adapters: admission waits for a slot
  std::shared_ptr<Model> model(std::move(f.model));
  Engine engine(model, ec, nullptr);
  for (const auto& a : f.adapters) engine.add_adapter(a);

  struct Expected {
    std::string variant;
    size_t prompt;
  };
  std::vector<Expected> order;
  for (size_t i = 0; i < f.num_prompts(); ++i)
    for (const std::string& v : f.variants) order.push_back({v, i});
  std::map<std::string, std::vector<int32_t>> outputs;
  std::map<std::string, std::vector<std::optional<LogprobEntry>>> prompt_lps;
  size_t submitted = 0;
  int64_t steps = 0;
  while (submitted < order.size() || engine.has_unfinished()) {
    // Staggered arrivals: two new requests every third step.
    if (submitted < order.size() && steps % 3 == 0) {
      for (int k = 0; k < 2 && submitted < order.size(); ++k, ++submitted) {
        EngineRequest r;
        r.request_id = std::to_string(submitted);
        r.prompt_ids = f.prompt(order[submitted].prompt);
        r.adapter = order[submitted].variant == "base" ? "" : order[submitted].variant;
        r.sampling.temperature = 0;
        r.sampling.max_tokens = f.generate_tokens();
        r.sampling.ignore_eos = true;
        r.sampling.prompt_logprobs = 5;
        engine.add_request(std::move(r));
      }
    }
    for (auto& out : engine.step()) {
      for (auto& so : out.sequences)
        outputs[out.request_id].insert(outputs[out.request_id].end(), so.new_token_ids.begin(),
                                       so.new_token_ids.end());
      if (!out.prompt_logprobs.empty()) prompt_lps[out.request_id] = out.prompt_logprobs;
    }
    ASSERT_EQ(engine.check_invariants(), "") << "after step " << steps;
    ASSERT_LT(++steps, 20000) << "the engine does not finish";
  }
  EngineStats st = engine.stats();
  EXPECT_GT(st.num_preemptions, 0) << "the small cache should force preemption";
  std::printf("[engine-golden] %s -tp %d: %zu requests in %ld steps, %ld preemptions\n", GetParam().model.c_str(),
              options.tensor_parallel_size, order.size(), static_cast<long>(steps), static_cast<long>(st.num_preemptions));

  int64_t vocab = model->config().vocab_size;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& [variant, i] = order[k];
    std::string id = std::to_string(k);
    std::vector<int32_t> ref = f.greedy(variant, i);
    const TensorInfo* margin = f.ref->find(variant + ".margin." + std::to_string(i));
    const auto* m = static_cast<const float*>(margin->data);
    ASSERT_EQ(outputs[id].size(), ref.size()) << variant << " prompt " << i;
    for (size_t s = 0; s < ref.size(); ++s) {
      if (m[s] < 1e-3) break;
      ASSERT_EQ(outputs[id][s], ref[s]) << variant << " prompt " << i << " step " << s;
    }
    // Prompt log-probs: the logprob of each prompt token (index ≥ 1) and the top-5 alternatives.
    const auto* ref_lp =
        static_cast<const float*>(f.ref->find(variant + ".logprobs." + std::to_string(i))->data);
    std::vector<int32_t> prompt = f.prompt(i);
    const auto& lps = prompt_lps[id];
    ASSERT_EQ(lps.size(), prompt.size()) << variant << " prompt " << i;
    EXPECT_FALSE(lps[0].has_value());
    for (size_t p = 1; p < prompt.size(); ++p) {
      ASSERT_TRUE(lps[p].has_value());
      EXPECT_EQ(lps[p]->id, prompt[p]);
      EXPECT_NEAR(lps[p]->logprob, ref_lp[(p - 1) * vocab + prompt[p]], 1e-3)
          << variant << " prompt " << i << " pos " << p;
      for (const auto& t : lps[p]->top) EXPECT_NEAR(t.logprob, ref_lp[(p - 1) * vocab + t.id], 1e-3);
    }
  }
}

std::vector<EngineGoldenCase> cases(int tensor_parallel_size) {
  std::vector<EngineGoldenCase> c;
  for (const std::string& m : fixture_models()) c.push_back({m, tensor_parallel_size});
  return c;
}

std::string case_name(const ::testing::TestParamInfo<EngineGoldenCase>& info) {
  std::string n = info.param.model;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

INSTANTIATE_TEST_SUITE_P(Models, EngineGoldenTest, ::testing::ValuesIn(cases(1)), case_name);
INSTANTIATE_TEST_SUITE_P(TensorParallel2, EngineGoldenTest, ::testing::ValuesIn(cases(2)), case_name);

std::vector<EngineGoldenCase> sharded_cases() {
  std::vector<EngineGoldenCase> c;
  for (const std::string& m : fixture_models()) c.push_back({m, 2, m != "llama-tiny", true});
  return c;
}
INSTANTIATE_TEST_SUITE_P(TensorParallel2ExpertParallelFullySharded, EngineGoldenTest,
                         ::testing::ValuesIn(sharded_cases()), case_name);

}  // namespace
}  // namespace polylora::golden
