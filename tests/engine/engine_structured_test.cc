// tests/engine/engine_structured_test.cc: structured output end to end on a fixture model (CPU): every
// constrained response parses and conforms to its schema (the random tiny model writes something else
// unconstrained), choice and regex outputs match, and a batch mixing constrained and free requests gives
// each the outputs it gets alone, with synchronous and asynchronous scheduling and with the device sampler
// (which applies the grammar masks itself: the same tokens as the host sampler's masks). Bad schemas are
// refused by add_request, naming the problem.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/engine.h"
#include "golden/golden_fixture.h"
#include "tokenizer/tokenizer.h"
#include "unit/structured/schema_check.h"

namespace polylora::golden {
namespace {

using structured::GrammarSpec;
using structured::SpecKind;

struct Out {
  std::vector<int32_t> tokens;
  std::string text;
  std::optional<FinishReason> finish;
};

class EngineStructuredTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = new Fixture("llama-tiny");
    model_ = new std::shared_ptr<Model>(std::move(fixture_->model));
    tokenizer_ = new std::shared_ptr<const tokenizer::Tokenizer>(
        std::make_shared<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(fixture_->dir)));
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete model_;
    delete fixture_;
  }

  std::unique_ptr<Engine> engine(bool async, bool device_sampling) {
    EngineConfig ec;
    ec.cache.block_size = 16;
    ec.cache.num_kv_blocks = 512;
    ec.scheduler.max_num_seqs = 16;
    ec.scheduler.max_num_batched_tokens = 256;
    ec.scheduler.max_model_len = 1024;
    ec.execution.async_scheduling = async;
    ec.execution.device_sampling = device_sampling;
    return std::make_unique<Engine>(*model_, ec, *tokenizer_);
  }

  EngineRequest request(const std::string& id, const std::string& prompt, std::optional<GrammarSpec> spec,
                        double temperature, uint64_t seed, int64_t max_tokens = 300) {
    EngineRequest r;
    r.request_id = id;
    r.prompt_ids = (*tokenizer_)->encode(prompt, true);
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.sampling.max_tokens = max_tokens;
    r.sampling.structured_output = std::move(spec);
    return r;
  }

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
      EXPECT_EQ(e.check_invariants(), "");
    }
    return out;
  }

  static Fixture* fixture_;
  static std::shared_ptr<Model>* model_;
  static std::shared_ptr<const tokenizer::Tokenizer>* tokenizer_;
};

Fixture* EngineStructuredTest::fixture_ = nullptr;
std::shared_ptr<Model>* EngineStructuredTest::model_ = nullptr;
std::shared_ptr<const tokenizer::Tokenizer>* EngineStructuredTest::tokenizer_ = nullptr;

const char* kPersonSchema = R"({"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    "manager": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/ref"}]}},
  "required": ["name", "age", "role", "tags", "manager"], "additionalProperties": false,
  "$defs": {"ref": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99}},
                    "required": ["id"]}}})";

const char* kNumbersSchema = R"({"type": "object", "properties": {
    "t": {"type": "number", "minimum": -40.5, "exclusiveMaximum": 60.25},
    "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "n": {"type": "array", "items": {"type": "integer", "minimum": -3, "maximum": 3}, "maxItems": 3}},
  "required": ["t", "p", "n"], "additionalProperties": false})";

TEST_F(EngineStructuredTest, ConstrainedOutputsParseAndConform) {
  const nlohmann::json person = nlohmann::json::parse(kPersonSchema);
  const nlohmann::json numbers = nlohmann::json::parse(kNumbersSchema);
  std::vector<EngineRequest> reqs;
  const std::vector<std::string> prompts = {"Hello world", "The quick brown fox", "Once upon a time",
                                            "Write JSON:"};
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (double t : {0.0, 1.0})
      reqs.push_back(request("p" + std::to_string(i) + "t" + std::to_string(static_cast<int>(t)), prompts[i],
                             GrammarSpec{SpecKind::kJsonSchema, kPersonSchema, {}}, t, 100 + i));
    reqs.push_back(request("numbers" + std::to_string(i), prompts[i],
                           GrammarSpec{SpecKind::kJsonSchema, kNumbersSchema, {}}, 1.0, 200 + i));
  }
  // The same prompt without a constraint: the model writes something that is not the schema's JSON.
  reqs.push_back(request("free", prompts[0], std::nullopt, 0.0, 1, 40));
  // Masks applied by the host sampler and by the device sampler (its host version here).
  for (bool device : {false, true}) {
    auto e = engine(false, device);
    auto out = run(*e, reqs);
    ASSERT_EQ(out.size(), reqs.size());
    for (const auto& [id, o] : out) {
      if (id == "free") {
        EXPECT_TRUE(nlohmann::json::parse(o.text, nullptr, false).is_discarded()) << o.text;
        continue;
      }
      EXPECT_EQ(o.finish, FinishReason::kStop) << id << ": " << o.text;
      nlohmann::json v = nlohmann::json::parse(o.text, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << id << " is not JSON: " << o.text;
      const nlohmann::json& schema = id.starts_with("numbers") ? numbers : person;
      EXPECT_EQ(testing_util::schema_violation(v, schema, schema), "") << id << " device " << device << ": " << o.text;
    }
  }
}

TEST_F(EngineStructuredTest, ChoiceRegexAndGrammar) {
  auto e = engine(false, false);
  std::vector<EngineRequest> reqs;
  for (uint64_t s = 0; s < 3; ++s) {
    reqs.push_back(request("choice" + std::to_string(s), "Sentiment:",
                           GrammarSpec{SpecKind::kChoice, "", {"positive", "negative", "neutral"}}, 1.0, s));
    reqs.push_back(request("regex" + std::to_string(s),
                           "Code:", GrammarSpec{SpecKind::kRegex, "[A-Z]{2}-\\d{3}", {}}, 1.0, s));
    reqs.push_back(request(
        "gbnf" + std::to_string(s),
        "List:", GrammarSpec{SpecKind::kGrammar, "root ::= item (\", \" item){1,2}\nitem ::= [a-z]{1,5}", {}},
        1.0, s));
  }
  auto out = run(*e, reqs);
  for (const auto& [id, o] : out) {
    EXPECT_EQ(o.finish, FinishReason::kStop) << id << ": " << o.text;
    if (id.starts_with("choice")) {
      EXPECT_TRUE(o.text == "positive" || o.text == "negative" || o.text == "neutral") << o.text;
    } else if (id.starts_with("regex")) {
      EXPECT_TRUE(std::regex_match(o.text, std::regex("[A-Z]{2}-[0-9]{3}"))) << o.text;
    } else if (id.starts_with("gbnf")) {
      EXPECT_TRUE(std::regex_match(o.text, std::regex("[a-z]{1,5}(, [a-z]{1,5}){1,2}"))) << o.text;
    }
  }
}

// Constrained and free requests in one batch give what each gives alone, whatever the scheduling.
TEST_F(EngineStructuredTest, MixedBatchesMatchRequestsAlone) {
  std::vector<EngineRequest> reqs = {
      request("json-greedy", "Hello world", GrammarSpec{SpecKind::kJsonSchema, kPersonSchema, {}}, 0.0, 1),
      request("free-greedy", "The quick brown fox", std::nullopt, 0.0, 2, 30),
      request("json-sampled", "Once upon", GrammarSpec{SpecKind::kJsonSchema, kPersonSchema, {}}, 0.8, 3),
      request("free-sampled", "Write JSON:", std::nullopt, 0.8, 4, 30),
      request("choice", "Answer:", GrammarSpec{SpecKind::kChoice, "", {"yes", "no"}}, 1.0, 5),
      request("json-numbers", "Numbers:", GrammarSpec{SpecKind::kJsonSchema, kNumbersSchema, {}}, 1.0, 6),
  };
  // Constrained rows with filters, penalties and log-probs (each sampler applies the mask after them).
  reqs.back().sampling.top_k = 20;
  reqs.back().sampling.repetition_penalty = 1.2;
  reqs.back().sampling.logprobs = 2;
  // Alone: synchronous, with or without the device sampler (its random draws are its own).
  std::map<bool, std::map<std::string, Out>> alone;
  for (bool device : {false, true})
    for (const auto& r : reqs) {
      auto e = engine(false, device);
      alone[device][r.request_id] = run(*e, {r}).at(r.request_id);
    }
  for (const auto& r : reqs)
    if (r.sampling.structured_output)  // the device sampler's masks give the host sampler's tokens
      EXPECT_EQ(alone[false][r.request_id].tokens, alone[true][r.request_id].tokens) << r.request_id;
  for (bool async : {false, true})
    for (bool device : {false, true}) {
      auto e = engine(async, device);
      auto mixed = run(*e, reqs);
      for (const auto& r : reqs) {
        EXPECT_EQ(mixed.at(r.request_id).tokens, alone[device].at(r.request_id).tokens)
            << r.request_id << " async " << async << " device sampler " << device;
        EXPECT_EQ(mixed.at(r.request_id).text, alone[device].at(r.request_id).text) << r.request_id;
      }
    }
}

TEST_F(EngineStructuredTest, BadSpecsAreRefusedNamingTheProblem) {
  auto e = engine(false, false);
  auto message = [&](GrammarSpec spec) -> std::string {
    try {
      e->add_request(request("bad", "x", std::move(spec), 0.0, 1));
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kInvalid);
      return err.what();
    }
    return "";
  };
  EXPECT_NE(message({SpecKind::kJsonSchema, R"({"type": "object", "patternProperties": {}})", {}})
                .find("patternProperties"),
            std::string::npos);
  EXPECT_NE(message({SpecKind::kJsonSchema, "{", {}}).find("not valid JSON"), std::string::npos);
  EXPECT_NE(message({SpecKind::kGrammar, "root ::= item", {}}).find("'item'"), std::string::npos);
  EXPECT_NE(message({SpecKind::kRegex, "(a", {}}).find("missing ')'"), std::string::npos);
  EXPECT_FALSE(e->has_unfinished());
}

}  // namespace
}  // namespace polylora::golden
