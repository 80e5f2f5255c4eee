// apps/cmd_generate.cc: `polylora generate`: greedy continuation of token-id prompts on the CPU, with
// optional LoRA adapters. Prints one line of comma-separated ids per prompt on standard output.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/backend_flags.h"
#include "apps/command.h"
#include "common/error.h"
#include "common/log.h"
#include "lora/adapter.h"
#include "model/model.h"
#include "worker/generator.h"

namespace polylora::apps {
namespace {

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      fail("--prompt-ids: '{}' is not a non-negative integer (expected e.g. 1,2,3)", item);
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

int run_generate(int argc, char** argv) {
  CLI::App app{"Greedy generation from token ids (CPU)", "polylora generate"};
  std::string model_dir, adapter, load_format = "auto", device = "auto", dtype = "auto";
  std::vector<std::string> loras, prompts;
  int64_t max_tokens = 16, max_lora_rank = 64;
  app.add_option("--model", model_dir, "Hugging Face model directory (config.json + safetensors)")->required();
  app.add_option("--lora", loras, "Adapter to load, NAME=DIR (repeatable)");
  app.add_option("--adapter", adapter, "Adapter NAME to apply to the prompts (default: base model)");
  app.add_option("--prompt-ids", prompts, "Prompt token ids, comma-separated (repeatable: one line each)")
      ->required();
  app.add_option("--max-tokens", max_tokens, "Tokens to generate")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--max-lora-rank", max_lora_rank, "Largest LoRA rank accepted")->check(CLI::PositiveNumber);
  app.add_option("--load-format", load_format, "auto | safetensors | dummy (random weights from config.json)")
      ->check(CLI::IsMember({"auto", "safetensors", "dummy"}));
  app.add_option("--device", device, "cpu | cuda | auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--dtype", dtype, "auto | bfloat16 | float32: weight and GEMM dtype on the GPU (the CPU path "
                                   "computes in float32 from the checkpoint's weights)")
      ->check(CLI::IsMember({"auto", "bfloat16", "float32"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  ModelLoadOptions opts;
  opts.load_format = load_format == "dummy" ? LoadFormat::kDummy : LoadFormat::kSafetensors;
  auto model = Model::load(model_dir, opts, make_backend(backend_options(device, dtype)));
  spdlog::info("loaded {} ({}, {} layers, {:.1f} MB of parameters) on {}", model->source(),
               model->config().model_type, model->config().num_layers,
               static_cast<double>(model->weights().num_bytes) / 1e6, model->backend().name());

  std::vector<std::shared_ptr<LoraAdapter>> adapters;
  std::vector<const LoraAdapter*> slots;
  int32_t slot = -1;
  for (const std::string& spec : loras) {
    size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      fail("--lora '{}': expected NAME=DIR", spec);
    std::string name = spec.substr(0, eq);
    for (const auto& a : adapters)
      if (a->name == name) fail("--lora: adapter name '{}' is given twice", name);
    adapters.push_back(load_peft_adapter(spec.substr(eq + 1), name, model->config(), {max_lora_rank}));
    slots.push_back(adapters.back().get());
    if (name == adapter) slot = static_cast<int32_t>(slots.size() - 1);
    spdlog::info("loaded adapter '{}' (max rank {})", name, adapters.back()->max_rank);
  }
  if (!adapter.empty() && slot < 0) {
    std::string known;
    for (const auto& a : adapters) known += (known.empty() ? "" : ", ") + a->name;
    fail("--adapter '{}' is not among the loaded adapters ({})", adapter, known.empty() ? "none loaded" : known);
  }

  std::vector<GenerateRequest> requests;
  for (const std::string& p : prompts) {
    GenerateRequest r;
    r.prompt = parse_ids(p);
    r.adapter_slot = slot;
    r.max_tokens = max_tokens;
    requests.push_back(std::move(r));
  }
  Generator gen(*model);
  auto results = gen.run(requests, slots);
  for (const auto& r : results) {
    std::string line;
    for (size_t i = 0; i < r.output.size(); ++i) line += (i ? "," : "") + std::to_string(r.output[i]);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}

Registrar reg("generate", "Greedy generation from token ids on the CPU (with LoRA adapters)", run_generate);

}  // namespace
}  // namespace polylora::apps
