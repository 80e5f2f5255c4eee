// config/server_config.h: settings of the OpenAI-compatible HTTP server, with vLLM's flag names where
// vLLM has one. Filled from flags by apps/ only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace polylora {

struct ServerConfig {
  std::string host = "0.0.0.0";                 // --host
  int port = 8000;                              // --port
  std::string api_key;                          // --api-key (also VLLM_API_KEY / POLYLORA_API_KEY)
  std::vector<std::string> served_model_names;  // --served-model-name (first is the main name)
  bool allow_runtime_lora_updating =
      false;  // --enable-lora-runtime-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING)
  std::vector<std::string> lora_allowed_dirs;  // --lora-allowed-dirs: where runtime loads may read adapters
  std::string chat_template;                   // --chat-template FILE (default: the tokenizer's)
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
  std::string web_root;             // --web-root: the playground's built files, served at / (web/dist)
};

}  // namespace polylora
