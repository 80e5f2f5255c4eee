// engine/engine.h: the serving engine: one loop of schedule -> execute -> update over many requests,
// each with its own adapter, arriving at any time.
// Owns: the scheduler (and through it the KV-cache manager), the model runner, the adapter registry,
// request validation, n > 1 fan-out, stop conditions (EOS, stop ids, max_tokens, max_model_len, stop
// strings on the detokenized text) and the per-request outputs. Used directly by the offline CLI, and
// from one engine thread by the server (engine/engine_thread.h).
// Must not: parse JSON or talk HTTP; be called from two threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/request.h"
#include "config/engine_config.h"
#include "lora/adapter.h"
#include "lora/adapter_registry.h"
#include "lora/adapter_resolver.h"
#include "model/model.h"
#include "sched/scheduler.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "worker/model_runner.h"

namespace polylora {

struct AdapterCounters {
  int64_t requests = 0;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
};

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  double kv_usage = 0;
  int64_t num_kv_blocks = 0;
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
  int64_t num_preemptions = 0;
  int64_t prompt_tokens = 0;      // total computed prompt tokens of finished + running requests
  int64_t generation_tokens = 0;  // total generated tokens
  // Every prompt token of the requests whose prefill has finished, prefix-cache hits included (vLLM's
  // vllm:prompt_tokens_total; prompt_tokens above counts computed tokens only).
  int64_t prompt_tokens_total = 0;
  std::map<std::string, AdapterCounters> adapters;  // "" = base model
  // The adapter tiers (lora/adapter_registry.h) and vLLM's lora_requests_info: adapters of running and
  // waiting requests, by name.
  AdapterRegistryStats adapter_tiers;
  std::vector<std::string> running_adapters, waiting_adapters;
  int64_t max_loras = 0;
};

class Engine {
 public:
  // tokenizer may be nullptr (then outputs carry no text and stop strings are refused).
  Engine(std::shared_ptr<Model> model, const EngineConfig& config,
         std::shared_ptr<const tokenizer::Tokenizer> tokenizer);
  // The same, with the tokenizer still being read (cold start: the start-up's workspace sizing, KV cache
  // and CUDA graph recording go on meanwhile, and so does a model's background weight load); the
  // constructor waits for both at its end (their errors are its errors).
  Engine(std::shared_ptr<Model> model, const EngineConfig& config,
         std::shared_future<std::shared_ptr<const tokenizer::Tokenizer>> tokenizer);
  ~Engine();

  // Validates and queues a request. Errors (polylora::Error): invalid sampling values (the field is
  // named), a prompt longer than max_model_len, an unknown adapter (ErrorKind::kNotFound), a full waiting
  // queue (ErrorKind::kOverloaded), a duplicate request id.
  void add_request(EngineRequest request);
  void abort(const std::string& request_id);
  // Runs one step; returns the outputs of requests that changed (finished ones last time they appear).
  // With asynchronous scheduling (on the GPU) a call queues the next step and returns the outputs of the
  // one queued by the previous call, which the GPU ran meanwhile; a request that stopped there had one
  // more token computed by the queued step, which is discarded.
  std::vector<RequestOutput> step();
  bool has_unfinished() const;
  // Between requests: finishes adapter copies that are done and starts more into empty slots (what a
  // step does first). Returns whether a copy is still under way (call again soon).
  bool idle_adapter_work();

  // Adapters (held by the AdapterRegistry). add_adapter replaces nothing: a name in use is an error. It
  // enters the host tier (the least recently used unpinned copy goes to disk when --max-cpu-loras are
  // held); `reload` reads it again from disk after an eviction (empty: from adapter->path, trusted, or,
  // with no path, never evicted). remove_adapter lets running requests of that adapter finish with it.
  // Returns false when the name is unknown.
  void add_adapter(std::shared_ptr<LoraAdapter> adapter, AdapterRegistry::Loader reload = {});
  // Registers an adapter that stays on disk (trusted `path`, read on first use; a broken one fails the
  // requests that named it).
  void add_adapter_on_disk(const std::string& name, const std::string& path);
  bool remove_adapter(const std::string& name);
  // Registered adapters, by name (those the resolver is still loading are left out).
  std::vector<AdapterEntryInfo> adapters() const;
  bool has_adapter(const std::string& name) const { return adapters_->has(name); }
  const AdapterRegistry& adapter_registry() const { return *adapters_; }

  // Loading on first use (--lora-resolver-dir, vLLM's filesystem resolver; lora/adapter_resolver.h).
  // kRegistered: a registered name (add_request takes it). kLoading: the resolver is loading it; wait
  // for take_resolutions() to report it, then add the request. kUnknown: not registered and nothing to
  // resolve (no resolver, a name that is not a plain directory name, or no DIR/<name>); add_request
  // refuses it as an unknown model (kNotFound). For a plain name that exists in DIR, the first call
  // registers it (on disk, read through the confined loader) and starts its load on the loader thread;
  // later calls for the same name while it loads return kLoading and start nothing.
  enum class AdapterLookup { kRegistered, kLoading, kUnknown };
  AdapterLookup lookup_adapter(const std::string& name);
  struct AdapterResolution {
    std::string name;
    std::optional<std::string> error;  // set: it could not be loaded (and is unregistered again, so a
                                       // later request tries anew)
  };
  // The resolver loads that ended since the last call.
  std::vector<AdapterResolution> take_resolutions();
  bool resolving() const { return !resolving_.empty(); }
  bool has_resolver() const { return resolver_.has_value(); }
  // Takes finished adapter loads and starts the next (as every step does), for a caller that waits on
  // resolver loads with no step to run.
  void poll_adapter_loads() { poll_adapters(); }
  // Runs on the loader thread after each load it finishes (to wake a thread waiting on
  // take_resolutions()); it must be quick and must not call into the engine.
  void set_adapter_load_listener(std::function<void()> listener) { adapters_->set_load_listener(std::move(listener)); }

  EngineStats stats() const;
  // Metrics: the ids of requests whose first step was queued since the last call (each once).
  std::vector<std::string> take_first_scheduled() {
    std::vector<std::string> out;
    out.swap(first_scheduled_);
    return out;
  }
  int64_t max_model_len() const { return max_model_len_; }
  int64_t num_kv_blocks() const { return num_kv_blocks_; }
  const ModelConfig& model_config() const { return model_->config(); }
  const EngineConfig& config() const { return config_; }
  const std::shared_ptr<const tokenizer::Tokenizer>& tokenizer() const { return tokenizer_; }
  // Forgets every cached prefix block (the blocks stay in use by their requests); the next requests
  // compute their prompts anew. vLLM's /reset_prefix_cache.
  void reset_prefix_cache() { scheduler_->kv().reset_prefix_cache(); }
  // For tests: the scheduler's invariants (empty when all hold).
  std::string check_invariants() const;
  // For tests: the most steps a waiting request whose adapter was ready saw later requests admitted.
  uint64_t max_passed_over_steps() const { return scheduler_->max_passed_over(); }

 private:
  struct Sequence;
  struct Group;
  void finish_sequence(Sequence& seq, FinishReason reason, std::optional<StopReason> stop_reason);
  // Structured output: the compiled grammar of a request's spec (the compiler is built from the
  // tokenizer on first use and caches by spec). Throws polylora::Error naming what is wrong.
  std::shared_ptr<const structured::CompiledGrammar> compile_grammar(const structured::GrammarSpec& spec);
  // After a step is queued: the scheduler's counts and the prompt-token counters.
  void launched(const StepPlan& plan);
  // After its results are back: tokens appended, stop conditions, outputs.
  std::vector<RequestOutput> complete(const StepPlan& plan, const StepResult& result);
  // Adapters around a step: loads that finished (failed ones fail their requests), prefetches for the
  // waiting queue; the step's adapters pinned and placed in device slots (false: the step in flight holds
  // the slots), then retired when its results are back.
  void poll_adapters();
  bool place_adapters(const StepPlan& plan, uint64_t seq);
  void retire_adapters(uint64_t seq);
  AdapterId resolve_adapter(const std::string& name);

  std::shared_ptr<Model> model_;
  EngineConfig config_;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<structured::GrammarCompiler> grammar_compiler_;  // structured output; built on first use
  int64_t max_model_len_ = 0;
  int64_t context_limit_ = 0;  // max_model_len_, or the whole KV cache's tokens where that is less
  int64_t num_kv_blocks_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  bool async_ = false;                   // --async-scheduling on the GPU
  std::optional<StepPlan> inflight_plan_;  // the step queued and not yet completed
  std::vector<int32_t> eos_ids_;
  std::mt19937_64 seed_rng_;  // --seed: generators of unseeded requests
  std::unique_ptr<AdapterRegistry> adapters_;
  std::optional<AdapterResolver> resolver_;               // --lora-resolver-dir
  std::map<std::string, AdapterId> resolving_;            // resolver loads in progress (each pinned once)
  std::vector<AdapterResolution> resolutions_;            // ended, for take_resolutions()
  std::map<uint64_t, std::vector<AdapterId>> step_adapters_;  // steps in flight: the adapters they pinned
  uint64_t step_seq_ = 0, inflight_seq_ = 0;
  std::unordered_map<std::string, std::unique_ptr<Group>> groups_;  // by external request id
  std::unordered_map<RequestId, Sequence*> sequences_;
  RequestId next_id_ = 1;
  int64_t total_prompt_tokens_ = 0, total_generation_tokens_ = 0;
  int64_t prompt_tokens_total_ = 0;  // EngineStats::prompt_tokens_total
  std::map<std::string, AdapterCounters> adapter_counters_;
  std::vector<std::string> first_scheduled_;  // for take_first_scheduled()
};

}  // namespace polylora
