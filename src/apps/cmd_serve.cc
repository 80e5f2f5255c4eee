// apps/cmd_serve.cc: `polylora serve`: the OpenAI-compatible server. Without --model it serves the
// built-in default model (models/demo when present, else the qwen3-moe-tiny fixture) with every adapter
// found in its adapters/ folder registered. SIGTERM/SIGINT: stop accepting, let running requests finish
// (up to --shutdown-timeout seconds), abort the rest, exit 0.
#include <CLI/CLI.hpp>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <unistd.h>
#include <sstream>
#include <thread>

#include "apps/command.h"
#include "apps/engine_flags.h"
#include "apps/vllm_flags.h"
#include "common/error.h"
#include "common/log.h"
#include "config/generation_config.h"
#include "config/hf_cache.h"
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

// vLLM's CORS flags take a JSON list ('["a", "b"]'); plain values are accepted too.
std::vector<std::string> cors_list(const std::vector<std::string>& given, const char* flag,
                                   std::vector<std::string> fallback) {
  if (given.empty()) return fallback;
  std::vector<std::string> out;
  for (const std::string& v : given) {
    if (!v.empty() && v.front() == '[') {
      auto j = nlohmann::json::parse(v, nullptr, false);
      if (j.is_discarded() || !j.is_array()) fail("{} '{}': not a JSON list", flag, v);
      for (const auto& x : j) {
        if (!x.is_string()) fail("{} '{}': the list must hold strings", flag, v);
        out.push_back(x.get<std::string>());
      }
    } else {
      // CLI11 splits a bracketed list itself and leaves each element's JSON quotes on; a comma list
      // (GET,POST) is split here.
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) {
        const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        if (b == std::string::npos) continue;
        item = item.substr(b, e - b + 1);
        if (item.size() >= 2 && (item.front() == '"' || item.front() == '\'') && item.back() == item.front())
          item = item.substr(1, item.size() - 2);
        out.push_back(item);
      }
    }
  }
  return out;
}

// --chat-template: a readable file is used as is; text that cannot be a path (it holds '{', '}' or a
// newline, vLLM's test) is the template itself, written to a temporary file for the server.
std::string chat_template_file(const std::string& value) {
  if (value.empty() || fs::is_regular_file(value)) return value;
  if (value.find_first_of("{}\n") == std::string::npos)
    fail("--chat-template {}: no such file (and it does not look like an inline template)", value);
  fs::path file = fs::temp_directory_path() / ("polylora-chat-template-" + std::to_string(getpid()) + ".jinja");
  std::ofstream out(file);
  out << value;
  if (!out) fail("--chat-template: cannot write the inline template to {}", file.string());
  spdlog::info("--chat-template: an inline template ({} bytes)", value.size());
  return file.string();
}

int run_serve(int argc, char** argv) {
  CLI::App app{"OpenAI-compatible server with many LoRA adapters", "polylora serve"};
  ModelFlags mf;
  EngineConfig ec;
  ServerConfig sc;
  sc.web_root = (fs::path(POLYLORA_SOURCE_DIR) / "web/dist").string();
  IgnoredFlags ignored;
  std::optional<uint64_t> seed = 0;  // vLLM V1's default: unseeded requests repeat across restarts
  bool disable_log_requests = false;
  std::vector<std::string> origins, methods, headers;
  app.add_option("model_tag", mf.model_tag, "The model (as vLLM's `serve MODEL`): same as --model");
  add_model_flags(app, mf, false);
  add_engine_flags(app, ec, mf);
  app.add_option("--config", "vLLM config file: a flat YAML of `flag-name: value` (the command line wins)");
  app.add_option(
      "--seed", seed,
      "Seeds the generators of requests that give no seed (default 0, as vLLM: the same requests in "
      "the same order sample the same tokens after a restart)");
  app.add_flag("--enable-lora,!--no-enable-lora", mf.enable_lora,
               "Accepted for vLLM compatibility: LoRA is always on");
  app.add_option("--generation-config", mf.generation_config,
                 "auto: defaults and EOS ids from the model's generation_config.json; vllm: ignore it; DIR: "
                 "read DIR/generation_config.json")
      ->capture_default_str();
  app.add_option("--override-generation-config", mf.override_generation_config,
                 "JSON over the generation config, e.g. '{\"temperature\": 0.5}'");
  app.add_flag("--enable-log-requests,!--no-enable-log-requests", sc.enable_log_requests, "Log every request");
  app.add_flag("--disable-log-requests", disable_log_requests, "No request logs (the default; vLLM's old flag)");
  app.add_flag("--disable-log-stats,!--no-disable-log-stats", sc.disable_log_stats, "No periodic stats line");
  app.add_option("--log-stats-interval", sc.log_stats_interval, "Seconds between stats lines")
      ->capture_default_str();
  app.add_option("--uvicorn-log-level", sc.uvicorn_log_level, "Log level of the HTTP server's access log")
      ->check(CLI::IsMember({"critical", "error", "warning", "info", "debug", "trace"}))
      ->capture_default_str();
  app.add_flag("--enable-request-id-headers,!--no-enable-request-id-headers", sc.enable_request_id_headers,
               "X-Request-Id on every response");
  app.add_option("--response-role", sc.response_role, "Role of generated chat messages")->capture_default_str();
  app.add_flag("--enable-auto-tool-choice,!--no-enable-auto-tool-choice", sc.enable_auto_tool_choice,
               "tool_choice \"auto\": parse tool calls out of the output (needs --tool-call-parser)");
  app.add_option("--tool-call-parser", sc.tool_call_parser,
                 "Tool-call format: hermes, openai, llama3_json, mistral, qwen3_coder");
  app.add_option("--chat-template-content-format", sc.chat_template_content_format,
                 "Message content as the template gets it: auto (detected from the template), string (text "
                 "parts joined) or openai (a list of {\"type\": \"text\", \"text\"} parts)")
      ->check(CLI::IsMember({"auto", "string", "openai"}))
      ->capture_default_str();
  app.add_flag("--exclude-tools-when-tool-choice-none,!--no-exclude-tools-when-tool-choice-none",
               sc.exclude_tools_when_tool_choice_none,
               "With tool_choice \"none\" the chat template gets no tools");
  app.add_option("--reasoning-parser", sc.reasoning_parser,
                 "Reasoning format: qwen3 or deepseek_r1 (<think>), openai_gptoss (harmony channels)");
  app.add_flag("--return-tokens-as-token-ids,!--no-return-tokens-as-token-ids", sc.return_tokens_as_token_ids,
               "Logprob tokens as 'token_id:N' (tokens that are not valid UTF-8 stay identifiable)");
  app.add_option("--allowed-origins", origins, "CORS origins: a JSON list or values (default [\"*\"])");
  app.add_option("--allowed-methods", methods, "CORS methods: a JSON list or values (default [\"*\"])");
  app.add_option("--allowed-headers", headers, "CORS headers: a JSON list or values (default [\"*\"])");
  app.add_flag("--allow-credentials,!--no-allow-credentials", sc.allow_credentials,
               "CORS: allow credentials (default off)");
  app.add_flag("--disable-uvicorn-access-log,!--no-disable-uvicorn-access-log", sc.disable_uvicorn_access_log,
               "No HTTP access log lines");
  app.add_option("--disable-access-log-for-endpoints", sc.disable_access_log_for_endpoints,
                 "Paths without access log lines, comma-separated (e.g. /health,/metrics)");
  app.add_flag("--enable-force-include-usage,!--no-enable-force-include-usage", sc.enable_force_include_usage,
               "Usage at the end of every streamed response, whatever stream_options.include_usage says");
  app.add_option("--default-chat-template-kwargs", sc.default_chat_template_kwargs,
                 "JSON object of chat template variables; a request's chat_template_kwargs win");
  app.add_option("--host", sc.host)->capture_default_str();
  app.add_option("--port", sc.port)->capture_default_str();
  app.add_option(
      "--api-key", sc.api_keys,
      "Require one of these keys (Authorization: Bearer) on the /v1 routes, /tokenize, /detokenize, "
      "/invocations and the admin routes");
  app.add_option("--served-model-name", sc.served_model_names, "Name(s) the base model answers to");
  app.add_flag("--enable-lora-runtime-updating,!--no-enable-lora-runtime-updating",
               sc.allow_runtime_lora_updating, "Enable /v1/load_lora_adapter and /v1/unload_lora_adapter");
  app.add_option("--lora-allowed-dirs", sc.lora_allowed_dirs,
                 "Directories runtime adapter loads may read from");
  app.add_option("--chat-template", sc.chat_template,
                 "Jinja chat template: a file, or the template itself (default: the tokenizer's)");
  app.add_option("--metrics-api-key", sc.metrics_api_key,
                 "Require this key (Authorization: Bearer) on /metrics (default: /metrics is open)");
  app.add_option("--shutdown-timeout", sc.shutdown_grace_seconds, "Seconds running requests get on SIGTERM")
      ->capture_default_str();
  // HTTP limits (no connection holds a thread; each limit is answered with a clear 4xx).
  app.add_option("--max-connections", sc.max_connections,
                 "Open HTTP connections; at the limit the idlest connection is closed")
      ->capture_default_str();
  app.add_option("--max-header-bytes,--h11-max-incomplete-event-size", sc.max_header_bytes,
                 "Request line + headers, bytes (431 above)")
      ->capture_default_str();
  app.add_option("--max-header-count,--h11-max-header-count", sc.max_header_count,
                 "Header fields per request (431 above)")
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
  add_ignored_vllm_flags(app, ignored);  // keep last: it skips the flags defined above
  try {
    parse_args(app, expand_vllm_argv(argc, argv, app));
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  check_ignored_vllm_flags(ignored);
  finish_model_flags(mf, ec);
  ec.seed = seed;
  if (disable_log_requests) sc.enable_log_requests = false;
  if (mf.enable_lora) spdlog::info("--enable-lora: accepted; LoRA is always enabled in polylora");
  sc.allowed_origins = cors_list(origins, "--allowed-origins", sc.allowed_origins);
  sc.allowed_methods = cors_list(methods, "--allowed-methods", sc.allowed_methods);
  sc.allowed_headers = cors_list(headers, "--allowed-headers", sc.allowed_headers);
  sc.chat_template = chat_template_file(sc.chat_template);
  if (sc.api_keys.empty())
    for (const char* env : {"VLLM_API_KEY", "POLYLORA_API_KEY"})
      if (const char* v = std::getenv(env); v != nullptr && *v != '\0') {
        sc.api_keys = {v};
        break;
      }
  for (const std::string& k : sc.api_keys)
    if (k.empty()) fail("--api-key: a key must not be empty");
  if (const char* v = std::getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"))
    if (std::string(v) == "True" || std::string(v) == "true" || std::string(v) == "1")
      sc.allow_runtime_lora_updating = true;
  // vLLM's filesystem resolver plugin: VLLM_LORA_RESOLVER_CACHE_DIR, with VLLM_PLUGINS unset (vLLM then
  // loads every plugin) or listing lora_filesystem_resolver. --lora-resolver-dir takes precedence.
  if (const char* dir = std::getenv("VLLM_LORA_RESOLVER_CACHE_DIR"); dir && *dir && ec.lora.resolver_dir.empty()) {
    const char* plugins = std::getenv("VLLM_PLUGINS");
    bool listed = plugins == nullptr;
    for (std::string_view rest = plugins ? plugins : ""; !listed && !rest.empty();) {
      size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      listed = item == "lora_filesystem_resolver";
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    if (listed) {
      ec.lora.resolver_dir = dir;
      spdlog::info("VLLM_LORA_RESOLVER_CACHE_DIR: adapters not registered are loaded on first use from {}", dir);
    }
  }
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
  for (const std::string& spec : mf.loras)
    if (LoraModuleSpec m = parse_lora_module(spec); !m.base_model_name.empty())
      sc.lora_parents[m.name] = m.base_model_name;
  {
    std::string dir = resolve_model_path(mf.model_dir, mf.revision, "model");
    sc.generation_defaults =
        load_generation_defaults(mf.generation_config, dir, mf.override_generation_config);
    ec.extra_eos_token_ids = sc.generation_defaults.eos_token_ids;
    if (!sc.generation_defaults.empty())
      spdlog::info("generation config ({}): request defaults {}", mf.generation_config,
                   sc.generation_defaults.describe());
  }
  LoadedEngine le = load_engine(mf, ec);
  auto tokenizer = le.tokenizer;
  EngineThreadOptions eto;
  eto.log_stats_interval = sc.disable_log_stats ? 0 : sc.log_stats_interval;
  eto.log_requests = sc.enable_log_requests;
  EngineThread engine(std::move(le.engine), eto);
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
