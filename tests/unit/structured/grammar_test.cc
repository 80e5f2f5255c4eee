// tests/unit/structured/grammar_test.cc: the grammar engine through its public API: GBNF, regex, choice,
// json_object and every JSON Schema feature, each accepting exactly what it should and refusing near
// misses; token masks agreeing with byte-level matching; rollback; the compile cache.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "structured/compiled_grammar.h"
#include "structured/grammar.h"

namespace polylora::structured {
namespace {

// A small vocabulary: every single byte, some words, a stop token (id 300) and a special one (301).
std::shared_ptr<const Vocabulary> small_vocab() {
  std::vector<std::string> t;
  for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
  for (const char* w : {"{\"", "\":", "\"}", "true", "false", "null", "12", "345", ", \"", "name", "\xC3",
                        "\xA9", "\xC3\xA9", "ab", "abc", "   "})
    t.push_back(w);
  while (t.size() < 300) t.push_back("zz" + std::to_string(t.size()));
  t.push_back("<eos>");   // 300
  t.push_back("<|im|>");  // 301
  return Vocabulary::create(t, {300}, {301});
}

class Engine : public ::testing::Test {
 protected:
  std::shared_ptr<const Vocabulary> vocab_ = small_vocab();
  GrammarCompiler compiler_{vocab_};

  std::shared_ptr<const CompiledGrammar> schema(const std::string& s) {
    return compiler_.compile({SpecKind::kJsonSchema, s, {}});
  }
  std::shared_ptr<const CompiledGrammar> gbnf(const std::string& s) {
    return compiler_.compile({SpecKind::kGrammar, s, {}});
  }
  std::shared_ptr<const CompiledGrammar> regex(const std::string& s) {
    return compiler_.compile({SpecKind::kRegex, s, {}});
  }
  void expect_all(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<std::string>& yes,
                  const std::vector<std::string>& no) {
    for (const auto& s : yes) EXPECT_TRUE(matches(*g, s)) << "should accept: " << s;
    for (const auto& s : no) EXPECT_FALSE(matches(*g, s)) << "should refuse: " << s;
  }
  std::string error_of(const GrammarSpec& spec) {
    try {
      compiler_.compile(spec);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(Engine, GbnfLiteralsClassesGroupsAndRepetition) {
  auto g = gbnf(R"(root ::= greet (" " name)+ "!"?
greet ::= "hi" | "hello"   # a comment
name ::= [A-Z] [a-z]{1,3})");
  expect_all(g, {"hi Bob", "hello Al Bea!", "hi Abcd"},
             {"hi", "hi bob", "hi Abcde", "hey Bob", "hi Bob!!", "hi  Bob"});
  auto multi = gbnf("root ::= \"a\"\n   | \"b\" \"c\"\n");  // alternatives over lines
  expect_all(multi, {"a", "bc"}, {"b", "abc"});
  auto neg = gbnf(R"(root ::= [^a-c\n]* "\x41" "\u00e9")");
  expect_all(neg,
             {"xyzA\xC3\xA9", "A\xC3\xA9",
              "\xE4\xB8\xAD"
              "A\xC3\xA9"},
             {"aA\xC3\xA9", "x\nA\xC3\xA9", "A\xC3"});
  auto bounded = gbnf(R"(root ::= "x"{2} "y"{1,} "z"{0,2})");
  expect_all(bounded, {"xxy", "xxyyyzz"}, {"xy", "xxyzzz", "xxz"});
  auto dot = gbnf("root ::= . .");
  expect_all(dot, {"ab", "\xC3\xA9\xE2\x82\xAC", "\xF0\x9F\x98\x80x"}, {"a", "abc", "\xC3", "\xED\xA0\x80x"});
}

TEST_F(Engine, GbnfErrorsNameTheProblem) {
  EXPECT_NE(error_of({SpecKind::kGrammar, "root ::= foo", {}}).find("'foo' is used but never defined"),
            std::string::npos);
  EXPECT_NE(error_of({SpecKind::kGrammar, "start ::= \"a\"", {}}).find("no 'root' rule"), std::string::npos);
  EXPECT_NE(error_of({SpecKind::kGrammar, "root ::= root \"a\" | \"b\"", {}}).find("left-recursive"),
            std::string::npos);
  EXPECT_NE(error_of({SpecKind::kGrammar, "root ::= \"a", {}}).find("unterminated string"),
            std::string::npos);
  EXPECT_NE(error_of({SpecKind::kGrammar, "root ::= [b-a]", {}}).find("out of order"), std::string::npos);
  EXPECT_NE(error_of({SpecKind::kGrammar, "root ::= \"a\"\nroot ::= \"b\"", {}}).find("defined twice"),
            std::string::npos);
  EXPECT_NE(error_of({SpecKind::kGrammar, "root ::= (\"a\" | \"b\"", {}}).find("line 1"), std::string::npos);
}

TEST_F(Engine, Regex) {
  expect_all(regex(R"(\d{3}-[A-Z]{2})"), {"123-AB"}, {"12-AB", "123-ab", "123-ABC", "a123-AB"});
  expect_all(regex(R"(^(cat|dog)s?$)"), {"cat", "dogs"}, {"cow", "cats!", ""});
  expect_all(regex(R"([\w.]+@[a-z]+\.com)"), {"a.b_c@mail.com"}, {"@mail.com", "a@mail.org"});
  expect_all(regex(R"(a.c)"),
             {"abc",
              "a\xC3\xA9"
              "c"},
             {"a\nc", "ac"});
  expect_all(regex(R"((?:ab)*|x{2,})"), {"", "abab", "xxx"}, {"aba", "x"});
  EXPECT_NE(error_of({SpecKind::kRegex, R"((a)\1)", {}}).find("backreferences"), std::string::npos);
  EXPECT_NE(error_of({SpecKind::kRegex, R"((?=a)b)", {}}).find("lookaround"), std::string::npos);
  EXPECT_NE(error_of({SpecKind::kRegex, R"(a(b)", {}}).find("missing ')'"), std::string::npos);
}

TEST_F(Engine, Choice) {
  auto g = compiler_.compile({SpecKind::kChoice, "", {"yes", "no", "maybe \"so\""}});
  expect_all(g, {"yes", "no", "maybe \"so\""}, {"ye", "yesno", "No", ""});
  EXPECT_NE(error_of({SpecKind::kChoice, "", {}}).find("empty"), std::string::npos);
}

TEST_F(Engine, JsonObject) {
  auto g = compiler_.compile({SpecKind::kJsonObject, "", {}});
  expect_all(g,
             {"{}", "{\"a\": [1, -2.5e3, \"x\", null, true, {\"b\": {}}]}", "{\n  \"k\": \"v\\n\\u00e9\"\n}"},
             {"[]", "{\"a\"}", "{\"a\": 01}", "{\"a\": tru}", "{'a': 1}", "{\"a\": 1,}", "\"x\"",
              "{\"a\":\"\x01\"}"});
}

TEST_F(Engine, SchemaTypes) {
  expect_all(schema(R"({"type": "string"})"), {"\"\"", "\"a\\\"b\"", "\"\xC3\xA9\""},
             {"\"a", "a", "\"\\x\""});
  expect_all(schema(R"({"type": "integer"})"), {"0", "-12", "345"}, {"01", "1.0", "-", "1e3", "+1"});
  expect_all(schema(R"({"type": "number"})"), {"0", "-1.5", "2e10", "3.25E-2"}, {"1.", ".5", "--1", "1e"});
  expect_all(schema(R"({"type": "boolean"})"), {"true", "false"}, {"True", "1"});
  expect_all(schema(R"({"type": "null"})"), {"null"}, {"nul", "None"});
  expect_all(schema(R"({"type": ["integer", "null"]})"), {"5", "null"}, {"\"5\"", "true"});
}

TEST_F(Engine, SchemaObjects) {
  auto g = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                      "c": {"type": "boolean"}}, "required": ["a", "c"]})");
  expect_all(
      g, {R"({"a": 1, "c": true})", R"({"a":1,"b":"x","c":false})", R"({ "a" : 1 , "b" : "" , "c" : true })"},
      {R"({"a": 1})", R"({"c": true, "a": 1})", R"({"a": 1, "c": true, "d": 1})", R"({"a": "1", "c": true})",
       R"({"a": 1, "b": "x"})", R"({"a": 1,, "c": true})", R"({, "a": 1, "c": true})"});
  auto none_required =
      schema(R"({"type": "object", "properties": {"x": {"type": "null"}, "y": {"type": "null"}}})");
  expect_all(none_required, {"{}", R"({"y": null})", R"({"x": null, "y": null})"},
             {R"({"x": null,})", R"({,})"});
  auto extra = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                          "additionalProperties": {"type": "string"}})");
  expect_all(extra, {R"({"a": 1})", R"({"a": 1, "zz": "q", "y": ""})"},
             {R"({"a": 1, "zz": 2})", R"({"zz": "q"})"});
  // An extra member never repeats a listed name (written plainly or with escapes); keys that share a
  // prefix with a name, extend one or are empty are fine.
  auto named = schema(R"({"type": "object", "properties": {"ab": {"type": "integer"}, "\u00e9": {"type": "null"}},
                          "additionalProperties": {"type": "string"}})");
  expect_all(named,
             {R"({"ab": 1, "a": "x"})", R"({"abc": "x"})", R"({"b": "x", "ax": ""})",
              "{\"\xC3\xA9\": null, \"\xC3\xA9x\": \"\"}", R"({"": "e"})", R"({"x\n": "y"})",
              R"({"ab": 2, "abab": "z"})"},
             {R"({"ab": "x"})", R"({"ab": 1, "ab": "x"})", R"({"a\u0062": "x"})", "{\"\xC3\xA9\": \"s\"}",
              R"({"\u00e9": "s"})"});
  auto any = schema(R"({"type": "object", "additionalProperties": true})");
  expect_all(any, {"{}", R"({"k": [1, {"x": null}]})"}, {"[]"});
  EXPECT_NE(error_of({SpecKind::kJsonSchema,
                      R"({"type":"object","properties":{},"required":["q"],"additionalProperties":false})",
                      {}})
                .find("required property 'q'"),
            std::string::npos);
}

TEST_F(Engine, SchemaEnumConstAnyOfRefs) {
  expect_all(schema(R"({"enum": ["red", 2, null, {"a": [true]}]})"),
             {"\"red\"", "2", "null", R"({"a":[true]})"}, {"\"blue\"", "\"2\"", "red"});
  expect_all(schema(R"({"const": "fixed"})"), {"\"fixed\""}, {"\"fixe\"", "fixed"});
  expect_all(schema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})"),
             {"7", "\"ab\""}, {"\"abc\"", "true"});
  expect_all(schema(R"({"oneOf": [{"const": 1}, {"const": 2}]})"), {"1", "2"}, {"3"});
  auto refs = schema(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
      "$ref": "#/$defs/node"})");
  expect_all(refs,
             {R"({"v": 1, "next": null})", R"({"v": 1, "next": {"v": 2, "next": {"v": 3, "next": null}}})"},
             {R"({"v": 1})", R"({"v": 1, "next": {"v": 2}})"});
  auto defs = schema(
      R"({"definitions": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/definitions/n"}})");
  expect_all(defs, {"[1, 2]"}, {"[\"1\"]"});
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"$ref": "#/$defs/missing"})", {}}).find("points at nothing"),
            std::string::npos);
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"$ref": "http://x/s.json"})", {}}).find("not supported"),
            std::string::npos);
}

TEST_F(Engine, SchemaArrays) {
  expect_all(schema(R"({"type": "array", "items": {"type": "integer"}})"),
             {"[]", "[1]", "[1, 2, 3]", "[ 1 ,2 ]"}, {"[1,]", "[,1]", "[\"a\"]", "["});
  expect_all(schema(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})"),
             {"[1, 2]", "[1, 2, 3]"}, {"[]", "[1]", "[1, 2, 3, 4]"});
  expect_all(schema(R"({"type": "array", "items": {"type": "boolean"}, "maxItems": 1})"), {"[]", "[true]"},
             {"[true, false]"});
  expect_all(schema(R"({"type": "array", "minItems": 1})"), {"[1]", "[\"a\", {}]"}, {"[]"});
  expect_all(
      schema(
          R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})"),
      {"[]", "[\"a\"]", "[\"a\", 1]"}, {"[1, \"a\"]", "[\"a\", 1, 2]"});
  expect_all(
      schema(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2})"),
      {"[\"a\", 1]", "[\"a\", 1, null, {}]"}, {"[\"a\"]", "[1, \"a\"]"});
}

TEST_F(Engine, SchemaStrings) {
  expect_all(schema(R"({"type": "string", "minLength": 2, "maxLength": 3})"),
             {"\"ab\"", "\"a\\nb\"", "\"\xC3\xA9\xC3\xA9\""}, {"\"a\"", "\"abcd\""});
  expect_all(schema(R"({"type": "string", "pattern": "^[a-z]+-\\d{2}$"})"), {"\"ab-12\""},
             {"\"ab-1\"", "\"AB-12\"", "ab-12"});
  expect_all(schema(R"({"type": "string", "pattern": "a\"b"})"), {"\"a\\\"b\""}, {"\"a\"b\""});
  expect_all(
      schema(R"({"type": "string", "format": "date-time"})"),
      {"\"2024-02-29T13:05:00Z\"", "\"2024-12-31T23:59:59.123+05:30\"", "\"2000-02-29T00:00:00z\""},
      {"\"2024-13-01T00:00:00Z\"", "\"2024-01-01T24:00:00Z\"", "\"2024-01-01\"", "\"2024-01-01T00:00:00\"",
       "\"2023-02-29T00:00:00Z\"", "\"1900-02-29T00:00:00Z\"", "\"2024-04-31T00:00:00Z\"",
       "\"2024-01-01T00:00:60Z\""});
  // Every day of 2023 and 2024 and none past a month's end, checked against the calendar.
  auto date = schema(R"({"type": "string", "format": "date"})");
  for (int year : {1900, 2000, 2023, 2024})
    for (int month = 1; month <= 12; ++month)
      for (int day = 1; day <= 32; ++day) {
        const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        const int days[] = {31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        const std::string d = fmt::format("\"{:04}-{:02}-{:02}\"", year, month, day);
        EXPECT_EQ(matches(*date, d), day <= days[month - 1]) << d;
      }
  expect_all(schema(R"({"type": "string", "format": "email"})"), {"\"a.b+c@x-y.example.org\""},
             {"\".a@x.org\"", "\"a..b@x.org\"", "\"a@-x.org\"", "\"a@x\"", "\"a b@x.org\""});
  for (const char* bad : {R"({"type": "string", "pattern": "a+", "maxLength": 3})",
                          R"({"type": "string", "format": "date", "minLength": 3})"})
    EXPECT_NE(error_of({SpecKind::kJsonSchema, bad, {}}).find("together with"), std::string::npos) << bad;
  expect_all(schema(R"({"type": "string", "format": "uuid"})"), {"\"123e4567-e89b-12d3-a456-426614174000\""},
             {"\"123e4567e89b12d3a456426614174000\""});
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"type": "string", "format": "hostname"})", {}})
                .find("format 'hostname'"),
            std::string::npos);
}

TEST_F(Engine, SchemaIntegerBoundsExact) {
  struct Case {
    std::string schema;
    int64_t lo, hi;
  };
  std::vector<Case> cases = {
      {R"({"type": "integer", "minimum": 0, "maximum": 100})", 0, 100},
      {R"({"type": "integer", "minimum": -15, "maximum": 7})", -15, 7},
      {R"({"type": "integer", "minimum": 17, "maximum": 2345})", 17, 2345},
      {R"({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 100})", 10, 99},
      {R"({"type": "integer", "minimum": -250, "maximum": -30})", -250, -30},
      {R"({"type": "integer", "minimum": 1.5, "maximum": 20.5})", 2, 20},
  };
  for (const Case& c : cases) {
    auto g = schema(c.schema);
    for (int64_t v = -3000; v <= 3000; ++v)
      EXPECT_EQ(matches(*g, std::to_string(v)), v >= c.lo && v <= c.hi) << c.schema << " value " << v;
    EXPECT_FALSE(matches(*g, "-0"));
    EXPECT_FALSE(matches(*g, "007"));
  }
  expect_all(schema(R"({"type": "integer", "minimum": -1e30, "maximum": 3e40})"), {"-999999999999999999", "0", "7"},
             {"1.5"});
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"type": "integer", "minimum": 1e19})", {}}).find("beyond"),
            std::string::npos);
  auto lower_only = schema(R"({"type": "integer", "minimum": 5})");
  expect_all(lower_only, {"5", "6", "1000000000000"}, {"4", "-5", "0"});
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"type": "integer", "minimum": 5, "maximum": 4})", {}})
                .find("no integer"),
            std::string::npos);
}

// Value of a plain decimal string with at most 3 fraction digits, times 1000 (exact in an int64).
int64_t milli(const std::string& text) {
  const bool neg = text[0] == '-';
  const std::string t = neg ? text.substr(1) : text;
  const size_t dot = t.find('.');
  int64_t v = std::stoll(t.substr(0, dot)) * 1000;
  if (dot != std::string::npos) {
    std::string f = t.substr(dot + 1);
    f.resize(3, '0');
    v += std::stoll(f);
  }
  return neg ? -v : v;
}

TEST_F(Engine, SchemaNumberBoundsExact) {
  // Every plain decimal with an integer part 0..24 and 0..3 fraction digits, both signs.
  std::vector<std::string> texts;
  for (int ip = 0; ip <= 24; ++ip) {
    const std::string i = std::to_string(ip);
    texts.push_back(i);
    for (int f = 0; f < 10; ++f) texts.push_back(fmt::format("{}.{}", i, f));
    for (int f = 0; f < 100; ++f) texts.push_back(fmt::format("{}.{:02}", i, f));
    for (int f = 0; f < 1000; f += 7) texts.push_back(fmt::format("{}.{:03}", i, f));
  }
  for (size_t n = texts.size(), k = 0; k < n; ++k)
    if (texts[k] != "0") texts.push_back("-" + texts[k]);
  struct Case {
    std::string schema;
    std::optional<int64_t> lo, hi;  // in thousandths
    bool lo_ex, hi_ex;
  };
  std::vector<Case> cases = {
      {R"({"type": "number", "minimum": 0.5, "maximum": 12.25})", 500, 12250, false, false},
      {R"({"type": "number", "exclusiveMinimum": -3.75, "exclusiveMaximum": 7})", -3750, 7000, true, true},
      {R"({"type": "number", "minimum": -20, "maximum": -0.125})", -20000, -125, false, false},
      {R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})", 0, 1000, true, false},
      {R"({"type": "number", "minimum": 2.5})", 2500, std::nullopt, false, false},
      {R"({"type": "number", "exclusiveMaximum": 0.001})", std::nullopt, 1, false, true},
      {R"({"type": "number", "maximum": -1.001})", std::nullopt, -1001, false, false},
      {R"({"type": "number", "minimum": 1.5, "exclusiveMinimum": true, "maximum": 3, "exclusiveMaximum": true})",
       1500, 3000, true, true},
      {R"({"type": "number", "minimum": 5, "maximum": 5})", 5000, 5000, false, false},
      {R"({"type": "number", "minimum": 3, "exclusiveMinimum": 3.5, "maximum": 4.999})", 3500, 4999, true, false},
      {R"({"type": "number", "minimum": -0.999, "maximum": 0.5, "exclusiveMaximum": 0.25})", -999, 250, false, true},
      {R"({"type": ["number", "null"], "minimum": 10.01, "exclusiveMaximum": 10.011})", 10010, 10011, false, true},
  };
  for (const Case& c : cases) {
    auto g = schema(c.schema);
    int64_t accepted = 0;
    for (const std::string& t : texts) {
      const int64_t v = milli(t);
      const bool in = (!c.lo || (c.lo_ex ? v > *c.lo : v >= *c.lo)) && (!c.hi || (c.hi_ex ? v < *c.hi : v <= *c.hi));
      const bool negative_zero = t[0] == '-' && v == 0;
      EXPECT_EQ(matches(*g, t), in && !negative_zero) << c.schema << " value " << t;
      accepted += in;
    }
    EXPECT_GT(accepted, 0) << c.schema;
    EXPECT_FALSE(matches(*g, "1e1")) << c.schema;  // bounded numbers are written without exponents
    EXPECT_FALSE(matches(*g, "05")) << c.schema;
    EXPECT_FALSE(matches(*g, "5.")) << c.schema;
  }
  // Beyond the 3 digits above: 17 fraction digits, compared as decimals.
  auto tenth = schema(R"({"type": "number", "minimum": 0.1, "maximum": 0.30000000000000004})");
  expect_all(tenth, {"0.1", "0.10000000000000001", "0.2999999", "0.3", "0.30000000000000004"},
             {"0.09999999999999999", "0.30000000000000005", "0.31"});
  auto tiny = schema(R"({"type": "number", "exclusiveMinimum": 1e-7, "maximum": 1e20})");
  expect_all(tiny, {"0.00000011", "0.0000002", "123456789012345678.5"},
             {"0.0000001", "0.00000009", "0", "-1"});
  auto wide = schema(R"({"type": "number", "minimum": -1e30, "maximum": 99.5})");
  expect_all(wide, {"-999999999999999999.25", "99.5", "-0.5", "0"}, {"99.51", "100"});
  for (const char* bad : {R"({"type": "number", "minimum": 2, "maximum": 1})",
                          R"({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1})",
                          R"({"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.5})"})
    EXPECT_NE(error_of({SpecKind::kJsonSchema, bad, {}}).find("no number lies between"), std::string::npos) << bad;
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"type": "number", "minimum": 1e19})", {}}).find("beyond"),
            std::string::npos);
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"type": "number", "maximum": "3"})", {}}).find("maximum must be a number"),
            std::string::npos);
  // Without bounds, numbers keep exponents.
  expect_all(schema(R"({"type": "number"})"), {"1e5", "-2.5E-3", "0"}, {"01", "1e"});
}

TEST_F(Engine, SchemaUnsupportedKeywordsAreNamed) {
  for (const char* kw :
       {"not", "if", "patternProperties", "uniqueItems", "multipleOf", "minProperties", "contains"}) {
    std::string s = std::string(R"({"type": "object", ")") + kw + R"(": {}})";
    EXPECT_NE(error_of({SpecKind::kJsonSchema, s, {}}).find(std::string("'") + kw + "' is not supported"),
              std::string::npos)
        << kw;
  }
  EXPECT_NE(error_of({SpecKind::kJsonSchema, "{not json", {}}).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of({SpecKind::kJsonSchema, R"({"type": "strin"})", {}}).find("unknown type 'strin'"),
            std::string::npos);
  // Annotations and unknown extension keywords are ignored.
  expect_all(schema(R"({"type": "integer", "title": "T", "description": "d", "x-extra": 1, "default": 3})"),
             {"3"}, {"\"3\""});
}

// Token-level: the mask agrees with trying every token, multi-byte characters split over tokens, stop
// tokens only when complete, special tokens never.
TEST_F(Engine, MaskMatchesAcceptTokenForEveryId) {
  auto g = schema(R"({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
                      "required": ["name", "n"]})");
  GrammarMatcher m(g);
  std::vector<uint32_t> mask(mask_words(vocab_->size()));
  const std::string text = "{\"name\": \"\xC3\xA9t\xC3\xA9\", \"n\": 12345}";
  for (size_t pos = 0;; ++pos) {
    m.fill_mask(mask);
    for (int32_t id = 0; id < vocab_->size(); ++id) {
      GrammarMatcher probe = GrammarMatcher(g);
      ASSERT_TRUE(probe.accept_bytes(text.substr(0, pos)));
      bool allowed = mask[static_cast<size_t>(id) >> 5] >> (id & 31) & 1u;
      EXPECT_EQ(allowed, probe.accept_token(id)) << "pos " << pos << " id " << id;
    }
    EXPECT_FALSE(mask[301 >> 5] >> (301 & 31) & 1u);
    EXPECT_EQ(static_cast<bool>(mask[300 >> 5] >> (300 & 31) & 1u), pos == text.size());
    if (pos == text.size()) break;
    ASSERT_TRUE(m.accept_bytes(text.substr(pos, 1)));
  }
  EXPECT_TRUE(m.can_terminate());
  EXPECT_TRUE(m.must_terminate());
  EXPECT_TRUE(m.accept_token(300));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_token('x'));
  m.rollback(1);
  EXPECT_FALSE(m.is_terminated());
  m.rollback(3);  // back before "45}": the text ends in "123"
  EXPECT_FALSE(m.can_terminate());
  EXPECT_TRUE(m.accept_token(263));  // "345"
  EXPECT_TRUE(m.accept_bytes("}"));
  EXPECT_TRUE(m.can_terminate());
}

TEST_F(Engine, RejectedTokenLeavesStateUnchanged) {
  GrammarMatcher m(regex("ab+c"));
  EXPECT_FALSE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token('a'));
  EXPECT_FALSE(m.accept_token(300));  // stop before complete
  EXPECT_TRUE(m.accept_token('b'));
  EXPECT_TRUE(m.accept_token('c'));
  EXPECT_EQ(m.num_accepted_tokens(), 3);
  EXPECT_TRUE(m.accept_token(300));
}

TEST_F(Engine, CompileIsCachedBySpec) {
  auto a = schema(R"({"type": "integer"})");
  auto b = schema(R"({"type": "integer"})");
  auto c = schema(R"({"type": "integer", "minimum": 0})");
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
  // The same text as another kind is another grammar.
  auto any = compiler_.compile({SpecKind::kJsonSchema, "true", {}});
  auto word = compiler_.compile({SpecKind::kRegex, "true", {}});
  EXPECT_NE(any.get(), word.get());
  EXPECT_TRUE(matches(*any, "[1]"));
  EXPECT_FALSE(matches(*word, "[1]"));
  // Masks of a repeated state are cached: the second visit adds none.
  GrammarMatcher m(schema(R"({"type": "string"})"));
  std::vector<uint32_t> mask(mask_words(vocab_->size()));
  m.accept_bytes("\"a");
  m.fill_mask(mask);
  size_t cached = m.grammar().num_cached_masks();
  m.accept_bytes("b");
  m.fill_mask(mask);
  EXPECT_EQ(m.grammar().num_cached_masks(), cached);
}

TEST(GrammarText, JsonSchemaRulesCompose) {
  std::string rules = json_schema_to_gbnf(R"({"type": "object", "properties": {"city": {"type": "string"}},
                                              "required": ["city"]})",
                                          "args");
  std::string g =
      "root ::= \"<tool_call>{\\\"name\\\": \\\"w\\\", \\\"arguments\\\": \" args \"}</tool_call>\"\n" +
      rules;
  GrammarCompiler compiler(small_vocab());
  auto compiled = compiler.compile({SpecKind::kGrammar, g, {}});
  EXPECT_TRUE(matches(*compiled, R"(<tool_call>{"name": "w", "arguments": {"city": "Paris"}}</tool_call>)"));
  EXPECT_FALSE(matches(*compiled, R"(<tool_call>{"name": "w", "arguments": {}}</tool_call>)"));
  EXPECT_EQ(gbnf_literal("a\"b\\\n"), "\"a\\\"b\\\\\\x0A\"");
}

}  // namespace
}  // namespace polylora::structured
