// server/admin_api.h: the bodies of the non-generation routes (tokenize, detokenize, runtime adapter load
// and unload) read into plain values, validated, every problem a polylora::Error (400) naming the field.
// Pure functions of the parsed JSON, so the request fuzz target runs them without a server.
// Must not: touch the engine or sockets.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_api.h"

namespace polylora::server {

struct TokenizeResult {
  std::vector<int32_t> ids;
  bool return_token_strs = false;
};
// {"prompt": str, "add_special_tokens"?} or a chat body {"messages": [...], ...}.
TokenizeResult tokenize_request(const nlohmann::ordered_json& body, const ParseContext& ctx);

// {"tokens": [ids]}: ids checked against the vocabulary.
std::vector<int32_t> detokenize_request(const nlohmann::ordered_json& body, const ParseContext& ctx);

struct LoadAdapterRequest {
  std::string name;
  std::string path;
};
// {"lora_name": non-empty str, "lora_path": non-empty str}; names and paths must be valid UTF-8 without NUL.
LoadAdapterRequest load_adapter_request(const nlohmann::ordered_json& body);
// {"lora_name": str}.
std::string unload_adapter_request(const nlohmann::ordered_json& body);

}  // namespace polylora::server
