// server/admin_api.cc: tokenize / detokenize / adapter load and unload request bodies (see the header).
#include "server/admin_api.h"

#include "common/error.h"
#include "common/utf8.h"

namespace polylora::server {

using json = nlohmann::ordered_json;

namespace {

const std::string* string_field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || !it->is_string()) return nullptr;
  return it->get_ptr<const std::string*>();
}

void require_object(const json& body) {
  if (!body.is_object()) fail("the request body must be a JSON object");
}

}  // namespace

TokenizeResult tokenize_request(const json& body, const ParseContext& ctx) {
  require_object(body);
  check_model(body, ctx);
  if (!ctx.tokenizer) fail("this server has no tokenizer");
  TokenizeResult out;
  if (body.contains("messages")) {
    json chat = body;  // /tokenize's own field is not a chat completion field
    chat.erase("return_token_strs");
    ParsedRequest p = parse_chat(chat, ctx);
    out.ids = p.prompts.front().prompt_ids;
  } else {
    const std::string* prompt = string_field(body, "prompt");
    if (!prompt) fail("'prompt' (a string) or 'messages' is required");
    bool add_special = true;
    if (auto it = body.find("add_special_tokens"); it != body.end() && !it->is_null()) {
      if (!it->is_boolean()) fail("'add_special_tokens' must be a boolean");
      add_special = it->get<bool>();
    }
    out.ids = ctx.tokenizer->encode(*prompt, add_special);
  }
  if (auto it = body.find("return_token_strs"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) fail("'return_token_strs' must be a boolean");
    out.return_token_strs = it->get<bool>();
  }
  return out;
}

std::vector<int32_t> detokenize_request(const json& body, const ParseContext& ctx) {
  require_object(body);
  check_model(body, ctx);
  const int64_t vocab_size = ctx.vocab_size;
  auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) fail("'tokens' (a list of token ids) is required");
  std::vector<int32_t> ids;
  ids.reserve(tokens->size());
  for (const auto& v : *tokens) {
    if (!v.is_number_integer()) fail("'tokens' must hold integer token ids");
    bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                           : v.get<int64_t>() >= 0 && v.get<int64_t>() < vocab_size;
    if (!in_range) fail("'tokens': token id {} is outside the vocabulary (size {})", v.dump(), vocab_size);
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

LoadAdapterRequest load_adapter_request(const json& body) {
  require_object(body);
  const std::string* name = string_field(body, "lora_name");
  if (!name || name->empty()) fail("'lora_name' (a non-empty string) is required");
  const std::string* path = string_field(body, "lora_path");
  if (!path || path->empty()) fail("'lora_path' (a non-empty string) is required");
  for (const std::string* s : {name, path})
    if (s->find('\0') != std::string::npos)
      fail("'lora_name' and 'lora_path' must not contain NUL characters");
  if (name->size() > 256) fail("'lora_name' is {} bytes long; at most 256 are allowed", name->size());
  return {*name, *path};
}

std::string unload_adapter_request(const json& body) {
  require_object(body);
  const std::string* name = string_field(body, "lora_name");
  if (!name) fail("'lora_name' (a string) is required");
  return *name;
}

}  // namespace polylora::server
