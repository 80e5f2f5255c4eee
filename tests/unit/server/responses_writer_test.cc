// The Responses API's event stream (server/responses_api.h) for parsed deltas holding reasoning, text and
// tool calls: item order, part events, consecutive sequence numbers, and a final response whose items hold
// exactly the streamed text.
#include "server/responses_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

namespace polylora::server {
namespace {

using json = nlohmann::ordered_json;

std::vector<json> events_of(const std::string& sse) {
  std::vector<json> out;
  std::istringstream in(sse);
  std::string line;
  std::string last_event;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) last_event = line.substr(7);
    if (line.rfind("data: ", 0) != 0) continue;
    json e = json::parse(line.substr(6));
    EXPECT_EQ(e["type"], last_event);  // the SSE event name is the event's type
    out.push_back(e);
  }
  return out;
}

TEST(ResponsesWriter, ReasoningTextAndCallsStreamAsItems) {
  ParsedRequest req;
  req.model = "m";
  req.responses = {{"instructions", "be brief"}};
  ResponsesWriter w(req, "resp_1", 1);
  OutputParser p({ReasoningParserKind::kQwen3, ToolParserKind::kHermes, "", false});
  std::string sse = w.start();
  for (std::string chunk : {"<think>pla", "n</think>Hel", "lo <tool_call>{\"name\": \"f\", \"arguments\": {\"a\"",
                            ": 1}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>"})
    sse += w.on_delta(p.feed(chunk));
  sse += w.on_delta(p.finish());
  sse += w.finish(FinishReason::kStop, {10, 20, 0});
  std::vector<json> ev = events_of(sse);
  for (size_t i = 0; i < ev.size(); ++i) EXPECT_EQ(ev[i]["sequence_number"], i);
  std::vector<std::string> types;
  for (const auto& e : ev) types.push_back(e["type"]);
  std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, want);
  const json& r = ev.back()["response"];
  ASSERT_EQ(r["output"].size(), 4u);
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "plan");
  EXPECT_EQ(r["output"][1]["content"][0]["text"], "Hello ");
  EXPECT_EQ(r["output"][2]["name"], "f");
  EXPECT_EQ(json::parse(r["output"][2]["arguments"].get<std::string>()), json({{"a", 1}}));
  EXPECT_EQ(r["output"][3]["name"], "g");
  EXPECT_EQ(r["output"][3]["arguments"], "{}");
  EXPECT_NE(r["output"][2]["call_id"], r["output"][3]["call_id"]);
  EXPECT_EQ(r["instructions"], "be brief");
  EXPECT_EQ(r["status"], "completed");
  EXPECT_EQ(r["usage"]["total_tokens"], 30);
  // Each item's output_index is its place in the final output.
  for (const auto& e : ev) {
    if (e["type"] == "response.output_item.done") {
      EXPECT_EQ(r["output"][e["output_index"].get<size_t>()]["id"], e["item"]["id"]);
    }
  }
}

TEST(ResponsesWriter, CutByMaxOutputTokensIsIncomplete) {
  ParsedRequest req;
  ResponsesWriter w(req, "resp_2", 1);
  OutputParser::Result res;
  res.content = "abc";
  json r = w.response(res, FinishReason::kLength, {3, 4, 0});
  EXPECT_EQ(r["status"], "incomplete");
  EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(r["output"][0]["content"][0]["text"], "abc");
  std::string sse = w.start() + w.finish(FinishReason::kLength, {3, 4, 0});
  std::vector<json> ev = events_of(sse);
  EXPECT_EQ(ev.back()["type"], "response.completed");
  EXPECT_EQ(ev.back()["response"]["status"], "incomplete");
  // An empty answer has no output item (vLLM adds the message only when it has content), whole or streamed.
  EXPECT_TRUE(ev.back()["response"]["output"].empty());
  OutputParser::Result empty;
  EXPECT_TRUE(w.response(empty, FinishReason::kLength, {3, 4, 0})["output"].empty());
}

}  // namespace
}  // namespace polylora::server
