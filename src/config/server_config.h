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
  int64_t max_connections = 2048;              // --max-connections: HTTP worker threads
  int64_t shutdown_grace_seconds = 30;         // SIGTERM: time given to running requests
  std::string model_root;                      // reported as `root` in /v1/models
  std::string web_root;  // --web-root: the playground's built files, served at / (web/dist)
};

}  // namespace polylora
