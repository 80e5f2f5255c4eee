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
  bool takes_value;   // false: a plain switch (its --no- form is accepted too)
  std::vector<const char*> honoured;  // values polylora matches (empty: any value)
  const char* why;    // why it is not needed / what polylora does instead
  bool refused = false;  // any use is an error (the feature does not exist here)
};

// vLLM's `vllm serve` flags (vllm/entrypoints/openai/cli_args.py, vllm/engine/arg_utils.py) with no
// meaning here. Flags with one are defined by cmd_serve.cc / engine_flags.cc.
const std::vector<Ignored>& ignored_table() {
  static const std::vector<Ignored> t = {
      // Model and loading.
      {"--trust-remote-code",
       false,
       {},
       "polylora runs its own implementations of the supported architectures"},
      {"--tokenizer-mode", true, {"auto", "hf", "slow", "fast"}, "tokenizer.json is always used"},
      {"--download-dir", true, {}, "polylora does not download"},
      {"--hf-token", true, {}, "polylora does not download"},
      {"--code-revision", true, {}, "no remote code"},
      {"--tokenizer-revision",
       true,
       {},
       "the tokenizer is read from the resolved model (or --tokenizer) directory"},
      {"--config-format", true, {"auto", "hf"}, "config.json is read in Hugging Face's format"},
      {"--model-impl", true, {"auto", "vllm"}, "polylora has one implementation of each architecture"},
      {"--runner", true, {"auto", "generate"}, "polylora serves generative models only"},
      {"--convert", true, {"auto", "none"}, "polylora serves generative models only"},
      {"--task", true, {"auto", "generate"}, "polylora serves generative models only"},
      {"--hf-config-path", true, {}, "config.json is read from the model directory", true},
      {"--hf-overrides", true, {"{}"}, "config.json is used as it is"},
      {"--rope-scaling", true, {"{}"}, "RoPE follows config.json"},
      {"--rope-theta", true, {}, "RoPE follows config.json", true},
      {"--override-attention-dtype", true, {}, "attention runs in the compute dtype", true},
      {"--skip-tokenizer-init",
       false,
       {},
       "polylora needs the tokenizer (stop strings, chat templates)",
       true},
      {"--enable-prompt-embeds", false, {}, "prompts are text or token ids (no prompt embeddings)", true},
      {"--max-parallel-loading-workers", true, {}, "the staged loader picks its reader threads"},
      {"--model-loader-extra-config", true, {}, "the staged loader has no extra settings"},
      {"--ignore-patterns", true, {}, "only *.safetensors files are read"},
      {"--use-tqdm-on-load", false, {}, "loading progress is logged per shard"},
      {"--pt-load-map-location", true, {}, "only safetensors checkpoints are read"},
      {"--safetensors-load-strategy", true, {}, "the staged loader reads shards in parallel"},
      {"--tokenizer-pool-size", true, {}, "tokenization runs on the HTTP worker threads"},
      {"--tokenizer-pool-type", true, {}, "tokenization runs on the HTTP worker threads"},
      {"--tokenizer-pool-extra-config", true, {}, "tokenization runs on the HTTP worker threads"},
      {"--logprobs-mode", true, {"raw_logprobs"}, "logprobs are those of the raw model output"},
      {"--disable-sliding-window", false, {}, "sliding-window layers follow config.json", true},
      {"--disable-cascade-attn", false, {}, "there is no cascade attention"},
      {"--logits-processor-pattern", true, {}, "no logits processors are loaded"},
      {"--logits-processors", true, {}, "custom logits processors (Python classes) cannot be loaded", true},
      {"--generation-config-path", true, {}, "use --generation-config DIR", true},
      // Multimodal (polylora serves text-only models).
      {"--limit-mm-per-prompt", true, {}, "text-only models"},
      {"--mm-processor-kwargs", true, {}, "text-only models"},
      {"--mm-processor-cache-gb", true, {}, "text-only models"},
      {"--disable-mm-preprocessor-cache", false, {}, "text-only models"},
      {"--mm-encoder-tp-mode", true, {}, "text-only models"},
      {"--interleave-mm-strings", false, {}, "text-only models"},
      {"--skip-mm-profiling", false, {}, "text-only models"},
      {"--media-io-kwargs", true, {}, "text-only models"},
      {"--allowed-local-media-path", true, {}, "text-only models"},
      {"--allowed-media-domains", true, {}, "text-only models"},
      {"--disable-chunked-mm-input", false, {}, "text-only models"},
      // Cache and memory.
      {"--swap-space", true, {}, "preempted requests are recomputed, never swapped to CPU memory"},
      {"--calculate-kv-scales", false, {}, "there is no fp8 KV cache to scale"},
      {"--cpu-offload-gb", true, {"0"}, "weights are not offloaded to CPU memory"},
      {"--kv-offloading-size", true, {}, "the KV cache is not offloaded to CPU memory", true},
      {"--kv-offloading-backend", true, {}, "the KV cache is not offloaded to CPU memory", true},
      {"--prefix-caching-hash-algo", true, {}, "prefix blocks are hashed with polylora's own 64-bit hash"},
      {"--kv-sharing-fast-prefill", false, {}, "no cross-layer KV sharing"},
      {"--mamba-cache-dtype", true, {}, "no Mamba layers"},
      {"--mamba-ssm-cache-dtype", true, {}, "no Mamba layers"},
      {"--disable-hybrid-kv-cache-manager", false, {}, "there is one KV cache manager"},
      {"--kv-cache-memory-bytes", true, {}, "use --num-kv-blocks (or --gpu-memory-utilization)", true},
      {"--enable-sleep-mode", false, {}, "there are no sleep / wake-up endpoints", true},
      {"--use-v2-block-manager", false, {}, "there is one block manager"},
      // Parallelism and distribution.
      {"--pipeline-parallel-size", true, {"1"}, "polylora runs on one GPU (no pipeline parallelism)"},
      {"--data-parallel-size", true, {"1"}, "run several polylora servers behind a load balancer instead"},
      {"--decode-context-parallel-size", true, {"1"}, "polylora runs on one GPU (no context parallelism)"},
      {"--data-parallel-rank", true, {"0"}, "one polylora server per GPU"},
      {"--data-parallel-start-rank", true, {"0"}, "one polylora server per GPU"},
      {"--data-parallel-size-local", true, {"1"}, "one polylora server per GPU"},
      {"--data-parallel-address", true, {}, "one polylora server per GPU"},
      {"--data-parallel-rpc-port", true, {}, "one polylora server per GPU"},
      {"--data-parallel-backend", true, {}, "one polylora server per GPU"},
      {"--data-parallel-hybrid-lb", false, {}, "one polylora server per GPU"},
      {"--data-parallel-external-lb", false, {}, "one polylora server per GPU"},
      {"--nnodes", true, {"1"}, "polylora runs on one node"},
      {"--node-rank", true, {"0"}, "polylora runs on one node"},
      {"--master-addr", true, {}, "polylora runs on one node"},
      {"--master-port", true, {}, "polylora runs on one node"},
      {"--enable-eplb",
       false,
       {},
       "no expert load balancing (--enable-expert-parallel spreads the experts evenly)"},
      {"--eplb-config",
       true,
       {},
       "no expert load balancing (--enable-expert-parallel spreads the experts evenly)"},
      {"--num-redundant-experts", true, {"0"}, "each expert lives on one rank (no redundant copies)"},
      {"--all2all-backend", true, {}, "expert parallelism uses the communicator's all_to_all_v"},
      {"--enable-dbo", false, {}, "no dual-batch overlap (it needs expert parallelism)"},
      {"--ubatch-size", true, {}, "no dual-batch overlap"},
      {"--distributed-executor-backend", true, {}, "polylora runs on one GPU in one process"},
      {"--worker-cls", true, {}, "there is one worker implementation"},
      {"--worker-extension-cls", true, {}, "workers cannot be extended with Python classes", true},
      {"--ray-workers-use-nsight", false, {}, "no Ray workers"},
      {"--disable-custom-all-reduce", false, {}, "polylora runs on one GPU"},
      {"--headless", false, {}, "the engine and the HTTP server are one process", true},
      {"--api-server-count", true, {"1"}, "one HTTP server (its I/O threads: --http-io-threads)"},
      {"--grpc", false, {}, "polylora serves HTTP only", true},
      // Scheduling and execution.
      {"--max-num-partial-prefills", true, {}, "chunked prefill is scheduled by the token budget"},
      {"--max-long-partial-prefills", true, {}, "chunked prefill is scheduled by the token budget"},
      {"--long-prefill-token-threshold", true, {}, "chunked prefill is scheduled by the token budget"},
      {"--num-lookahead-slots", true, {"0"}, "no speculative decoding"},
      {"--scheduler-delay-factor", true, {}, "steps are scheduled as soon as the previous one is queued"},
      {"--preemption-mode", true, {"recompute"}, "preempted requests are recomputed (no swapping)"},
      {"--scheduler-cls", true, {}, "the scheduler cannot be replaced by a Python class", true},
      {"--num-scheduler-steps", true, {"1"}, "one scheduling step per forward pass"},
      {"--multi-step-stream-outputs", false, {}, "one scheduling step per forward pass"},
      {"--stream-interval", true, {"1"}, "streamed responses send every token as it is generated"},
      {"--max-seq-len-to-capture", true, {}, "see --cuda-graph-max-context"},
      {"--max-cudagraph-capture-size", true, {}, "see --cuda-graph-sizes"},
      {"--compilation-config",
       true,
       {},
       "CUDA graphs are controlled by --enforce-eager / --cuda-graph-sizes"},
      {"--disable-async-output-proc", false, {}, "no separate output process"},
      {"--speculative-config", true, {}, "no speculative decoding", true},
      {"--kv-transfer-config", true, {}, "no disaggregated prefill / KV transfer", true},
      {"--kv-events-config", true, {}, "no KV cache events", true},
      {"--additional-config", true, {}, "no platform plugins"},
      // LoRA.
      {"--lora-dtype", true, {"auto"}, "adapters are stored in the compute dtype"},
      {"--lora-extra-vocab-size", true, {}, "adapters that add tokens are refused when loaded"},
      {"--long-lora-scaling-factors", true, {}, "no long-context LoRA", true},
      {"--default-mm-loras", true, {}, "text-only models"},
      {"--enable-prompt-adapter", false, {}, "no prompt adapters", true},
      // Observability.
      {"--otlp-traces-endpoint", true, {}, "no OpenTelemetry tracing", true},
      {"--collect-detailed-traces", true, {}, "no OpenTelemetry tracing"},
      {"--show-hidden-metrics-for-version", true, {}, "/metrics has no hidden metrics"},
      {"--aggregate-engine-logging", false, {}, "one engine: its stats line is the aggregate"},
      {"--enable-mfu-metrics", false, {}, "no MFU metrics"},
      {"--enable-layerwise-nvtx-tracing", false, {}, "no NVTX ranges per layer"},
      // Tool calling and structured outputs (polylora's own parsers and grammar engine).
      {"--tool-parser-plugin",
       true,
       {},
       "tool-call parsers are built in (--tool-call-parser hermes, openai, llama3_json, mistral, "
       "qwen3_coder, pythonic, llama4_pythonic), not Python plugins",
       true},
      {"--structured-outputs-config",
       true,
       {},
       "response_format, structured_outputs and guided_* run on polylora's own grammar engine (no backend "
       "to choose)"},
      {"--guided-decoding-backend",
       true,
       {},
       "response_format, structured_outputs and guided_* run on polylora's own grammar engine (no backend "
       "to choose)"},
      // Frontend.
      {"--disable-frontend-multiprocessing", false, {}, "the HTTP server and engine share one process"},
      {"--disable-fastapi-docs", false, {}, "there is no FastAPI (no /docs)"},
      {"--enable-offline-docs", false, {}, "there is no FastAPI (no /docs)"},
      {"--root-path", true, {}, "routes are served at / (root_path only changes FastAPI's docs)"},
      {"--log-config-file", true, {}, "polylora's logs are set by POLYLORA_LOG_FORMAT (text or json)"},
      {"--max-log-len", true, {}, "request logs print the prompt's length, not its text"},
      {"--enable-log-outputs", false, {}, "request logs give each request's finish reason and token counts"},
      {"--log-error-stack", false, {}, "errors are logged with their message"},
      {"--enable-prompt-tokens-details",
       false,
       {},
       "prompt_tokens_details is always given when tokens were cached"},
      {"--enable-server-load-tracking",
       false,
       {},
       "no /load endpoint: see vllm:num_requests_running on /metrics"},
      {"--enable-tokenizer-info-endpoint", false, {}, "no /tokenizer_info endpoint", true},
      {"--trust-request-chat-template",
       false,
       {},
       "a request's chat_template is always accepted (it renders in the sandboxed template engine)"},
      {"--tool-server", true, {}, "no built-in tool servers (MCP)", true},
      {"--middleware", true, {}, "ASGI middleware (Python import paths) cannot be loaded", true},
      {"--uds", true, {}, "polylora listens on TCP only (--host, --port)", true},
      {"--ssl-keyfile", true, {}, "polylora serves plain HTTP: terminate TLS in a reverse proxy", true},
      {"--ssl-certfile", true, {}, "polylora serves plain HTTP: terminate TLS in a reverse proxy", true},
      {"--ssl-ca-certs", true, {}, "polylora serves plain HTTP: terminate TLS in a reverse proxy", true},
      {"--ssl-cert-reqs", true, {"0"}, "polylora serves plain HTTP: terminate TLS in a reverse proxy"},
      {"--ssl-ciphers", true, {}, "polylora serves plain HTTP: terminate TLS in a reverse proxy", true},
      {"--enable-ssl-refresh",
       false,
       {},
       "polylora serves plain HTTP: terminate TLS in a reverse proxy",
       true},
      {"--tokens-only", false, {}, "polylora serves the OpenAI endpoints", true},
      {"--fingerprint-mode", true, {}, "no system_fingerprint in responses"},
  };
  return t;
}

void add_table(CLI::App& app, const std::vector<Ignored>& table, std::map<std::string, std::string>& given,
               const char* group) {
  for (const Ignored& ig : table) {
    std::string name = ig.name;
    if (app.get_option_no_throw(name) != nullptr) continue;  // polylora defines it (with a meaning)
    if (ig.takes_value) {
      app.add_option_function<std::string>(
             name, [&given, name](const std::string& v) { given[name] = v; },
             std::string("(vLLM; ") + (ig.refused ? "not available here: " : "not needed here: ") + ig.why + ")")
          ->group(group);
    } else {
      std::string no = "--no-" + name.substr(2);
      std::string names = app.get_option_no_throw(no) == nullptr ? name + ",!" + no : name;
      app.add_flag_function(
             names, [&given, name](int64_t n) { given[name] = n > 0 ? "" : "false"; },
             std::string("(vLLM; ") + (ig.refused ? "not available here: " : "not needed here: ") + ig.why + ")")
          ->group(group);
    }
  }
}

}  // namespace

void add_ignored_vllm_flags(CLI::App& app, IgnoredFlags& flags) {
  add_table(app, ignored_table(), flags.given, "vLLM flags without a use here");
}

void check_ignored_vllm_flags(const IgnoredFlags& flags) {
  for (const Ignored& ig : ignored_table()) {
    auto it = flags.given.find(ig.name);
    if (it == flags.given.end()) continue;
    const std::string& v = it->second;
    if (v == "false" && !ig.takes_value) continue;  // --no-<flag>: the vLLM default, nothing to do
    if (ig.refused)
      fail("{}{}{}: polylora cannot honour this flag: {}", ig.name, v.empty() ? "" : " ", v, ig.why);
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
  // argparse: a scalar flag given twice takes the last value (CLI11 would refuse it). Lists keep every value.
  for (CLI::Option* opt : app.get_options())
    if (opt->get_items_expected_max() == 1 && opt->nonpositional())
      opt->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::vector<std::string> rev(args.begin() + 1, args.end());
  std::reverse(rev.begin(), rev.end());
  app.parse(rev);
}

}  // namespace polylora::apps
