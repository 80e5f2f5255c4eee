// engine/engine_thread.cc: the engine loop on its own thread and its thread-safe handle.
#include "engine/engine_thread.h"

#include <spdlog/fmt/ranges.h>

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "common/utf8.h"

namespace polylora {

using Clock = std::chrono::steady_clock;

namespace {

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::optional<RequestOutput> OutputStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || finished_; });
  if (queue_.empty()) return std::nullopt;
  RequestOutput out = std::move(queue_.front());
  queue_.pop_front();
  return out;
}

void OutputStream::push(RequestOutput output) {
  std::function<void()> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (output.finished) finished_ = true;
    queue_.push_back(std::move(output));
    listener = listener_;
  }
  cv_.notify_all();
  if (listener) listener();
}

void OutputStream::set_listener(std::function<void()> listener) {
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    listener_ = listener;
    waiting = !queue_.empty();
  }
  if (waiting && listener) listener();
}

bool OutputStream::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_ && queue_.empty();
}

EngineThread::EngineThread(std::unique_ptr<Engine> engine, EngineThreadOptions options)
    : engine_(std::move(engine)),
      model_config_(engine_->model_config()),
      max_model_len_(engine_->max_model_len()),
      options_(options),
      stats_logger_(options.log_stats_interval, Clock::now()) {
  const CacheConfig& cc = engine_->config().cache;
  auto fmt_double = [](double v) {
    std::string t = fmt::format("{}", v);
    return t;
  };
  cache_config_ = {
      {"block_size", std::to_string(cc.block_size)},
      {"cache_dtype", cc.kv_cache_dtype == DType::kBF16 ? "bfloat16" : "auto"},
      {"enable_prefix_caching", cc.enable_prefix_caching ? "True" : "False"},
      {"gpu_memory_utilization", fmt_double(cc.gpu_memory_utilization)},
      {"num_cpu_blocks", "None"},
      {"num_gpu_blocks", std::to_string(engine_->num_kv_blocks())},
      {"num_gpu_blocks_override", cc.num_kv_blocks > 0 ? std::to_string(cc.num_kv_blocks) : "None"},
      {"swap_space", "0"},
  };
  resolves_adapters_ = engine_->has_resolver();
  // Wakes the loop when the loader thread finishes a load that requests may be held for.
  engine_->set_adapter_load_listener([this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      loads_done_ = true;
    }
    cv_.notify_all();
  });
  last_step_time_ = unix_now();
  publish();
  thread_ = std::thread([this] { loop(); });
}

EngineThread::~EngineThread() {
  shutdown(std::chrono::milliseconds(0));
  engine_.reset();  // joins the loader thread while the listener's mutex still exists
}

template <typename T>
T EngineThread::call(std::function<T()> fn) {
  auto task = std::make_shared<std::packaged_task<T()>>(std::move(fn));
  std::future<T> result = task->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exit_) fail_with(ErrorKind::kOverloaded, "the server is shutting down");
    commands_.push_back([task] { (*task)(); });
  }
  cv_.notify_all();
  return result.get();
}

std::shared_ptr<OutputStream> EngineThread::add_request(EngineRequest request) {
  auto accepted = std::make_shared<std::promise<std::shared_ptr<OutputStream>>>();
  std::future<std::shared_ptr<OutputStream>> result = accepted->get_future();
  add_request_async(std::move(request), [accepted](std::shared_ptr<OutputStream> stream, std::exception_ptr error) {
    if (error)
      accepted->set_exception(error);
    else
      accepted->set_value(std::move(stream));
  });
  return result.get();
}

void EngineThread::add_request_async(EngineRequest request, AddCallback done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_ && !exit_) {
      commands_.push_back([this, r = std::move(request), done = std::move(done)]() mutable {
        admit(std::move(r), std::move(done));
      });
      request = EngineRequest();
      done = nullptr;
    }
  }
  if (done) {
    done(nullptr, std::make_exception_ptr(Error("the server is shutting down and accepts no new requests",
                                                ErrorKind::kOverloaded)));
    return;
  }
  cv_.notify_all();
}

void EngineThread::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exit_) return;
    commands_.push_back([this, request_id] { engine_->abort(request_id); });
  }
  cv_.notify_all();
}

void EngineThread::add_adapter(std::shared_ptr<LoraAdapter> adapter, AdapterRegistry::Loader reload) {
  call<int>([this, a = std::move(adapter), r = std::move(reload)]() mutable {
    engine_->add_adapter(std::move(a), std::move(r));
    publish();
    return 0;
  });
}

bool EngineThread::remove_adapter(const std::string& name) {
  return call<bool>([this, name] {
    bool removed = engine_->remove_adapter(name);
    publish();
    return removed;
  });
}

void EngineThread::reset_prefix_cache() {
  call<bool>([this] {
    engine_->reset_prefix_cache();
    publish();
    return true;
  });
}

bool EngineThread::has_adapter(const std::string& name) const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  for (const auto& a : snapshot_.adapters)
    if (a.name == name) return true;
  return false;
}

EngineSnapshot EngineThread::snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

void EngineThread::admit(EngineRequest r, AddCallback done) {
  std::shared_ptr<OutputStream> stream;
  std::exception_ptr error;
  try {
    if (!r.adapter.empty() && engine_->lookup_adapter(r.adapter) == Engine::AdapterLookup::kLoading) {
      int64_t num_held = 0;
      for (const auto& [name, held] : held_) num_held += static_cast<int64_t>(held.size());
      const int64_t limit = engine_->config().scheduler.max_waiting;
      if (num_held + engine_->stats().num_waiting >= limit)
        fail_with(ErrorKind::kOverloaded,
                  "the server is overloaded: {} requests are waiting (the limit is {}); retry later",
                  num_held + engine_->stats().num_waiting, limit);
      std::string name = r.adapter;
      held_[name].push_back({std::move(r), std::move(done)});
      return;
    }
    stream = accept(std::move(r));
  } catch (...) {
    error = std::current_exception();
  }
  done(std::move(stream), error);
}

void EngineThread::settle_resolutions() {
  if (held_.empty() && !engine_->resolving()) return;
  engine_->poll_adapter_loads();
  std::vector<Engine::AdapterResolution> resolutions = engine_->take_resolutions();
  if (resolutions.empty()) return;
  publish();  // the adapter list and the load counters, before anyone hears of the outcome
  for (Engine::AdapterResolution& res : resolutions) {
    auto it = held_.find(res.name);
    if (it == held_.end()) continue;
    std::vector<Held> held = std::move(it->second);
    held_.erase(it);
    for (Held& h : held) {
      if (res.error) {
        // As vLLM's resolver: found, but it does not load (a 400 naming the problem).
        h.done(nullptr, std::make_exception_ptr(Error(
                            fmt::format("LoRA adapter '{}' was found but could not be loaded: {}",
                                        sanitize_utf8(res.name), *res.error),
                            ErrorKind::kInvalid)));
        continue;
      }
      admit(std::move(h.request), std::move(h.done));  // registered now
    }
  }
}

std::shared_ptr<OutputStream> EngineThread::accept(EngineRequest r) {
  const std::string id = r.request_id;
  const SamplingParams& sp = r.sampling;
  const int64_t prompt_len = static_cast<int64_t>(r.prompt_ids.size());
  const int64_t max_tokens = sp.max_tokens.value_or(std::max<int64_t>(0, max_model_len_ - prompt_len));
  if (options_.log_requests) {
    std::string stop;
    for (const auto& st : sp.stop) stop += (stop.empty() ? "'" : ", '") + st + "'";
    spdlog::info(
        "Received request {}: prompt length: {} tokens, params: SamplingParams(n={}, presence_penalty={}, "
        "frequency_penalty={}, repetition_penalty={}, temperature={}, top_p={}, top_k={}, min_p={}, seed={}, "
        "stop=[{}], stop_token_ids={}, ignore_eos={}, max_tokens={}, min_tokens={}, logprobs={}, "
        "prompt_logprobs={}, skip_special_tokens={}), lora_request: {}.",
        id, prompt_len, sp.n, sp.presence_penalty, sp.frequency_penalty, sp.repetition_penalty, sp.temperature,
        sp.top_p, sp.top_k, sp.min_p, sp.seed ? std::to_string(*sp.seed) : "None", stop,
        fmt::join(sp.stop_token_ids, ", "), sp.ignore_eos ? "True" : "False",
        sp.max_tokens ? std::to_string(*sp.max_tokens) : "None", sp.min_tokens,
        sp.logprobs ? std::to_string(*sp.logprobs) : "None",
        sp.prompt_logprobs ? std::to_string(*sp.prompt_logprobs) : "None",
        sp.skip_special_tokens ? "True" : "False", r.adapter.empty() ? "None" : r.adapter);
  }
  const int64_t n = sp.n;
  engine_->add_request(std::move(r));  // throws on invalid input; nothing is registered then
  if (options_.log_requests) spdlog::info("Added request {}.", id);
  auto stream = std::make_shared<OutputStream>();
  streams_[id] = stream;
  Timing t;
  t.arrival = t.last_token = Clock::now();
  timings_[id] = t;
  metrics_.params_n.observe(static_cast<double>(n));
  metrics_.params_max_tokens.observe(static_cast<double>(max_tokens));
  return stream;
}

void EngineThread::record_finished(const std::string& rid, const RequestOutput& out, Clock::time_point now) {
  const Timing& t = timings_[rid];
  auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  metrics_.e2e.observe(secs(t.arrival, now));
  metrics_.prompt_tokens.observe(static_cast<double>(out.num_prompt_tokens));
  int64_t generated = 0;
  std::string reasons;
  for (const auto& s : out.sequences) {
    generated = std::max(generated, s.num_output_tokens);
    if (s.finish_reason) {
      ++metrics_.finished_by_reason[finish_reason_name(*s.finish_reason)];
      reasons += (reasons.empty() ? "" : ",") + std::string(finish_reason_name(*s.finish_reason));
    }
  }
  metrics_.generation_tokens.observe(static_cast<double>(generated));
  // As vLLM: the phases of a request that was scheduled (a request aborted while waiting has none).
  if (t.was_scheduled) {
    metrics_.queue_time.observe(secs(t.arrival, t.scheduled));
    Clock::time_point last = t.first_token ? t.last_token : now;
    metrics_.inference_time.observe(secs(t.scheduled, last));
    if (t.first_token) {
      metrics_.prefill_time.observe(secs(t.scheduled, t.first_token_time));
      metrics_.decode_time.observe(secs(t.first_token_time, t.last_token));
    }
  }
  if (options_.log_requests) {
    if (out.error)
      spdlog::info("Aborted request {}: {}.", rid, *out.error);
    else
      spdlog::info("Finished request {}: finish_reason: {}, prompt tokens: {}, generated tokens: {}, e2e: {:.3f} s.",
                   rid, reasons.empty() ? "None" : reasons, out.num_prompt_tokens, generated,
                   secs(t.arrival, now));
  }
}

void EngineThread::log_stats_if_due() {
  if (!stats_logger_.enabled() || Clock::now() < stats_logger_.next_due()) return;
  if (auto line = stats_logger_.maybe_log(engine_->stats(), Clock::now())) {
    if (line->idle)
      spdlog::debug("{}", line->text);
    else
      spdlog::info("{}", line->text);
  }
}

void EngineThread::publish() {
  EngineSnapshot s;
  s.stats = engine_->stats();
  // Tokens of the steps since the last publish (one step, when called after a step).
  const int64_t step_tokens = s.stats.prompt_tokens + s.stats.generation_tokens;
  if (step_tokens > last_step_tokens_)
    metrics_.iteration_tokens.observe(static_cast<double>(step_tokens - last_step_tokens_));
  last_step_tokens_ = step_tokens;
  s.cache_config = cache_config_;
  s.lora_info_time = last_step_time_;
  for (const AdapterEntryInfo& a : engine_->adapters())
    s.adapters.push_back({a.name, a.path, a.id.version, a.max_rank, adapter_tier_name(a.tier), a.loading});
  s.metrics = metrics_.snapshot();
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = std::move(s);
}

void EngineThread::shutdown(std::chrono::milliseconds grace) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    if (snapshot().stats.num_running + snapshot().stats.num_waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    exit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EngineThread::loop() {
  while (true) {
    std::deque<Command> commands;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return exit_ || !commands_.empty() || loads_done_ || engine_->has_unfinished(); };
      if (idle_copies_)  // adapter copies under way while idle: look again shortly
        cv_.wait_for(lock, std::chrono::milliseconds(2), ready);
      else if (stats_logger_.enabled())
        cv_.wait_until(lock, stats_logger_.next_due(), ready);  // wakes to log the stats line when idle
      else
        cv_.wait(lock, ready);
      commands.swap(commands_);
      loads_done_ = false;
      if (exit_) {
        // Requests handed over before the exit still get their streams (finished with an error below).
        for (auto& c : commands) c();
        break;
      }
    }
    for (auto& c : commands) c();
    settle_resolutions();
    log_stats_if_due();
    if (!engine_->has_unfinished()) {
      // Idle: adapter copies go on (empty slots are filled with adapters in host memory).
      try {
        idle_copies_ = engine_->idle_adapter_work();
      } catch (const std::exception& e) {
        spdlog::error("adapter copy failed: {}", e.what());
        idle_copies_ = false;
      }
      publish();
      continue;
    }
    idle_copies_ = false;
    const auto step_start = Clock::now();
    std::vector<RequestOutput> outputs;
    try {
      outputs = engine_->step();
    } catch (const std::exception& e) {
      // A failed step must not take the server down: fail the requests in flight, keep serving.
      spdlog::error("engine step failed: {}; aborting the requests in flight", e.what());
      for (auto& [id, stream] : streams_) {
        RequestOutput out;
        out.request_id = id;
        out.finished = true;
        out.error = std::string("internal error: ") + e.what();
        engine_->abort(id);
        stream->push(std::move(out));
      }
      try {
        engine_->step();  // drains the aborted requests
      } catch (const std::exception& e2) {
        spdlog::error("engine step failed again: {}", e2.what());
      }
      streams_.clear();
      timings_.clear();
      publish();
      continue;
    }
    auto now = Clock::now();
    last_step_time_ = unix_now();
    settle_resolutions();
    for (const std::string& rid : engine_->take_first_scheduled()) {
      auto t = timings_.find(rid);
      if (t == timings_.end()) continue;
      t->second.scheduled = step_start;
      t->second.was_scheduled = true;
    }
    // Metrics and the snapshot first, the streams after: a client that has its answer sees /metrics
    // without its request (not still running).
    std::vector<std::pair<std::shared_ptr<OutputStream>, RequestOutput>> ready;
    for (auto& out : outputs) {
      const std::string rid = out.request_id;
      auto it = streams_.find(rid);
      if (it == streams_.end()) continue;
      Timing& t = timings_[rid];
      int64_t new_tokens = 0;
      for (const auto& s : out.sequences) new_tokens += static_cast<int64_t>(s.new_token_ids.size());
      if (new_tokens > 0) {
        double since =
            std::chrono::duration<double>(now - (t.first_token ? t.last_token : t.arrival)).count();
        if (!t.first_token)
          metrics_.ttft.observe(since);
        else
          metrics_.itl.observe(since);
        if (!t.first_token) t.first_token_time = now;
        t.first_token = true;
        t.last_token = now;
      }
      if (out.finished) {
        record_finished(rid, out, now);
        ready.emplace_back(it->second, std::move(out));
        streams_.erase(it);
        timings_.erase(rid);
      } else {
        ready.emplace_back(it->second, std::move(out));
      }
    }
    publish();
    for (auto& [stream, out] : ready) stream->push(std::move(out));
    log_stats_if_due();
  }
  // Exit: refuse the requests still held for an adapter load, abort whatever is left so readers see a
  // final output.
  for (auto& [name, held] : held_)
    for (Held& h : held)
      h.done(nullptr, std::make_exception_ptr(Error("the server is shutting down and accepts no new requests",
                                                    ErrorKind::kOverloaded)));
  held_.clear();
  for (auto& [id, stream] : streams_) {
    RequestOutput out;
    out.request_id = id;
    out.finished = true;
    out.error = "the server shut down before the request finished";
    out.error_is_shutdown = true;
    stream->push(std::move(out));
  }
  streams_.clear();
}

}  // namespace polylora
