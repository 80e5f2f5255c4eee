// server/http_server.h: the OpenAI-compatible HTTP server: a route table over the event-driven transport
// (server/http_transport.h), auth, error bodies, runtime adapter loading, tokenize/detokenize, models,
// health, version, Prometheus metrics and the playground's static files. Completions and chat run as a
// Generation (server/generation.h).
// Talks to the engine only through EngineThread (queues in, output streams out).
// Must not: call kernels or the scheduler, or block the engine thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "config/server_config.h"
#include "engine/engine_thread.h"
#include "server/http_transport.h"
#include "server/json_body.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace polylora::server {

class HttpServer {
 public:
  HttpServer(ServerConfig config, EngineThread& engine, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
             LoraLimits lora_limits);
  ~HttpServer();

  // Binds and serves until stop(); returns false when the address cannot be bound.
  bool listen();
  // Stops accepting; idle connections close; running requests go on (safe from any thread).
  void begin_shutdown();
  // Closes every connection after `drain` and returns from listen() (safe from any thread).
  void stop(std::chrono::milliseconds drain = std::chrono::milliseconds(500));
  int bound_port() const { return bound_port_; }

 private:
  struct Route;
  void handle(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  bool authorized(const HttpRequest& req) const;
  void serve_static(const HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  nlohmann::ordered_json body_json(const HttpRequest& req) const;
  ParseContext parse_context() const;

  void completions(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void chat_completions(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void responses(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void models(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void load_lora_adapter(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void unload_lora_adapter(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void tokenize(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void detokenize(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void health(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void version(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void metrics(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void model_by_id(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void ping(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void invocations(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void server_info(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void reset_prefix_cache(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  void start_generation(ParsedRequest parsed, const HttpRequest& req, const std::shared_ptr<HttpResponder>& res);
  nlohmann::ordered_json model_cards() const;
  // CORS (Starlette's CORSMiddleware, as vLLM configures it): headers of a simple response, and the answer
  // to a preflight (OPTIONS with Access-Control-Request-Method).
  std::vector<std::pair<std::string, std::string>> response_headers(const HttpRequest& req) const;
  bool origin_allowed(const std::string& origin) const;
  HttpResponse preflight(const HttpRequest& req) const;
  void playground_missing(HttpRequest& req, const std::shared_ptr<HttpResponder>& res);

  ServerConfig config_;
  EngineThread& engine_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  nlohmann::ordered_json default_chat_template_kwargs_;  // --default-chat-template-kwargs (null: none)
  LoraLimits lora_limits_;
  ToolParserKind tool_parser_ = ToolParserKind::kNone;            // --tool-call-parser
  ReasoningParserKind reasoning_parser_ = ReasoningParserKind::kNone;  // --reasoning-parser
  JsonLimits json_limits_;
  bool playground_ = false;
  std::unique_ptr<HttpTransport> transport_;
  int bound_port_ = 0;
};

// Renders the engine's snapshot in the Prometheus text format, with vLLM's metric names.
std::string prometheus_text(const EngineSnapshot& snapshot, const std::string& model_name);

}  // namespace polylora::server
