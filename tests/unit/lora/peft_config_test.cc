// tests/unit/lora/peft_config_test.cc: adapter_config.json as untrusted input: every field type-checked,
// bounded nesting and size, invalid UTF-8, and rank_pattern / alpha_pattern keys compiled with PCRE2 under
// limits (deep nesting, catastrophic backtracking, invalid patterns) with PEFT's matching rule.
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "lora/peft_config.h"

namespace polylora {
namespace {

const std::string kWhere = "adapter 'x': /a/adapter_config.json";

std::string error_of(std::string_view bytes) {
  try {
    parse_peft_config(bytes, kWhere);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalid);
    std::string message = e.what();
    EXPECT_NO_THROW((void)nlohmann::json(message).dump()) << "message is not valid UTF-8";
    return message;
  }
  return "";
}

std::string with_field(const std::string& field, const std::string& value_json) {
  return R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8, ")" + field + R"(": )" + value_json + "}";
}

TEST(PeftConfigTest, ValidConfigParses) {
  PeftConfig c = parse_peft_config(
      R"({"peft_type": "LORA", "r": 16, "lora_alpha": 32.5, "use_rslora": true, "target_modules": "all-linear",
          "target_parameters": null, "modules_to_save": null, "bias": "none", "use_dora": false,
          "lora_bias": false, "fan_in_fan_out": false, "rank_pattern": {"q_proj": 8}, "alpha_pattern": {}})",
      kWhere);
  EXPECT_EQ(c.r, 16);
  EXPECT_DOUBLE_EQ(c.lora_alpha, 32.5);
  EXPECT_TRUE(c.use_rslora);
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.q_proj"), 8);
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.k_proj"), 16);
  EXPECT_DOUBLE_EQ(c.alpha_for("model.layers.0.self_attn.q_proj"), 32.5);
  PeftConfig defaults = parse_peft_config("{}", kWhere);
  EXPECT_EQ(defaults.r, 8);
  EXPECT_DOUBLE_EQ(defaults.lora_alpha, 8);
}

TEST(PeftConfigTest, FieldTypes) {
  EXPECT_EQ(error_of(R"({"r": 16.5})"), kWhere + ": 'r' must be a positive integer, got 16.5");
  EXPECT_EQ(error_of(R"({"r": "16"})"), kWhere + ": 'r' must be a positive integer, got \"16\"");
  EXPECT_EQ(error_of(R"({"r": true})"), kWhere + ": 'r' must be a positive integer, got true");
  EXPECT_EQ(error_of(R"({"r": 0})"), kWhere + ": 'r' must be a positive integer, got 0");
  EXPECT_EQ(error_of(R"({"r": -3})"), kWhere + ": 'r' must be a positive integer, got -3");
  EXPECT_EQ(error_of(R"({"r": 99999999999999999999})"),
            kWhere + ": 'r' must be a positive integer, got 1e+20");
  EXPECT_EQ(error_of(R"({"r": [4]})"), kWhere + ": 'r' must be a positive integer, got an array");
  EXPECT_EQ(error_of(R"({"lora_alpha": "x"})"), kWhere + ": 'lora_alpha' must be a number, got \"x\"");
  EXPECT_NE(error_of(R"({"lora_alpha": 1e999})"), "");  // number overflow: not valid JSON
  EXPECT_EQ(error_of(R"({"use_rslora": "yes"})"),
            kWhere + ": 'use_rslora' must be true or false, got \"yes\"");
  EXPECT_NE(error_of(with_field("rank_pattern", R"({"q_proj": 2.5})")).find("must be a positive integer"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("rank_pattern", "[1]")).find("'rank_pattern' must be an object"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("alpha_pattern", R"({"q_proj": "a"})")).find("must be a number"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("target_modules", "5")).find("'target_modules' must be a string, a list"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("target_modules", R"(["q_proj", 1])")).find("one entry is 1"),
            std::string::npos);
  EXPECT_NE(
      error_of(with_field("target_parameters", R"("mlp.experts.down_proj")")).find("'target_parameters'"),
      std::string::npos);
  EXPECT_NE(error_of(with_field("peft_type", "1")).find("'peft_type' must be a string"), std::string::npos);
  EXPECT_NE(error_of(with_field("bias", "false")).find("'bias' must be a string"), std::string::npos);
  EXPECT_NE(error_of(with_field("use_dora", "0")).find("'use_dora' must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("lora_bias", "\"no\"")).find("'lora_bias' must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("fan_in_fan_out", "null")).find("'fan_in_fan_out' must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(with_field("modules_to_save", "\"lm_head\"")).find("'modules_to_save' must be a list"),
            std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("must hold a JSON object"), std::string::npos);
}

TEST(PeftConfigTest, UnsupportedOptions) {
  EXPECT_NE(error_of(with_field("peft_type", "\"IA3\"")).find("only LORA adapters"), std::string::npos);
  EXPECT_NE(error_of(with_field("use_dora", "true")).find("DoRA"), std::string::npos);
  EXPECT_NE(error_of(with_field("bias", "\"all\"")).find("LoRA bias 'all' is not supported"),
            std::string::npos);
  EXPECT_NE(
      error_of(with_field("modules_to_save", R"(["lm_head"])")).find("modules_to_save is not supported"),
      std::string::npos);
}

TEST(PeftConfigTest, DeepNestingIsBounded) {
  std::string deep(100000, '[');
  EXPECT_EQ(error_of(deep), kWhere + " nests objects and arrays deeper than 64 levels");
  std::string deep_objects;
  for (int i = 0; i < 100000; ++i) deep_objects += "{\"a\":";
  EXPECT_EQ(error_of(deep_objects), kWhere + " nests objects and arrays deeper than 64 levels");
  std::string ok = R"({"x": )" + std::string(60, '[') + std::string(60, ']') + "}";
  EXPECT_EQ(error_of(ok), "");
}

TEST(PeftConfigTest, InvalidUtf8AndSize) {
  std::string e1 = error_of("{\"peft_type\": \"LO\xff\xfeRA\"}");
  EXPECT_NE(e1.find("is not valid JSON"), std::string::npos) << e1;
  std::string e2 = error_of("{\"r\xc3\": 4}");
  EXPECT_NE(e2.find("is not valid JSON"), std::string::npos) << e2;
  std::string e3 = error_of("{\"r\": 4} \xff\xff");
  EXPECT_NE(e3.find("is not valid JSON"), std::string::npos) << e3;
  std::string big = "{\"x\": \"" + std::string(kMaxPeftConfigBytes, 'a') + "\"}";
  EXPECT_NE(error_of(big).find("is larger than 1048576 bytes"), std::string::npos);
  // A long string value cut inside a multi-byte character must still give a valid UTF-8 message.
  std::string accents;
  for (int i = 0; i < 60; ++i) accents += "\xc3\xa9";
  EXPECT_NE(error_of(with_field("peft_type", "\"" + accents + "\"")).find("only LORA"), std::string::npos);
}

TEST(PeftConfigTest, PatternKeysAreBounded) {
  std::string e1 = error_of(with_field("rank_pattern", R"({")" + std::string(50000, '(') + R"(": 4})"));
  EXPECT_NE(e1.find("is 50000 bytes long, more than the 1024 allowed"), std::string::npos) << e1;
  std::string nested = std::string(200, '(') + "q_proj" + std::string(200, ')');
  std::string e2 = error_of(with_field("rank_pattern", R"({")" + nested + R"(": 4})"));
  EXPECT_NE(e2.find("is not a valid regular expression: parentheses are too deeply nested"),
            std::string::npos)
      << e2;
  EXPECT_EQ(error_of(with_field("rank_pattern", R"({"(((": 4})")),
            kWhere +
                ": rank_pattern key '(((' is not a valid regular expression: missing closing parenthesis at "
                "offset 3");
  EXPECT_NE(error_of(with_field("alpha_pattern", R"({"q_proj[": 4})")).find("alpha_pattern key 'q_proj['"),
            std::string::npos);
  nlohmann::json many = nlohmann::json::object();
  for (int i = 0; i < 1025; ++i) many["k" + std::to_string(i)] = 4;
  EXPECT_NE(
      error_of(with_field("rank_pattern", many.dump())).find("has 1025 keys, more than the 1024 allowed"),
      std::string::npos);
}

TEST(PeftConfigTest, CatastrophicBacktrackingIsBounded) {
  PeftConfig c =
      parse_peft_config(with_field("rank_pattern", R"({"(.*)*(.*)*(.*)*(.*)*(.*)*(.*)*X": 2})"), kWhere);
  std::string module = "model.layers.0." + std::string(5000, 'a') + ".q_proj";
  auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    EXPECT_EQ(c.rank_for(module), 4);
  } catch (const Error& e) {
    message = e.what();
  }
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(1));
  if (!message.empty()) {
    EXPECT_NE(message.find("rank_pattern key '(.*)*"), std::string::npos) << message;
  }

  // A pattern PCRE2 cannot shortcut: nested quantifiers and no required literal.
  PeftConfig d = parse_peft_config(with_field("rank_pattern", R"({"(a|aa)*(a|aa)*(a|aa)*b?c": 2})"), kWhere);
  std::string as = "model.layers.0." + std::string(200, 'a');
  start = std::chrono::steady_clock::now();
  try {
    d.rank_for(as);
  } catch (const Error& e) {
    message = e.what();
    EXPECT_NE(message.find("too costly to match"), std::string::npos) << message;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

TEST(PeftConfigTest, PatternSemanticsArePefts) {
  PeftConfig c = parse_peft_config(with_field("rank_pattern", R"({
      "model.layers.1.self_attn.q_proj": 2, "q_proj": 3, "layers\\.[0-9]+\\.mlp\\.(gate|up)_proj": 5,
      "v.proj": 6, "o_proj|k_proj": 7})"),
                                   kWhere);
  EXPECT_EQ(c.rank_for("model.layers.1.self_attn.q_proj"), 2);  // first key in document order wins
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.q_proj"), 3);
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.xq_proj"), 4);  // a suffix only after a dot
  EXPECT_EQ(c.rank_for("q_proj"), 3);                            // or the whole name
  EXPECT_EQ(c.rank_for("model.layers.12.mlp.up_proj"), 5);
  EXPECT_EQ(c.rank_for("model.layers.12.mlp.down_proj"), 4);
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.v_proj"), 6);  // '.' is a regex wildcard, as in PEFT
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.k_proj"), 7);  // the key is grouped: (.*\.)?(o|k)$
  EXPECT_EQ(c.rank_for("model.layers.0.self_attn.o_proj"), 7);
  for (const char* module :
       {"model.layers.1.self_attn.q_proj", "q_proj", "model.layers.0.self_attn.xq_proj",
        "model.layers.0.self_attn.v_proj", "model.layers.0.self_attnvv_proj", "v_proj.v_proj"})
    EXPECT_EQ(c.rank_pattern.first_match(module), c.rank_pattern.first_match_regex_only(module)) << module;
}

}  // namespace
}  // namespace polylora
