// apps/vllm_flags.h: `polylora serve` takes vLLM's command line (docs/vllm-flags.md): argv normalisation
// (`--max_model_len`, `-tp 2`), `--config FILE.yaml`, and the vLLM flags with no meaning here, which are
// accepted and logged once, or refused with the reason when their value cannot be honoured.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

namespace polylora::apps {

// Values of the accepted-but-not-needed flags, by flag name (only those given).
struct IgnoredFlags {
  std::map<std::string, std::string> given;
};

// Adds the flags of the table in docs/vllm-flags.md that polylora has no use for, skipping any name already
// defined: call it after every other flag.
void add_ignored_vllm_flags(CLI::App& app, IgnoredFlags& flags);
// Logs each given ignored flag once; throws polylora::Error naming a flag whose value cannot be honoured
// (`-tp 2`, `--kv-cache-dtype fp8`, ...).
void check_ignored_vllm_flags(const IgnoredFlags& flags);

// argv[1..] normalised (normalize_vllm_args) with `--config FILE.yaml` expanded in place of itself; keys
// also given on the command line are left out (the command line wins). `app` tells which flags have a
// `--no-` form. The result includes argv[0].
std::vector<std::string> expand_vllm_argv(int argc, char** argv, const CLI::App& app);

// Parses with CLI11 from a vector of arguments (argv[0] first); a repeated scalar flag takes its last
// value, as argparse.
void parse_args(CLI::App& app, const std::vector<std::string>& args);

}  // namespace polylora::apps
