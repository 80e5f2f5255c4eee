// tests/unit/lora/adapter_test.cc: PEFT adapters in every fixture format load with the right scales and
// layouts, and every bad adapter is a clear error that leaves the loaded model usable.
#include <gtest/gtest.h>

#include <cmath>

#include "common/error.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "runtime/safetensors.h"
#include "unit/engine_run.h"
#include "unit/test_util.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;

fs::path model_dir(const std::string& name) {
  return fs::path(data_dir()) / "models" / name;
}

class AdapterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(model_dir("llama-tiny").string());
    tmp_ = make_temp_dir("adapter");
  }
  void TearDown() override { fs::remove_all(tmp_); }

  // An adapter dir with the given config and tensors.
  fs::path make_adapter(const std::string& tag, const nlohmann::json& config,
                        const std::map<std::string, RawTensor>& tensors) {
    fs::path dir = tmp_ / tag;
    fs::create_directories(dir);
    write_json(dir / "adapter_config.json", config);
    write_safetensors(dir / "adapter_model.safetensors", tensors);
    return dir;
  }
  std::string error_of(const fs::path& dir, int64_t max_rank = 64) {
    try {
      load_peft_adapter(dir.string(), "bad", model_->config(), {max_rank});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  // The model still reproduces its reference greedy tokens.
  void expect_model_usable() {
    static const DType kTypes[] = {DType::kF32, DType::kI32};
    auto ref = SafetensorsFile::open((model_dir("llama-tiny") / "reference.safetensors").string(), kTypes);
    const TensorInfo* p = ref->find("prompt.1");
    const TensorInfo* g = ref->find("base.greedy.1");
    std::vector<int32_t> prompt(static_cast<const int32_t*>(p->data),
                                static_cast<const int32_t*>(p->data) + p->numel());
    Engine engine(model_, test_engine_config(), nullptr);
    auto out = run_one(engine, greedy_request(prompt, 6)).output;
    auto* gi = static_cast<const int32_t*>(g->data);
    EXPECT_EQ(out, std::vector<int32_t>(gi, gi + 6));
  }
  static nlohmann::json config(int r = 4, nlohmann::json targets = {"q_proj"}) {
    return {
        {"peft_type", "LORA"}, {"r", r}, {"lora_alpha", 8}, {"target_modules", targets}, {"bias", "none"}};
  }
  std::shared_ptr<Model> model_;
  fs::path tmp_;
};

TEST_F(AdapterTest, FixtureFormatsLoad) {
  auto a = load_peft_adapter((model_dir("llama-tiny") / "adapters/qv-r4-rslora").string(), "rs",
                             model_->config(), {64});
  ASSERT_TRUE(a->layers[0].modules[static_cast<size_t>(LoraModule::kQ)]);
  EXPECT_FLOAT_EQ(a->layers[0].modules[static_cast<size_t>(LoraModule::kQ)]->scale,
                  8.0f / 2.0f);  // alpha/sqrt(4)
  EXPECT_FALSE(a->layers[0].modules[static_cast<size_t>(LoraModule::kK)]);
  auto b = load_peft_adapter((model_dir("llama-tiny") / "adapters/attn-mlp-r8").string(), "m",
                             model_->config(), {64});
  EXPECT_FLOAT_EQ(b->layers[1].modules[static_cast<size_t>(LoraModule::kDown)]->scale, 2.0f);  // 16/8

  auto qwen = Model::load(model_dir("qwen3-moe-tiny").string());
  auto fused = load_peft_adapter((model_dir("qwen3-moe-tiny") / "adapters/experts-attn-r8").string(), "f",
                                 qwen->config(), {64});
  ASSERT_EQ(fused->layers[0].experts.size(), 8u);
  EXPECT_EQ(fused->layers[0].experts[3].gate_up->out, 128);
  EXPECT_EQ(fused->layers[0].experts[3].down->in, 64);
  EXPECT_TRUE(fused->has_expert_lora);
  auto per_expert = load_peft_adapter((model_dir("qwen3-moe-tiny") / "adapters/per-expert-r8").string(), "p",
                                      qwen->config(), {64});
  EXPECT_TRUE(per_expert->layers[2].experts[7].gate && per_expert->layers[2].experts[7].up &&
              per_expert->layers[2].experts[7].down);
}

TEST_F(AdapterTest, MissingFiles) {
  EXPECT_NE(error_of(tmp_ / "nope").find("does not exist"), std::string::npos);
  fs::create_directories(tmp_ / "noconfig");
  EXPECT_NE(error_of(tmp_ / "noconfig").find("adapter_config.json is missing"), std::string::npos);
  fs::create_directories(tmp_ / "noweights");
  write_json(tmp_ / "noweights/adapter_config.json", config());
  EXPECT_NE(error_of(tmp_ / "noweights").find("adapter_model.safetensors is missing"), std::string::npos);
  std::ofstream(tmp_ / "noweights/adapter_model.bin") << "pickle";
  EXPECT_NE(error_of(tmp_ / "noweights").find("pickle adapters are not supported"), std::string::npos);
  fs::create_directories(tmp_ / "badjson");
  std::ofstream(tmp_ / "badjson/adapter_config.json") << "{oops";
  EXPECT_NE(error_of(tmp_ / "badjson").find("not valid JSON"), std::string::npos);
  expect_model_usable();
}

TEST_F(AdapterTest, RankAboveMaximum) {
  std::string err = error_of(model_dir("llama-tiny") / "adapters/attn-mlp-r8", 4);
  EXPECT_NE(err.find("LoRA rank 8 is greater than max_lora_rank 4"), std::string::npos) << err;
  expect_model_usable();
}

TEST_F(AdapterTest, TargetTheModelLacks) {
  std::string pre = "base_model.model.model.layers.";
  auto d1 = make_adapter("layer", config(),
                         {{pre + "7.self_attn.q_proj.lora_A.weight", f32_tensor({4, 128})},
                          {pre + "7.self_attn.q_proj.lora_B.weight", f32_tensor({128, 4})}});
  std::string e1 = error_of(d1);
  EXPECT_NE(e1.find("names layer 7, but the model has 2 layers"), std::string::npos) << e1;
  auto d2 = make_adapter("module", config(),
                         {{pre + "0.self_attn.qkv_proj.lora_A.weight", f32_tensor({4, 128})},
                          {pre + "0.self_attn.qkv_proj.lora_B.weight", f32_tensor({128, 4})}});
  std::string e2 = error_of(d2);
  EXPECT_NE(e2.find("'model.layers.0.self_attn.qkv_proj' is not a module of this llama model"),
            std::string::npos)
      << e2;
  auto d3 = make_adapter("experts", config(),
                         {{pre + "0.mlp.experts.0.gate_proj.lora_A.weight", f32_tensor({4, 128})},
                          {pre + "0.mlp.experts.0.gate_proj.lora_B.weight", f32_tensor({64, 4})}});
  EXPECT_NE(error_of(d3).find("is not a module of this llama model"), std::string::npos) << error_of(d3);
  auto d4 = make_adapter("lmhead", config(),
                         {{"base_model.model.lm_head.lora_A.weight", f32_tensor({4, 128})},
                          {"base_model.model.lm_head.lora_B.weight", f32_tensor({1024, 4})}});
  EXPECT_NE(error_of(d4).find("target 'lm_head' is not supported"), std::string::npos) << error_of(d4);
  expect_model_usable();
}

TEST_F(AdapterTest, ShapesThatDoNotFit) {
  std::string pre = "base_model.model.model.layers.0.self_attn.";
  auto d1 = make_adapter("shape", config(),
                         {{pre + "q_proj.lora_A.weight", f32_tensor({4, 100})},
                          {pre + "q_proj.lora_B.weight", f32_tensor({128, 4})}});
  std::string e1 = error_of(d1);
  EXPECT_NE(e1.find("does not fit the model"), std::string::npos) << e1;
  EXPECT_NE(e1.find("[4, 100]"), std::string::npos) << e1;
  auto d2 = make_adapter("onlyA", config(), {{pre + "q_proj.lora_A.weight", f32_tensor({4, 128})}});
  EXPECT_NE(error_of(d2).find("has lora_A but no lora_B"), std::string::npos) << error_of(d2);
  auto d3 = make_adapter("rank", config(8),
                         {{pre + "q_proj.lora_A.weight", f32_tensor({4, 128})},
                          {pre + "q_proj.lora_B.weight", f32_tensor({128, 4})}});
  EXPECT_NE(error_of(d3).find("adapter_config.json says r = 8"), std::string::npos) << error_of(d3);
  expect_model_usable();
}

TEST_F(AdapterTest, UnsupportedOptions) {
  std::string pre = "base_model.model.model.layers.0.self_attn.";
  std::map<std::string, RawTensor> ok = {{pre + "q_proj.lora_A.weight", f32_tensor({4, 128})},
                                         {pre + "q_proj.lora_B.weight", f32_tensor({128, 4})}};
  auto dora = config();
  dora["use_dora"] = true;
  EXPECT_NE(error_of(make_adapter("dora", dora, ok)).find("DoRA"), std::string::npos);
  auto prefix = config();
  prefix["peft_type"] = "PREFIX_TUNING";
  EXPECT_NE(error_of(make_adapter("prefix", prefix, ok)).find("only LORA adapters"), std::string::npos);
  auto save = config();
  save["modules_to_save"] = {"lm_head"};
  EXPECT_NE(error_of(make_adapter("save", save, ok)).find("modules_to_save"), std::string::npos);
  auto bf =
      make_adapter("notlora", config(),
                   {{"base_model.model.model.layers.0.self_attn.q_proj.weight", f32_tensor({128, 128})}});
  EXPECT_NE(error_of(bf).find("is not a LoRA weight"), std::string::npos);
  expect_model_usable();
}

TEST_F(AdapterTest, ReloadGetsNewVersion) {
  auto path = (model_dir("llama-tiny") / "adapters/qv-r4-rslora").string();
  Engine engine(model_, test_engine_config(), nullptr);
  engine.add_adapter(load_peft_adapter(path, "x", model_->config(), {64}));
  uint64_t first = engine.adapters().at(0).id.version;
  EXPECT_TRUE(engine.remove_adapter("x"));
  engine.add_adapter(load_peft_adapter(path, "x", model_->config(), {64}));
  EXPECT_NE(engine.adapters().at(0).id.version, first);
}

}  // namespace
}  // namespace polylora
