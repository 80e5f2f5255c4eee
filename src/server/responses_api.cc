// server/responses_api.cc: /v1/responses requests as chat requests, and the response object and events
// (see the header).
#include "server/responses_api.h"

#include <algorithm>
#include <random>

#include "common/error.h"
#include "common/utf8.h"
#include "server/json_body.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

namespace {

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 32; ++i) s += hex[rng() % 16];
  return s;
}

const json* get(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The fields of OpenAI's ResponseCreateParams polylora reads, and those it accepts with no effect here
// (store: nothing is stored; include, truncation, service_tier, prompt_cache_key, safety_identifier: no
// meaning for a single local model), plus vLLM's sampling extras.
const std::vector<std::string>& responses_fields() {
  static const std::vector<std::string> f = {"model",
                                             "input",
                                             "instructions",
                                             "tools",
                                             "tool_choice",
                                             "parallel_tool_calls",
                                             "text",
                                             "reasoning",
                                             "max_output_tokens",
                                             "temperature",
                                             "top_p",
                                             "stream",
                                             "store",
                                             "metadata",
                                             "user",
                                             "truncation",
                                             "include",
                                             "previous_response_id",
                                             "background",
                                             "service_tier",
                                             "prompt_cache_key",
                                             "safety_identifier",
                                             "max_tool_calls",
                                             "top_k",
                                             "min_p",
                                             "seed",
                                             "repetition_penalty",
                                             "request_id",
                                             "cache_salt",
                                             "priority",
                                             "stop",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "top_logprobs",
                                             "logit_bias",
                                             "skip_special_tokens"};
  return f;
}

// Text of a content field: a string, or a list of parts whose text is joined.
std::string content_text(const json& content, const char* where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) fail("'input': the {} of an item must be a string or a list of content parts", where);
  std::string text;
  for (const auto& part : content) {
    std::string type = part.is_object() ? string_member(part, "type") : "";
    if ((type != "input_text" && type != "output_text" && type != "text" && type != "reasoning_text" &&
         type != "summary_text") ||
        !part.contains("text") || !part["text"].is_string())
      fail("'input': only text content parts are supported (got type '{}')", sanitize_utf8(type));
    if (!text.empty()) text += "\n";
    text += part["text"].get<std::string>();
  }
  return text;
}

json input_messages(const json& body) {
  json messages = json::array();
  if (const json* ins = get(body, "instructions")) {
    if (!ins->is_string()) fail("'instructions' must be a string");
    messages.push_back({{"role", "system"}, {"content", *ins}});
  }
  const json* input = get(body, "input");
  if (!input) fail("'input' is required");
  if (input->is_string()) {
    messages.push_back({{"role", "user"}, {"content", *input}});
    return messages;
  }
  if (!input->is_array() || input->empty()) fail("'input' must be a string or a non-empty list of items");
  std::string pending_reasoning;
  for (const auto& item : *input) {
    if (!item.is_object()) fail("'input': each item must be an object");
    std::string type = string_member(item, "type", item.contains("role") ? "message" : "");
    if (type == "message") {
      if (!item.contains("role") || !item["role"].is_string()) fail("'input': a message item needs a 'role'");
      std::string role = item["role"].get<std::string>();
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system")
        fail("'input': unknown message role '{}'", sanitize_utf8(role));
      json m = {{"role", role}, {"content", item.contains("content") ? content_text(item["content"], "content") : ""}};
      if (role == "assistant" && !pending_reasoning.empty()) m["reasoning_content"] = pending_reasoning;
      pending_reasoning.clear();
      messages.push_back(std::move(m));
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!item.contains(k) || !item[k].is_string()) fail("'input': a function_call item needs a string '{}'", k);
      json call = {{"id", item["call_id"]},
                   {"type", "function"},
                   {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
      // Calls in a row belong to one assistant turn.
      if (messages.empty() || string_member(messages.back(), "role") != "assistant" ||
          !messages.back().contains("tool_calls")) {
        json m = {{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array()}};
        if (!pending_reasoning.empty()) m["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
        messages.push_back(std::move(m));
      }
      messages.back()["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      if (!item.contains("call_id") || !item["call_id"].is_string())
        fail("'input': a function_call_output item needs a string 'call_id'");
      if (!item.contains("output")) fail("'input': a function_call_output item needs an 'output'");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item["call_id"]},
                          {"content", content_text(item["output"], "output")}});
    } else if (type == "reasoning") {
      // The model's earlier reasoning: handed to the next assistant turn (templates may show it).
      if (item.contains("content") && item["content"].is_array())
        pending_reasoning = content_text(item["content"], "content");
      else if (item.contains("summary") && item["summary"].is_array())
        pending_reasoning = content_text(item["summary"], "summary");
    } else {
      fail("'input': items of type '{}' are not supported (message, function_call, function_call_output and "
           "reasoning are)",
           sanitize_utf8(type));
    }
  }
  return messages;
}

json chat_tools(const json& tools) {
  if (!tools.is_array()) fail("'tools' must be a list");
  json out = json::array();
  for (const auto& t : tools) {
    if (!t.is_object() || string_member(t, "type") != "function")
      fail("'tools': only function tools are supported (got '{}')",
           t.is_object() ? sanitize_utf8(string_member(t, "type")) : std::string("not an object"));
    if (!t.contains("name") || !t["name"].is_string()) fail("'tools': a function tool needs a string 'name'");
    json f = {{"name", t["name"]}};
    if (t.contains("description") && t["description"].is_string()) f["description"] = t["description"];
    f["parameters"] = t.contains("parameters") && t["parameters"].is_object() ? t["parameters"]
                                                                                 : json{{"type", "object"}};
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

}  // namespace

ParsedRequest parse_responses(const json& body, const ParseContext& ctx) {
  if (!body.is_object()) fail("the request body must be a JSON object");
  const auto& known = responses_fields();
  for (const auto& [key, value] : body.items())
    if (std::find(known.begin(), known.end(), key) == known.end())
      fail("'{}' is not a field polylora accepts on /v1/responses (unknown or not implemented)", sanitize_utf8(key));
  // vLLM without a response store: the id is not found (404). The whole conversation goes in 'input'.
  if (const json* prev = get(body, "previous_response_id"))
    fail_with(ErrorKind::kNotFound, "Response with id '{}' not found.",
              prev->is_string() ? sanitize_utf8(prev->get<std::string>()) : dump_json(*prev));
  if (const json* bg = get(body, "background"); bg && (!bg->is_boolean() || bg->get<bool>()))
    fail("'background' responses are not supported");
  json chat = json::object();
  for (const char* k :
       {"model", "temperature", "top_p", "stream", "user", "top_k", "min_p", "seed", "repetition_penalty",
        "request_id", "cache_salt", "priority", "stop", "presence_penalty", "frequency_penalty",
        "parallel_tool_calls", "logit_bias", "skip_special_tokens"})
    if (const json* v = get(body, k)) chat[k] = *v;
  chat["messages"] = input_messages(body);
  // include: ["message.output_text.logprobs"] asks for the output's logprobs (with top_logprobs
  // alternatives), as vLLM's is_include_output_logprobs.
  bool output_logprobs = false;
  if (const json* inc = get(body, "include")) {
    if (!inc->is_array()) fail("'include' must be a list");
    for (const auto& i : *inc)
      if (i.is_string() && i.get<std::string>() == "message.output_text.logprobs") output_logprobs = true;
  }
  int64_t top_logprobs = 0;
  if (const json* tl = get(body, "top_logprobs")) {
    if (!tl->is_number_integer() || tl->get<int64_t>() < 0)
      fail("'top_logprobs' must be a non-negative integer");
    top_logprobs = tl->get<int64_t>();
  }
  if (output_logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = top_logprobs;
  }
  // max_output_tokens: at most what the context leaves after the prompt (vLLM's
  // min(max_output_tokens, max_model_len - prompt tokens)), applied once the prompt is known.
  std::optional<int64_t> max_output;
  if (const json* m = get(body, "max_output_tokens")) {
    if (!m->is_number_integer() || m->get<int64_t>() < 1)
      fail("'max_output_tokens' must be an integer of at least 1");
    max_output = m->get<int64_t>();
  }
  if (const json* t = get(body, "tools")) chat["tools"] = chat_tools(*t);
  if (const json* tc = get(body, "tool_choice")) {
    if (tc->is_object()) {
      if (string_member(*tc, "type") != "function" || !tc->contains("name") || !(*tc)["name"].is_string())
        fail("'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"name\": ...}}");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
    } else {
      chat["tool_choice"] = *tc;
    }
  }
  if (const json* r = get(body, "reasoning")) {
    if (!r->is_object()) fail("'reasoning' must be an object");
    if (const json* e = get(*r, "effort")) {
      if (!e->is_string()) fail("'reasoning.effort' must be a string");
      std::string effort = e->get<std::string>();
      chat["reasoning_effort"] = effort == "minimal" ? "low" : effort;
    }
  }
  if (const json* text = get(body, "text")) {
    if (!text->is_object()) fail("'text' must be an object");
    if (const json* f = get(*text, "format")) {
      std::string type = string_member(*f, "type");
      if (type == "json_schema") {
        if (!f->contains("schema") || !(*f)["schema"].is_object()) fail("'text.format.schema' must be an object");
        chat["response_format"] = {{"type", "json_schema"},
                                   {"json_schema",
                                    {{"name", string_member(*f, "name", "response")},
                                     {"schema", (*f)["schema"]},
                                     {"strict", f->contains("strict") && (*f)["strict"].is_boolean() &&
                                                    (*f)["strict"].get<bool>()}}}};
      } else if (type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type != "text") {
        fail("'text.format.type' must be 'text', 'json_object' or 'json_schema'");
      }
      const auto& chat_known = known_fields(ApiKind::kChat);
      if (chat.contains("response_format") &&
          std::find(chat_known.begin(), chat_known.end(), "response_format") == chat_known.end())
        fail("'text.format' {} needs structured outputs, which this build of polylora does not have", type);
    }
  }
  ParsedRequest out = parse_chat(chat, ctx);
  out.kind = ApiKind::kResponses;
  SamplingParams& sp = out.prompts.front().sampling;
  const auto prompt_len = static_cast<int64_t>(out.prompts.front().prompt_ids.size());
  const int64_t room = ctx.max_model_len > 0 ? ctx.max_model_len - prompt_len : INT64_MAX;
  if (max_output) sp.max_tokens = std::min(*max_output, sp.max_tokens.value_or(room));
  // A body request_id is the response's id as given (vLLM: request_id defaults to "resp_<uuid>").
  if (const json* rid = get(body, "request_id")) out.response_id = rid->get<std::string>();
  json echo = json::object();
  for (const char* k : {"instructions", "metadata", "parallel_tool_calls", "reasoning", "store", "text",
                        "tool_choice", "tools", "truncation", "user", "max_tool_calls"})
    echo[k] = body.contains(k) ? body[k] : json(nullptr);
  // The values the sampling used (vLLM's ResponsesResponse.from_request takes them from its sampling
  // parameters): the generation config's defaults and the token limit show.
  echo["temperature"] = sp.temperature;
  echo["top_p"] = sp.top_p;
  echo["max_output_tokens"] = sp.max_tokens.value_or(room);
  echo["top_logprobs"] = top_logprobs;
  out.responses = std::move(echo);
  return out;
}

ResponsesWriter::ResponsesWriter(const ParsedRequest& request, std::string id, int64_t created_at)
    : request_(request), id_(std::move(id)), created_at_(created_at), parallel_(request.parallel_tool_calls) {}

json ResponsesWriter::base(const std::string& status) const {
  const json& e = request_.responses;
  auto or_default = [&](const char* k, json d) { return e.contains(k) && !e[k].is_null() ? e[k] : d; };
  json reasoning = or_default("reasoning", json{{"effort", nullptr}, {"summary", nullptr}});
  return {{"id", id_},
          {"object", "response"},
          {"created_at", created_at_},
          {"status", status},
          {"background", false},
          {"error", nullptr},
          {"incomplete_details", nullptr},
          {"instructions", or_default("instructions", nullptr)},
          {"max_output_tokens", or_default("max_output_tokens", nullptr)},
          {"max_tool_calls", or_default("max_tool_calls", nullptr)},
          {"metadata", or_default("metadata", json::object())},
          {"model", request_.model},
          {"output", json::array()},
          {"parallel_tool_calls", request_.parallel_tool_calls},
          {"previous_response_id", nullptr},
          {"prompt", nullptr},
          {"reasoning", reasoning},
          {"service_tier", "auto"},
          {"store", false},
          {"temperature", or_default("temperature", 1.0)},
          {"text", or_default("text", json{{"format", {{"type", "text"}}}})},
          {"tool_choice", or_default("tool_choice", "auto")},
          {"tools", or_default("tools", json::array())},
          {"top_logprobs", or_default("top_logprobs", 0)},
          {"top_p", or_default("top_p", 1.0)},
          {"truncation", or_default("truncation", "disabled")},
          {"usage", nullptr},
          {"user", or_default("user", nullptr)}};
}

namespace {

json usage_object(const ResponsesUsage& u) {
  return {{"input_tokens", u.input_tokens},
          {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"output_tokens", u.output_tokens},
          {"output_tokens_details", {{"reasoning_tokens", 0}, {"tool_output_tokens", 0}}},
          {"total_tokens", u.input_tokens + u.output_tokens}};
}

// logprobs: the output's (include "message.output_text.logprobs"), else null (vLLM).
json message_item(const std::string& id, const std::string& text, const char* status,
                  json logprobs = nullptr) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", json::array({{{"type", "output_text"},
                                    {"text", text},
                                    {"annotations", json::array()},
                                    {"logprobs", std::move(logprobs)}}})}};
}

json reasoning_item(const std::string& id, const std::string& text) {
  return {{"id", id},
          {"type", "reasoning"},
          {"summary", json::array()},
          {"content", json::array({{{"type", "reasoning_text"}, {"text", text}}})},
          {"encrypted_content", nullptr},
          {"status", "completed"}};
}

json call_item(const std::string& id, const std::string& call_id, const std::string& name, const std::string& args,
               const char* status) {
  return {{"id", id}, {"type", "function_call"}, {"status", status}, {"arguments", args}, {"call_id", call_id},
          {"name", name}};
}

// Responses ends "incomplete" when the output was cut by max_output_tokens (or the context).
void set_status(json& r, FinishReason reason) {
  if (std::string(finish_reason_name(reason)) == "length") {
    r["status"] = "incomplete";
    r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  } else {
    r["status"] = "completed";
  }
}

}  // namespace

json ResponsesWriter::response(const OutputParser::Result& result, FinishReason reason,
                               const ResponsesUsage& usage, json logprobs) const {
  json r = base("completed");
  json output = json::array();
  if (!result.reasoning.empty()) output.push_back(reasoning_item(random_id("rs_"), result.reasoning));
  // (vLLM adds the message only when it has content: an empty answer has no output item)
  if (!result.content.empty())
    output.push_back(message_item(random_id("msg_"), result.content, "completed", std::move(logprobs)));
  for (const auto& c : result.tool_calls) {
    output.push_back(call_item(random_id("fc_"), random_id("call_"), c.name, c.arguments, "completed"));
    if (!parallel_) break;
  }
  r["output"] = std::move(output);
  set_status(r, reason);
  r["usage"] = usage_object(usage);
  return r;
}

std::string ResponsesWriter::event(const char* type, json fields) {
  json e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [k, v] : fields.items()) e[k] = std::move(v);
  return std::string("event: ") + type + "\ndata: " + dump_json(e) + "\n\n";
}

std::string ResponsesWriter::start() {
  std::string out = event("response.created", {{"response", base("in_progress")}});
  out += event("response.in_progress", {{"response", base("in_progress")}});
  return out;
}

std::string ResponsesWriter::open_item(ItemKind kind, const OutputDelta::Call* call) {
  std::string out = close_item();
  open_ = kind;
  text_.clear();
  size_t index = output_.size();
  switch (kind) {
    case ItemKind::kNone:
      return out;
    case ItemKind::kReasoning:
      item_ = reasoning_item(random_id("rs_"), "");
      item_["content"] = json::array();
      item_["status"] = "in_progress";
      out += event("response.output_item.added", {{"output_index", index}, {"item", item_}});
      out += event("response.content_part.added", {{"item_id", item_["id"]},
                                                   {"output_index", index},
                                                   {"content_index", 0},
                                                   {"part", {{"type", "reasoning_text"}, {"text", ""}}}});
      return out;
    case ItemKind::kMessage:
      item_ = message_item(random_id("msg_"), "", "in_progress");
      item_["content"] = json::array();
      out += event("response.output_item.added", {{"output_index", index}, {"item", item_}});
      out += event("response.content_part.added",
                   {{"item_id", item_["id"]},
                    {"output_index", index},
                    {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}}}});
      return out;
    case ItemKind::kCall:
      open_call_ = call->index;
      item_ = call_item(random_id("fc_"), random_id("call_"), call->name, "", "in_progress");
      out += event("response.output_item.added", {{"output_index", index}, {"item", item_}});
      return out;
  }
  return out;
}

std::string ResponsesWriter::close_item() {
  std::string out;
  size_t index = output_.size();
  switch (open_) {
    case ItemKind::kNone:
      return out;
    case ItemKind::kReasoning:
      out += event("response.reasoning_text.done",
                   {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
      out += event("response.content_part.done", {{"item_id", item_["id"]},
                                                  {"output_index", index},
                                                  {"content_index", 0},
                                                  {"part", {{"type", "reasoning_text"}, {"text", text_}}}});
      item_ = reasoning_item(item_["id"].get<std::string>(), text_);
      break;
    case ItemKind::kMessage: {
      json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}, {"logprobs", json::array()}};
      out += event("response.output_text.done", {{"item_id", item_["id"]},
                                                 {"output_index", index},
                                                 {"content_index", 0},
                                                 {"text", text_},
                                                 {"logprobs", json::array()}});
      out += event("response.content_part.done",
                   {{"item_id", item_["id"]}, {"output_index", index}, {"content_index", 0}, {"part", part}});
      item_ = message_item(item_["id"].get<std::string>(), text_, "completed");
      break;
    }
    case ItemKind::kCall:
      out += event("response.function_call_arguments.done", {{"item_id", item_["id"]},
                                                             {"output_index", index},
                                                             {"name", item_["name"]},
                                                             {"arguments", text_}});
      item_["arguments"] = text_;
      item_["status"] = "completed";
      break;
  }
  out += event("response.output_item.done", {{"output_index", index}, {"item", item_}});
  output_.push_back(std::move(item_));
  item_ = nullptr;
  open_ = ItemKind::kNone;
  return out;
}

std::string ResponsesWriter::on_delta(const OutputDelta& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    if (open_ != ItemKind::kReasoning) out += open_item(ItemKind::kReasoning, nullptr);
    text_ += d.reasoning;
    out += event("response.reasoning_text.delta",
                 {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"content_index", 0}, {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (open_ != ItemKind::kMessage) out += open_item(ItemKind::kMessage, nullptr);
    text_ += d.content;
    out += event("response.output_text.delta", {{"item_id", item_["id"]},
                                                 {"output_index", output_.size()},
                                                 {"content_index", 0},
                                                 {"delta", d.content},
                                                 {"logprobs", json::array()}});
  }
  for (const auto& c : d.calls) {
    if (!parallel_ && c.index > 0) continue;
    if (c.is_new) out += open_item(ItemKind::kCall, &c);
    if (open_ != ItemKind::kCall || open_call_ != c.index || c.arguments.empty()) continue;
    text_ += c.arguments;
    out += event("response.function_call_arguments.delta",
                 {{"item_id", item_["id"]}, {"output_index", output_.size()}, {"delta", c.arguments}});
  }
  return out;
}

std::string ResponsesWriter::finish(FinishReason reason, const ResponsesUsage& usage) {
  std::string out;
  out += close_item();  // (an empty answer has no item, as in vLLM)
  json r = base("completed");
  r["output"] = output_;
  set_status(r, reason);
  r["usage"] = usage_object(usage);
  // As vLLM: response.completed also for an incomplete response (its status says so), which is the event
  // the openai package's ResponseStream takes its final response from.
  out += event("response.completed", {{"response", std::move(r)}});
  return out;
}

}  // namespace polylora::server
