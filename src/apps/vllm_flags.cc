// apps/vllm_flags.cc: see vllm_flags.h.
#include "apps/vllm_flags.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/log.h"
#include "config/cli_values.h"

namespace polylora::apps {
namespace {

struct Ignored {
  const char* name;   // long flag
  bool takes_value;   // false: a plain switch
  std::vector<const char*> honoured;  // values polylora matches (empty: any value)
  const char* why;    // why it is not needed / what polylora does instead
};

const std::vector<Ignored>& ignored_table() {
  static const std::vector<Ignored> t = {
      {"--trust-remote-code", false, {}, "polylora runs its own implementations of the supported architectures"},
      {"--disable-custom-all-reduce", false, {}, "polylora runs on one GPU"},
      {"--disable-frontend-multiprocessing", false, {}, "the HTTP server and engine share one process"},
      {"--disable-async-output-proc", false, {}, "no separate output process"},
      {"--disable-uvicorn-access-log", false, {}, "there is no uvicorn"},
      {"--disable-fastapi-docs", false, {}, "there is no FastAPI"},
      {"--use-v2-block-manager", false, {}, "there is one block manager"},
      {"--swap-space", true, {}, "preempted requests are recomputed, never swapped to CPU memory"},
      {"--tokenizer-mode", true, {"auto", "hf", "slow", "fast"}, "tokenizer.json is always used"},
      {"--download-dir", true, {}, "polylora does not download"},
      {"--hf-token", true, {}, "polylora does not download"},
      {"--code-revision", true, {}, "no remote code"},
      {"--tokenizer-revision", true, {}, "the tokenizer is read from the resolved model (or --tokenizer) directory"},
      {"--distributed-executor-backend", true, {}, "polylora runs on one GPU in one process"},
      {"--max-num-partial-prefills", true, {}, "chunked prefill is scheduled by the token budget"},
      {"--max-long-partial-prefills", true, {}, "chunked prefill is scheduled by the token budget"},
      {"--long-prefill-token-threshold", true, {}, "chunked prefill is scheduled by the token budget"},
      {"--worker-cls", true, {}, "there is one worker implementation"},
      {"--max-seq-len-to-capture", true, {}, "see --cuda-graph-max-context"},
      {"--max-parallel-loading-workers", true, {}, "the staged loader picks its reader threads"},
      {"--compilation-config", true, {}, "CUDA graphs are controlled by --enforce-eager / --cuda-graph-sizes"},
      {"--num-scheduler-steps", true, {"1"}, "one scheduling step per forward pass"},
      {"--tensor-parallel-size", true, {"1"}, "polylora runs on one GPU (no tensor parallelism yet)"},
      {"--pipeline-parallel-size", true, {"1"}, "polylora runs on one GPU (no pipeline parallelism)"},
      {"--data-parallel-size", true, {"1"}, "run several polylora servers behind a load balancer instead"},
      {"--kv-cache-dtype", true, {"auto"}, "the KV cache is stored in the compute dtype (no fp8 KV cache)"},
      {"--cpu-offload-gb", true, {"0"}, "weights are not offloaded to CPU memory"},
      {"--lora-dtype", true, {"auto"}, "adapters are stored in the compute dtype"},
      {"--quantization", true, {"none", "mxfp4"},
       "quantized checkpoints other than GPT-OSS's MXFP4 experts (read from config.json) are not supported"},
  };
  return t;
}

}  // namespace

void add_ignored_vllm_flags(CLI::App& app, IgnoredFlags& flags) {
  for (const Ignored& ig : ignored_table()) {
    std::string name = ig.name;
    if (ig.takes_value) {
      app.add_option_function<std::string>(
             name, [&flags, name](const std::string& v) { flags.given[name] = v; },
             std::string("(vLLM; not needed here: ") + ig.why + ")")
          ->group("vLLM flags without a use here");
    } else {
      app.add_flag_function(
             name, [&flags, name](int64_t) { flags.given[name] = ""; },
             std::string("(vLLM; not needed here: ") + ig.why + ")")
          ->group("vLLM flags without a use here");
    }
  }
}

void check_ignored_vllm_flags(const IgnoredFlags& flags) {
  for (const Ignored& ig : ignored_table()) {
    auto it = flags.given.find(ig.name);
    if (it == flags.given.end()) continue;
    const std::string& v = it->second;
    if (!ig.honoured.empty()) {
      bool ok = false;
      for (const char* h : ig.honoured) ok = ok || v == h;
      if (!ok) {
        std::string allowed;
        for (const char* h : ig.honoured) allowed += std::string(allowed.empty() ? "" : ", ") + h;
        fail("{} {}: polylora cannot honour this value: {} (accepted: {})", ig.name, v, ig.why, allowed);
      }
    }
    spdlog::info("{}{}{}: accepted for vLLM compatibility, not needed here ({})", ig.name, v.empty() ? "" : " ",
                 v, ig.why);
  }
}

std::vector<std::string> expand_vllm_argv(int argc, char** argv, const CLI::App& app) {
  std::vector<std::string> args(argv + 1, argv + argc);
  args = normalize_vllm_args(std::move(args));
  std::vector<std::string> out{argc > 0 ? argv[0] : "polylora"};
  std::set<std::string> given;
  for (const std::string& a : args)
    if (a.rfind("--", 0) == 0) {
      std::string key = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
      given.insert(key);
      if (key.rfind("no-", 0) == 0) given.insert(key.substr(3));
    }
  for (size_t i = 0; i < args.size(); ++i) {
    std::string file;
    if (args[i] == "--config") {
      if (i + 1 >= args.size()) fail("--config: expected a YAML file");
      file = args[++i];
    } else if (args[i].rfind("--config=", 0) == 0) {
      file = args[i].substr(9);
    } else {
      out.push_back(args[i]);
      continue;
    }
    std::ifstream in(file);
    if (!in) fail("--config {}: cannot read the file", file);
    std::stringstream ss;
    ss << in.rdbuf();
    auto entries = parse_flat_yaml(ss.str(), file);
    auto cfg = config_to_args(
        entries, [&](const std::string& key) { return given.count(key) > 0; },
        [&](const std::string& key) { return app.get_option_no_throw("--no-" + key) != nullptr; });
    spdlog::info("--config {}: {} setting(s)", file, entries.size());
    out.insert(out.end(), cfg.begin(), cfg.end());
  }
  return out;
}

void parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> rev(args.begin() + 1, args.end());
  std::reverse(rev.begin(), rev.end());
  app.parse(rev);
}

}  // namespace polylora::apps
