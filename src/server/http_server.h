// server/http_server.h: the OpenAI-compatible HTTP server: routes, auth, error bodies, SSE streaming,
// runtime adapter loading, tokenize/detokenize, models, health, version and Prometheus metrics.
// Talks to the engine only through EngineThread (queues in, output streams out).
// Must not: call kernels or the scheduler, or block the engine thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "config/server_config.h"
#include "engine/engine_thread.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace polylora::server {

class HttpServer {
 public:
  HttpServer(ServerConfig config, EngineThread& engine, std::shared_ptr<const tokenizer::Tokenizer> tokenizer,
             LoraLimits lora_limits);
  ~HttpServer();

  // Binds and serves until stop(); returns false when the address cannot be bound.
  bool listen();
  // Stops accepting connections and returns from listen() (safe from another thread).
  void stop();
  int bound_port() const { return bound_port_; }

 private:
  void register_routes();
  struct Impl;
  ServerConfig config_;
  EngineThread& engine_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  LoraLimits lora_limits_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<uint64_t> next_id_{1};
  int bound_port_ = 0;
  int listen_socket_ = -1;  // recorded by the socket-options hook, to raise the listen backlog
};

// Renders the engine's snapshot in the Prometheus text format, with vLLM's metric names.
std::string prometheus_text(const EngineSnapshot& snapshot, const std::string& model_name);

}  // namespace polylora::server
