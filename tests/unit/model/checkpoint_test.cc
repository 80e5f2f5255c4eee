// tests/unit/model/checkpoint_test.cc: checkpoints that disagree with their config are clear errors naming
// the first mismatch; sharded checkpoints load; --load-format dummy builds a model from config.json alone.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

fs::path llama_dir() {
  return fs::path(data_dir()) / "models/llama-tiny";
}

// A model dir with llama-tiny's weights and a modified config.
fs::path with_config(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  fs::path dir = make_temp_dir(tag);
  nlohmann::json cfg = read_json(llama_dir() / "config.json");
  edit(cfg);
  write_json(dir / "config.json", cfg);
  fs::copy_file(llama_dir() / "model.safetensors", dir / "model.safetensors");
  return dir;
}

std::string load_error(const fs::path& dir) {
  try {
    Model::load(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, MissingTensorIsNamed) {
  auto dir = with_config("more-layers", [](nlohmann::json& c) { c["num_hidden_layers"] = 3; });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("tensor 'model.layers.2.input_layernorm.weight'"), std::string::npos) << err;
  EXPECT_NE(err.find("is missing"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(Checkpoint, UnusedTensorIsNamed) {
  auto dir = with_config("fewer-layers", [](nlohmann::json& c) { c["num_hidden_layers"] = 1; });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("'model.layers.1."), std::string::npos) << err;
  EXPECT_NE(err.find("is not a parameter of this model"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(Checkpoint, WrongShapeIsNamed) {
  auto dir = with_config("shape", [](nlohmann::json& c) { c["intermediate_size"] = 128; });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("'model.layers.0.mlp.gate_proj.weight' has shape [256, 128], expected [128, 128]"),
            std::string::npos)
      << err;
  fs::remove_all(dir);
}

TEST(Checkpoint, TiedEmbeddingsLeaveLmHeadUnused) {
  auto dir = with_config("tied", [](nlohmann::json& c) { c["tie_word_embeddings"] = true; });
  std::string err = load_error(dir);
  EXPECT_NE(err.find("'lm_head.weight' is not a parameter"), std::string::npos) << err;
  fs::remove_all(dir);
}

TEST(Checkpoint, NoCheckpointInDirectory) {
  fs::path dir = make_temp_dir("empty");
  fs::copy_file(llama_dir() / "config.json", dir / "config.json");
  std::string err = load_error(dir);
  EXPECT_FALSE(err.empty());
  EXPECT_NE(err.find(dir.string()), std::string::npos) << err;
  fs::remove_all(dir);
}

std::vector<int32_t> reference_greedy(const fs::path& model_dir, int prompt,
                                      std::vector<int32_t>* prompt_ids) {
  static const DType kTypes[] = {DType::kF32, DType::kI32};
  auto ref = SafetensorsFile::open((model_dir / "reference.safetensors").string(), kTypes);
  const TensorInfo* p = ref->find("prompt." + std::to_string(prompt));
  const TensorInfo* g = ref->find("base.greedy." + std::to_string(prompt));
  auto* pi = static_cast<const int32_t*>(p->data);
  auto* gi = static_cast<const int32_t*>(g->data);
  *prompt_ids = {pi, pi + p->numel()};
  return {gi, gi + g->numel()};
}

TEST(Checkpoint, ShardedCheckpointMatchesSingleFile) {
  fs::path dir = make_temp_dir("sharded");
  fs::copy_file(llama_dir() / "config.json", dir / "config.json");
  auto single = SafetensorsFile::open((llama_dir() / "model.safetensors").string());
  std::map<std::string, RawTensor> shard[2];
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (const TensorInfo& t : single->tensors()) {
    int s = (i++ % 2);
    const auto* bytes = static_cast<const uint8_t*>(t.data);
    shard[s][t.name] = RawTensor{std::string(dtype_name(t.dtype)), t.shape, {bytes, bytes + t.num_bytes}};
    index["weight_map"][t.name] =
        s == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", shard[0]);
  write_safetensors(dir / "model-00002-of-00002.safetensors", shard[1]);
  write_json(dir / "model.safetensors.index.json", index);
  std::shared_ptr<Model> model = Model::load(dir.string());
  std::vector<int32_t> prompt;
  std::vector<int32_t> expected = reference_greedy(llama_dir(), 1, &prompt);
  Engine engine(model, test_engine_config(), nullptr);
  auto out = run_one(engine, greedy_request(prompt, 8)).output;
  EXPECT_EQ(out, std::vector<int32_t>(expected.begin(), expected.begin() + 8));
  fs::remove_all(dir);
}

TEST(Checkpoint, DummyWeightsFromConfigAlone) {
  for (const char* name : {"qwen3-moe-tiny", "gpt-oss-tiny", "mixtral-tiny", "llama-tiny"}) {
    fs::path dir = make_temp_dir("dummy");
    fs::copy_file(fs::path(data_dir()) / "models" / name / "config.json", dir / "config.json");
    ModelLoadOptions opts;
    opts.load_format = LoadFormat::kDummy;
    std::shared_ptr<Model> model = Model::load(dir.string(), opts);
    Engine engine(model, test_engine_config(), nullptr);
    EngineRequest req = greedy_request({1, 2, 3, 4, 5}, 4);
    req.sampling.logprobs = 20;
    req.sampling.prompt_logprobs = 20;
    EngineRun r = run_one(engine, std::move(req));
    EXPECT_EQ(r.output.size(), 4u) << name;
    // Finite log-probs at every position (a NaN or infinite logit anywhere in a row would spoil its
    // log-sum-exp and so every log-prob of that row).
    std::vector<LogprobEntry> rows = r.logprobs;
    for (const auto& e : r.prompt_logprobs)
      if (e) rows.push_back(*e);
    EXPECT_EQ(rows.size(), 4u + 4u) << name;
    for (const LogprobEntry& e : rows) {
      ASSERT_TRUE(std::isfinite(e.logprob)) << name;
      for (const auto& t : e.top) ASSERT_TRUE(std::isfinite(t.logprob)) << name;
    }
    fs::remove_all(dir);
  }
}

TEST(Checkpoint, TokenIdOutsideVocabularyIsAnError) {
  std::shared_ptr<Model> model = Model::load(llama_dir().string());
  Engine engine(model, test_engine_config(), nullptr);
  EXPECT_THROW(engine.add_request(greedy_request({1, 5000}, 1)), Error);
}

}  // namespace
}  // namespace polylora
