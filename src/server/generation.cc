// server/generation.cc: a completion / chat request in flight (see the header).
#include "server/generation.h"

#include <ctime>
#include <random>

#include "common/error.h"
#include "common/log.h"
#include "common/utf8.h"
#include "server/api_error.h"
#include "server/json_body.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

namespace {

std::string random_suffix() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 24; ++i) s += hex[rng() % 16];
  return s;
}

std::string sse(const json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

}  // namespace

Generation::Generation(ParsedRequest parsed, EngineThread& engine, const tokenizer::Tokenizer* tokenizer,
                       std::shared_ptr<HttpResponder> responder, PostWork post_work)
    : parsed_(std::move(parsed)),
      engine_(engine),
      tokenizer_(tokenizer),
      responder_(std::move(responder)),
      post_work_(std::move(post_work)) {
  chat_ = parsed_.kind != ApiKind::kCompletion;
  const bool responses = parsed_.kind == ApiKind::kResponses;
  id_ = responses && !parsed_.response_id.empty()
            ? parsed_.response_id
            : (responses ? "resp_"
               : chat_   ? "chatcmpl-"
                         : "cmpl-") +
                  (parsed_.request_id.empty() ? random_suffix() : parsed_.request_id);
  // A client's request id need not be unique: the engine's ids get a random part of their own.
  engine_id_ = parsed_.request_id.empty() ? id_ : id_ + "-" + random_suffix();
  created_ = static_cast<int64_t>(std::time(nullptr));
  size_t num_prompts = parsed_.prompts.size();
  choices_.resize(num_prompts * static_cast<size_t>(parsed_.n));
  prompt_logprobs_.resize(num_prompts);
  streams_.resize(num_prompts);
  stream_done_.assign(num_prompts, false);
  if (responses) responses_ = std::make_unique<ResponsesWriter>(parsed_, id_, created_);
  // Streamed chat with a parser (and every streamed response): each choice splits its text as it comes.
  if (parsed_.stream && (parsed_.output_parser || responses))
    for (auto& ch : choices_) ch.parser.emplace(parsed_.output_parser.value_or(OutputParserOptions{}));
  if (parsed_.echo)
    for (size_t i = 0; i < num_prompts; ++i)
      for (int64_t k = 0; k < parsed_.n; ++k) {
        ChoiceState& ch = choices_[i * parsed_.n + k];
        ch.text = chat_ ? parsed_.chat_echo : completion_echo_text(i);
        ch.text_chars = utf8_char_count(ch.text);
      }
}

void Generation::start() {
  auto self = shared_from_this();
  // Weak: the responder is held by this generation (a strong pointer here would be a cycle).
  responder_->on_disconnect([weak = std::weak_ptr<Generation>(self)] {
    auto g = weak.lock();
    if (!g) return;
    g->client_gone_ = true;
    std::lock_guard<std::mutex> lock(g->mu_);
    g->abort_all();
  });
  for (size_t i = 0; i < parsed_.prompts.size(); ++i) {
    EngineRequest r = parsed_.prompts[i];
    r.request_id = engine_request_id(i);
    auto added = [self, i](std::shared_ptr<OutputStream> stream, std::exception_ptr error) {
      self->post_work_([self, i, stream = std::move(stream), error]() mutable {
        try {
          self->on_added(i, std::move(stream), error);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(self->mu_);
          spdlog::error("request {}: {}", self->id_, e.what());
          self->abort_all();
          self->fail_request(500, std::string("internal error: ") + e.what());
        }
      });
    };
    if (parsed_.beam_search) {  // its stream carries the one final output of the search
      auto search = std::make_shared<BeamSearch>(std::move(r), *parsed_.beam_search, engine_, tokenizer_,
                                                 engine_.max_model_len(), post_work_, std::move(added));
      {
        std::lock_guard<std::mutex> lock(mu_);
        beam_searches_.push_back(search);
      }
      search->start();
    } else {
      engine_.add_request_async(std::move(r), std::move(added));
    }
  }
}

void Generation::on_added(size_t prompt_idx, std::shared_ptr<OutputStream> stream, std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mu_);
  ++num_answered_;
  if (error) {
    std::string message;
    int status = status_of_exception(error, message);
    if (!add_error_) add_error_ = {status, message};
    stream_done_[prompt_idx] = true;
  } else {
    streams_[prompt_idx] = stream;
    if (finished_) {  // the client went (or another prompt failed) meanwhile
      engine_.abort(engine_request_id(prompt_idx));
      stream_done_[prompt_idx] = true;
      return;
    }
    auto self = shared_from_this();  // the listener keeps the generation alive; cleared when it ends
    stream->set_listener([self] { self->wake(); });
  }
  if (num_answered_ < parsed_.prompts.size() || finished_) return;
  if (add_error_) {
    abort_all();
    send_json(add_error_->first, error_json(add_error_->first, add_error_->second));
    return;
  }
  if (parsed_.stream) {
    responder_->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
    stream_started_ = true;
    std::string out;
    if (responses_) out += responses_->start();
    if (chat_ && !responses_) {
      // The first chunk of every choice announces the role; then (vLLM: after all of them) the echoed
      // content.
      for (size_t c = 0; c < choices_.size(); ++c) {
        json j = chunk({{"index", c},
                        {"delta", {{"role", parsed_.role}, {"content", ""}}},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}});
        if (parsed_.continuous_usage) j["usage"] = continuous_usage(c);
        if (parsed_.return_token_ids)  // vLLM: the prompt's ids in the first chunk
          j["prompt_token_ids"] = parsed_.prompts[c / static_cast<size_t>(parsed_.n)].prompt_ids;
        out += sse(j);
      }
      if (parsed_.echo && !parsed_.chat_echo.empty())
        for (size_t c = 0; c < choices_.size(); ++c) {
          json e = chunk({{"index", c},
                          {"delta", {{"content", parsed_.chat_echo}}},
                          {"logprobs", nullptr},
                          {"finish_reason", nullptr}});
          if (parsed_.continuous_usage) e["usage"] = continuous_usage(c);
          out += sse(e);
        }
    }
    responder_->write(std::move(out));
  }
  pump();
}

void Generation::wake() {
  if (wake_pending_.exchange(true)) return;
  auto self = shared_from_this();
  post_work_([self] {
    self->wake_pending_ = false;
    std::lock_guard<std::mutex> lock(self->mu_);
    try {
      self->pump();
    } catch (const std::exception& e) {
      spdlog::error("request {}: {}", self->id_, e.what());
      self->abort_all();
      self->fail_request(500, std::string("internal error: ") + e.what());
    }
  });
}

json Generation::chunk(json choice) const {
  return json{{"id", id_},
              {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", parsed_.model},
              {"choices", json::array({std::move(choice)})}};
}

json Generation::finish_json(const ChoiceState& ch) const {
  if (!ch.finish_reason) return nullptr;
  return finish_reason_name(*ch.finish_reason);
}

// vLLM's continuous usage: the choice's prompt tokens and the tokens it has generated so far.
json Generation::continuous_usage(size_t choice) const {
  size_t p = choice / static_cast<size_t>(parsed_.n);
  auto prompt = static_cast<int64_t>(parsed_.prompts[p].prompt_ids.size());
  auto generated = static_cast<int64_t>(choices_[choice].token_ids.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
}

// return_token_ids on a streamed choice: the chunk's new token ids, and (completions) the prompt's ids in
// the choice's first chunk; chat sends those in the role chunk.
void Generation::add_token_ids(size_t c, json& choice, const std::vector<int32_t>& new_token_ids) {
  if (!parsed_.return_token_ids) return;
  ChoiceState& ch = choices_[c];
  if (!chat_ && !ch.prompt_ids_sent) {
    choice["prompt_token_ids"] = parsed_.prompts[c / static_cast<size_t>(parsed_.n)].prompt_ids;
    ch.prompt_ids_sent = true;
  }
  choice["token_ids"] = new_token_ids;
}

// Completions, echo: the prompt's text (vLLM leaves it out when return_token_ids is on: the ids say it).
std::string Generation::completion_echo_text(size_t prompt_idx) const {
  return parsed_.return_token_ids ? std::string() : parsed_.prompt_texts[prompt_idx];
}

// One streamed step of a choice whose text is parsed: a chat chunk with the parsed delta (reasoning,
// content, tool-call fragments), or the Responses events it makes. At the end the parser releases what it
// held and the finish reason says whether tools were called.
std::string Generation::parsed_delta_chunk(size_t c, ChoiceState& ch, const std::string& new_text,
                                           const std::vector<int32_t>& new_token_ids,
                                           const std::vector<LogprobEntry>& new_logprobs, bool finished) {
  OutputDelta d = ch.parser->feed(new_text);
  if (finished) {
    OutputDelta tail = ch.parser->finish();
    d.reasoning += tail.reasoning;
    d.content += tail.content;
    for (auto& call : tail.calls) {
      if (!call.is_new && !d.calls.empty() && d.calls.back().index == call.index)
        d.calls.back().arguments += call.arguments;
      else
        d.calls.push_back(std::move(call));
    }
  }
  if (responses_) return responses_->on_delta(d);
  if (!parsed_.include_reasoning) d.reasoning.clear();
  json delta = chat_delta_json(d, ch, parsed_.parallel_tool_calls);
  json lp = nullptr;
  if (parsed_.logprobs && !new_logprobs.empty()) lp = chat_logprobs_json(new_logprobs, parsed_, tokenizer_);
  if (delta.empty() && !finished && lp.is_null() && !(parsed_.return_token_ids && !new_token_ids.empty()))
    return "";
  // (an empty delta is sent as {}, as vLLM's DeltaMessage() and OpenAI's last chunk)
  json finish = nullptr;
  if (finished && ch.finish_reason)
    finish = chat_finish_reason(*ch.finish_reason, !ch.tool_call_ids.empty(), *parsed_.output_parser);
  json choice = {{"index", c}, {"delta", std::move(delta)}, {"logprobs", lp}, {"finish_reason", finish}};
  if (finished) choice["stop_reason"] = stop_reason_json(ch.stop_reason);
  add_token_ids(c, choice, new_token_ids);
  json j = chunk(std::move(choice));
  if (parsed_.continuous_usage) j["usage"] = continuous_usage(c);
  return sse(j);
}

void Generation::pump() {
  if (finished_ || num_answered_ < parsed_.prompts.size()) return;
  std::string out;
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (stream_done_[i] || !streams_[i]) continue;
    while (auto o = streams_[i]->next(std::chrono::milliseconds(0))) {
      if (o->error) {
        error_ = *o->error;
        error_is_shutdown_ = o->error_is_shutdown;
      }
      if (prompt_logprobs_[i].empty() && !o->prompt_logprobs.empty())
        prompt_logprobs_[i] = o->prompt_logprobs;
      for (const SequenceOutput& out_seq : o->sequences) {
        // echo with max_tokens 0: the generated token is counted (as vLLM's usage does) and dropped.
        SequenceOutput dropped;
        if (parsed_.echo_only) {
          completion_tokens_ += static_cast<int64_t>(out_seq.new_token_ids.size());
          dropped.index = out_seq.index;
          dropped.finish_reason = out_seq.finish_reason;
          dropped.stop_reason = out_seq.stop_reason;
        }
        const SequenceOutput& so = parsed_.echo_only ? dropped : out_seq;
        size_t c = i * static_cast<size_t>(parsed_.n) + static_cast<size_t>(so.index);
        ChoiceState& ch = choices_[c];
        const size_t chars_before = ch.text_chars;
        ch.text += so.new_text;
        ch.text_chars += utf8_char_count(so.new_text);
        ch.token_ids.insert(ch.token_ids.end(), so.new_token_ids.begin(), so.new_token_ids.end());
        ch.logprobs.insert(ch.logprobs.end(), so.new_logprobs.begin(), so.new_logprobs.end());
        completion_tokens_ += static_cast<int64_t>(so.new_token_ids.size());
        if (so.finish_reason) {
          ch.finish_reason = so.finish_reason;
          ch.stop_reason = so.stop_reason;
        }
        if (!parsed_.stream || (so.new_text.empty() && so.new_token_ids.empty() && !so.finish_reason))
          continue;
        if (ch.parser) {
          out += parsed_delta_chunk(c, ch, so.new_text, so.new_token_ids, so.new_logprobs,
                                    so.finish_reason.has_value());
          continue;
        }
        json lp = nullptr;
        // Completions, echo: the prompt goes with each choice's first chunk, its logprobs before the
        // chunk's own (vLLM's first chunk: prompt text + output text).
        const bool with_echo = !chat_ && parsed_.echo && !ch.echo_sent;
        if (with_echo) {
          ch.echo_sent = true;
          if (parsed_.logprobs)
            lp = completion_echo_logprobs_json(parsed_.prompts[i].prompt_ids, prompt_logprobs_[i],
                                               so.new_logprobs, parsed_, tokenizer_);
        } else if (parsed_.logprobs && !so.new_logprobs.empty()) {
          lp = chat_ ? chat_logprobs_json(so.new_logprobs, parsed_, tokenizer_)
                     : completion_logprobs_json(so.new_logprobs, parsed_, tokenizer_, chars_before);
        }
        json choice;
        if (chat_)
          choice = {{"index", c},
                    {"delta", {{"content", so.new_text}}},
                    {"logprobs", lp},
                    {"finish_reason", finish_json(ch)}};
        else
          choice = {{"index", c},
                    {"text", with_echo ? completion_echo_text(i) + so.new_text : so.new_text},
                    {"logprobs", lp},
                    {"finish_reason", finish_json(ch)},
                    {"stop_reason", nullptr}};  // vLLM's completion chunks carry it, null until the end
        if (so.finish_reason) choice["stop_reason"] = stop_reason_json(so.stop_reason);
        add_token_ids(c, choice, so.new_token_ids);
        json j = chunk(std::move(choice));
        if (parsed_.continuous_usage) j["usage"] = continuous_usage(c);
        out += sse(j);
      }
      if (o->finished) {
        stream_done_[i] = true;
        prompt_tokens_ += o->num_prompt_tokens;
        cached_tokens_ += o->num_cached_tokens;
        break;
      }
    }
  }
  if (parsed_.stream && !out.empty()) responder_->write(std::move(out));
  if (error_) {
    abort_all();
    fail_request(error_is_shutdown_ ? 503 : 500, *error_);
    return;
  }
  for (bool d : stream_done_)
    if (!d) return;
  if (parsed_.stream)
    finish_stream();
  else
    finish_body();
}

void Generation::abort_all() {
  for (auto& search : beam_searches_) search->cancel();
  for (size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i]) streams_[i]->set_listener(nullptr);
    if (streams_[i] && !stream_done_[i]) engine_.abort(engine_request_id(i));
    stream_done_[i] = true;
  }
  finished_ = true;
}

void Generation::send_json(int status, const json& body) {
  finished_ = true;
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  responder_->send(std::move(r));
}

void Generation::fail_request(int status, const std::string& message) {
  finished_ = true;
  if (stream_started_) {
    // The status line has gone out: the error travels as an event, then the stream ends as usual.
    responder_->write(sse(error_json(status, message)) + "data: [DONE]\n\n");
    responder_->end();
  } else {
    send_json(status, error_json(status, message));
  }
}

void Generation::finish_stream() {
  abort_all();  // nothing left to abort; clears the listeners
  std::string out;
  if (responses_) {
    out = responses_->finish(choices_[0].finish_reason.value_or(FinishReason::kStop),
                             {prompt_tokens_, completion_tokens_, cached_tokens_});
    responder_->write(std::move(out));
    responder_->end();
    return;
  }
  if (parsed_.include_usage)
    out += sse({{"id", id_},
                {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                {"created", created_},
                {"model", parsed_.model},
                {"choices", json::array()},
                {"usage", stream_usage_json()}});
  out += "data: [DONE]\n\n";
  responder_->write(std::move(out));
  responder_->end();
}

// The usage of a stream's last chunk: vLLM writes chunks without their null fields (exclude_none), so a
// prompt_tokens_details of null is left out.
json Generation::stream_usage_json() const {
  json u = usage_json(prompt_tokens_, completion_tokens_, cached_tokens_);
  if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_null())
    u.erase("prompt_tokens_details");
  return u;
}

void Generation::finish_body() {
  abort_all();  // nothing left to abort; clears the listeners
  if (responses_) {
    const ChoiceState& ch = choices_[0];
    OutputParser::Result r = OutputParser::parse(parsed_.output_parser.value_or(OutputParserOptions{}), ch.text);
    json lp = nullptr;
    if (parsed_.logprobs) lp = chat_logprobs_json(ch.logprobs, parsed_, tokenizer_)["content"];
    send_json(200, responses_->response(r, ch.finish_reason.value_or(FinishReason::kStop),
                                        {prompt_tokens_, completion_tokens_, cached_tokens_}, std::move(lp)));
    return;
  }
  json choices = json::array();
  for (size_t c = 0; c < choices_.size(); ++c) {
    const ChoiceState& ch = choices_[c];
    size_t p = c / static_cast<size_t>(parsed_.n);
    json lp = nullptr;
    if (parsed_.logprobs) {
      if (chat_)
        lp = chat_logprobs_json(ch.logprobs, parsed_, tokenizer_);
      else if (parsed_.echo)
        lp = completion_echo_logprobs_json(parsed_.prompts[p].prompt_ids, prompt_logprobs_[p], ch.logprobs,
                                           parsed_, tokenizer_);
      else
        lp = completion_logprobs_json(ch.logprobs, parsed_, tokenizer_, 0);
    }
    json choice;
    if (chat_ && parsed_.output_parser) {
      const OutputParserOptions& o = *parsed_.output_parser;
      std::string_view text = ch.text;
      text.remove_prefix(std::min(text.size(), parsed_.echo ? parsed_.chat_echo.size() : 0));
      OutputParser::Result r = OutputParser::parse(o, text);
      json message = {{"role", parsed_.role}};
      std::string content = (parsed_.echo ? parsed_.chat_echo : std::string()) + r.content;
      message["content"] = content.empty() && !r.tool_calls.empty() ? json(nullptr) : json(content);
      if (o.reasoning != ReasoningParserKind::kNone) {
        // vLLM's `reasoning` (and `reasoning_content`, its name before late 2025); none with
        // include_reasoning false.
        json reasoning = r.has_reasoning && parsed_.include_reasoning ? json(r.reasoning) : json(nullptr);
        message["reasoning"] = reasoning;
        message["reasoning_content"] = reasoning;
      }
      message["tool_calls"] = tool_calls_json(r.tool_calls, parsed_.parallel_tool_calls);
      choice = {{"index", c},
                {"message", std::move(message)},
                {"logprobs", lp},
                {"finish_reason", ch.finish_reason ? json(chat_finish_reason(*ch.finish_reason, !r.tool_calls.empty(), o))
                                                   : json(nullptr)},
                {"stop_reason", stop_reason_json(ch.stop_reason)}};
    } else if (chat_)
      choice = {{"index", c},
                {"message", {{"role", parsed_.role}, {"content", ch.text}, {"tool_calls", json::array()}}},
                {"logprobs", lp},
                {"finish_reason", finish_json(ch)},
                {"stop_reason", stop_reason_json(ch.stop_reason)}};
    else
      choice = {{"index", c},
                {"text", ch.text},
                {"logprobs", lp},
                {"finish_reason", finish_json(ch)},
                {"stop_reason", stop_reason_json(ch.stop_reason)}};
    if (!chat_ && parsed_.prompt_logprobs && !prompt_logprobs_[p].empty())
      choice["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs_[p], tokenizer_,
                                                       static_cast<size_t>(*parsed_.prompt_logprobs));
    if (parsed_.return_token_ids && !chat_) choice["prompt_token_ids"] = parsed_.prompts[p].prompt_ids;
    if (parsed_.return_tokens_as_token_ids || parsed_.return_token_ids) choice["token_ids"] = ch.token_ids;
    choices.push_back(std::move(choice));
  }
  json body = {
      {"id", id_},           {"object", chat_ ? "chat.completion" : "text_completion"},
      {"created", created_}, {"model", parsed_.model},
      {"choices", choices},  {"usage", usage_json(prompt_tokens_, completion_tokens_, cached_tokens_)}};
  // vLLM: a chat response's prompt ids and prompt logprobs at the top (completions carry them per choice).
  if (parsed_.return_token_ids && chat_) body["prompt_token_ids"] = parsed_.prompts.front().prompt_ids;
  if (chat_ && parsed_.prompt_logprobs && !prompt_logprobs_.empty() && !prompt_logprobs_.front().empty())
    body["prompt_logprobs"] = prompt_logprobs_json(prompt_logprobs_.front(), tokenizer_,
                                                   static_cast<size_t>(*parsed_.prompt_logprobs));
  send_json(200, body);
}

}  // namespace polylora::server
