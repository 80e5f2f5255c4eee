// server/http_server.cc: routes of the OpenAI-compatible server (cpp-httplib, one worker thread per
// connection so that slow or streaming clients never hold up others or the engine thread).
#include "server/http_server.h"

#include <httplib.h>

#include <sys/socket.h>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/log.h"
#include "lora/adapter.h"
#include "server/openai_api.h"

namespace polylora::server {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

const char* error_type(int status) {
  switch (status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 404:
      return "NotFoundError";
    case 503:
      return "ServiceUnavailableError";
    default:
      return "InternalServerError";
  }
}

int status_of(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalid:
      return 400;
    case ErrorKind::kNotFound:
      return 404;
    case ErrorKind::kOverloaded:
      return 503;
  }
  return 500;
}

json error_json(int status, const std::string& message) {
  return {
      {"error", {{"message", message}, {"type", error_type(status)}, {"param", nullptr}, {"code", status}}}};
}

void send_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(error_json(status, message).dump(), "application/json");
}

std::string random_suffix() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 24; ++i) s += hex[rng() % 16];
  return s;
}

std::string sse(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

// One generation request in flight: its engine streams, per-choice state and usage.
struct Generation {
  ParsedRequest parsed;
  std::string id;
  std::string object;  // "text_completion" / "chat.completion" (non-stream) or chunk object names
  int64_t created = 0;
  std::vector<std::shared_ptr<OutputStream>> streams;
  std::vector<bool> stream_done;
  std::vector<ChoiceState> choices;                                       // [prompts · n]
  std::vector<std::vector<std::optional<LogprobEntry>>> prompt_logprobs;  // per prompt
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::optional<std::string> error;
};

}  // namespace

HttpServer::HttpServer(ServerConfig config, EngineThread& engine,
                       std::shared_ptr<const tokenizer::Tokenizer> tokenizer, LoraLimits lora_limits)
    : config_(std::move(config)),
      engine_(engine),
      tokenizer_(std::move(tokenizer)),
      lora_limits_(lora_limits) {
  std::string source = config_.chat_template;
  if (!source.empty()) {
    std::ifstream in(source);
    if (!in) fail("--chat-template: cannot read {}", source);
    source.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } else if (tokenizer_) {
    source = tokenizer_->chat_template();
  }
  if (!source.empty()) chat_template_ = ChatTemplate::compile(source);
  if (config_.served_model_names.empty()) config_.served_model_names.push_back("polylora");
  http_ = std::make_unique<httplib::Server>();
  size_t threads = static_cast<size_t>(std::max<int64_t>(config_.max_connections, 8));
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_keep_alive_max_count(1000);
  // A connection waits this long for its (next) request. Longer than clients' idle timeouts (Node: 4 s), so
  // the client closes idle sockets first, and long enough that a loaded client still gets its first request
  // in after connecting.
  http_->set_keep_alive_timeout(20);
  http_->set_read_timeout(std::chrono::seconds(600));
  http_->set_write_timeout(std::chrono::seconds(600));
  // cpp-httplib listens with a backlog of 5: a burst of connections overflows it and the kernel drops
  // SYNs, which clients retry after 1, 3, 7, 15... s. Keep the listening socket to raise the backlog.
  http_->set_socket_options([this](socket_t sock) {
    httplib::default_socket_options(sock);
    listen_socket_ = static_cast<int>(sock);
  });
  register_routes();
}

HttpServer::~HttpServer() = default;

bool HttpServer::listen() {
  bound_port_ = config_.port;
  if (config_.port == 0) {
    bound_port_ = http_->bind_to_any_port(config_.host);
    if (bound_port_ <= 0) return false;
  } else if (!http_->bind_to_port(config_.host, config_.port)) {
    return false;
  }
  if (listen_socket_ >= 0) ::listen(listen_socket_, SOMAXCONN);  // a larger backlog (see the constructor)
  spdlog::info("serving the OpenAI API on http://{}:{} (models: {})", config_.host, bound_port_,
               config_.served_model_names.front());
  return http_->listen_after_bind();
}

void HttpServer::stop() {
  http_->stop();
}

void HttpServer::register_routes() {
  httplib::Server& s = *http_;
  // Authentication: every /v1 route needs the key when one is configured (health and metrics do not).
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (config_.api_key.empty() || req.path.rfind("/v1", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + config_.api_key) {
      send_error(res, 401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const Error& e) {
      send_error(res, status_of(e), e.what());
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what());
    }
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty())
      send_error(res, 404, "no route for " + req.method + " " + req.path);
  });

  auto parse_body = [](const httplib::Request& req) {
    try {
      return ordered_json::parse(req.body);
    } catch (const json::exception& e) {
      fail("the request body is not valid JSON: {}", e.what());
    }
  };
  auto context = [this]() {
    ParseContext ctx;
    ctx.tokenizer = tokenizer_.get();
    ctx.chat_template = chat_template_ ? &*chat_template_ : nullptr;
    ctx.served_model_names = config_.served_model_names;
    ctx.has_adapter = [this](const std::string& name) { return engine_.has_adapter(name); };
    ctx.max_model_len = engine_.max_model_len();
    return ctx;
  };

  auto generate = [this](const httplib::Request& req, httplib::Response& res, ParsedRequest parsed) {
    auto g = std::make_shared<Generation>();
    g->parsed = std::move(parsed);
    bool chat = g->parsed.kind == ApiKind::kChat;
    g->id = (chat ? "chatcmpl-" : "cmpl-") + random_suffix();
    g->created = static_cast<int64_t>(std::time(nullptr));
    size_t num_prompts = g->parsed.prompts.size();
    g->choices.resize(num_prompts * static_cast<size_t>(g->parsed.n));
    g->prompt_logprobs.resize(num_prompts);
    for (size_t i = 0; i < num_prompts; ++i) {
      EngineRequest r = g->parsed.prompts[i];
      r.request_id = g->id + "-" + std::to_string(i);
      try {
        g->streams.push_back(engine_.add_request(std::move(r)));
      } catch (...) {
        for (size_t j = 0; j < i; ++j) engine_.abort(g->id + "-" + std::to_string(j));
        throw;
      }
    }
    g->stream_done.assign(num_prompts, false);
    if (g->parsed.echo)
      for (size_t i = 0; i < num_prompts; ++i)
        for (int64_t k = 0; k < g->parsed.n; ++k)
          g->choices[i * g->parsed.n + k].text = g->parsed.prompt_texts[i];
    auto abort_all = [this, g] {
      for (size_t i = 0; i < g->streams.size(); ++i)
        if (!g->stream_done[i]) engine_.abort(g->id + "-" + std::to_string(i));
    };
    const bool stream = g->parsed.stream;
    // Pulls outputs; calls on_delta(choice, delta text, new logprobs, finished?) for streaming.
    auto pump = [this, g](std::chrono::milliseconds wait,
                          const std::function<void(size_t, const SequenceOutput&)>& on_seq) {
      bool any = false;
      size_t open = 0;
      for (size_t i = 0; i < g->streams.size(); ++i) open += g->stream_done[i] ? 0 : 1;
      auto per_wait = open > 1 ? std::chrono::milliseconds(2) : wait;
      for (size_t i = 0; i < g->streams.size(); ++i) {
        if (g->stream_done[i]) continue;
        while (auto out = g->streams[i]->next(any ? std::chrono::milliseconds(0) : per_wait)) {
          any = true;
          if (out->error) g->error = *out->error;
          if (g->prompt_logprobs[i].empty() && !out->prompt_logprobs.empty())
            g->prompt_logprobs[i] = out->prompt_logprobs;
          for (const auto& so : out->sequences) {
            size_t c = i * static_cast<size_t>(g->parsed.n) + static_cast<size_t>(so.index);
            ChoiceState& ch = g->choices[c];
            ch.text += so.new_text;
            ch.token_ids.insert(ch.token_ids.end(), so.new_token_ids.begin(), so.new_token_ids.end());
            ch.logprobs.insert(ch.logprobs.end(), so.new_logprobs.begin(), so.new_logprobs.end());
            g->completion_tokens += static_cast<int64_t>(so.new_token_ids.size());
            if (so.finish_reason) {
              ch.finish_reason = so.finish_reason;
              ch.stop_reason = so.stop_reason;
            }
            on_seq(c, so);
          }
          if (out->finished) {
            g->stream_done[i] = true;
            g->prompt_tokens += out->num_prompt_tokens;
            g->cached_tokens += out->num_cached_tokens;
            break;
          }
        }
      }
      return any;
    };
    auto all_done = [g] {
      for (bool d : g->stream_done)
        if (!d) return false;
      return true;
    };
    auto finish_json = [](const ChoiceState& ch) -> json {
      if (!ch.finish_reason) return nullptr;
      return finish_reason_name(*ch.finish_reason) == std::string("abort")
                 ? json("abort")
                 : json(finish_reason_name(*ch.finish_reason));
    };

    if (stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, g, pump, all_done, abort_all, finish_json, chat](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& data) { return sink.write(data.data(), data.size()); };
            const char* object = chat ? "chat.completion.chunk" : "text_completion";
            auto chunk = [&](json choice) {
              return json{{"id", g->id},
                          {"object", object},
                          {"created", g->created},
                          {"model", g->parsed.model},
                          {"choices", json::array({std::move(choice)})}};
            };
            bool ok = true;
            // Chat: the first chunk of every choice announces the role.
            if (chat)
              for (size_t c = 0; c < g->choices.size() && ok; ++c)
                ok = write(sse(chunk({{"index", c},
                                      {"delta", {{"role", "assistant"}, {"content", ""}}},
                                      {"logprobs", nullptr},
                                      {"finish_reason", nullptr}})));
            if (!chat && g->parsed.echo)
              for (size_t c = 0; c < g->choices.size() && ok; ++c)
                ok = write(sse(chunk({{"index", c},
                                      {"text", g->choices[c].text},
                                      {"logprobs", nullptr},
                                      {"finish_reason", nullptr},
                                      {"stop_reason", nullptr}})));
            auto last_write = std::chrono::steady_clock::now();
            while (ok && !all_done()) {
              std::vector<std::string> pieces;
              pump(std::chrono::milliseconds(500), [&](size_t c, const SequenceOutput& so) {
                const ChoiceState& ch = g->choices[c];
                if (so.new_text.empty() && so.new_token_ids.empty() && !so.finish_reason) return;
                json choice;
                json lp = nullptr;
                if (g->parsed.logprobs && !so.new_logprobs.empty())
                  lp = chat ? chat_logprobs_json(so.new_logprobs, g->parsed, tokenizer_.get())
                            : completion_logprobs_json(so.new_logprobs, g->parsed, tokenizer_.get(),
                                                       ch.text.size() - so.new_text.size());
                if (chat) {
                  choice = {{"index", c},
                            {"delta", {{"content", so.new_text}}},
                            {"logprobs", lp},
                            {"finish_reason", finish_json(ch)}};
                } else {
                  choice = {{"index", c},
                            {"text", so.new_text},
                            {"logprobs", lp},
                            {"finish_reason", finish_json(ch)}};
                }
                if (so.finish_reason) choice["stop_reason"] = stop_reason_json(so.stop_reason);
                json j = chunk(std::move(choice));
                if (g->parsed.continuous_usage)
                  j["usage"] = usage_json(g->prompt_tokens, g->completion_tokens, g->cached_tokens);
                pieces.push_back(sse(j));
              });
              for (const auto& p : pieces) {
                if (!(ok = write(p))) break;
                last_write = std::chrono::steady_clock::now();
              }
              if (ok && g->error) {
                ok = write(sse(error_json(500, *g->error)));
                break;
              }
              // Probe an idle connection now and then, so a vanished client is noticed and aborted.
              if (ok && std::chrono::steady_clock::now() - last_write > std::chrono::seconds(5)) {
                ok = write(": keep-alive\n\n");
                last_write = std::chrono::steady_clock::now();
              }
            }
            if (!ok) {
              abort_all();
              return false;
            }
            if (g->parsed.include_usage)
              ok = write(
                  sse({{"id", g->id},
                       {"object", object},
                       {"created", g->created},
                       {"model", g->parsed.model},
                       {"choices", json::array()},
                       {"usage", usage_json(g->prompt_tokens, g->completion_tokens, g->cached_tokens)}}));
            if (ok) ok = write("data: [DONE]\n\n");
            if (!ok) return false;
            sink.done();
            return true;
          },
          [abort_all, all_done](bool success) {
            if (!success || !all_done()) abort_all();
          });
      return;
    }
    // Non-streaming: collect, then answer once. The body is sent chunked, so an idle connection can be
    // probed with JSON whitespace (valid before the object) and a vanished client aborts its request.
    res.set_chunked_content_provider(
        "application/json",
        [this, g, pump, all_done, abort_all, finish_json, chat](size_t, httplib::DataSink& sink) {
          auto last_write = std::chrono::steady_clock::now();
          while (!all_done()) {
            pump(std::chrono::milliseconds(500), [](size_t, const SequenceOutput&) {});
            if (g->error) break;
            if (std::chrono::steady_clock::now() - last_write > std::chrono::seconds(2)) {
              if (!sink.write(" ", 1)) {
                abort_all();
                return false;
              }
              last_write = std::chrono::steady_clock::now();
            }
          }
          json body;
          if (g->error) {
            body = error_json(500, *g->error);
          } else {
            json choices = json::array();
            for (size_t c = 0; c < g->choices.size(); ++c) {
              const ChoiceState& ch = g->choices[c];
              json lp = nullptr;
              if (g->parsed.logprobs)
                lp = chat ? chat_logprobs_json(ch.logprobs, g->parsed, tokenizer_.get())
                          : completion_logprobs_json(
                                ch.logprobs, g->parsed, tokenizer_.get(),
                                g->parsed.echo ? g->parsed.prompt_texts[c / g->parsed.n].size() : 0);
              json choice;
              if (chat)
                choice = {
                    {"index", c},
                    {"message", {{"role", "assistant"}, {"content", ch.text}, {"tool_calls", json::array()}}},
                    {"logprobs", lp},
                    {"finish_reason", finish_json(ch)},
                    {"stop_reason", stop_reason_json(ch.stop_reason)}};
              else
                choice = {{"index", c},
                          {"text", ch.text},
                          {"logprobs", lp},
                          {"finish_reason", finish_json(ch)},
                          {"stop_reason", stop_reason_json(ch.stop_reason)}};
              size_t p = c / static_cast<size_t>(g->parsed.n);
              if (!g->prompt_logprobs[p].empty())
                choice["prompt_logprobs"] = prompt_logprobs_json(g->prompt_logprobs[p], tokenizer_.get());
              if (g->parsed.return_tokens_as_token_ids) choice["token_ids"] = ch.token_ids;
              choices.push_back(std::move(choice));
            }
            body = {{"id", g->id},
                    {"object", chat ? "chat.completion" : "text_completion"},
                    {"created", g->created},
                    {"model", g->parsed.model},
                    {"choices", choices},
                    {"usage", usage_json(g->prompt_tokens, g->completion_tokens, g->cached_tokens)}};
          }
          std::string text = body.dump(-1, ' ', false, json::error_handler_t::replace);
          if (!sink.write(text.data(), text.size())) return false;
          sink.done();
          return true;
        },
        [abort_all, all_done](bool success) {
          if (!success || !all_done()) abort_all();
        });
  };

  s.Post("/v1/completions", [=](const httplib::Request& req, httplib::Response& res) {
    ordered_json body = parse_body(req);
    generate(req, res, parse_completion(json::parse(body.dump()), context()));
  });
  s.Post("/v1/chat/completions", [=](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, parse_chat(parse_body(req), context()));
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    int64_t created = static_cast<int64_t>(std::time(nullptr));
    json data = json::array();
    for (const auto& name : config_.served_model_names)
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "polylora"},
                      {"root", config_.model_root.empty() ? name : config_.model_root},
                      {"parent", nullptr},
                      {"max_model_len", engine_.max_model_len()}});
    for (const auto& a : engine_.snapshot().adapters)
      data.push_back({{"id", a.name},
                      {"object", "model"},
                      {"created", created},
                      {"owned_by", "polylora"},
                      {"root", a.path},
                      {"parent", config_.served_model_names.front()},
                      {"max_model_len", engine_.max_model_len()}});
    res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
  });

  auto runtime_lora_check = [this]() {
    if (!config_.allow_runtime_lora_updating)
      fail_with(ErrorKind::kNotFound,
                "runtime LoRA loading is disabled; start the server with --enable-lora-runtime-updating");
  };
  s.Post("/v1/load_lora_adapter", [=](const httplib::Request& req, httplib::Response& res) {
    runtime_lora_check();
    json body = json::parse(parse_body(req).dump());
    if (!body.is_object() || !body.contains("lora_name") || !body["lora_name"].is_string() ||
        body["lora_name"].get<std::string>().empty())
      fail("'lora_name' (a non-empty string) is required");
    if (!body.contains("lora_path") || !body["lora_path"].is_string())
      fail("'lora_path' (a string) is required");
    std::string name = body["lora_name"].get<std::string>(), path = body["lora_path"].get<std::string>();
    for (const auto& served : config_.served_model_names)
      if (served == name) fail("'{}' is the base model's name; choose another adapter name", name);
    if (engine_.has_adapter(name)) fail("The lora adapter '{}' has already been loaded.", name);
    if (config_.lora_allowed_dirs.empty())
      fail("loading adapters at run time needs --lora-allowed-dirs; no directory is allowed");
    std::error_code ec;
    fs::path real = fs::weakly_canonical(fs::path(path), ec);
    bool allowed = false;
    if (!ec) {
      for (const auto& dir : config_.lora_allowed_dirs) {
        fs::path base = fs::weakly_canonical(fs::path(dir), ec);
        if (ec) continue;
        auto rel = real.lexically_relative(base);
        if (!rel.empty() && rel.native().rfind("..", 0) != 0 && !rel.is_absolute()) allowed = true;
      }
    }
    if (!allowed)
      fail(
          "lora_path '{}' is outside the directories allowed by --lora-allowed-dirs (symbolic links and '..' "
          "are "
          "resolved before the check)",
          path);
    auto adapter = load_peft_adapter(real.string(), name, engine_.model_config(), lora_limits_);
    adapter->path = path;
    engine_.add_adapter(std::move(adapter));
    spdlog::info("loaded adapter '{}' from {}", name, real.string());
    res.set_content("Success: LoRA adapter '" + name + "' added successfully.", "text/plain");
  });
  s.Post("/v1/unload_lora_adapter", [=](const httplib::Request& req, httplib::Response& res) {
    runtime_lora_check();
    json body = json::parse(parse_body(req).dump());
    if (!body.is_object() || !body.contains("lora_name") || !body["lora_name"].is_string())
      fail("'lora_name' (a string) is required");
    std::string name = body["lora_name"].get<std::string>();
    if (!engine_.remove_adapter(name))
      fail_with(ErrorKind::kNotFound, "The lora adapter '{}' cannot be found.", name);
    res.set_content("Success: LoRA adapter '" + name + "' removed successfully.", "text/plain");
  });

  s.Post("/tokenize", [=](const httplib::Request& req, httplib::Response& res) {
    ordered_json body = parse_body(req);
    if (!tokenizer_) fail("this server has no tokenizer");
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
      ParsedRequest p = parse_chat(body, context());
      ids = p.prompts.front().prompt_ids;
    } else {
      if (!body.contains("prompt") || !body["prompt"].is_string())
        fail("'prompt' (a string) or 'messages' is required");
      bool add_special = body.contains("add_special_tokens") && body["add_special_tokens"].is_boolean()
                             ? body["add_special_tokens"].get<bool>()
                             : true;
      ids = tokenizer_->encode(body["prompt"].get<std::string>(), add_special);
    }
    json out = {{"count", ids.size()}, {"max_model_len", engine_.max_model_len()}, {"tokens", ids}};
    if (body.contains("return_token_strs") && body["return_token_strs"] == true) {
      json strs = json::array();
      for (int32_t id : ids) strs.push_back(tokenizer_->id_to_token(id));
      out["token_strs"] = strs;
    } else {
      out["token_strs"] = nullptr;
    }
    res.set_content(out.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  });
  s.Post("/detokenize", [=](const httplib::Request& req, httplib::Response& res) {
    json body = json::parse(parse_body(req).dump());
    if (!tokenizer_) fail("this server has no tokenizer");
    if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
      fail("'tokens' (a list of token ids) is required");
    std::vector<int32_t> ids;
    for (const auto& v : body["tokens"]) {
      if (!v.is_number_integer()) fail("'tokens' must hold integer token ids");
      int64_t id = v.get<int64_t>();
      if (id < 0 || id >= engine_.model_config().vocab_size)
        fail("'tokens': token id {} is outside the vocabulary", id);
      ids.push_back(static_cast<int32_t>(id));
    }
    res.set_content(
        json{{"prompt", tokenizer_->decode(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
        "application/json");
  });
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.status = 200; });
  s.Get("/version", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(json{{"version", POLYLORA_VERSION_STRING}}.dump(), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(engine_.snapshot(), config_.served_model_names.front()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  // The browser playground (web/, built by `npm run build` into web/dist): static files at / from
  // --web-root, without authentication (its API calls carry the key). Files are matched before the routes
  // above; a path that is no file falls through to them. Without a built playground, / says how to build it.
  bool playground = !config_.web_root.empty() && fs::exists(fs::path(config_.web_root) / "index.html") &&
                    s.set_mount_point("/", config_.web_root);
  if (playground) spdlog::info("playground: serving {} at /", config_.web_root);
  s.Get("/", [this](const httplib::Request&, httplib::Response& res) {
    std::string where =
        config_.web_root.empty() ? std::string("(disabled: --web-root '')") : config_.web_root;
    res.set_content(
        "<!doctype html><meta charset=utf-8><title>polylora</title><h1>polylora</h1>"
        "<p>The browser playground is not built: no <code>index.html</code> in <code>" +
            where +
            "</code>.</p><p>Build it with <code>npm ci &amp;&amp; npm run build</code> in the repository's "
            "<code>web/</code> folder (or <code>./scripts/build_web.sh</code>), or point "
            "<code>--web-root</code> at a built copy. The OpenAI API is at <code>/v1</code>.</p>",
        "text/html; charset=utf-8");
  });
}

}  // namespace polylora::server
