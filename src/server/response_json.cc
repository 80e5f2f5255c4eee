// server/response_json.cc: the pieces of completion and chat responses (OpenAI + vLLM fields): logprobs
// objects (completions, chat, prompt logprobs), chat deltas and tool calls, finish and stop reasons, usage.
// Declared in server/openai_api.h; openai_api.cc parses the requests.
#include <random>

#include "common/utf8.h"
#include "server/json_body.h"
#include "server/openai_api.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

std::string token_text(int32_t id, const ParsedRequest& req, const tokenizer::Tokenizer* tok) {
  if (req.return_tokens_as_token_ids || !tok) return "token_id:" + std::to_string(id);
  std::vector<int32_t> one{id};
  return tok->decode(one, false);
}

namespace {

// One position of a completions logprobs object: the token, and its entry (null when it has none).
struct LogprobPosition {
  int32_t id;
  const LogprobEntry* entry;
};

json completion_logprobs_positions(const std::vector<LogprobPosition>& positions, const ParsedRequest& req,
                                   const tokenizer::Tokenizer* tok, size_t text_offset) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(), offsets = json::array();
  size_t max_top = static_cast<size_t>(req.logprobs.value_or(0));
  for (const auto& p : positions) {
    std::string t = token_text(p.id, req, tok);
    tokens.push_back(t);
    offsets.push_back(text_offset);
    text_offset += utf8_char_count(t);  // characters, as vLLM's len() of the token's text
    if (!p.entry) {
      token_logprobs.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    token_logprobs.push_back(p.entry->logprob);
    json alts = json::object();
    for (size_t k = 0; k < p.entry->top.size() && k < max_top; ++k)
      alts[token_text(p.entry->top[k].id, req, tok)] = p.entry->top[k].logprob;
    alts[t] = p.entry->logprob;
    top.push_back(alts);
  }
  return {{"text_offset", offsets},
          {"token_logprobs", token_logprobs},
          {"tokens", tokens},
          {"top_logprobs", top}};
}

}  // namespace

json completion_logprobs_json(const std::vector<LogprobEntry>& entries, const ParsedRequest& req,
                              const tokenizer::Tokenizer* tok, size_t text_offset) {
  std::vector<LogprobPosition> positions;
  for (const auto& e : entries) positions.push_back({e.id, &e});
  return completion_logprobs_positions(positions, req, tok, text_offset);
}

json completion_echo_logprobs_json(const std::vector<int32_t>& prompt_ids,
                                   const std::vector<std::optional<LogprobEntry>>& prompt,
                                   const std::vector<LogprobEntry>& generated, const ParsedRequest& req,
                                   const tokenizer::Tokenizer* tok) {
  std::vector<LogprobPosition> positions;
  for (size_t i = 0; i < prompt_ids.size(); ++i)
    positions.push_back({prompt_ids[i], i < prompt.size() && prompt[i] ? &*prompt[i] : nullptr});
  for (const auto& e : generated) positions.push_back({e.id, &e});
  return completion_logprobs_positions(positions, req, tok, 0);
}

json chat_logprobs_json(const std::vector<LogprobEntry>& entries, const ParsedRequest& req,
                        const tokenizer::Tokenizer* tok) {
  json content = json::array();
  auto bytes_of = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  for (const auto& e : entries) {
    std::string t = token_text(e.id, req, tok);
    json alts = json::array();
    for (const auto& a : e.top) {
      std::string at = token_text(a.id, req, tok);
      alts.push_back({{"token", at}, {"logprob", a.logprob}, {"bytes", bytes_of(at)}});
    }
    content.push_back({{"token", t}, {"logprob", e.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", alts}});
  }
  return {{"content", content}};
}

json prompt_logprobs_json(const std::vector<std::optional<LogprobEntry>>& entries,
                          const tokenizer::Tokenizer* tok, size_t max_top) {
  json out = json::array();
  for (const auto& e : entries) {
    if (!e) {
      out.push_back(nullptr);
      continue;
    }
    auto dec = [&](int32_t id) {
      std::vector<int32_t> one{id};
      return tok ? tok->decode(one, false) : std::string();
    };
    json m = json::object();
    m[std::to_string(e->id)] = {{"logprob", e->logprob}, {"rank", e->rank}, {"decoded_token", dec(e->id)}};
    int64_t rank = 1;
    for (const auto& a : e->top) {
      if (static_cast<size_t>(rank) > max_top) break;
      if (!m.contains(std::to_string(a.id)))
        m[std::to_string(a.id)] = {{"logprob", a.logprob}, {"rank", rank}, {"decoded_token", dec(a.id)}};
      ++rank;
    }
    out.push_back(m);
  }
  return out;
}

std::string tool_call_id() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s = "chatcmpl-tool-";
  for (int i = 0; i < 32; ++i) s += hex[rng() % 16];
  return s;
}

json chat_delta_json(const OutputDelta& delta, ChoiceState& ch, bool parallel) {
  json d = json::object();
  // vLLM sends `reasoning` (since late 2025; `reasoning_content` before): both, for clients of either.
  if (!delta.reasoning.empty()) {
    d["reasoning"] = delta.reasoning;
    d["reasoning_content"] = delta.reasoning;
  }
  if (!delta.content.empty()) d["content"] = delta.content;
  json calls = json::array();
  for (const auto& c : delta.calls) {
    if (!parallel && c.index > 0) continue;
    if (c.is_new) {
      ch.tool_call_ids.push_back(tool_call_id());
      calls.push_back({{"index", c.index},
                       {"id", ch.tool_call_ids.back()},
                       {"type", "function"},
                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    } else {
      calls.push_back({{"index", c.index}, {"function", {{"arguments", c.arguments}}}});
    }
  }
  if (!calls.empty()) d["tool_calls"] = std::move(calls);
  return d;
}

json tool_calls_json(const std::vector<ParsedToolCall>& calls, bool parallel) {
  json out = json::array();
  for (const auto& c : calls) {
    out.push_back({{"id", tool_call_id()},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    if (!parallel) break;
  }
  return out;
}

std::string chat_finish_reason(FinishReason reason, bool called_tools, const OutputParserOptions& parser) {
  std::string name = finish_reason_name(reason);
  // vLLM: a named tool_choice keeps "stop"; auto and required calls end with "tool_calls"
  if (name == "stop" && called_tools && parser.tools != ToolParserKind::kNamed) return "tool_calls";
  return name;
}

json stop_reason_json(const std::optional<StopReason>& reason) {
  if (!reason) return nullptr;
  if (const auto* id = std::get_if<int32_t>(&*reason)) return *id;
  return std::get<std::string>(*reason);
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  json u = {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  u["prompt_tokens_details"] = cached_tokens > 0 ? json{{"cached_tokens", cached_tokens}} : json(nullptr);
  return u;
}

}  // namespace polylora::server
