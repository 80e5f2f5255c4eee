// apps/cmd_serve.cc: `polylora serve`: the OpenAI-compatible server. Without --model it serves the
// built-in default model (models/demo when present, else the qwen3-moe-tiny fixture) with every adapter
// found in its adapters/ folder registered. SIGTERM/SIGINT: stop accepting, let running requests finish
// (up to --shutdown-timeout seconds), abort the rest, exit 0.
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "apps/command.h"
#include "apps/engine_flags.h"
#include "common/error.h"
#include "common/log.h"
#include "config/server_config.h"
#include "engine/engine_thread.h"
#include "server/http_server.h"

namespace polylora::apps {
namespace {

namespace fs = std::filesystem;
std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
}

std::string default_model_dir() {
  for (const char* rel : {"models/demo", "tests/data/models/qwen3-moe-tiny"}) {
    fs::path p = fs::path(POLYLORA_SOURCE_DIR) / rel;
    if (fs::exists(p / "config.json")) return p.string();
  }
  fail("no --model given and no built-in model found under {}", POLYLORA_SOURCE_DIR);
}

int run_serve(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible server with many LoRA adapters", "polylora serve"};
  ModelFlags mf;
  EngineConfig ec;
  ServerConfig sc;
  sc.web_root = (fs::path(POLYLORA_SOURCE_DIR) / "web/dist").string();
  add_model_flags(app, mf, false);
  add_engine_flags(app, ec);
  app.add_option("--host", sc.host)->capture_default_str();
  app.add_option("--port", sc.port)->capture_default_str();
  app.add_option("--api-key", sc.api_key, "Require this key (Authorization: Bearer) on /v1 routes");
  app.add_option("--served-model-name", sc.served_model_names, "Name(s) the base model answers to");
  app.add_flag("--enable-lora-runtime-updating", sc.allow_runtime_lora_updating,
               "Enable /v1/load_lora_adapter and /v1/unload_lora_adapter");
  app.add_option("--lora-allowed-dirs", sc.lora_allowed_dirs,
                 "Directories runtime adapter loads may read from");
  app.add_option("--chat-template", sc.chat_template, "Jinja chat template file (default: the tokenizer's)");
  app.add_option("--metrics-api-key", sc.metrics_api_key,
                 "Require this key (Authorization: Bearer) on /metrics (default: /metrics is open)");
  app.add_option("--shutdown-timeout", sc.shutdown_grace_seconds, "Seconds running requests get on SIGTERM")
      ->capture_default_str();
  // HTTP limits (no connection holds a thread; each limit is answered with a clear 4xx).
  app.add_option("--max-connections", sc.max_connections,
                 "Open HTTP connections; at the limit the idlest connection is closed")
      ->capture_default_str();
  app.add_option("--max-header-bytes", sc.max_header_bytes, "Request line + headers, bytes (431 above)")
      ->capture_default_str();
  app.add_option("--max-header-count", sc.max_header_count, "Header fields per request (431 above)")
      ->capture_default_str();
  app.add_option("--max-body-bytes", sc.max_body_bytes, "Request body as sent, bytes (413 above)")
      ->capture_default_str();
  app.add_option("--max-decompressed-body-bytes", sc.max_decompressed_body_bytes,
                 "Request body after gzip/deflate, bytes (413 above)")
      ->capture_default_str();
  app.add_option("--header-timeout", sc.header_timeout, "Seconds for a request's line and headers, in total")
      ->capture_default_str();
  app.add_option("--body-timeout", sc.body_timeout, "Seconds for a request's body, in total")
      ->capture_default_str();
  app.add_option("--timeout-keep-alive", sc.keep_alive_timeout,
                 "Seconds an idle keep-alive connection stays open")
      ->capture_default_str();
  app.add_option("--write-timeout", sc.write_timeout, "Seconds a response write may make no progress")
      ->capture_default_str();
  app.add_option("--max-json-depth", sc.max_json_depth, "Nesting depth of JSON request bodies (400 above)")
      ->capture_default_str();
  app.add_option("--max-json-keys", sc.max_json_keys, "Members of one JSON object in a request (400 above)")
      ->capture_default_str();
  app.add_option("--http-io-threads", sc.http_io_threads, "Threads serving the sockets")
      ->capture_default_str();
  app.add_option("--http-worker-threads", sc.http_worker_threads,
                 "Threads running request handlers (0: one per core, 4 to 16)")
      ->capture_default_str();
  app.add_option("--web-root", sc.web_root,
                 "Built playground (npm run build in web/), served at /; '' disables it")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (sc.api_key.empty())
    for (const char* env : {"POLYLORA_API_KEY", "VLLM_API_KEY"})
      if (const char* v = std::getenv(env)) sc.api_key = v;
  if (const char* v = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
    if (std::string(v) == "True" || std::string(v) == "true" || std::string(v) == "1")
      sc.allow_runtime_lora_updating = true;
  bool default_model = mf.model_dir.empty();
  if (default_model) {
    mf.model_dir = default_model_dir();
    fs::path adapters = fs::path(mf.model_dir) / "adapters";
    if (fs::is_directory(adapters) && mf.loras.empty())
      for (const auto& entry : fs::directory_iterator(adapters))
        if (fs::exists(entry.path() / "adapter_config.json"))
          mf.loras.push_back(entry.path().filename().string() + "=" + entry.path().string());
    std::sort(mf.loras.begin(), mf.loras.end());
    spdlog::info("no --model given: serving the built-in model {}", mf.model_dir);
  }
  if (sc.served_model_names.empty())
    sc.served_model_names.push_back(default_model ? fs::path(mf.model_dir).filename().string()
                                                  : mf.model_dir);
  sc.model_root = mf.model_dir;
  LoadedEngine le = load_engine(mf, ec);
  auto tokenizer = le.tokenizer;
  EngineThread engine(std::move(le.engine));
  server::HttpServer http(sc, engine, tokenizer, {ec.lora.max_lora_rank});

  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::signal(SIGPIPE, SIG_IGN);
  // SIGTERM: stop accepting and close idle connections at once, give running requests up to
  // --shutdown-timeout, abort the rest (their clients get an error), and close everything 0.5 s later, so
  // the process exits within --shutdown-timeout + 1 s whatever clients do.
  std::thread watcher([&] {
    while (g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (g_signal.load() > 0)
      spdlog::info("signal {} received: no new requests; finishing those in flight (up to {} s)",
                   g_signal.load(), sc.shutdown_grace_seconds);
    http.begin_shutdown();
    engine.shutdown(std::chrono::seconds(sc.shutdown_grace_seconds));
    http.stop(std::chrono::milliseconds(500));
  });
  bool ok = http.listen();
  if (!ok && g_signal.load() == 0) {
    spdlog::error("cannot listen on {}:{} (in use, or not allowed)", sc.host, sc.port);
    g_signal.store(-1);
    watcher.join();
    return 1;
  }
  g_signal.store(g_signal.load() == 0 ? -1 : g_signal.load());
  watcher.join();
  spdlog::info("server stopped");
  return 0;
}

Registrar reg("serve", "OpenAI-compatible HTTP server (completions, chat, adapters, metrics)", run_serve);

}  // namespace
}  // namespace polylora::apps
