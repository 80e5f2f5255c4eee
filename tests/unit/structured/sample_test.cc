// tests/unit/structured/sample_test.cc: texts generated token by token from the masks of JSON Schema
// grammars (random choices among the allowed tokens) always parse as JSON and pass an independent schema
// check (schema_check.h), for every supported feature.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "structured/grammar.h"
#include "unit/structured/schema_check.h"

namespace polylora::structured {
namespace {

// Every byte, a few hundred multi-byte tokens of JSON-ish text, and a stop token at the end.
std::shared_ptr<const Vocabulary> sample_vocab(int32_t& stop_id) {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* w : {"{\"",  "\":",  "\": ", "\"}",  "\",",   "\", \"",   "true",     "false", "null",
                        "12",   "345",  "0.",   "-1",   "e+",    "[\"",      "\"]",      "],",    "},",
                        "name", "tags", "\\n",  "\\\"", "\\u00", "\xC3\xA9", "\xE2\x82", "\xAC",  "20",
                        "24-",  "T1",   ":00",  "Z\"",  "  ",    "\n ",      "ab",       "\"a",   "b\""})
    t.push_back(w);
  stop_id = static_cast<int32_t>(t.size());
  t.push_back("</s>");
  return Vocabulary::create(t, {stop_id}, {});
}

// Generates one text; fails the test when the mask allows nothing or the text grows past 4000 tokens.
std::string generate(const std::shared_ptr<const CompiledGrammar>& g, const Vocabulary& v, int32_t stop_id,
                     std::mt19937& rng, unsigned closing_percent = 50) {
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(mask_words(v.size()));
  std::string text;
  for (int step = 0; step < 4000; ++step) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed, closing;
    for (int32_t id = 0; id < v.size(); ++id) {
      if (!(mask[static_cast<size_t>(id) >> 5] >> (id & 31) & 1u)) continue;
      allowed.push_back(id);
      char c = id == stop_id ? '\0' : v.token_bytes(id)[0];
      if (id == stop_id || c == '"' || c == ']' || c == '}' || c == ',' || (c >= '0' && c <= '9'))
        closing.push_back(id);
    }
    EXPECT_FALSE(allowed.empty()) << "nothing allowed after: " << text;
    if (allowed.empty()) return text;
    const auto& pool = !closing.empty() && rng() % 100 < closing_percent ? closing : allowed;
    int32_t id = pool[rng() % pool.size()];
    EXPECT_TRUE(m.accept_token(id));
    if (id == stop_id) {
      EXPECT_TRUE(m.is_terminated());
      return text;
    }
    text += v.token_bytes(id);
  }
  ADD_FAILURE() << "no stop after 4000 tokens: " << text.substr(0, 200);
  return text;
}

TEST(GrammarSamples, EverySampleParsesAndConformsToItsSchema) {
  int32_t stop_id = 0;
  auto vocab = sample_vocab(stop_id);
  GrammarCompiler compiler(vocab);
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer",
          "minimum": 0, "maximum": 120}, "score": {"type": "number", "minimum": 0}, "ok": {"type": "boolean"}},
          "required": ["name", "age"]})",
      R"({"type": "array", "items": {"enum": ["red", "green", 3, null]}, "minItems": 1, "maxItems": 4})",
      R"({"anyOf": [{"type": "integer", "minimum": -50, "maximum": -7}, {"type": "string", "minLength": 2,
          "maxLength": 3}, {"const": {"k": [1, 2]}}]})",
      R"({"$defs": {"tree": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 1, "maximum": 9},
          "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2}}, "required": ["v", "kids"]}},
          "$ref": "#/$defs/tree"})",
      R"({"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}, "code": {"type":
          "string", "pattern": "^[A-Z]{2}-\\d{3}$"}}, "required": ["when", "code"], "additionalProperties": false})",
      R"({"type": "object", "properties": {"id": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 13}},
          "required": ["id"], "additionalProperties": {"type": "string", "maxLength": 2}})",
      R"({"type": "array", "prefixItems": [{"type": "string", "maxLength": 1}, {"type": "null"}], "minItems": 2,
          "items": {"type": "boolean"}, "maxItems": 5})",
      R"({"type": ["integer", "null"]})",
      R"({"type": "object", "properties": {"t": {"type": "number", "minimum": -2.5, "exclusiveMaximum": 3.75},
          "p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "n": {"type": "number", "maximum": -100.5}},
          "required": ["t", "p", "n"]})",
      R"({"type": "array", "items": {"type": "number", "minimum": 0.25, "maximum": 0.75}, "minItems": 3})",
      R"({"oneOf": [{"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]},
          {"type": "object", "properties": {"b": {"const": 2}}, "required": ["b"]}]})",
  };
  std::mt19937 rng(1234);
  for (const std::string& s : schemas) {
    auto schema = nlohmann::json::parse(s);
    auto g = compiler.compile({SpecKind::kJsonSchema, s, {}});
    for (int i = 0; i < 40; ++i) {
      std::string text = generate(g, *vocab, stop_id, rng);
      nlohmann::json value;
      try {
        value = nlohmann::json::parse(text);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not JSON: " << text << " (" << e.what() << ") for " << s;
        continue;
      }
      EXPECT_EQ(testing_util::schema_violation(value, schema, schema), "") << text << " for " << s;
    }
  }
}

TEST(GrammarSamples, JsonObjectSamplesAreObjects) {
  int32_t stop_id = 0;
  auto vocab = sample_vocab(stop_id);
  GrammarCompiler compiler(vocab);
  auto g = compiler.compile({SpecKind::kJsonObject, "", {}});
  std::mt19937 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::string text = generate(g, *vocab, stop_id, rng, 85);
    nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
    EXPECT_TRUE(value.is_object()) << text;
  }
}

}  // namespace
}  // namespace polylora::structured
