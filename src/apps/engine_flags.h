// apps/engine_flags.h: the one place command-line flags become configuration: model loading flags
// (--model, --tokenizer, --device, --dtype, --load-format, adapters) and the engine flags (vLLM's names),
// shared by `generate` and `serve`, plus building the Engine from them.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "config/engine_config.h"
#include "engine/engine.h"

namespace polylora::apps {

struct ModelFlags {
  std::string model_dir;
  std::string tokenizer_dir;  // empty: the model directory when it has a tokenizer
  std::string device = "auto";
  std::string dtype = "auto";
  std::string load_format = "auto";
  std::vector<std::string> loras;  // NAME=DIR
};

void add_model_flags(CLI::App& app, ModelFlags& flags, bool model_required);
void add_engine_flags(CLI::App& app, EngineConfig& config);

struct LoadedEngine {
  std::shared_ptr<Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;  // may be null
  std::unique_ptr<Engine> engine;
};
// Loads the model, tokenizer and adapters and builds the engine; logs what it did.
LoadedEngine load_engine(const ModelFlags& flags, const EngineConfig& config);

}  // namespace polylora::apps
