// server/openai_api.cc: completion / chat request parsing (OpenAI + vLLM fields); responses:
// response_json.cc.
#include "server/openai_api.h"

#include <algorithm>
#include <random>

#include "common/error.h"
#include "common/utf8.h"
#include "server/json_body.h"
#include "server/request_json.h"
#include "server/structured_fields.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

namespace {

const json* get(const json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool bool_field(const json& body, const char* name, bool fallback) {
  const json* f = get(body, name);
  if (!f) return fallback;
  if (std::optional<bool> b = lax_bool(*f)) return *b;  // pydantic's lax mode, as vLLM reads requests
  fail("'{}' must be a boolean, got {}", name, f->type_name());
}

// Resolves `model` to the base model or an adapter; 404 when it is neither.
void resolve_model(const json& body, const ParseContext& ctx, ParsedRequest& out) {
  const json* m = get(body, "model");
  if (!m) {
    out.model = ctx.served_model_names.empty() ? "" : ctx.served_model_names.front();
    return;
  }
  if (!m->is_string()) fail("'model' must be a string");
  out.model = m->get<std::string>();
  if (out.model.empty()) {  // vLLM: an empty name means the served model
    out.model = ctx.served_model_names.empty() ? "" : ctx.served_model_names.front();
    return;
  }
  // vLLM answers with the first served name whichever of them was asked for.
  for (const auto& name : ctx.served_model_names)
    if (name == out.model) {
      out.model = ctx.served_model_names.front();
      return;
    }
  if (ctx.has_adapter && ctx.has_adapter(out.model)) {
    out.adapter = out.model;
    return;
  }
  fail_with(ErrorKind::kNotFound, "The model `{}` does not exist.", out.model);
}

void check_fields(const json& body, ApiKind kind) {
  const auto& known = known_fields(kind);
  for (const auto& [key, value] : body.items()) {
    // null is "not set" (pydantic's None): nothing is asked for, so nothing is dropped.
    if (value.is_null() || std::find(known.begin(), known.end(), key) != known.end()) continue;
    fail("'{}' is not a field polylora accepts on {} (unknown or not implemented)",
         sanitize_utf8(key), kind == ApiKind::kChat ? "/v1/chat/completions" : "/v1/completions");
  }
  if (const json* lp = get(body, "length_penalty"))  // (used by beam search only, as in vLLM)
    if (!lp->is_number()) fail("'length_penalty' must be a number");
  if (const json* u = get(body, "user"))
    if (!u->is_string()) fail("'user' must be a string");
  // OpenAI's chat fields with no effect on the output (as /v1/responses takes them; vLLM drops them):
  // store (nothing is stored), metadata, service_tier, prompt_cache_key (prefix caching is automatic),
  // safety_identifier. Their types are still checked.
  if (const json* v = get(body, "store"))
    if (!lax_bool(*v)) fail("'store' must be a boolean");
  if (const json* v = get(body, "metadata")) {
    if (!v->is_object()) fail("'metadata' must be an object of string values");
    for (const auto& [k, x] : v->items())
      if (!x.is_string()) fail("'metadata': the value of '{}' must be a string", sanitize_utf8(k));
  }
  for (const char* f : {"service_tier", "prompt_cache_key", "safety_identifier"})
    if (const json* v = get(body, f))
      if (!v->is_string()) fail("'{}' must be a string", f);
  if (const json* rid = get(body, "request_id"))
    if (!rid->is_string() || rid->get<std::string>().empty()) fail("'request_id' must be a non-empty string");
}

// --generation-config: the model's generation_config.json (or --override-generation-config) gives the
// defaults of the sampling fields a request omits, as vLLM's default_sampling_params. Its max_new_tokens
// (max_tokens) is not a default but a cap on every request (check_length; vLLM's get_max_tokens).
void apply_generation_defaults(const ParseContext& ctx, SamplingParams& sp) {
  const GenerationDefaults* d = ctx.generation_defaults;
  if (!d) return;
  if (d->temperature) sp.temperature = *d->temperature;
  if (d->top_p) sp.top_p = *d->top_p;
  if (d->top_k) sp.top_k = *d->top_k;
  if (d->min_p) sp.min_p = *d->min_p;
  if (d->repetition_penalty) sp.repetition_penalty = *d->repetition_penalty;
}

void read_common(const json& body, ParsedRequest& out, SamplingParams& sp, const ParseContext& ctx) {
  read_sampling_fields(body, sp);
  read_structured_output(body, sp);
  if (const json* rid = get(body, "request_id")) out.request_id = rid->get<std::string>();
  if (sp.truncate_prompt_tokens && *sp.truncate_prompt_tokens == -1)
    sp.truncate_prompt_tokens = ctx.max_model_len;
  if (!sp.bad_words.empty()) {
    if (!ctx.tokenizer) fail("'bad_words' needs a tokenizer, which this server has not");
    const tokenizer::Tokenizer* tok = ctx.tokenizer;
    tokenize_bad_words(sp, [tok](const std::string& w) { return tok->encode(w, false); });
    // (the engine checks logprobs against --max-logprobs)
    if (ctx.vocab_size > 0) sp.validate(ctx.vocab_size, SamplingParams::kLogprobsLimit);
  }
  out.stream = bool_field(body, "stream", false);
  if (const json* so = get(body, "stream_options")) {
    if (!so->is_object()) fail("'stream_options' must be an object");
    if (!out.stream) fail("'stream_options' is only allowed when 'stream' is true");
    // vLLM's StreamOptions: include_usage defaults to true; continuous stats need include_usage too.
    out.include_usage = bool_field(*so, "include_usage", true) || ctx.force_include_usage;
    out.continuous_usage = out.include_usage && bool_field(*so, "continuous_usage_stats", false);
  } else if (out.stream) {
    out.include_usage = ctx.force_include_usage;  // vLLM's should_include_usage
  }
  out.return_tokens_as_token_ids = bool_field(body, "return_tokens_as_token_ids", ctx.return_tokens_as_token_ids);
  out.return_token_ids = bool_field(body, "return_token_ids", false);
  out.n = sp.n;
  if (bool_field(body, "use_beam_search", false)) {
    // vLLM's to_beam_search_params: width n; of the sampling fields only max_tokens, ignore_eos,
    // include_stop_str_in_output and logprobs apply (docs/vllm-requests.md).
    BeamSearchOptions bs;
    bs.width = sp.n;
    if (const json* lp = get(body, "length_penalty")) bs.length_penalty = lp->get<double>();
    bs.ignore_eos = sp.ignore_eos;
    bs.include_stop_str_in_output = sp.include_stop_str_in_output;
    out.beam_search = bs;
    if (sp.prompt_logprobs) fail("'prompt_logprobs' cannot be used with 'use_beam_search'");
  }
  if (const json* bo = get(body, "best_of")) {
    if (!bo->is_number_integer() || bo->get<int64_t>() != sp.n)
      fail("'best_of' other than n is not supported (got {}, n = {})",
           bo->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), sp.n);
  }
}

EngineRequest base_request(const json& body, const ParsedRequest& out, const SamplingParams& sp) {
  EngineRequest r;
  r.sampling = sp;
  r.adapter = out.adapter;
  if (const json* cs = get(body, "cache_salt")) {
    if (!cs->is_string() || cs->get<std::string>().empty()) fail("'cache_salt' must be a non-empty string");
    r.cache_salt = cs->get<std::string>();
  }
  if (const json* pr = get(body, "priority")) {
    if (!pr->is_number_integer()) fail("'priority' must be an integer");
    r.priority = pr->get<int64_t>();
  }
  return r;
}

// truncate_prompt_tokens: the last N prompt tokens (vLLM truncates from the left).
void truncate_prompt(EngineRequest& r) {
  const auto& t = r.sampling.truncate_prompt_tokens;
  if (t && static_cast<int64_t>(r.prompt_ids.size()) > *t)
    r.prompt_ids.erase(r.prompt_ids.begin(), r.prompt_ids.end() - *t);
}

void check_length(EngineRequest& r, const ParseContext& ctx) {
  truncate_prompt(r);
  int64_t prompt = static_cast<int64_t>(r.prompt_ids.size());
  if (prompt == 0) fail("the prompt is empty");
  if (prompt >= ctx.max_model_len)
    fail(
        "This model's maximum context length is {} tokens. However, your request has {} input tokens. Please "
        "reduce the length of the input messages.",
        ctx.max_model_len, prompt);
  if (r.sampling.max_tokens && *r.sampling.max_tokens > ctx.max_model_len - prompt)
    fail(
        "'max_tokens' is too large: {}. This model's maximum context length is {} tokens and your request "
        "has {} "
        "input tokens ({} > {} - {}).",
        *r.sampling.max_tokens, ctx.max_model_len, prompt, *r.sampling.max_tokens, ctx.max_model_len, prompt);
  // The generation config's max_new_tokens caps every request, clamped to the context (vLLM's
  // get_max_tokens: the least of the request's, the default's and what the context leaves).
  if (ctx.generation_defaults && ctx.generation_defaults->max_tokens) {
    const int64_t cap = std::min(*ctx.generation_defaults->max_tokens, ctx.max_model_len - prompt);
    r.sampling.max_tokens = r.sampling.max_tokens ? std::min(*r.sampling.max_tokens, cap) : cap;
  }
}

std::vector<int32_t> ids_of(const json& list, int64_t ctx_vocab) {
  std::vector<int32_t> ids;
  for (const auto& v : list) {
    if (!v.is_number_integer()) fail("'prompt': a token-id prompt must hold only integers");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > INT32_MAX
                               : v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail("'prompt': token id {} is out of range", v.dump());
    int64_t x = v.get<int64_t>();
    if (ctx_vocab > 0 && x >= ctx_vocab)
      fail("'prompt': token id {} is outside the vocabulary (size {})", x, ctx_vocab);
    ids.push_back(static_cast<int32_t>(x));
  }
  return ids;
}

// A message of the history as templates expect it: an assistant's tool-call arguments as an object (the
// API sends a JSON string; vLLM parses it the same way), and its reasoning under the names templates read
// (`reasoning_content` for Qwen, `thinking` for GPT-OSS).
void normalize_history_message(json& msg) {
  if (msg.contains("tool_calls") && !msg["tool_calls"].is_null()) {
    if (!msg["tool_calls"].is_array()) fail("'messages': 'tool_calls' must be a list");
    for (auto& call : msg["tool_calls"]) {
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
        fail("'messages': each tool call needs a 'function' object");
      json& f = call["function"];
      if (!f.contains("name") || !f["name"].is_string()) fail("'messages': a tool call's function needs a 'name'");
      // vLLM's _postprocess_messages: absent, null or empty arguments are {}.
      if (!f.contains("arguments") || f["arguments"].is_null() ||
          (f["arguments"].is_string() && f["arguments"].get<std::string>().empty())) {
        f["arguments"] = json::object();
      } else if (f["arguments"].is_string()) {
        json args = json::parse(f["arguments"].get<std::string>(), nullptr, false);
        if (args.is_discarded())
          fail("'messages': the arguments of tool call '{}' are not valid JSON", f["name"].get<std::string>());
        f["arguments"] = std::move(args);
      }
    }
  }
  const json* reasoning = nullptr;
  for (const char* key : {"reasoning_content", "reasoning"})
    if (msg.contains(key) && msg[key].is_string()) reasoning = &msg[key];
  if (reasoning) {  // under every name templates read it by (vLLM: reasoning and reasoning_content)
    json r = *reasoning;
    if (!msg.contains("reasoning_content")) msg["reasoning_content"] = r;
    if (!msg.contains("reasoning")) msg["reasoning"] = r;
    if (!msg.contains("thinking")) msg["thinking"] = r;
  }
  if (string_member(msg, "role") == "assistant" && msg.contains("content") && msg["content"].is_null() &&
      msg.contains("tool_calls"))
    msg["content"] = "";
}

// vLLM's _parse_chat_message_content: a message's content as the template gets it. Text parts ("text",
// "input_text", "output_text", "refusal", "thinking", or plain strings) in order, parts without text
// skipped; kString joins them with "\n" (empty ones left out), kOpenai keeps them as {"type": "text",
// "text": ...} parts (a string content is one part, a null or absent one none).
json chat_content(const json& m, ChatContentFormat format) {
  std::vector<std::string> texts;
  const json* c = m.contains("content") ? &m["content"] : nullptr;
  if (c == nullptr || c->is_null()) {
    // no parts
  } else if (c->is_string()) {
    texts.push_back(c->get<std::string>());
  } else if (c->is_array()) {
    for (const auto& part : *c) {
      if (part.is_string()) {
        texts.push_back(part.get<std::string>());
        continue;
      }
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        fail("'messages': each content part must be a string or an object with a string 'type'");
      const std::string type = part["type"].get<std::string>();
      const char* key = type == "text" || type == "input_text" || type == "output_text" ? "text"
                        : type == "refusal"                                             ? "refusal"
                        : type == "thinking"                                            ? "thinking"
                                                                                        : nullptr;
      if (key == nullptr)
        fail(
            "'messages': content parts of type '{}' are not supported: this model takes text ('text', "
            "'input_text', 'output_text', 'refusal' and 'thinking' parts)",
            sanitize_utf8(type));
      if (!part.contains(key) || part[key].is_null()) continue;
      if (!part[key].is_string())
        fail("'messages': the '{}' of a '{}' content part must be a string", key, type);
      texts.push_back(part[key].get<std::string>());
    }
  } else {
    fail("'messages': 'content' must be a string, a list of content parts, or null");
  }
  if (format == ChatContentFormat::kOpenai) {
    json parts = json::array();
    for (std::string& t : texts) parts.push_back(json{{"type", "text"}, {"text", std::move(t)}});
    return parts;
  }
  std::string joined;
  bool first = true;
  for (const std::string& t : texts) {
    if (t.empty()) continue;
    if (!first) joined += "\n";
    joined += t;
    first = false;
  }
  return joined;
}

// A content as text: itself, or its parts' texts joined with "\n" (echo, continue_final_message).
std::string content_text(const json& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array())
    for (const auto& p : content) {
      if (!p.is_object() || !p.contains("text") || !p["text"].is_string()) continue;
      if (!out.empty()) out += "\n";
      out += p["text"].get<std::string>();
    }
  return out;
}

// A tool or a named tool_choice whose `type` is "function", or absent / null (vLLM's
// ChatCompletionToolsParam and ChatCompletionNamedToolChoiceParam default it to "function").
bool function_typed(const json& obj) {
  return !obj.contains("type") || obj["type"].is_null() || string_member(obj, "type") == "function";
}

void check_tools(const json& tools) {
  for (const auto& t : tools) {
    if (!t.is_object() || !function_typed(t) || !t.contains("function") || !t["function"].is_object())
      fail("'tools': each tool must be {{\"type\": \"function\", \"function\": {{...}}}}");
    const json& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      fail("'tools': each function needs a non-empty string 'name'");
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
      fail("'tools': the parameters of function '{}' must be a JSON Schema object", f["name"].get<std::string>());
  }
}

// tool_choice, parallel_tool_calls and the server's parsers -> how the output is split (vLLM's rules:
// "auto" needs --enable-auto-tool-choice and --tool-call-parser; "required" and a named function are
// constrained to a schema and parsed as such; "none" parses no tool calls).
constexpr const char* kToolChoiceForms =
    "'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": "
    "{{\"name\": ...}}}}";

std::optional<OutputParserOptions> choose_output_parser(const json& body, const json& tools, const ParseContext& ctx,
                                                        ParsedRequest& out) {
  OutputParserOptions o;
  o.reasoning = ctx.reasoning_parser;
  const bool has_tools = tools.is_array() && !tools.empty();
  out.parallel_tool_calls = bool_field(body, "parallel_tool_calls", true);
  out.include_reasoning = bool_field(body, "include_reasoning", true);
  const json* tc = get(body, "tool_choice");
  std::string choice = tc ? "" : (has_tools ? "auto" : "none");
  if (tc && tc->is_string()) choice = tc->get<std::string>();
  // vLLM's check_tool_usage: a tool_choice other than "none" needs `tools`; "required" over an empty list
  // is "none".
  if (tc && choice != "none" && !tools.is_array()) fail("When using `tool_choice`, `tools` must be set.");
  if (choice == "required" && !has_tools) choice = "none";
  if (choice == "auto") {
    if (!ctx.enable_auto_tool_choice || ctx.tool_parser == ToolParserKind::kNone)
      fail("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set");
    if (has_tools) o.tools = ctx.tool_parser;
    if (o.tools == ToolParserKind::kQwen3Coder) o.tools_json = tools.dump();  // its parameters' types
  } else if (choice == "required") {
    o.tools = ToolParserKind::kRequired;
    out.output_schema = required_tools_schema(tools.dump());
  } else if (choice == "none") {
    // no tool-call parsing
  } else if (tc && tc->is_object()) {
    std::string name;
    if (function_typed(*tc) && tc->contains("function") && (*tc)["function"].is_object() &&
        (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string())
      name = (*tc)["function"]["name"].get<std::string>();
    if (name.empty()) fail(kToolChoiceForms);
    const json* params = nullptr;
    bool found = false;
    if (has_tools)
      for (const auto& t : tools)
        if (t["function"]["name"] == name) {
          found = true;
          if (t["function"].contains("parameters") && t["function"]["parameters"].is_object())
            params = &t["function"]["parameters"];
        }
    if (!found) fail("The tool specified in `tool_choice` does not match any of the specified `tools`");
    o.tools = ToolParserKind::kNamed;
    o.named_function = name;
    out.output_schema = params ? params->dump() : json{{"type", "object"}}.dump();
  } else {
    fail(kToolChoiceForms);
  }
  if (o.tools == ToolParserKind::kNone && o.reasoning == ReasoningParserKind::kNone) return std::nullopt;
  return o;
}

}  // namespace

void check_model(const json& body, const ParseContext& ctx) {
  ParsedRequest unused;
  resolve_model(body, ctx, unused);
}

ParsedRequest parse_completion(const json& body, const ParseContext& ctx) {
  if (!body.is_object()) fail("the request body must be a JSON object");
  ParsedRequest out;
  out.kind = ApiKind::kCompletion;
  resolve_model(body, ctx, out);
  check_fields(body, ApiKind::kCompletion);
  SamplingParams sp;  // completions default: max_tokens 16, temperature 1
  apply_generation_defaults(ctx, sp);
  // An explicit null max_tokens is vLLM's None: up to the context (absent keeps CompletionRequest's 16).
  if (body.contains("max_tokens") && body.at("max_tokens").is_null()) sp.max_tokens.reset();
  // echo with max_tokens 0 (the legacy way of scoring a prompt): the prompt alone comes back, with its
  // logprobs; one token is generated and dropped, as vLLM does (its usage counts it).
  json echo_body;
  const json* fields = &body;
  if (const json* mt = get(body, "max_tokens");
      bool_field(body, "echo", false) && mt && mt->is_number() && mt->get<double>() == 0.0) {
    echo_body = body;
    echo_body["max_tokens"] = 1;
    fields = &echo_body;
    out.echo_only = true;
  }
  read_common(*fields, out, sp, ctx);
  out.echo = bool_field(body, "echo", false);
  if (sp.logprobs) out.logprobs = sp.logprobs;
  out.prompt_logprobs = sp.prompt_logprobs;
  // echo with logprobs: the prompt's tokens get logprobs too (first entry null), as vLLM and OpenAI do;
  // they come from the engine's prompt logprobs with at least `logprobs` alternatives. As in vLLM (echo sets
  // prompt_logprobs = logprobs when none is given), each choice then carries prompt_logprobs as well.
  if (out.echo && sp.logprobs) {
    if (out.beam_search)
      fail("'echo' with 'logprobs' cannot be used with 'use_beam_search' (no prompt logprobs)");
    if (!out.prompt_logprobs) out.prompt_logprobs = sp.logprobs;
    sp.prompt_logprobs = std::max(sp.prompt_logprobs.value_or(0), *sp.logprobs);
  }
  if (get(body, "suffix")) fail("'suffix' is not supported");
  const json* prompt = get(body, "prompt");
  if (!prompt) fail("'prompt' is required");
  auto check_count = [&] {
    if (static_cast<int64_t>(out.prompts.size() + 1) * out.n > kMaxSequencesPerRequest)
      fail("the request asks for more than {} sequences (prompts × n = {} × {}); split it",
           kMaxSequencesPerRequest, prompt->is_array() ? prompt->size() : 1, out.n);
  };
  auto add_text = [&](const std::string& text) {
    check_count();
    if (!ctx.tokenizer) fail("this server has no tokenizer: send the prompt as token ids");
    EngineRequest r = base_request(body, out, sp);
    r.prompt_ids = ctx.tokenizer->encode(text, bool_field(body, "add_special_tokens", true));
    bool truncated = r.sampling.truncate_prompt_tokens &&
                     static_cast<int64_t>(r.prompt_ids.size()) > *r.sampling.truncate_prompt_tokens;
    check_length(r, ctx);
    out.prompt_texts.push_back(truncated ? ctx.tokenizer->decode(r.prompt_ids) : text);
    out.prompts.push_back(std::move(r));
  };
  auto add_ids = [&](const json& list) {
    check_count();
    EngineRequest r = base_request(body, out, sp);
    r.prompt_ids = ids_of(list, ctx.vocab_size);
    check_length(r, ctx);
    out.prompt_texts.push_back(ctx.tokenizer ? ctx.tokenizer->decode(r.prompt_ids) : "");
    out.prompts.push_back(std::move(r));
  };
  if (prompt->is_string()) {
    add_text(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) fail("'prompt' must not be empty");
    if ((*prompt)[0].is_number_integer()) {
      add_ids(*prompt);
    } else {
      for (const auto& p : *prompt) {
        if (p.is_string())
          add_text(p.get<std::string>());
        else if (p.is_array())
          add_ids(p);
        else
          fail(
              "'prompt' must be a string, a list of strings, a list of token ids, or a list of lists of "
              "token ids");
      }
    }
  } else {
    fail(
        "'prompt' must be a string, a list of strings, a list of token ids, or a list of lists of token ids");
  }
  return out;
}

ParsedRequest parse_chat(const json& body, const ParseContext& ctx) {
  if (!body.is_object()) fail("the request body must be a JSON object");
  const json& obody = body;
  ParsedRequest out;
  out.kind = ApiKind::kChat;
  resolve_model(body, ctx, out);
  SamplingParams sp;
  check_fields(body, ApiKind::kChat);
  sp.max_tokens.reset();  // chat: up to the context length unless max_tokens / max_completion_tokens
  apply_generation_defaults(ctx, sp);
  read_common(body, out, sp, ctx);
  out.prompt_logprobs = sp.prompt_logprobs;  // the response's top-level prompt_logprobs (vLLM)
  // vLLM's check_logprobs: a top_logprobs other than 0 needs logprobs true.
  const json* tl = get(body, "top_logprobs");
  const bool wants_top = tl && !(tl->is_number() && tl->get<double>() == 0.0);
  if (const json* lp = get(body, "logprobs")) {
    if (!lp->is_boolean()) fail("'logprobs' must be a boolean for chat completions");
    if (lp->get<bool>()) {
      out.logprobs = sp.logprobs.value_or(0);
    } else {
      if (wants_top) fail("when using `top_logprobs`, `logprobs` must be set to true.");
      sp.logprobs.reset();
    }
  } else if (wants_top) {
    fail("when using `top_logprobs`, `logprobs` must be set to true.");
  }
  // OpenAI's output modalities: this server writes text only. `prediction` (a predicted output, a latency
  // hint) changes no token, so it is accepted and not used.
  if (const json* mod = get(body, "modalities")) {
    if (!mod->is_array()) fail("'modalities' must be a list");
    for (const auto& m : *mod)
      if (!m.is_string() || m.get<std::string>() != "text")
        fail("'modalities': this server produces text only (got {})", dump_json(m));
  }
  if (const json* pred = get(body, "prediction"); pred && !pred->is_object())
    fail("'prediction' must be an object");
  if (!ctx.tokenizer) fail("this server has no tokenizer, which chat completions need");
  const json* messages = nullptr;
  if (obody.contains("messages")) messages = &obody.at("messages");
  if (!messages || !messages->is_array() || messages->empty()) fail("'messages' must be a non-empty list");
  // The template (the request's own, else the server's) and the form it wants content in.
  std::optional<ChatTemplate> request_template;
  const ChatTemplate* tmpl = ctx.chat_template;
  if (const json* ct = get(body, "chat_template")) {
    if (!ct->is_string()) fail("'chat_template' must be a string");
    request_template = ChatTemplate::compile(ct->get<std::string>());
    tmpl = &*request_template;
  }
  if (!tmpl)
    fail(
        "the model has no chat template; pass 'chat_template' in the request or start the server with "
        "--chat-template");
  const ChatContentFormat format = ctx.content_format.value_or(tmpl->content_format());
  ChatTemplateInputs in;
  in.messages = json::array();
  for (const auto& m : *messages) {
    if (!m.is_object()) fail("'messages': each message must be an object");
    if (!m.contains("role") || !m["role"].is_string()) fail("'messages': each message needs a string 'role'");
    json msg = m;
    msg["content"] = chat_content(m, format);
    normalize_history_message(msg);
    in.messages.push_back(std::move(msg));
  }
  bool add_generation_prompt = bool_field(body, "add_generation_prompt", true);
  bool continue_final = bool_field(body, "continue_final_message", false);
  if (continue_final && add_generation_prompt && get(body, "add_generation_prompt"))
    fail("Cannot set both `continue_final_message` and `add_generation_prompt` to True.");
  if (continue_final) add_generation_prompt = false;
  in.add_generation_prompt = add_generation_prompt;
  // vLLM's get_chat_request_role: --response-role when a generation prompt is added, else the final
  // message's role (the message being continued).
  out.role = add_generation_prompt ? ctx.response_role : in.messages.back()["role"].get<std::string>();
  if (obody.contains("tools") && !obody["tools"].is_null()) {
    if (!obody["tools"].is_array()) fail("'tools' must be a list");
    check_tools(obody["tools"]);
    in.tools = obody["tools"];
  }
  if (ctx.default_chat_template_kwargs.is_object()) in.kwargs = ctx.default_chat_template_kwargs;
  if (obody.contains("chat_template_kwargs") && !obody["chat_template_kwargs"].is_null()) {
    if (!obody["chat_template_kwargs"].is_object()) fail("'chat_template_kwargs' must be an object");
    for (const auto& [key, value] : obody["chat_template_kwargs"].items()) in.kwargs[key] = value;  // request wins
  }
  if (const json* docs = get(body, "documents")) {
    // vLLM: documents for retrieval-augmented templates (Command-R, Granite), the template variable
    // `documents`: a list of objects of string values (e.g. "title" and "text"). The field wins over
    // chat_template_kwargs.documents.
    if (!docs->is_array()) fail("'documents' must be a list of objects, got {}", docs->type_name());
    for (size_t i = 0; i < docs->size(); ++i) {
      const json& d = (*docs)[i];
      if (!d.is_object()) fail("'documents[{}]' must be an object, got {}", i, d.type_name());
      for (const auto& [key, value] : d.items())
        if (!value.is_string())
          fail("'documents[{}].{}' must be a string, got {}", i, key, value.type_name());
    }
    in.kwargs["documents"] = *docs;
  }
  if (const json* re = get(body, "reasoning_effort")) {
    // vLLM hands it to the chat template as the variable `reasoning_effort` (GPT-OSS's template reads it).
    if (!re->is_string() || (re->get<std::string>() != "low" && re->get<std::string>() != "medium" &&
                             re->get<std::string>() != "high"))
      fail("'reasoning_effort' must be one of 'low', 'medium', 'high'");
    if (!in.kwargs.contains("reasoning_effort")) in.kwargs["reasoning_effort"] = *re;
  }
  std::optional<OutputParserOptions> parser = choose_output_parser(body, in.tools, ctx, out);
  // --exclude-tools-when-tool-choice-none: an explicit "none" keeps the tools out of the prompt too.
  if (ctx.exclude_tools_when_tool_choice_none) {
    const json* tc = get(body, "tool_choice");
    if (tc && tc->is_string() && tc->get<std::string>() == "none") in.tools = json();
  }
  // tool_choice required / named: the output is constrained to the calls' schema (unless the request
  // set a structured output of its own)
  if (out.output_schema && !sp.structured_output)
    sp.structured_output = structured::GrammarSpec{structured::SpecKind::kJsonSchema, *out.output_schema, {}};
  out.echo = bool_field(body, "echo", false);
  if (out.echo) {
    // vLLM: the final message's content is echoed when that message has the response's role.
    const json& last = in.messages.back();
    const std::string text = content_text(last["content"]);
    if (string_member(last, "role") == out.role && !text.empty()) out.chat_echo = text;
  }
  const tokenizer::Tokenizer& tok = *ctx.tokenizer;
  if (tok.bos_id()) in.bos_token = tok.id_to_token(*tok.bos_id());
  in.eos_token = tok.eos_token();
  std::string rendered;
  try {
    rendered = tmpl->render(in);
  } catch (const TemplateRaisedError& e) {
    fail("{}", e.what());
  }
  if (continue_final) {
    // Keep the final message open: cut the rendering right after its content.
    // (a list of parts: its last text part, as transformers does)
    const json& last = in.messages.back();
    std::string content;
    if (last["content"].is_string()) {
      content = last["content"].get<std::string>();
    } else {
      for (auto it = last["content"].rbegin(); it != last["content"].rend(); ++it)
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          content = (*it)["text"].get<std::string>();
          break;
        }
    }
    // transformers' rule: find the content stripped of white space (a template may trim it); keep its
    // trailing white space when the rendering kept it too.
    constexpr const char* kSpace = " \t\n\r\v\f";
    const size_t first = content.find_first_not_of(kSpace);
    const std::string lstripped = first == std::string::npos ? "" : content.substr(first);
    const size_t last_char = lstripped.find_last_not_of(kSpace);
    const std::string stripped = last_char == std::string::npos ? "" : lstripped.substr(0, last_char + 1);
    const size_t pos = rendered.rfind(stripped);
    if (pos == std::string::npos)
      fail("'continue_final_message': the final message's content was not found in the rendered prompt");
    const bool spacing_kept = rendered.compare(pos, lstripped.size(), content) == 0;
    rendered.resize(pos + (spacing_kept ? lstripped.size() : stripped.size()));
  }
  if (parser) {
    // qwen3: a template that opens <think> in the generation prompt leaves the model inside the reasoning
    std::string_view tail = rendered;
    while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.remove_suffix(1);
    parser->starts_in_reasoning = parser->reasoning == ReasoningParserKind::kQwen3 && tail.ends_with("<think>");
    // markers that are special tokens (harmony's, [TOOL_CALLS]) must reach the parser
    if (needs_special_tokens(parser->tools, parser->reasoning)) sp.skip_special_tokens = false;
    out.output_parser = parser;
  }
  EngineRequest r = base_request(body, out, sp);
  r.prompt_ids = tok.encode(rendered, bool_field(body, "add_special_tokens", false));
  truncate_prompt(r);
  check_length(r, ctx);
  out.prompt_texts.push_back(rendered);
  out.prompts.push_back(std::move(r));
  return out;
}

const std::vector<std::string>& known_fields(ApiKind kind) {
  // vLLM's CompletionRequest / ChatCompletionRequest fields that polylora implements, plus `user` (an
  // end-user identifier with no effect on generation, in vLLM too) and `spaces_between_special_tokens`
  // (no effect with a fast tokenizer, in vLLM too). use_beam_search and length_penalty are accepted only
  // with their default values. Structured outputs (response_format, structured_outputs, guided_*) are
  // added below; logits_processors, prompt_embeds, kv_transfer_params, vllm_xargs and
  // mm_processor_kwargs are refused.
  static const std::vector<std::string> common = {"model",
                                                  "stream",
                                                  "stream_options",
                                                  "n",
                                                  "best_of",
                                                  "temperature",
                                                  "top_p",
                                                  "top_k",
                                                  "min_p",
                                                  "seed",
                                                  "presence_penalty",
                                                  "frequency_penalty",
                                                  "repetition_penalty",
                                                  "logit_bias",
                                                  "min_tokens",
                                                  "max_tokens",
                                                  "stop",
                                                  "stop_token_ids",
                                                  "include_stop_str_in_output",
                                                  "ignore_eos",
                                                  "skip_special_tokens",
                                                  "spaces_between_special_tokens",
                                                  "logprobs",
                                                  "prompt_logprobs",
                                                  "allowed_token_ids",
                                                  "bad_words",
                                                  "truncate_prompt_tokens",
                                                  "add_special_tokens",
                                                  "priority",
                                                  "request_id",
                                                  "cache_salt",
                                                  "return_tokens_as_token_ids",
                                                  "return_token_ids",
                                                  "user",
                                                  "use_beam_search",
                                                  "length_penalty",
                                                  "echo"};
  static const std::vector<std::string> common_with_structured = [] {
    std::vector<std::string> v = common;  // response_format, structured_outputs, guided_*
    v.insert(v.end(), structured_output_fields().begin(), structured_output_fields().end());
    return v;
  }();
  static const std::vector<std::string> completion = [] {
    std::vector<std::string> v = common_with_structured;
    for (const char* f : {"prompt", "suffix"}) v.push_back(f);
    return v;
  }();
  static const std::vector<std::string> chat = [] {
    std::vector<std::string> v = common_with_structured;
    for (const char* f : {"messages",
                          "max_completion_tokens",
                          "top_logprobs",
                          "tools",
                          "tool_choice",
                          "chat_template",
                          "chat_template_kwargs",
                          "add_generation_prompt",
                          "continue_final_message",
                          "reasoning_effort",
                          "parallel_tool_calls",
                          "include_reasoning",
                          "store",
                          "metadata",
                          "service_tier",
                          "prompt_cache_key",
                          "safety_identifier",
                          "documents",
                          "modalities",
                          "prediction"})
      v.push_back(f);
    return v;
  }();
  return kind == ApiKind::kCompletion ? completion : chat;
}

}  // namespace polylora::server
