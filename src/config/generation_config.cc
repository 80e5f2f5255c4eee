// config/generation_config.cc: generation_config.json defaults.
#include "config/generation_config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/error.h"

namespace polylora {
namespace {

using nlohmann::json;

void read_fields(const json& j, GenerationDefaults& d, const std::string& source, bool is_override) {
  if (!j.is_object()) fail("{}: expected a JSON object", source);
  auto number = [&](const char* key, std::optional<double>& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number()) fail("{}: '{}' must be a number, got {}", source, key, j[key].dump());
    out = j[key].get<double>();
  };
  auto integer = [&](const char* key, std::optional<int64_t>& out) {
    if (!j.contains(key) || j[key].is_null()) return;
    if (!j[key].is_number_integer()) fail("{}: '{}' must be an integer, got {}", source, key, j[key].dump());
    out = j[key].get<int64_t>();
  };
  number("temperature", d.temperature);
  number("top_p", d.top_p);
  integer("top_k", d.top_k);
  number("min_p", d.min_p);
  number("repetition_penalty", d.repetition_penalty);
  integer("max_new_tokens", d.max_tokens);
  if (is_override) integer("max_tokens", d.max_tokens);
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    std::vector<int64_t> ids;
    if (e.is_number_integer()) {
      ids.push_back(e.get<int64_t>());
    } else if (e.is_array()) {
      for (const json& v : e) {
        if (!v.is_number_integer()) fail("{}: 'eos_token_id' must be an id or a list of ids", source);
        ids.push_back(v.get<int64_t>());
      }
    } else {
      fail("{}: 'eos_token_id' must be an id or a list of ids", source);
    }
    d.eos_token_ids = std::move(ids);
  }
}

}  // namespace

std::string GenerationDefaults::describe() const {
  json j = json::object();
  if (temperature) j["temperature"] = *temperature;
  if (top_p) j["top_p"] = *top_p;
  if (top_k) j["top_k"] = *top_k;
  if (min_p) j["min_p"] = *min_p;
  if (repetition_penalty) j["repetition_penalty"] = *repetition_penalty;
  if (max_tokens) j["max_tokens"] = *max_tokens;
  if (!eos_token_ids.empty()) j["eos_token_id"] = eos_token_ids;
  return j.dump();
}

GenerationDefaults GenerationDefaults::from_json(const std::string& json_text, const std::string& source) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) fail("{}: not valid JSON", source);
  GenerationDefaults d;
  read_fields(j, d, source, false);
  return d;
}

void GenerationDefaults::apply_override(const std::string& json_text) {
  if (json_text.empty()) return;
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) fail("--override-generation-config: not valid JSON: {}", json_text);
  read_fields(j, *this, "--override-generation-config", true);
}

GenerationDefaults load_generation_defaults(const std::string& mode, const std::string& model_dir,
                                            const std::string& override_json) {
  namespace fs = std::filesystem;
  GenerationDefaults d;
  const bool is_model_file = mode.empty() || mode == "auto" || mode == "vllm";
  fs::path file = fs::path(is_model_file ? model_dir : mode) / "generation_config.json";
  if (fs::exists(file)) {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    d = GenerationDefaults::from_json(ss.str(), file.string());
  } else if (!is_model_file) {
    fail(
        "--generation-config {}: no generation_config.json there (use auto, vllm or a directory holding one)",
        mode);
  }
  if (mode == "vllm") {  // vLLM still reads the model's file for its special tokens, not for defaults
    GenerationDefaults eos_only;
    eos_only.eos_token_ids = std::move(d.eos_token_ids);
    d = std::move(eos_only);
  }
  d.apply_override(override_json);
  return d;
}

}  // namespace polylora
