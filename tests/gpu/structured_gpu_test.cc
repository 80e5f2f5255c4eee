// tests/gpu/structured_gpu_test.cc: structured output on the CUDA backend through the Engine, where the
// grammar masks are filled while the forward pass runs and applied by the device sampler (the default on
// the GPU): every constrained output parses and conforms to its schema (the random tiny model writes
// something else unconstrained), and a batch mixing constrained and free requests (greedy and sampled,
// filters, a penalty, log-probs) gives each request the tokens it gets alone, with synchronous and
// asynchronous scheduling (the asynchronous engine defers a constrained row's sampling until the step in
// flight is completed: ModelRunner::finish_launch). Exact equality also needs the forward pass to be
// batch-size invariant (as the BF16 kernels are meant to be): a difference names the request and mode.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "golden/golden_fixture.h"
#include "tokenizer/tokenizer.h"
#include "unit/structured/schema_check.h"

namespace polylora::golden {
namespace {

using structured::GrammarSpec;
using structured::SpecKind;

const char* kPerson = R"({"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "score": {"type": "number", "exclusiveMinimum": -1.5, "maximum": 2.25},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3}},
  "required": ["name", "age", "role", "score", "tags"], "additionalProperties": false})";

struct Out {
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<FinishReason> finish;
};

std::map<std::string, Out> run(Engine& e, const std::vector<EngineRequest>& reqs) {
  std::map<std::string, Out> out;
  for (const auto& r : reqs) e.add_request(r);
  for (int step = 0; e.has_unfinished(); ++step) {
    EXPECT_LT(step, 5000);
    if (step >= 5000) break;
    for (auto& o : e.step()) {
      EXPECT_FALSE(o.error.has_value()) << o.request_id;
      for (auto& so : o.sequences) {
        Out& x = out[o.request_id];
        x.tokens.insert(x.tokens.end(), so.new_token_ids.begin(), so.new_token_ids.end());
        x.text += so.new_text;
        if (so.finish_reason) x.finish = so.finish_reason;
      }
    }
  }
  return out;
}

TEST(GpuStructured, DeviceMasksConformAndMixedBatchesMatchAlone) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  BackendOptions bo;
  bo.device = DeviceKind::kCuda;
  bo.weight_dtype = DType::kBF16;  // the serving default, whose kernels are batch-size invariant
  for (bool async : {false, true}) {
    Fixture f("llama-tiny", make_cuda_backend(bo));
    auto tok = std::make_shared<const tokenizer::Tokenizer>(tokenizer::Tokenizer::load(f.dir));
    EngineConfig ec;
    ec.cache.block_size = 16;
    ec.cache.num_kv_blocks = 512;
    ec.scheduler.max_num_seqs = 16;
    ec.scheduler.max_num_batched_tokens = 256;
    ec.scheduler.max_model_len = 1024;
    ec.execution.async_scheduling = async;
    Engine e(f.model, ec, tok);
    auto request = [&](const std::string& id, const std::string& prompt, std::optional<GrammarSpec> spec,
                       double temperature, uint64_t seed, int64_t max_tokens = 300) {
      EngineRequest r;
      r.request_id = id;
      r.prompt_ids = tok->encode(prompt, true);
      r.sampling.temperature = temperature;
      r.sampling.seed = seed;
      r.sampling.max_tokens = max_tokens;
      r.sampling.structured_output = std::move(spec);
      return r;
    };
    const GrammarSpec person{SpecKind::kJsonSchema, kPerson, {}};
    std::vector<EngineRequest> reqs = {
        request("json-greedy", "Hello world", person, 0.0, 1),
        request("free-greedy", "The quick brown fox", std::nullopt, 0.0, 2, 30),
        request("json-sampled", "Once upon", person, 0.8, 3),
        request("free-sampled", "Write JSON:", std::nullopt, 0.8, 4, 30),
        request("choice", "Answer:", GrammarSpec{SpecKind::kChoice, "", {"yes", "no"}}, 1.0, 5),
        request("regex", "Code:", GrammarSpec{SpecKind::kRegex, "[A-Z]{2}-\\d{3}", {}}, 1.0, 6),
        request("json-filtered", "Numbers:", person, 1.0, 7),
    };
    reqs.back().sampling.top_k = 20;
    reqs.back().sampling.top_p = 0.9;
    reqs.back().sampling.repetition_penalty = 1.2;
    reqs.back().sampling.logprobs = 2;
    std::map<std::string, Out> alone;
    for (const auto& r : reqs) alone[r.request_id] = run(e, {r}).at(r.request_id);
    const nlohmann::json schema = nlohmann::json::parse(kPerson);
    for (const auto& [id, o] : alone) {
      if (id.starts_with("free")) {
        EXPECT_TRUE(nlohmann::json::parse(o.text, nullptr, false).is_discarded()) << o.text;
        continue;
      }
      EXPECT_EQ(o.finish, FinishReason::kStop) << id << ": " << o.text;
      if (id == "choice") {
        EXPECT_TRUE(o.text == "yes" || o.text == "no") << o.text;
      } else if (id == "regex") {
        EXPECT_EQ(o.text.size(), 6u) << o.text;
      } else {
        nlohmann::json v = nlohmann::json::parse(o.text, nullptr, false);
        ASSERT_FALSE(v.is_discarded()) << id << " is not JSON: " << o.text;
        EXPECT_EQ(testing_util::schema_violation(v, schema, schema), "") << id << ": " << o.text;
      }
    }
    auto mixed = run(e, reqs);
    for (const auto& r : reqs) {
      EXPECT_EQ(mixed.at(r.request_id).tokens, alone.at(r.request_id).tokens)
          << r.request_id << " async " << async;
      EXPECT_EQ(mixed.at(r.request_id).text, alone.at(r.request_id).text) << r.request_id;
    }
  }
}

}  // namespace
}  // namespace polylora::golden
