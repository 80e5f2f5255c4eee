// config/server_config.h: settings of the OpenAI-compatible HTTP server, with vLLM's flag names where
// vLLM has one. Filled from flags by apps/ only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "config/generation_config.h"

namespace polylora {

struct ServerConfig {
  std::string host = "0.0.0.0";                 // --host
  int port = 8000;                              // --port
  std::vector<std::string> api_keys;  // --api-key KEY... (also VLLM_API_KEY / POLYLORA_API_KEY): any one
  std::vector<std::string> served_model_names;  // --served-model-name (first is the main name)
  bool allow_runtime_lora_updating =
      false;  // --enable-lora-runtime-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING)
  std::vector<std::string> lora_allowed_dirs;  // --lora-allowed-dirs: where runtime loads may read adapters
  // --chat-template FILE (default: the tokenizer's). vLLM also takes the template inline; apps/ writes an
  // inline template to a file and puts its path here, so this is always a file.
  std::string chat_template;
  std::string metrics_api_key;                 // --metrics-api-key: /metrics needs this key (else open)
  int64_t shutdown_grace_seconds = 30;         // SIGTERM: time given to running requests (--shutdown-timeout)
  // HTTP transport limits (server/http_transport.h). Connections hold no thread; at the connection limit
  // the idlest connection is shed.
  int64_t max_connections = 16384;                   // --max-connections: open connections
  int64_t max_header_bytes = 16 * 1024;              // --max-header-bytes: request line + headers
  int64_t max_header_count = 100;                    // --max-header-count
  int64_t max_body_bytes = 32ll << 20;               // --max-body-bytes: body as sent
  int64_t max_decompressed_body_bytes = 64ll << 20;  // --max-decompressed-body-bytes: after gzip/deflate
  double header_timeout = 10;       // --header-timeout: seconds for request line + headers, total
  double body_timeout = 60;         // --body-timeout: seconds for the body, total
  double keep_alive_timeout = 5;    // --timeout-keep-alive: idle seconds between requests
  double write_timeout = 60;        // --write-timeout: seconds a response write may stall
  int64_t max_json_depth = 64;      // --max-json-depth: nesting of request bodies
  int64_t max_json_keys = 10000;    // --max-json-keys: members of one JSON object
  int64_t http_io_threads = 2;      // --http-io-threads: threads serving sockets
  int64_t http_worker_threads = 0;  // --http-worker-threads: request handlers (0: cores, 4..16)
  std::string model_root;           // reported as `root` in /v1/models
  // --lora-modules' base_model_name per adapter: its `parent` in /v1/models (else the served name)
  std::map<std::string, std::string> lora_parents;
  std::string web_root;             // --web-root: the playground's built files, served at / (web/dist)

  // vLLM frontend flags (issue 18). apps/ fills them; the server's use of each is noted.
  // --generation-config / --override-generation-config: defaults for requests that omit the field
  // (temperature, top_p, top_k, min_p, repetition_penalty, max_tokens); apply where requests are parsed.
  // The EOS ids also go to EngineConfig::extra_eos_token_ids (applied by the engine).
  GenerationDefaults generation_defaults;
  bool enable_log_requests = false;       // --enable-log-requests (vLLM default off; --disable-log-requests: off)
  bool disable_log_stats = false;         // --disable-log-stats: no periodic stats line
  double log_stats_interval = 10.0;       // --log-stats-interval seconds (vLLM's VLLM_LOG_STATS_INTERVAL)
  std::string uvicorn_log_level = "info"; // --uvicorn-log-level: debug|info|warning|error|critical|trace
  bool enable_request_id_headers = false; // --enable-request-id-headers: X-Request-Id on responses
  std::string response_role = "assistant";  // --response-role: role of chat completion messages
  // --exclude-tools-when-tool-choice-none: with tool_choice "none" the chat template gets no tools (vLLM's
  // flag; by default it gets them, as in vLLM).
  bool exclude_tools_when_tool_choice_none = false;
  // --chat-template-content-format: auto (the template's own form, vLLM's detection), string or openai.
  std::string chat_template_content_format = "auto";
  bool enable_auto_tool_choice = false;  // --enable-auto-tool-choice: tool_choice "auto" parses tool calls
  std::string tool_call_parser;          // --tool-call-parser: hermes | openai | llama3_json | mistral
  std::string reasoning_parser;          // --reasoning-parser: qwen3 | openai_gptoss
  bool return_tokens_as_token_ids = false;  // --return-tokens-as-token-ids: logprob tokens as "token_id:N"
  bool disable_uvicorn_access_log = false;         // --disable-uvicorn-access-log: no access log lines
  std::string disable_access_log_for_endpoints;    // --disable-access-log-for-endpoints: "/health,/metrics"
  bool enable_force_include_usage = false;         // --enable-force-include-usage: usage in every stream
  std::string default_chat_template_kwargs;        // --default-chat-template-kwargs: a JSON object (or empty)
  // CORS (vLLM's defaults: everything allowed, no credentials).
  std::vector<std::string> allowed_origins = {"*"};  // --allowed-origins (JSON list or repeated)
  std::vector<std::string> allowed_methods = {"*"};  // --allowed-methods
  std::vector<std::string> allowed_headers = {"*"};  // --allowed-headers
  bool allow_credentials = false;                    // --allow-credentials
};

}  // namespace polylora
