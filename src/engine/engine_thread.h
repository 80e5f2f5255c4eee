// engine/engine_thread.h: the engine on its own thread, and the thread-safe handle the HTTP layer uses.
// Owns: the one engine thread (which alone touches the Engine: scheduler, cache, runner), a command queue
// in (add / abort / adapters / shutdown), one OutputStream per request out, request timing metrics, a
// stats snapshot refreshed after every step, and the requests held back while the resolver loads their
// adapter (--lora-resolver-dir: accepted once it is loaded, refused with its error if it cannot be).
// HTTP threads never wait on the engine loop beyond the short hand-off of a command; the engine thread
// never waits on an HTTP thread.
// Must not: parse JSON or know about HTTP.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/metrics.h"
#include "engine/stats_logger.h"

namespace polylora {

// The outputs of one request, produced by the engine thread and consumed by one reader.
class OutputStream {
 public:
  // Waits up to `timeout` for the next output; nullopt on timeout. After the final output (finished),
  // returns nullopt immediately.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  void push(RequestOutput output);
  bool done() const;
  // `listener` runs on the pushing (engine) thread after every push, and at once when outputs are already
  // waiting; it must be quick (hand the work to another thread).
  void set_listener(std::function<void()> listener);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestOutput> queue_;
  bool finished_ = false;  // the final output has been pushed
  std::function<void()> listener_;
};

struct AdapterInfo {
  std::string name;
  std::string path;
  uint64_t generation = 0;  // its AdapterId's version
  int64_t rank = 0;         // 0 until loaded once
  std::string tier;         // "gpu", "cpu" or "disk"
  bool loading = false;
};

struct EngineSnapshot {
  EngineStats stats;
  std::vector<AdapterInfo> adapters;
  MetricsSnapshot metrics;
  // The cache configuration as vLLM's cache_config_info labels (name, value), fixed at start.
  std::vector<std::pair<std::string, std::string>> cache_config;
  // Unix time (seconds) of the engine step that last set the adapter lists of stats (vLLM sets
  // vllm:lora_requests_info to the current time whenever it records them).
  double lora_info_time = 0;
};

struct EngineThreadOptions {
  double log_stats_interval = 10;  // seconds between stats lines; <= 0: none (--disable-log-stats)
  bool log_requests = false;       // a line per request received and finished (--enable-log-requests)
};

class EngineThread {
 public:
  explicit EngineThread(std::unique_ptr<Engine> engine, EngineThreadOptions options = {});
  ~EngineThread();

  // Thread-safe. Hands the request to the engine thread and waits for it to be accepted; throws the
  // engine's polylora::Error when it is not (invalid, unknown adapter, overloaded, shutting down).
  std::shared_ptr<OutputStream> add_request(EngineRequest request);
  // Thread-safe, never waits: `done` runs on the engine thread once the request is accepted (a stream) or
  // refused (an exception; polylora::Error when the input is at fault). It must be quick. A request
  // naming an adapter that is not registered but that the resolver finds (Engine::lookup_adapter) is
  // held until the loader thread has read it, without holding up the engine loop: then it is accepted,
  // or refused with "LoRA adapter 'x' was found but could not be loaded: <why>" (kInvalid, a 400 as
  // vLLM's). Concurrent requests for the same name share one load.
  using AddCallback = std::function<void(std::shared_ptr<OutputStream>, std::exception_ptr)>;
  void add_request_async(EngineRequest request, AddCallback done);
  void abort(const std::string& request_id);
  void add_adapter(std::shared_ptr<LoraAdapter> adapter, AdapterRegistry::Loader reload = {});  // throws
  bool remove_adapter(const std::string& name);
  bool has_adapter(const std::string& name) const;
  // Whether adapters that are not registered may be loaded on first use (--lora-resolver-dir).
  bool resolves_adapters() const { return resolves_adapters_; }
  // Runs Engine::reset_prefix_cache on the engine thread and waits for it.
  void reset_prefix_cache();
  EngineSnapshot snapshot() const;
  // Stops accepting requests; waits up to `grace` for running ones to finish, then aborts the rest and
  // stops the thread.
  void shutdown(std::chrono::milliseconds grace);

  const ModelConfig& model_config() const { return model_config_; }
  int64_t max_model_len() const { return max_model_len_; }

 private:
  using Command = std::function<void()>;
  void loop();
  // Runs `fn` on the engine thread and waits for its result (rethrowing its exception).
  template <typename T>
  T call(std::function<T()> fn);
  void publish();
  void log_stats_if_due();  // the periodic stats line (engine thread)
  // On the engine thread: validates and queues a request, registers its stream and timing (throws as
  // Engine::add_request).
  std::shared_ptr<OutputStream> accept(EngineRequest request);
  // On the engine thread: accepts (or refuses, through `done`) a request, or holds it while the
  // resolver loads its adapter.
  void admit(EngineRequest request, AddCallback done);
  // On the engine thread: the held requests whose adapter's load ended are accepted or refused.
  void settle_resolutions();
  void record_finished(const std::string& rid, const RequestOutput& out, std::chrono::steady_clock::time_point now);

  std::unique_ptr<Engine> engine_;
  ModelConfig model_config_;
  int64_t max_model_len_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> commands_;
  bool stopping_ = false;  // no new requests
  bool exit_ = false;      // leave the loop
  // An adapter copy was under way at the last idle check (true at start: empty slots get filled).
  bool idle_copies_ = true;
  bool loads_done_ = false;  // the adapter loader finished a load (set on its thread)
  bool resolves_adapters_ = false;
  std::thread thread_;
  // Engine-thread state.
  std::map<std::string, std::shared_ptr<OutputStream>> streams_;
  struct Timing {
    std::chrono::steady_clock::time_point arrival, last_token, scheduled, first_token_time;
    bool first_token = false;
    bool was_scheduled = false;
  };
  std::map<std::string, Timing> timings_;
  Metrics metrics_;
  EngineThreadOptions options_;
  StatsLogger stats_logger_;
  int64_t last_step_tokens_ = 0;  // prompt + generation tokens at the last publish (iteration tokens)
  std::vector<std::pair<std::string, std::string>> cache_config_;
  // Requests waiting for the resolver to load their adapter, by adapter name.
  struct Held {
    EngineRequest request;
    AddCallback done;
  };
  std::map<std::string, std::vector<Held>> held_;
  double last_step_time_ = 0;  // wall-clock seconds of the last step (vllm:lora_requests_info's value)
  // Published snapshot.
  mutable std::mutex snapshot_mu_;
  EngineSnapshot snapshot_;
};

}  // namespace polylora
