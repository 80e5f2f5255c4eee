// engine/engine.cc: request validation, n > 1 fan-out, the step loop, stop conditions and outputs.
#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <random>
#include <set>
#include <variant>

#include "common/error.h"
#include "common/log.h"
#include "common/utf8.h"
#include "engine/stop_rules.h"
#include "engine/text_stream.h"
#include "engine/grammar_vocab.h"

namespace polylora {

struct Engine::Sequence {
  RequestId id = 0;
  Group* group = nullptr;
  int64_t index = 0;
  std::vector<int32_t> output_ids;
  std::unique_ptr<TextStream> text;  // detokenized output, stop strings, holdback
  size_t emitted_tokens = 0;
  std::vector<LogprobEntry> logprobs;  // one per output token when asked
  std::optional<FinishReason> finish_reason;
  std::optional<StopReason> stop_reason;
  bool reported_finish = false;
  std::shared_ptr<structured::GrammarMatcher> grammar;  // structured output (shared with the runner)
};

struct Engine::Group {
  EngineRequest request;
  AdapterId adapter;  // pinned once per sequence while the group lives
  std::optional<std::string> error;  // the request failed (its adapter could not be loaded)
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<std::optional<LogprobEntry>> prompt_logprobs;
  bool prompt_logprobs_sent = false;
  int64_t num_cached_tokens = 0;
  bool counted_prompt = false;
  bool aborted = false;
  bool scheduled = false;  // its first step was queued (metrics: queue time)
};

namespace {
std::shared_future<std::shared_ptr<const tokenizer::Tokenizer>> ready(
    std::shared_ptr<const tokenizer::Tokenizer> tokenizer) {
  std::promise<std::shared_ptr<const tokenizer::Tokenizer>> p;
  p.set_value(std::move(tokenizer));
  return p.get_future().share();
}
}  // namespace

Engine::Engine(std::shared_ptr<Model> model, const EngineConfig& config,
               std::shared_ptr<const tokenizer::Tokenizer> tokenizer)
    : Engine(std::move(model), config, ready(std::move(tokenizer))) {}

Engine::Engine(std::shared_ptr<Model> model, const EngineConfig& config,
               std::shared_future<std::shared_ptr<const tokenizer::Tokenizer>> tokenizer)
    : model_(std::move(model)), config_(config) {
  config_.validate();
  const ModelConfig& mc = model_->config();
  max_model_len_ =
      config_.scheduler.max_model_len > 0 ? config_.scheduler.max_model_len : mc.max_position_embeddings;
  if (config_.scheduler.max_model_len > mc.max_position_embeddings)
    spdlog::warn("--max-model-len {} exceeds the model's max_position_embeddings {}", max_model_len_,
                 mc.max_position_embeddings);
  // vLLM's check: without chunked prefill a prompt is scheduled whole, so a longer one than a step's token
  // budget could never run (and would hold the queue).
  if (!config_.scheduler.enable_chunked_prefill && config_.scheduler.max_num_batched_tokens < max_model_len_)
    fail(
        "max_num_batched_tokens ({}) is smaller than max_model_len ({}). This effectively limits the maximum "
        "sequence length to max_num_batched_tokens and makes polylora reject longer sequences. Please "
        "increase --max-num-batched-tokens or decrease --max-model-len (or leave chunked prefill on)",
        config_.scheduler.max_num_batched_tokens, max_model_len_);
  int64_t bs = config_.cache.block_size;
  // Every tensor-parallel rank holds the blocks for its KV heads: counted together where they share memory
  // (the host on the CPU; ranks on one GPU), once per GPU where each rank has its own.
  const DType kv_dtype = config_.cache.kv_cache_dtype;
  int64_t per_block =
      KvStorage::bytes_per_block(model_->kv_config(), bs, kv_dtype) * model_->ranks_sharing_memory();
  Backend& be = model_->backend();
  const bool gpu = be.kind() == DeviceKind::kCuda;
  if (kv_dtype == DType::kBF16 && !gpu)
    fail("--kv-cache-dtype bfloat16 needs a CUDA backend: the CPU kernels keep the KV cache in float32");
  const int64_t warmup_tokens = std::min(config_.scheduler.max_num_batched_tokens, max_model_len_);
  // On the GPU, a profiling prefill of the largest step sizes every workspace first (as vLLM's profile
  // run), so the KV cache gets what is really left.
  const size_t weight_bytes = be.allocated_bytes();
  model_->set_adapter_slots(config_.lora.max_loras);
  {
    const char* sync_env = std::getenv("POLYLORA_SYNC_ADAPTER_UPLOADS");
    const bool sync = sync_env && std::string(sync_env) == "1";
    model_->set_async_uploads(!sync && config_.lora.async_uploads.value_or(gpu));
  }
  if (gpu && config_.lora.reserve_on_device)
    model_->reserve_adapters(config_.lora.max_loras, config_.lora.max_lora_rank);
  const size_t adapter_bytes = model_->adapter_bytes();
  bool profiled_dry = false;
  if (gpu) {
    KvStorage probe(model_->kv_config(), be, 1, bs, kv_dtype);
    const char* dry_env = std::getenv("POLYLORA_PROFILE_DRY_RUN");
    const bool dry = dry_env && *dry_env ? std::string(dry_env) != "0" : config_.execution.dry_run_profiling;
    model_->warm_up(probe.views(), warmup_tokens, config_.scheduler.max_num_seqs, dry);
    profiled_dry = dry;
  }
  const size_t workspace_bytes = be.allocated_bytes() - weight_bytes - adapter_bytes;
  // The device sampler's scratch is allocated before the KV cache takes what is left.
  std::unique_ptr<DeviceSampler> device_sampler;
  if (config_.execution.device_sampling.value_or(gpu))
    device_sampler = std::make_unique<DeviceSampler>(be, mc.vocab_size, config_.scheduler.max_num_seqs,
                                                     config_.max_logprobs);
  const size_t sampler_bytes = device_sampler ? device_sampler->device_bytes() : 0;
  constexpr double kGraphReserve = 256.0 * (1 << 20);  // CUDA graphs, cuBLAS and allocator slack
  double budget_total = 0;
  if (config_.cache.num_kv_blocks > 0) {
    num_kv_blocks_ = config_.cache.num_kv_blocks;
  } else if (!gpu) {
    num_kv_blocks_ = config_.cache.kv_cache_memory / per_block;
  } else {
    auto [free_bytes, total] = be.memory_info();
    budget_total = static_cast<double>(total) * config_.cache.gpu_memory_utilization;
    double budget = budget_total - static_cast<double>(total - free_bytes) - kGraphReserve;
    num_kv_blocks_ = budget > 0 ? static_cast<int64_t>(budget) / per_block : 0;
  }
  int64_t blocks_per_seq = (max_model_len_ + bs - 1) / bs;
  if (num_kv_blocks_ < 1)
    fail(
        "no memory is left for the KV cache (one block of {} tokens takes {} bytes); raise --kv-cache-memory "
        "or "
        "--gpu-memory-utilization, or set --num-kv-blocks",
        bs, per_block);
  if (config_.cache.num_kv_blocks == 0 && num_kv_blocks_ < blocks_per_seq)
    fail(
        "the KV cache ({} blocks of {} tokens) cannot hold one sequence of --max-model-len {} tokens; raise "
        "--kv-cache-memory / --gpu-memory-utilization or lower --max-model-len",
        num_kv_blocks_, bs, max_model_len_);
  spdlog::info(
      "KV cache: {} blocks of {} tokens ({:.1f} MiB, {}); maximum concurrency for {} tokens per request: {:.2f}x",
      num_kv_blocks_, bs, static_cast<double>(num_kv_blocks_ * per_block) / (1 << 20),
      kv_dtype == DType::kBF16 ? "bfloat16" : "float32",
      max_model_len_,
      static_cast<double>(num_kv_blocks_) / static_cast<double>(blocks_per_seq));
  // A sequence ends (by length) where the whole cache is full: one that outgrew it could never run again.
  context_limit_ = std::min(max_model_len_, num_kv_blocks_ * bs);
  auto kv = std::make_unique<KvCacheManager>(num_kv_blocks_, bs, config_.cache.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(config_.scheduler, config_.lora, std::move(kv));
  AdapterRegistry::Options ro;
  ro.max_loras = config_.lora.max_loras;
  ro.max_cpu_loras = config_.lora.max_cpu_loras;
  ro.load_thread = config_.lora.load_thread;
  adapters_ = std::make_unique<AdapterRegistry>(ro, model_.get());
  if (!config_.lora.resolver_dir.empty()) {
    resolver_.emplace(config_.lora.resolver_dir);
    spdlog::info("adapters not registered are loaded on first use from {}/<name>/", config_.lora.resolver_dir);
  }
  scheduler_->set_adapter_readiness([this](AdapterId id) {
    return adapters_->on_device(id) ? AdapterReadiness::kOnDevice
           : adapters_->ready(id)   ? AdapterReadiness::kInHost
                                    : AdapterReadiness::kNotReady;
  });
  runner_ = std::make_unique<ModelRunner>(*model_, num_kv_blocks_, bs, config_.scheduler.max_num_batched_tokens,
                                          std::move(device_sampler), kv_dtype);
  async_ = config_.execution.async_scheduling.value_or(gpu);
  size_t graph_bytes = 0;
  if (model_->backend().supports_graphs() && !config_.execution.enforce_eager) {
    GraphOptions go;
    go.enabled = true;
    go.sizes = config_.execution.cuda_graph_sizes.empty()
                   ? default_graph_sizes(config_.scheduler.max_num_seqs)
                   : config_.execution.cuda_graph_sizes;
    int64_t graph_ctx = std::min(max_model_len_, config_.execution.cuda_graph_max_context);
    go.max_blocks_per_seq = (graph_ctx + bs - 1) / bs;
    go.warmup_tokens = 0;  // done above
    auto before = be.memory_info();
    runner_->prepare_graphs(go);
    auto after = be.memory_info();
    graph_bytes = before.first > after.first ? before.first - after.first : 0;
  }
  if (gpu) {
    auto [free_bytes, total] = be.memory_info();
    spdlog::info(
        "GPU memory: weights {:.2f} GiB, workspace {:.2f} GiB (profiled at {} tokens{}), sampler {:.1f} MiB, "
        "CUDA graphs {:.1f} MiB, adapters {}, KV cache {:.2f} GiB ({} blocks); {:.2f} "
        "GiB of {:.2f} GiB in use (--gpu-memory-utilization {} allows {:.2f} GiB)",
        static_cast<double>(weight_bytes) / (1 << 30), static_cast<double>(workspace_bytes) / (1 << 30),
        warmup_tokens, profiled_dry ? ", dry run" : "", static_cast<double>(sampler_bytes) / (1 << 20),
        static_cast<double>(graph_bytes) / (1 << 20),
        adapter_bytes > 0
            ? fmt::format("{:.2f} GiB ({} slots of rank {})", static_cast<double>(adapter_bytes) / (1 << 30),
                          config_.lora.max_loras, (config_.lora.max_lora_rank + 7) / 8 * 8)
            : std::string("0 (reserved when the first adapter is used; --enable-lora reserves them now)"),
        static_cast<double>(num_kv_blocks_ * per_block) / (1 << 30), num_kv_blocks_,
        static_cast<double>(total - free_bytes) / (1 << 30), static_cast<double>(total) / (1 << 30),
        config_.cache.gpu_memory_utilization, budget_total / (1 << 30));
  }
  // What ran beside the start-up above: the tokenizer's read and (ModelLoadOptions::upload.background)
  // the weights' load.
  tokenizer_ = tokenizer.get();
  model_->wait_for_weights();
  for (int64_t id : mc.eos_token_ids) eos_ids_.push_back(static_cast<int32_t>(id));
  if (tokenizer_ && tokenizer_->eos_id() &&
      std::find(eos_ids_.begin(), eos_ids_.end(), *tokenizer_->eos_id()) == eos_ids_.end())
    eos_ids_.push_back(*tokenizer_->eos_id());
  for (int64_t id : config_.extra_eos_token_ids)  // --generation-config's eos_token_id
    if (id >= 0 && std::find(eos_ids_.begin(), eos_ids_.end(), id) == eos_ids_.end())
      eos_ids_.push_back(static_cast<int32_t>(id));
  if (config_.seed) seed_rng_.seed(*config_.seed);
}

Engine::~Engine() = default;

void Engine::add_adapter(std::shared_ptr<LoraAdapter> adapter, AdapterRegistry::Loader reload) {
  if (adapter->max_rank > config_.lora.max_lora_rank)
    fail("adapter '{}' has rank {}, above --max-lora-rank {}", adapter->name, adapter->max_rank,
         config_.lora.max_lora_rank);
  if (!reload && !adapter->path.empty()) {
    reload = [path = adapter->path, name = adapter->name, mc = model_->config(),
              limits = LoraLimits{config_.lora.max_lora_rank}] { return load_peft_adapter(path, name, mc, limits); };
  }
  adapters_->add(std::move(adapter), std::move(reload));
}

void Engine::add_adapter_on_disk(const std::string& name, const std::string& path) {
  adapters_->add_on_disk(name, path, [path, name, mc = model_->config(), limits = LoraLimits{config_.lora.max_lora_rank}] {
    return load_peft_adapter(path, name, mc, limits);
  });
}

bool Engine::remove_adapter(const std::string& name) {
  return adapters_->remove(name);
}

std::vector<AdapterEntryInfo> Engine::adapters() const {
  std::vector<AdapterEntryInfo> out = adapters_->list();
  std::erase_if(out, [&](const AdapterEntryInfo& a) { return resolving_.count(a.name) > 0; });
  return out;
}

Engine::AdapterLookup Engine::lookup_adapter(const std::string& name) {
  if (resolving_.count(name)) return AdapterLookup::kLoading;
  if (adapters_->has(name)) return AdapterLookup::kRegistered;
  if (!resolver_) return AdapterLookup::kUnknown;
  std::optional<std::string> dir = resolver_->locate(name);
  if (!dir) return AdapterLookup::kUnknown;
  AdapterId id = adapters_->add_on_disk(
      name, *dir, resolver_->loader(name, model_->config(), LoraLimits{config_.lora.max_lora_rank}));
  adapters_->pin(id);  // until the resolution is reported: the copy stays for the requests waiting on it
  resolving_[name] = id;
  adapters_->prefetch(id);  // started now, or by poll_adapters when the host tier has room
  spdlog::info("adapter '{}' is not registered: loading it from {}", sanitize_utf8(name), sanitize_utf8(*dir));
  return AdapterLookup::kLoading;
}

std::vector<Engine::AdapterResolution> Engine::take_resolutions() {
  std::vector<AdapterResolution> out;
  out.swap(resolutions_);
  return out;
}

std::string Engine::check_invariants() const {
  std::string s = scheduler_->check_invariants();
  if (!s.empty()) return s;
  s = adapters_->check_invariants();
  if (!s.empty()) return s;
  // Pins: one per live sequence of a group with an adapter, one per adapter of each step in flight.
  std::map<AdapterId, int64_t> want;
  for (const auto& [rid, g] : groups_)
    if (!g->adapter.base()) want[g->adapter] += static_cast<int64_t>(g->seqs.size());
  for (const auto& [seq, ids] : step_adapters_)
    for (AdapterId id : ids) want[id] += 1;
  for (const auto& [name, id] : resolving_) want[id] += 1;
  for (const AdapterEntryInfo& e : adapters_->list()) {
    int64_t w = want.count(e.id) ? want.at(e.id) : 0;
    if (e.pins != w)
      return "adapter '" + e.name + "' has " + std::to_string(e.pins) + " pins, " + std::to_string(w) +
             " expected";
  }
  return "";
}

AdapterId Engine::resolve_adapter(const std::string& name) {
  if (std::optional<AdapterId> id = adapters_->find(name)) return *id;
  fail_with(ErrorKind::kNotFound, "The model `{}` does not exist.", name);
}

void Engine::poll_adapters() {
  auto fail_requests = [&](const std::vector<AdapterRegistry::LoadFailure>& failures) {
    for (const AdapterRegistry::LoadFailure& f : failures) {
      const std::string name = adapters_->name_of(f.id);
      spdlog::error("adapter '{}' failed to load: {}", sanitize_utf8(name), f.error);
      // A resolver load: reported to the requests waiting on it, and the name unregistered again.
      if (auto r = resolving_.find(name); r != resolving_.end() && r->second == f.id) {
        resolutions_.push_back({name, f.error});
        resolving_.erase(r);
        adapters_->remove(name);
        adapters_->unpin(f.id);
      }
      for (auto& [rid, g] : groups_) {
        if (g->adapter != f.id || g->error) continue;
        g->error = "adapter '" + name + "' could not be loaded: " + f.error;
        for (auto& seq : g->seqs)
          if (!seq->finish_reason) finish_sequence(*seq, FinishReason::kAbort, std::nullopt);
      }
    }
  };
  fail_requests(adapters_->poll());
  // Prefetch the adapters of queued requests, in queue order, while the host tier has room.
  for (AdapterId id : scheduler_->waiting_adapters())
    if (!adapters_->prefetch(id)) break;
  for (const auto& [name, id] : resolving_) adapters_->prefetch(id);  // those that found no room yet
  // Inline loads (no loader thread) are done already: take them so this step can admit their requests.
  if (!config_.lora.load_thread) fail_requests(adapters_->poll());
  // Device tier: copies that are done make their adapters' requests admissible; then the adapters of
  // queued requests that are in host memory start their copies into slots that neither the running
  // requests nor adapters queued before them hold (in queue order, while slots can be taken). A request
  // is admitted once its adapter is on the device, so a copy never stalls the running ones.
  adapters_->poll_uploads();
  std::vector<AdapterId> keep = scheduler_->running_adapters();
  // Requests overdue for their adapter (bounded wait) go first and may take the slot of an adapter that
  // only requests queued before them want.
  // False when the adapter needs a slot and none can be taken (one still on disk is skipped: the host
  // prefetch above brings it).
  auto to_device = [&](AdapterId id) {
    if (adapters_->slot_of(id) < 0) {
      if (!adapters_->ready(id)) return true;
      if (!adapters_->prefetch_device(id, keep)) return false;
    }
    keep.push_back(id);
    return true;
  };
  for (AdapterId id : scheduler_->waiting_adapters(/*overdue_only=*/true)) to_device(id);
  for (AdapterId id : scheduler_->waiting_adapters())
    if (!to_device(id)) break;
  adapters_->fill_free_slots();  // adapters in host memory take slots nobody needs yet
  adapters_->poll_uploads();     // synchronous copies are done already
  // Resolver loads that are done: their waiting requests may now be added.
  for (auto it = resolving_.begin(); it != resolving_.end();) {
    const auto& [name, id] = *it;
    if (adapters_->find(name) != id) {
      resolutions_.push_back({name, "it was unloaded before it finished loading"});
    } else if (adapters_->ready(id)) {
      resolutions_.push_back({name, std::nullopt});
      spdlog::info("resolved and loaded adapter '{}'", sanitize_utf8(name));
    } else {
      ++it;
      continue;
    }
    adapters_->unpin(id);
    it = resolving_.erase(it);
  }
}

bool Engine::place_adapters(const StepPlan& plan, uint64_t seq) {
  std::vector<AdapterId>& ids = step_adapters_[seq];
  if (ids.empty()) {
    std::set<AdapterId> distinct;
    for (const auto& n : plan.new_requests)
      if (!n.adapter.base()) distinct.insert(n.adapter);
    for (const auto& r : plan.running)
      if (const SchedRequest* sr = scheduler_->get(r.id); sr && !sr->adapter.base()) distinct.insert(sr->adapter);
    ids.assign(distinct.begin(), distinct.end());
    for (AdapterId id : ids) adapters_->pin(id);  // alive until the step retires
  }
  return adapters_->ensure(seq, ids);
}

void Engine::retire_adapters(uint64_t seq) {
  adapters_->retire(seq);
  auto it = step_adapters_.find(seq);
  if (it == step_adapters_.end()) return;
  for (AdapterId id : it->second) adapters_->unpin(id);
  step_adapters_.erase(it);
}

void Engine::add_request(EngineRequest request) {
  const ModelConfig& mc = model_->config();
  if (request.request_id.empty()) fail("request_id must not be empty");
  if (groups_.count(request.request_id)) fail("request id '{}' is already in use", request.request_id);
  if (request.prompt_ids.empty()) fail("the prompt is empty");
  for (int32_t id : request.prompt_ids)
    if (id < 0 || id >= mc.vocab_size)
      fail("prompt token id {} is outside the vocabulary (size {})", id, mc.vocab_size);
  int64_t prompt_len = static_cast<int64_t>(request.prompt_ids.size());
  if (prompt_len >= max_model_len_)
    fail(
        "This model's maximum context length is {} tokens. However, your request has {} input tokens. Please "
        "reduce the length of the input messages.",
        max_model_len_, prompt_len);
  // A prompt the whole KV cache cannot hold (with a cache smaller than --max-model-len, as
  // --num-gpu-blocks-override allows) could never be admitted: refused, not queued forever.
  const int64_t bs = config_.cache.block_size;
  if ((prompt_len + 1 + bs - 1) / bs > num_kv_blocks_)
    fail(
        "the prompt ({} tokens) does not fit in the KV cache ({} blocks of {} tokens: at most {} tokens of "
        "prompt and output); send a shorter prompt, or start the server with a larger cache",
        prompt_len, num_kv_blocks_, bs, num_kv_blocks_ * bs - 1);
  request.sampling.validate(mc.vocab_size, config_.max_logprobs);
  std::shared_ptr<const structured::CompiledGrammar> grammar;
  if (request.sampling.structured_output) grammar = compile_grammar(*request.sampling.structured_output);
  if (!request.sampling.stop.empty() && !tokenizer_)
    fail("stop strings need a tokenizer, and this model was loaded without one");
  AdapterId adapter;
  if (!request.adapter.empty()) adapter = resolve_adapter(request.adapter);
  int64_t waiting = scheduler_->stats().num_waiting;
  if (waiting + request.sampling.n > config_.scheduler.max_waiting)
    fail_with(ErrorKind::kOverloaded,
              "the server is overloaded: {} requests are waiting (the limit is {}); retry later", waiting,
              config_.scheduler.max_waiting);

  auto group = std::make_unique<Group>();
  group->request = std::move(request);
  Group& g = *group;
  // From here on, read the request only through the group that now owns it (`request` is moved from).
  const SamplingParams& sp = g.request.sampling;
  g.adapter = adapter;
  adapters_->pin(adapter, sp.n);
  if (sp.prompt_logprobs) g.prompt_logprobs.assign(static_cast<size_t>(prompt_len), std::nullopt);
  // Clamped first, so that a huge max_tokens (up to 2^63 - 1) cannot overflow the sum below.
  int64_t max_tokens = std::min(sp.max_tokens.value_or(max_model_len_), max_model_len_);
  std::random_device rd;
  RequestId first = 0;
  for (int64_t i = 0; i < sp.n; ++i) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_id_++;
    seq->group = &g;
    seq->index = i;
    seq->text = std::make_unique<TextStream>(tokenizer_.get(), sp.skip_special_tokens, sp.stop,
                                             sp.include_stop_str_in_output);
    auto sr = std::make_unique<SchedRequest>();
    sr->id = seq->id;
    sr->tokens = g.request.prompt_ids;
    sr->max_total_tokens = std::min(context_limit_, prompt_len + max_tokens);
    sr->cache_key = {adapter, g.request.cache_salt};
    sr->adapter = adapter;
    sr->priority = g.request.priority;
    sr->prompt_logprobs = sp.prompt_logprobs.has_value() && i == 0;
    if (i == 0)
      first = seq->id;
    else if (config_.cache.enable_prefix_caching)
      sr->wait_for = first;  // share the prompt's blocks
    auto sampling = std::make_shared<RequestSampling>();
    sampling->params = sp;
    sampling->seed =
        sp.seed ? *sp.seed + static_cast<uint64_t>(i)
        : config_.seed ? seed_rng_()
                       : (static_cast<uint64_t>(rd()) << 32) ^ rd();
    if (!sp.ignore_eos) sampling->eos_ids = eos_ids_;
    if (grammar) {
      sampling->grammar = std::make_shared<structured::GrammarMatcher>(grammar);
      seq->grammar = sampling->grammar;
    }
    sr->sampling = std::move(sampling);  // reaches the runner inside the plan
    scheduler_->add(std::move(sr));
    sequences_[seq->id] = seq.get();
    g.seqs.push_back(std::move(seq));
  }
  AdapterCounters& ac = adapter_counters_[g.request.adapter];
  ac.requests += 1;
  groups_[g.request.request_id] = std::move(group);
}

void Engine::abort(const std::string& request_id) {
  auto it = groups_.find(request_id);
  if (it == groups_.end()) return;
  it->second->aborted = true;
  for (auto& seq : it->second->seqs)
    if (!seq->finish_reason) finish_sequence(*seq, FinishReason::kAbort, std::nullopt);
}

void Engine::finish_sequence(Sequence& seq, FinishReason reason, std::optional<StopReason> stop_reason) {
  seq.finish_reason = reason;
  bool by_stop_string = stop_reason && std::holds_alternative<std::string>(*stop_reason);
  seq.stop_reason = std::move(stop_reason);
  scheduler_->finish(seq.id);
  // A matched stop string has cut the text; otherwise whatever the detokenizer holds is part of it.
  if (!by_stop_string) seq.text->flush();
}

bool Engine::idle_adapter_work() {
  poll_adapters();
  return adapters_->stats().uploading_device > 0;
}

bool Engine::has_unfinished() const {
  return !groups_.empty() || inflight_plan_.has_value();
}

std::vector<RequestOutput> Engine::step() {
  poll_adapters();
  if (!async_) {
    StepPlan plan = scheduler_->schedule();
    const uint64_t seq = ++step_seq_;
    CHECK_MSG(place_adapters(plan, seq), "the step's adapters do not fit the device slots");
    StepResult result = runner_->execute(plan, adapters_.get());
    retire_adapters(seq);
    launched(plan);
    return complete(plan, result);
  }
  // Asynchronous: queue this step, then complete the one queued by the previous call while it runs. A
  // step sampled on the host is completed first instead (the next step needs its ids), and so is one
  // that holds device slots this step needs.
  std::vector<RequestOutput> outputs;
  auto complete_inflight = [&] {
    StepResult result = runner_->collect();
    std::vector<RequestOutput> more = complete(*inflight_plan_, result);
    retire_adapters(inflight_seq_);
    outputs.insert(outputs.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
    inflight_plan_.reset();
  };
  if (runner_->needs_collect_before_launch()) complete_inflight();
  StepPlan plan = scheduler_->schedule();
  const uint64_t seq = ++step_seq_;
  if (!place_adapters(plan, seq)) {
    CHECK_MSG(inflight_plan_.has_value(), "the step's adapters do not fit the device slots");
    complete_inflight();
    CHECK_MSG(place_adapters(plan, seq), "the step's adapters do not fit the device slots");
  }
  runner_->launch(plan, adapters_.get());  // queues nothing for an empty plan
  if (!plan.empty()) launched(plan);
  if (inflight_plan_) complete_inflight();
  // Structured output: a constrained row whose previous token the completed step sampled gets its mask
  // now (its matcher has seen that token), while the GPU runs the forward pass queued above.
  runner_->finish_launch();
  if (plan.empty()) {
    retire_adapters(seq);
  } else {
    inflight_plan_ = std::move(plan);
    inflight_seq_ = seq;
  }
  return outputs;
}

void Engine::launched(const StepPlan& plan) {
  scheduler_->launched(plan);
  // Prompt tokens computed by this step, for the counters.
  auto count_prompt = [&](RequestId id, int64_t num) {
    const SchedRequest* r = scheduler_->get(id);
    auto it = sequences_.find(id);
    if (!r || it == sequences_.end()) return;
    int64_t before = r->num_computed_tokens - num;
    int64_t in_prompt = std::max<int64_t>(0, std::min(r->num_prompt_tokens, r->num_computed_tokens) - before);
    total_prompt_tokens_ += in_prompt;
    adapter_counters_[it->second->group->request.adapter].prompt_tokens += in_prompt;
  };
  for (const auto& n : plan.new_requests) count_prompt(n.id, n.num_scheduled_tokens);
  // Metrics: requests scheduled for the first time.
  for (const auto& n : plan.new_requests) {
    auto it = sequences_.find(n.id);
    if (it == sequences_.end() || it->second->group->scheduled) continue;
    it->second->group->scheduled = true;
    first_scheduled_.push_back(it->second->group->request.request_id);
  }
  for (const auto& s : plan.running) count_prompt(s.id, s.num_scheduled_tokens);
}

std::vector<RequestOutput> Engine::complete(const StepPlan& plan, const StepResult& result) {
  std::unordered_map<RequestId, int32_t> sampled;
  for (const auto& [id, t] : result.sampled) sampled[id] = t.token;
  scheduler_->completed(plan, sampled);

  std::map<std::string, Group*> changed;
  for (const auto& [id, entries] : result.prompt_logprobs) {
    auto it = sequences_.find(id);
    if (it == sequences_.end()) continue;
    for (const auto& [index, entry] : entries)
      it->second->group->prompt_logprobs[static_cast<size_t>(index)] = entry;
  }

  for (const auto& [id, tok] : result.sampled) {
    // A request that finished (or was aborted) while this step was queued: its token is discarded.
    auto sit = sequences_.find(id);
    if (sit == sequences_.end()) continue;
    Sequence& seq = *sit->second;
    Group& g = *seq.group;
    const SamplingParams& sp = g.request.sampling;
    changed[g.request.request_id] = &g;
    if (seq.finish_reason) continue;
    const SchedRequest* r = scheduler_->get(id);
    if (!g.counted_prompt && r) {
      g.num_cached_tokens = r->num_cached_tokens;
      g.counted_prompt = true;
      prompt_tokens_total_ += static_cast<int64_t>(g.request.prompt_ids.size());
    }
    seq.output_ids.push_back(tok.token);
    // The sampler allowed only what the grammar allows, so this holds unless the grammar allows nothing
    // more (then the output stops here, as at a stop token).
    if (seq.grammar && !seq.grammar->accept_token(tok.token) && !seq.grammar->is_terminated())
      spdlog::warn("request {}: token {} does not fit its structured-output grammar", g.request.request_id, tok.token);
    if (tok.logprob) seq.logprobs.push_back(*tok.logprob);
    ++total_generation_tokens_;
    ++adapter_counters_[g.request.adapter].generation_tokens;
    const auto num_out = static_cast<int64_t>(seq.output_ids.size());
    const int64_t total = static_cast<int64_t>(g.request.prompt_ids.size()) + num_out;
    const std::optional<TokenStop> token_stop =
        check_token_stop(tok.token, num_out, sp, eos_ids_, tokenizer_ ? tokenizer_->eos_id() : std::nullopt);
    // The text of a stop token (EOS or stop_token_ids) is left out unless include_stop_str_in_output
    // (as vLLM's detokenizer does).
    if (!token_stop || sp.include_stop_str_in_output) seq.text->push(tok.token);
    if (num_out <= sp.min_tokens) seq.text->mark_min_tokens();
    if (token_stop) {
      finish_sequence(seq, token_stop->reason, token_stop->stop_reason);
      continue;
    }
    // As vLLM: stop strings count once more than min_tokens tokens are out, and only a match that ends
    // in the text of those later tokens.
    if (num_out > sp.min_tokens) {
      if (std::optional<std::string> hit = seq.text->find_stop()) {
        finish_sequence(seq, FinishReason::kStop, StopReason(std::move(*hit)));
        continue;
      }
    }
    if (reached_length(num_out, total, sp, context_limit_))
      finish_sequence(seq, FinishReason::kLength, std::nullopt);
  }
  for (auto& [rid, group] : groups_)
    if (group->aborted || group->error) changed[rid] = group.get();

  std::vector<RequestOutput> outputs;
  for (auto& [rid, gp] : changed) {
    Group& g = *gp;
    RequestOutput out;
    out.request_id = rid;
    out.num_prompt_tokens = static_cast<int64_t>(g.request.prompt_ids.size());
    out.num_cached_tokens = g.num_cached_tokens;
    if (g.request.sampling.prompt_logprobs && !g.prompt_logprobs_sent) {
      out.prompt_logprobs = g.prompt_logprobs;
      g.prompt_logprobs_sent = true;
    }
    bool all_finished = true;
    for (auto& sp : g.seqs) {
      Sequence& seq = *sp;
      all_finished &= seq.finish_reason.has_value();
      const bool finished = seq.finish_reason.has_value();
      bool has_new = seq.emitted_tokens < seq.output_ids.size() || seq.text->has_new(finished) ||
                     (finished && !seq.reported_finish);
      if (!has_new) continue;
      SequenceOutput so;
      so.index = seq.index;
      so.new_token_ids.assign(seq.output_ids.begin() + static_cast<long>(seq.emitted_tokens),
                              seq.output_ids.end());
      if (seq.logprobs.size() >= seq.output_ids.size())
        so.new_logprobs.assign(seq.logprobs.begin() + static_cast<long>(seq.emitted_tokens),
                               seq.logprobs.end());
      so.new_text = seq.text->take_new(finished);  // holds back what could still become a stop string
      seq.emitted_tokens = seq.output_ids.size();
      so.finish_reason = seq.finish_reason;
      so.stop_reason = seq.stop_reason;
      so.num_output_tokens = static_cast<int64_t>(seq.output_ids.size());
      if (seq.finish_reason) seq.reported_finish = true;
      out.sequences.push_back(std::move(so));
    }
    out.finished = all_finished;
    if (all_finished && g.error) out.error = g.error;
    outputs.push_back(std::move(out));
    if (all_finished) {
      adapters_->unpin(g.adapter, static_cast<int64_t>(g.seqs.size()));
      for (auto& seq : g.seqs) sequences_.erase(seq->id);
      groups_.erase(rid);
    }
  }
  return outputs;
}

std::shared_ptr<const structured::CompiledGrammar> Engine::compile_grammar(const structured::GrammarSpec& spec) {
  if (!tokenizer_) fail("structured output needs a tokenizer, and this model was loaded without one");
  if (!grammar_compiler_) {
    std::vector<int32_t> stops = eos_ids_;
    grammar_compiler_ = std::make_unique<structured::GrammarCompiler>(
        grammar_vocab(*tokenizer_, model_->config().vocab_size, stops));
  }
  return grammar_compiler_->compile(spec);
}

EngineStats Engine::stats() const {
  EngineStats s;
  SchedulerStats ss = scheduler_->stats();
  s.num_running = ss.num_running;
  s.num_waiting = ss.num_waiting;
  s.kv_usage = ss.kv_usage;
  s.num_kv_blocks = num_kv_blocks_;
  s.prefix_queries = ss.prefix.queries;
  s.prefix_hits = ss.prefix.hits;
  s.num_preemptions = ss.num_preemptions;
  s.prompt_tokens = total_prompt_tokens_;
  s.prompt_tokens_total = prompt_tokens_total_;
  s.generation_tokens = total_generation_tokens_;
  s.adapters = adapter_counters_;
  s.adapter_tiers = adapters_->stats();
  for (AdapterId id : scheduler_->running_adapters()) s.running_adapters.push_back(adapters_->name_of(id));
  for (AdapterId id : scheduler_->waiting_adapters()) s.waiting_adapters.push_back(adapters_->name_of(id));
  s.max_loras = config_.lora.max_loras;
  return s;
}

}  // namespace polylora
