// tests/unit/config/model_config_test.cc: config.json parsing for every supported architecture,
// both spellings of RoPE and expert-count fields, and clear errors.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "common/error.h"
#include "config/model_config.h"

namespace polylora {
namespace {

std::string data(const std::string& rel) {
  return std::string(POLYLORA_TEST_DATA) + "/" + rel;
}

std::string error_of(const std::string& json) {
  try {
    ModelConfig::from_json(json, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, FixtureModels) {
  ModelConfig llama = ModelConfig::from_file(data("models/llama-tiny/config.json"));
  EXPECT_EQ(llama.arch, Architecture::kLlama);
  EXPECT_EQ(llama.head_dim, 32);
  EXPECT_FALSE(llama.is_moe());
  EXPECT_EQ(llama.rope.type, RopeType::kDefault);

  ModelConfig qwen = ModelConfig::from_file(data("models/qwen3-moe-tiny/config.json"));
  EXPECT_EQ(qwen.num_experts, 8);  // spelled num_local_experts by transformers 5
  EXPECT_TRUE(qwen.norm_topk_prob);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_EQ(qwen.moe_intermediate_size, 64);
  EXPECT_EQ(qwen.rope.theta, 1000000.0);

  ModelConfig oss = ModelConfig::from_file(data("models/gpt-oss-tiny/config.json"));
  EXPECT_EQ(oss.arch, Architecture::kGptOss);
  EXPECT_EQ(oss.rope.type, RopeType::kYarn);
  EXPECT_FALSE(oss.rope.truncate);
  EXPECT_DOUBLE_EQ(oss.rope.factor, 32.0);
  EXPECT_EQ(oss.sliding_window, 16);
  EXPECT_EQ(oss.layer_window(0), 16);
  EXPECT_EQ(oss.layer_window(1), 0);
  EXPECT_TRUE(oss.attention_sinks);
  EXPECT_TRUE(oss.router_bias);

  ModelConfig mix = ModelConfig::from_file(data("models/mixtral-tiny/config.json"));
  EXPECT_EQ(mix.head_dim, 32);  // head_dim: null -> hidden / heads
  EXPECT_EQ(mix.sliding_window, 0);
}

TEST(ModelConfig, PublishedConfigs) {
  ModelConfig oss = ModelConfig::from_file(data("configs/gpt-oss-20b/config.json"));
  EXPECT_EQ(oss.rope.type, RopeType::kYarn);  // rope_scaling + rope_theta spelling
  EXPECT_EQ(oss.rope.theta, 150000.0);
  EXPECT_EQ(oss.num_experts, 32);
  EXPECT_EQ(oss.num_experts_per_tok, 4);
  EXPECT_EQ(oss.sliding_window, 128);
  ModelConfig qwen = ModelConfig::from_file(data("configs/qwen3-30b-a3b/config.json"));
  EXPECT_EQ(qwen.num_experts, 128);  // num_experts spelling
  EXPECT_EQ(qwen.rope.type, RopeType::kDefault);
  EXPECT_EQ(qwen.sliding_window, 0);  // use_sliding_window false
  ModelConfig mix = ModelConfig::from_file(data("configs/mixtral-8x7b/config.json"));
  EXPECT_EQ(mix.num_experts, 8);
  EXPECT_EQ(mix.head_dim, 128);
  ModelConfig bench = ModelConfig::from_file(data("configs/qwen3-moe-1.6b/config.json"));
  EXPECT_NEAR(static_cast<double>(bench.num_parameters()), 1.58e9, 0.02e9);
  // openai/gpt-oss-120b (tensor parallelism's benchmark model): 116.8B parameters as its model card says,
  // 20b's shapes with 36 layers and 128 experts.
  ModelConfig big = ModelConfig::from_file(data("configs/gpt-oss-120b/config.json"));
  EXPECT_EQ(big.num_layers, 36);
  EXPECT_EQ(big.num_experts, 128);
  EXPECT_NEAR(static_cast<double>(big.num_parameters()), 116.8e9, 0.3e9);
  ModelConfig small = ModelConfig::from_file(data("configs/gpt-oss-20b/config.json"));
  EXPECT_NEAR(static_cast<double>(small.num_parameters()), 20.9e9, 0.2e9);
}

TEST(ModelConfig, MlpOnlyLayersAndSparseStep) {
  std::string base = R"({"model_type":"qwen3_moe","vocab_size":10,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":4,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":4,"num_experts":4,
    "num_experts_per_tok":2,"moe_intermediate_size":4,"decoder_sparse_step":2,"mlp_only_layers":[3]})";
  ModelConfig c = ModelConfig::from_json(base, "config.json");
  EXPECT_EQ(c.moe_layers, (std::vector<bool>{false, true, false, false}));
}

TEST(ModelConfig, RopeScalingTypes) {
  std::string llama3 = R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
    "num_hidden_layers":1,"num_attention_heads":2,"rope_theta":500000.0,
    "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
    "original_max_position_embeddings":8192}})";
  ModelConfig c = ModelConfig::from_json(llama3, "config.json");
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
}

TEST(ModelConfig, Errors) {
  std::string unknown = error_of(R"({"model_type":"bert","vocab_size":10})");
  EXPECT_NE(unknown.find("'bert' is not supported"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("llama, qwen3, qwen3_moe, mixtral, gpt_oss"), std::string::npos) << unknown;
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  std::string missing = error_of(R"({"model_type":"llama","vocab_size":10})");
  EXPECT_NE(missing.find("'hidden_size' is missing"), std::string::npos) << missing;
  std::string wrong_type = error_of(R"({"model_type":"llama","vocab_size":"ten"})");
  EXPECT_NE(wrong_type.find("'vocab_size' has the wrong type"), std::string::npos) << wrong_type;
  std::string gqa = error_of(R"({"model_type":"llama","vocab_size":10,"hidden_size":12,"intermediate_size":4,
    "num_hidden_layers":1,"num_attention_heads":3,"num_key_value_heads":2,"head_dim":4})");
  EXPECT_NE(gqa.find("multiple of num_key_value_heads"), std::string::npos) << gqa;
  std::string rope = error_of(R"({"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":4,
    "num_hidden_layers":1,"num_attention_heads":2,"rope_scaling":{"rope_type":"longrope"}})");
  EXPECT_NE(rope.find("rope type 'longrope' is not supported"), std::string::npos) << rope;
  std::string layers =
      error_of(R"({"model_type":"gpt_oss","vocab_size":10,"hidden_size":8,"intermediate_size":4,
    "num_hidden_layers":2,"num_attention_heads":2,"head_dim":4,"num_local_experts":2,"num_experts_per_tok":1,
    "sliding_window":4,"layer_types":["sliding_attention"]})");
  EXPECT_NE(layers.find("layer_types"), std::string::npos) << layers;
}

}  // namespace
}  // namespace polylora
