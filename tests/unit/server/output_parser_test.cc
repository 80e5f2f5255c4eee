// Reasoning and tool-call parsers (server/output_parser.h) on hand-written model outputs and on assistant
// turns rendered by the real chat templates (tests/data/chat_templates), whole and streamed in chunks of
// every size from 1 byte (so chunks split the markers) and at random cut points.
#include "server/output_parser.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "server/qwen3_coder_tools.h"
#include "tokenizer/chat_template.h"

namespace polylora::server {
namespace {

using json = nlohmann::ordered_json;

// Everything a stream sends, put back together.
struct Streamed {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
  std::string error;  // a rule of the delta protocol that was broken
};

void apply(const OutputDelta& d, Streamed& s) {
  s.reasoning += d.reasoning;
  s.content += d.content;
  for (const auto& c : d.calls) {
    if (c.is_new) {
      if (c.index != s.calls.size()) s.error = "new call with index " + std::to_string(c.index);
      if (c.name.empty()) s.error = "new call without a name";
      s.calls.push_back({c.name, ""});
    } else if (c.index >= s.calls.size()) {
      s.error = "arguments for a call not announced";
      continue;
    }
    s.calls[c.index].arguments += c.arguments;
  }
}

Streamed stream(const OutputParserOptions& o, const std::string& text, const std::vector<size_t>& cuts) {
  OutputParser p(o);
  Streamed s;
  size_t prev = 0;
  for (size_t cut : cuts) {
    apply(p.feed(std::string_view(text).substr(prev, cut - prev)), s);
    prev = cut;
  }
  apply(p.feed(std::string_view(text).substr(prev)), s);
  apply(p.finish(), s);
  return s;
}

// Checks that streaming in every chunk size (and random cuts) sends exactly the non-streamed result.
void expect_stream_matches(const OutputParserOptions& o, const std::string& text) {
  OutputParser::Result whole = OutputParser::parse(o, text);
  std::mt19937 rng(7);
  std::vector<std::vector<size_t>> plans;
  for (size_t k = 1; k <= 9; ++k) {
    std::vector<size_t> cuts;
    for (size_t c = k; c < text.size(); c += k) cuts.push_back(c);
    plans.push_back(cuts);
  }
  for (int r = 0; r < 20; ++r) {
    std::vector<size_t> cuts;
    for (size_t c = 1 + rng() % 6; c < text.size(); c += 1 + rng() % 6) cuts.push_back(c);
    plans.push_back(cuts);
  }
  for (const auto& cuts : plans) {
    Streamed s = stream(o, text, cuts);
    SCOPED_TRACE("chunks cut at " + ::testing::PrintToString(cuts));
    EXPECT_EQ(s.error, "");
    EXPECT_EQ(s.reasoning, whole.reasoning);
    EXPECT_EQ(s.content, whole.content);
    ASSERT_EQ(s.calls.size(), whole.tool_calls.size());
    for (size_t i = 0; i < s.calls.size(); ++i) {
      EXPECT_EQ(s.calls[i].name, whole.tool_calls[i].name);
      EXPECT_EQ(json::parse(s.calls[i].arguments), json::parse(whole.tool_calls[i].arguments));
    }
  }
}

std::string read_template(const std::string& name) {
  std::ifstream in(std::string(POLYLORA_TEST_DATA) + "/chat_templates/" + name);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "get_time", "description": "Local time",
   "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}])");

// The text a model writes for `assistant` after the template's generation prompt: the rendering of the
// conversation with the assistant turn, less the rendering of the prompt, less the end-of-turn marker.
std::string rendered_turn(const std::string& tmpl_name, const json& assistant, const std::string& prompt_tail,
                          const std::string& end_marker) {
  ChatTemplate t = ChatTemplate::compile(read_template(tmpl_name));
  ChatTemplateInputs in;
  in.tools = kTools;
  in.date = "2025-01-01";
  in.messages = json::array({{{"role", "user"}, {"content", "Weather in Paris and the time there?"}}});
  std::string prompt = t.render(in);
  in.messages.push_back(assistant);
  std::string full = t.render(in);
  EXPECT_EQ(full.compare(0, prompt.size(), prompt), 0) << full;
  std::string turn = full.substr(prompt.size());
  EXPECT_EQ(turn.compare(0, prompt_tail.size(), prompt_tail), 0) << turn;
  turn = turn.substr(prompt_tail.size());
  size_t end = turn.rfind(end_marker);
  EXPECT_NE(end, std::string::npos) << turn;
  return turn.substr(0, end);
}

std::string rtrim_copy(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

OutputParserOptions opts(ToolParserKind t, ReasoningParserKind r) {
  OutputParserOptions o;
  o.tools = t;
  o.reasoning = r;
  return o;
}

// ---- harmony (GPT-OSS) ----

TEST(HarmonyParser, FinalOnly) {
  auto o = opts(ToolParserKind::kOpenai, ReasoningParserKind::kGptOss);
  std::string out = "<|channel|>final<|message|>Paris is sunny today.";  // <|return|> stops (not in the text)
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.content, "Paris is sunny today.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_TRUE(r.tool_calls.empty());
  expect_stream_matches(o, out);
}

TEST(HarmonyParser, AnalysisThenFinal) {
  auto o = opts(ToolParserKind::kNone, ReasoningParserKind::kGptOss);
  std::string out =
      "<|channel|>analysis<|message|>User asks about <weather>; answer briefly.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>It is 21 °C in Paris.<|return|>";
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.reasoning, "User asks about <weather>; answer briefly.");
  EXPECT_EQ(r.content, "It is 21 °C in Paris.");
  EXPECT_TRUE(r.has_reasoning);
  expect_stream_matches(o, out);
}

TEST(HarmonyParser, ToolCallAsTheTemplateRendersIt) {
  json assistant = {
      {"role", "assistant"},
      {"thinking", "Need the weather tool."},
      {"tool_calls",
       json::array({{{"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}};
  // The prompt ends with "<|start|>assistant": the model's text is what follows it.
  std::string out = rendered_turn("gpt-oss.jinja", assistant, "<|start|>assistant", "<|call|>");
  ASSERT_NE(out.find("to=functions.get_weather"), std::string::npos) << out;
  auto o = opts(ToolParserKind::kOpenai, ReasoningParserKind::kGptOss);
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.reasoning, "Need the weather tool.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 1u) << out;
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments), json({{"city", "Paris"}}));
  expect_stream_matches(o, out);
}

TEST(HarmonyParser, SeveralToolCallsWithConstrainAndAnalysis) {
  std::string out =
      "<|channel|>analysis<|message|>Two tools.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
      "{\"city\": \"Paris\"}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"
      "{\"tz\": \"Europe/Paris\", \"nested\": {\"a\": [1, 2]}}<|call|>";
  auto o = opts(ToolParserKind::kOpenai, ReasoningParserKind::kGptOss);
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.reasoning, "Two tools.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(json::parse(r.tool_calls[1].arguments)["nested"]["a"][1], 2);
  expect_stream_matches(o, out);
}

TEST(HarmonyParser, StreamHoldsAPartialMarker) {
  OutputParser p(opts(ToolParserKind::kOpenai, ReasoningParserKind::kGptOss));
  EXPECT_TRUE(p.feed("<|chan").empty());
  EXPECT_TRUE(p.feed("nel|>final<|mess").empty());
  OutputDelta d = p.feed("age|>Hi<|");
  EXPECT_EQ(d.content, "Hi");  // "<|" may begin <|end|>: held
  d = p.feed("end|>");
  EXPECT_EQ(d.content, "");
  EXPECT_TRUE(p.finish().empty());
  EXPECT_EQ(p.result().content, "Hi");
}

// ---- hermes (Qwen) and qwen3 reasoning ----

TEST(HermesParser, ContentOnly) {
  auto o = opts(ToolParserKind::kHermes, ReasoningParserKind::kQwen3);
  std::string out = "Just text, with a < sign and <tool but no call.";
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.content, out);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_FALSE(r.has_reasoning);
  expect_stream_matches(o, out);
}

TEST(HermesParser, ThinkThenAnswer) {
  auto o = opts(ToolParserKind::kHermes, ReasoningParserKind::kQwen3);
  std::string out = "<think>\nThe user greets me.\n</think>\n\nHello!";
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.reasoning, "\nThe user greets me.\n");
  EXPECT_EQ(r.content, "Hello!");
  expect_stream_matches(o, out);
  // The template opened <think> in the prompt: the output starts inside the reasoning.
  o.starts_in_reasoning = true;
  r = OutputParser::parse(o, "Greeting.</think>Hi");
  EXPECT_EQ(r.reasoning, "Greeting.");
  EXPECT_EQ(r.content, "Hi");
  expect_stream_matches(o, "Greeting.</think>Hi");
  // ... and the model may still write <think> itself after whitespace: a stream holds the whitespace back
  // until it knows (a fuzz finding: "\t" went out as reasoning, then the whole parse dropped it with the
  // tag).
  for (const std::string text : {"\t<think>Plan.</think>Hi", " \n <think>Plan.</think>Hi"}) {
    r = OutputParser::parse(o, text);
    EXPECT_EQ(r.reasoning, "Plan.") << text;
    EXPECT_EQ(r.content, "Hi") << text;
    expect_stream_matches(o, text);
  }
  // Whitespace alone, to the end, is the reasoning.
  r = OutputParser::parse(o, " \n");
  EXPECT_EQ(r.reasoning, " \n");
  expect_stream_matches(o, " \n");
}

// deepseek_r1 (vLLM's DeepSeekR1ReasoningParser): the output starts inside the reasoning whether or not the
// model writes <think>; without </think> everything is reasoning; tool calls after it still parse.
TEST(DeepSeekR1Parser, ReasoningFirstWithOrWithoutTheOpeningTag) {
  auto o = opts(ToolParserKind::kNone, ReasoningParserKind::kDeepSeekR1);
  for (const std::string out :
       {"Think it over.</think>\n\nThe answer is 4.", "<think>Think it over.</think>\n\nThe answer is 4."}) {
    auto r = OutputParser::parse(o, out);
    EXPECT_TRUE(r.has_reasoning) << out;
    EXPECT_EQ(r.reasoning, "Think it over.") << out;
    EXPECT_EQ(r.content, "The answer is 4.") << out;
    expect_stream_matches(o, out);
  }
  auto r = OutputParser::parse(o, "still thinking, cut off by max_tokens");
  EXPECT_EQ(r.reasoning, "still thinking, cut off by max_tokens");
  EXPECT_EQ(r.content, "");
  expect_stream_matches(o, "still thinking, cut off by max_tokens");
  o = opts(ToolParserKind::kHermes, ReasoningParserKind::kDeepSeekR1);
  r = OutputParser::parse(o,
                          "plan</think><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>");
  EXPECT_EQ(r.reasoning, "plan");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "f");
}

TEST(HermesParser, OneToolCallAsTheTemplateRendersIt) {
  json assistant = {
      {"role", "assistant"},
      {"content", ""},
      {"tool_calls",
       json::array({{{"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}})}};
  std::string out =
      rendered_turn("qwen2.5-instruct.jinja", assistant, "<|im_start|>assistant\n", "<|im_end|>");
  ASSERT_NE(out.find("<tool_call>"), std::string::npos) << out;
  auto o = opts(ToolParserKind::kHermes, ReasoningParserKind::kQwen3);
  auto r = OutputParser::parse(o, out);
  ASSERT_EQ(r.tool_calls.size(), 1u) << out;
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(r.content, "");
  expect_stream_matches(o, out);
}

TEST(HermesParser, SeveralToolCallsAfterThinkingAndText) {
  std::string out =
      "<think>two calls</think>Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Paris \\\"<tool_call>\\\"\"}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"tz\": "
      "\"CET\"}, \"name\": \"get_time\"}\n</tool_call>";
  auto o = opts(ToolParserKind::kHermes, ReasoningParserKind::kQwen3);
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.reasoning, "two calls");
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments)["city"], "Paris \"<tool_call>\"");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");  // keys in the other order still parse
  EXPECT_EQ(json::parse(r.tool_calls[1].arguments), json({{"tz", "CET"}}));
  expect_stream_matches(o, out);
}

TEST(HermesParser, ArgumentsStreamBeforeTheCallEnds) {
  OutputParser p(opts(ToolParserKind::kHermes, ReasoningParserKind::kNone));
  OutputDelta d = p.feed("<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"ci");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].is_new);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, "{\"ci");
  d = p.feed("ty\": \"Rome\"}}</tool_");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_FALSE(d.calls[0].is_new);
  EXPECT_EQ(d.calls[0].arguments, "ty\": \"Rome\"}");
  d = p.finish();
  EXPECT_TRUE(d.calls.empty());
}

TEST(HermesParser, BrokenCallIsContent) {
  std::string out = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call>";
  auto r = OutputParser::parse(opts(ToolParserKind::kHermes, ReasoningParserKind::kNone), out);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, out);
}

// ---- llama3_json, mistral, required, named ----

TEST(Llama3JsonParser, CallsAndContent) {
  auto o = opts(ToolParserKind::kLlama3Json, ReasoningParserKind::kNone);
  std::string out =
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": "
      "\"get_time\", \"parameters\": {}}";
  auto r = OutputParser::parse(o, out);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(json::parse(r.tool_calls[0].arguments)["city"], "Oslo");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  expect_stream_matches(o, out);
  r = OutputParser::parse(o, "The weather is fine.");
  EXPECT_EQ(r.content, "The weather is fine.");
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(PythonicParser, CallsWithJsonDumpsArguments) {
  auto o = opts(ToolParserKind::kPythonic, ReasoningParserKind::kNone);
  std::string out = R"([get_weather(city="San Francisco", metric="celsius"), get_time()])";
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "San Francisco", "metric": "celsius"})");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  expect_stream_matches(o, out);
  // Every literal form, written back as Python's json.dumps(..., ensure_ascii=False) writes it.
  std::string lits =
      "[f(a=1, b=2.5, c=True, d=None, e=[1, 'x', False], g={'k': 'v', 1: 2, None: true}, "
      "h='it\\'s \"q\"\\n', i=-3, j=1e3, k=0x1F, l=1_000, m=\"h\u00e9\\u00e9\\U0001F600\", n='a' \"b\", "
      "o=r'\\d+', p=false, q=null, r=1.5e-7, s=.5, t=10.0, u='''x\ny''')]";
  r = OutputParser::parse(o, lits);
  ASSERT_EQ(r.tool_calls.size(), 1u) << r.content;
  EXPECT_EQ(
      r.tool_calls[0].arguments,
      "{\"a\": 1, \"b\": 2.5, \"c\": true, \"d\": null, \"e\": [1, \"x\", false], \"g\": {\"k\": \"v\", "
      "\"1\": "
      "2, \"null\": true}, \"h\": \"it's \\\"q\\\"\\n\", \"i\": -3, \"j\": 1000.0, \"k\": 31, \"l\": 1000, "
      "\"m\": \"h\u00e9\u00e9\U0001F600\", \"n\": \"ab\", \"o\": \"\\\\d+\", \"p\": false, \"q\": null, "
      "\"r\": 1.5e-07, \"s\": 0.5, \"t\": 10.0, \"u\": \"x\\ny\"}");
  EXPECT_NO_THROW((void)json::parse(r.tool_calls[0].arguments));
  expect_stream_matches(o, lits);
  // While streaming, a call's arguments grow by whole keyword arguments: every delta extends the text.
  OutputParser p(o);
  std::string args;
  for (char c : out) {
    OutputDelta d = p.feed(std::string(1, c));
    for (const auto& call : d.calls)
      if (call.index == 0) args += call.arguments;
    EXPECT_EQ(d.content, "");
  }
  EXPECT_EQ(args, R"({"city": "San Francisco", "metric": "celsius"})");
}

TEST(PythonicParser, WhatIsNotACallListIsContent) {
  auto o = opts(ToolParserKind::kPythonic, ReasoningParserKind::kNone);
  for (const std::string out :
       {"The weather is fine.", "[1, 2]", "[f(1)]", "[f(a=x)]", "[f(a=(1, 2))]", "[_f()]", "[]",
        "[f()] and more", "[f(a=1),]", "[f(a=1)", "[f(a=1, b=)]", "[f(a=b'x')]", "[f(a='x\ny')]",
        "[m.f(a=1)]", "[f(a=1 + 2)]", "[f(a={[1]: 2})]", "[f(a=\"\\N{DASH}\")]", "[f(a=1, a=2)]"}) {
    SCOPED_TRACE(out);
    auto r = OutputParser::parse(o, out);
    EXPECT_EQ(r.content, out);
    EXPECT_TRUE(r.tool_calls.empty());
    // Streamed, a call announced before the text stopped parsing stays sent (as in vLLM); the text comes
    // as content at the end.
    std::vector<size_t> cuts;
    for (size_t c : {1, 2, 3, 5, 8})
      if (c < out.size()) cuts.push_back(c);
    Streamed st = stream(o, out, cuts);
    EXPECT_EQ(st.content, out);
  }
}

TEST(PythonicParser, Llama4TagsAreDropped) {
  auto o = opts(ToolParserKind::kLlama4Pythonic, ReasoningParserKind::kNone);
  EXPECT_TRUE(needs_special_tokens(ToolParserKind::kLlama4Pythonic, ReasoningParserKind::kNone));
  for (const std::string out :
       {"<|python_start|>[get_weather(city=\"Oslo\")]<|python_end|>",
        "<|python_start|>[get_weather(city=\"Oslo\")]", "[get_weather(city=\"Oslo\")]"}) {
    SCOPED_TRACE(out);
    auto r = OutputParser::parse(o, out);
    EXPECT_EQ(r.content, "");
    ASSERT_EQ(r.tool_calls.size(), 1u);
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Oslo"})");
    expect_stream_matches(o, out);
  }
  auto r = OutputParser::parse(o, "<|python_start|>print('hi')<|python_end|>");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "<|python_start|>print('hi')<|python_end|>");
  ASSERT_TRUE(tool_parser_from_name("pythonic"));
  ASSERT_TRUE(tool_parser_from_name("llama4_pythonic"));
}

TEST(MistralParser, ListAndNamedForms) {
  auto o = opts(ToolParserKind::kMistral, ReasoningParserKind::kNone);
  std::string list =
      "Sure.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Nice\"}}, {\"name\": "
      "\"get_time\", \"arguments\": {\"tz\": \"UTC\"}}]";
  auto r = OutputParser::parse(o, list);
  EXPECT_EQ(r.content, "Sure.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(json::parse(r.tool_calls[1].arguments)["tz"], "UTC");
  expect_stream_matches(o, list);
  std::string named = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Nice\"}[TOOL_CALLS]get_time[ARGS]{}";
  r = OutputParser::parse(o, named);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  expect_stream_matches(o, named);
}

TEST(RequiredAndNamed, WholeOutputIsTheCalls) {
  auto o = opts(ToolParserKind::kRequired, ReasoningParserKind::kNone);
  std::string out =
      "[{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}, {\"name\": \"get_weather\", "
      "\"parameters\": {\"city\": \"Lima\"}}]";
  auto r = OutputParser::parse(o, out);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[1].name, "get_weather");
  expect_stream_matches(o, out);
  OutputParserOptions n = opts(ToolParserKind::kNamed, ReasoningParserKind::kNone);
  n.named_function = "get_weather";
  r = OutputParser::parse(n, "{\"city\": \"Lima\"}");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Lima\"}");
  expect_stream_matches(n, "{\"city\": \"Lima\"}");
}

TEST(RequiredAndNamed, SchemaListsEveryTool) {
  json schema = json::parse(required_tools_schema(kTools.dump()));
  EXPECT_EQ(schema["type"], "array");
  EXPECT_EQ(schema["minItems"], 1);
  ASSERT_EQ(schema["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(schema["items"]["anyOf"][1]["properties"]["name"]["enum"][0], "get_time");
  EXPECT_EQ(schema["items"]["anyOf"][0]["properties"]["parameters"]["required"][0], "city");
}

// ---- qwen3_coder ----

OutputParserOptions coder_opts(const json& tools, ReasoningParserKind r = ReasoningParserKind::kNone) {
  OutputParserOptions o = opts(ToolParserKind::kQwen3Coder, r);
  o.tools_json = tools.dump();
  return o;
}

TEST(Qwen3CoderParser, CallsAsTheTemplateRendersThem) {
  json assistant = {
      {"role", "assistant"},
      {"content", "Checking both."},
      {"tool_calls",
       json::array(
           {{{"type", "function"},
             {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}},
            {{"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", {{"tz", "CET"}}}}}}})}};
  std::string out = rendered_turn("qwen3-agentic.jinja", assistant, "<|im_start|>assistant\n", "<|im_end|>");
  ASSERT_NE(out.find("<parameter=city>"), std::string::npos) << out;
  auto o = coder_opts(kTools, ReasoningParserKind::kQwen3);
  auto r = OutputParser::parse(o, out);
  ASSERT_EQ(r.tool_calls.size(), 2u) << out;
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.tool_calls[1].arguments, "{\"tz\": \"CET\"}");
  EXPECT_EQ(rtrim_copy(r.content), "Checking both.") << out;
  expect_stream_matches(o, out);
}

// Values converted by the types the tools declare, as vLLM's _convert_param_value: the exact arguments text
// (Python's json.dumps form) is checked, not just its JSON value.
TEST(Qwen3CoderParser, ParameterTypesFromTheTools) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "search", "parameters": {
      "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
      "ratio": {"type": "number"}, "whole": {"type": "Number "}, "exact": {"type": "boolean"},
      "filters": {"type": "object"}, "ids": {"type": "array"}, "note": {"type": "string"},
      "bad_int": {"type": "integer"}, "any": {"type": ["string", "null"]}, "plain": {}}}}}])");
  std::string out =
      "Let me look.\n<tool_call>\n<function=search>\n<parameter=query>\nrust \"async\" traits\n</parameter>\n"
      "<parameter=limit>\n 10 \n</parameter>\n<parameter=ratio>\n2.50\n</parameter>\n<parameter=whole>\n3.0\n"
      "</parameter>\n<parameter=exact>\nTrue\n</"
      "parameter>\n<parameter=filters>\n{\"lang\":\"en\",\"year\":2024}\n"
      "</parameter>\n<parameter=ids>\n[1,2, 3]\n</parameter>\n<parameter=note>\nNULL\n</parameter>\n"
      "<parameter=extra>\n42\n</parameter>\n<parameter=bad_int>\nten\n</parameter>\n<parameter=any>\n7\n"
      "</parameter>\n<parameter=plain>\n  two\nlines \n</parameter>\n</function>\n</tool_call>";
  auto o = coder_opts(tools);
  auto r = OutputParser::parse(o, out);
  EXPECT_EQ(r.content, "Let me look.\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].name, "search");
  EXPECT_EQ(r.tool_calls[0].arguments,
            "{\"query\": \"rust \\\"async\\\" traits\", \"limit\": 10, \"ratio\": 2.5, \"whole\": 3, "
            "\"exact\": true, "
            "\"filters\": {\"lang\": \"en\", \"year\": 2024}, \"ids\": [1, 2, 3], \"note\": null, \"extra\": "
            "\"42\", "
            "\"bad_int\": \"ten\", \"any\": 7, \"plain\": \"  two\\nlines \"}");
  expect_stream_matches(o, out);
  // A function the request does not list: every value a string ("null" still null).
  r = OutputParser::parse(
      o,
      "<tool_call>\n<function=other>\n<parameter=n>\n5\n</parameter>\n<parameter=z>\nnull\n"
      "</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"n\": \"5\", \"z\": null}");
}

TEST(Qwen3CoderParser, ValueConversions) {
  auto v = [](std::string_view raw, const char* type) {
    std::string t = type ? type : "";
    return qwen3_coder_value_json(raw, type ? &t : nullptr);
  };
  EXPECT_EQ(v("1_000", "int"), "1000");
  EXPECT_EQ(v("-7", "uint32"), "-7");
  EXPECT_EQ(v("5.5", "integer"), "\"5.5\"");  // int("5.5") fails: the text
  EXPECT_EQ(v("1e3", "float"), "1000");
  EXPECT_EQ(v("-0.25", "number"), "-0.25");
  EXPECT_EQ(v("inf", "number"), "\"inf\"");
  EXPECT_EQ(v("0x10", "number"), "\"0x10\"");
  EXPECT_EQ(v("yes", "bool"), "false");
  EXPECT_EQ(v("TRUE", "binary"), "true");
  EXPECT_EQ(v("[1, {\"a\": true}]", "list"), "[1, {\"a\": true}]");
  EXPECT_EQ(v("not json", "object"), "\"not json\"");
  EXPECT_EQ(v("None", "<non-string>"), "null");
  EXPECT_EQ(v("[true]", "<non-string>"), "\"[true]\"");  // not a Python literal
  EXPECT_EQ(v("\"quoted\"", "<non-string>"), "\"quoted\"");
  EXPECT_EQ(v("caf\xc3\xa9", nullptr), "\"caf\xc3\xa9\"");  // non-ASCII kept (ensure_ascii=False)
  EXPECT_EQ(v("Null", "integer"), "null");
}

TEST(Qwen3CoderParser, UnclosedCallsAndCallsWithoutTheWrapper) {
  auto o = coder_opts(kTools);
  // The output ends inside the call: the last parameter runs to the end, less one final newline.
  auto r = OutputParser::parse(o, "<tool_call>\n<function=get_time>\n<parameter=tz>\nUTC\n");
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"tz\": \"UTC\"}");
  EXPECT_EQ(r.content, "");
  // A parameter ended by the next one, no </parameter>; no parameters at all.
  std::string out =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n<parameter=unit>\nC\n</function>\n</"
      "tool_call>\n"
      "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
  r = OutputParser::parse(o, out);
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].arguments, "{\"city\": \"Lima\", \"unit\": \"C\"}");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
  expect_stream_matches(o, out);
  // <function=...> with no <tool_call>: still a call; the text before it is content.
  out = "Sure: <function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>";
  r = OutputParser::parse(o, out);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.content, "Sure: ");
  expect_stream_matches(o, out);
  // No <function= at all: everything is content, a <tool_call> included.
  r = OutputParser::parse(o, "a <tool_call> b");
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, "a <tool_call> b");
  expect_stream_matches(o, "a <tool_call> b <function");
}

TEST(Qwen3CoderParser, BrokenCallIsContent) {
  std::string out = "<tool_call>\n<function=get_time\n</function>\n</tool_call>";
  auto r = OutputParser::parse(coder_opts(kTools), out);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, out);
  out = "<tool_call>\n<function=get_time>\n<parameter=tz\nUTC</parameter>\n</function>\n</tool_call>";
  r = OutputParser::parse(coder_opts(kTools), out);
  EXPECT_TRUE(r.tool_calls.empty());
  EXPECT_EQ(r.content, out);
}

TEST(Qwen3CoderParser, ArgumentsStreamAsParametersEnd) {
  OutputParser p(coder_opts(kTools));
  OutputDelta d = p.feed("On it.<tool_ca");
  EXPECT_EQ(d.content, "On it.");
  d = p.feed("ll>\n<function=get_wea");
  EXPECT_TRUE(d.empty());
  d = p.feed("ther>\n<parameter=city>\nRo");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].is_new);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, "{");
  d = p.feed("me\n</parameter>\n</func");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "\"city\": \"Rome\"");
  d = p.feed("tion>\n</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].arguments, "}");
  d = p.finish();
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(p.result().tool_calls.size(), 1u);
}

TEST(ParserNames, VllmNames) {
  EXPECT_EQ(tool_parser_from_name("hermes"), ToolParserKind::kHermes);
  EXPECT_EQ(tool_parser_from_name("openai"), ToolParserKind::kOpenai);
  EXPECT_EQ(tool_parser_from_name("qwen3_coder"), ToolParserKind::kQwen3Coder);
  EXPECT_EQ(tool_parser_from_name("pythonic"), ToolParserKind::kPythonic);
  EXPECT_EQ(tool_parser_from_name("llama4_pythonic"), ToolParserKind::kLlama4Pythonic);
  EXPECT_FALSE(tool_parser_from_name("granite").has_value());
  EXPECT_EQ(reasoning_parser_from_name("openai_gptoss"), ReasoningParserKind::kGptOss);
  EXPECT_EQ(reasoning_parser_from_name("qwen3"), ReasoningParserKind::kQwen3);
  EXPECT_EQ(reasoning_parser_from_name("deepseek_r1"), ReasoningParserKind::kDeepSeekR1);
  EXPECT_FALSE(reasoning_parser_from_name("deepseek_v3").has_value());
}

}  // namespace
}  // namespace polylora::server
