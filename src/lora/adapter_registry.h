// lora/adapter_registry.h: the one owner of adapter state: names, versions, pins, tiers and loads.
// Owns: name -> AdapterId (a fresh version per registration; no global counter elsewhere), the pins
// that requests hold (an unload is deferred until the last pin goes), the host tier (--max-cpu-loras
// adapters in memory, LRU over unpinned ones; the rest is on disk and reloaded from its path), a loader
// thread that reads adapters from disk while steps run, the device tier (AdapterSlots, --max-loras) and
// the counters the metrics read. Everyone else carries AdapterIds.
// Model: TensorRT-LLM batch_manager/peftCacheManager (ensureBatch, markRequestDone); vLLM's
// LRUCacheWorkerLoRAManager (GPU slots over a CPU LRU cache).
// Must not: know about requests beyond their pins, HTTP, or kernels (the device side is AdapterDevice).
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "lora/adapter.h"
#include "lora/adapter_id.h"
#include "lora/adapter_slots.h"

namespace polylora {

enum class AdapterTier { kDevice, kHost, kDisk };
const char* adapter_tier_name(AdapterTier tier);  // "gpu", "cpu", "disk"

struct AdapterEntryInfo {
  AdapterId id;
  std::string name;
  std::string path;
  int64_t max_rank = 0;  // 0 until it was loaded once
  bool has_expert_lora = false;
  AdapterTier tier = AdapterTier::kDisk;
  bool loading = false;
  int64_t pins = 0;
  bool removed = false;  // unloaded, kept until its pins go
};

struct AdapterRegistryStats {
  int64_t registered = 0;
  int64_t resident_device = 0, resident_host = 0, on_disk = 0;
  int64_t loads_host = 0, loads_device = 0;          // disk -> host, host -> device
  int64_t evictions_host = 0, evictions_device = 0;  // host copies dropped, slots overwritten or freed
  int64_t load_failures = 0;
  int64_t uploading_device = 0;  // slots whose copy is under way
  // Asynchronous host -> device copies: count, seconds spent copying, bytes written.
  int64_t upload_count = 0;
  double upload_seconds = 0;
  double upload_bytes = 0;
  int64_t uploads_from_image = 0;  // those copied out of the adapter's host image
  // Disk -> host load latency: counts per upper bound (seconds, cumulative as Prometheus buckets).
  static constexpr std::array<double, 10> kLatencyBounds = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                                            0.05,  0.1,    0.25,  1.0,  5.0};
  std::array<int64_t, 10> latency_buckets{};
  int64_t latency_count = 0;
  double latency_sum = 0;
};

class AdapterRegistry {
 public:
  using Loader = std::function<std::shared_ptr<LoraAdapter>()>;  // reads the adapter; throws Error
  struct Options {
    int64_t max_loras = 8;        // device slots
    int64_t max_cpu_loras = 64;   // adapters held in host memory
    bool load_thread = true;      // false: loads run inline in prefetch() (deterministic tests)
  };
  AdapterRegistry(const Options& options, AdapterDevice* device);
  ~AdapterRegistry();
  AdapterRegistry(const AdapterRegistry&) = delete;
  AdapterRegistry& operator=(const AdapterRegistry&) = delete;

  // Registers an adapter already in memory (it enters the host tier, over the limit if it must: it is
  // never dropped without a loader). `reload` reads it again after the host tier evicted it; without
  // one it stays in memory. A name in use is an Error.
  AdapterId add(std::shared_ptr<LoraAdapter> adapter, Loader reload = {});
  // Registers an adapter that stays on disk until a request needs it.
  AdapterId add_on_disk(const std::string& name, const std::string& path, Loader load);
  // Unregisters a name: new requests no longer find it; requests holding pins finish with it, and its
  // memory and slot go with the last pin. False when the name is unknown.
  bool remove(const std::string& name);
  std::optional<AdapterId> find(const std::string& name) const;
  bool has(const std::string& name) const { return find(name).has_value(); }
  // Name of any id still held (removed ones included).
  const std::string& name_of(AdapterId id) const;

  void pin(AdapterId id, int64_t n = 1);
  void unpin(AdapterId id, int64_t n = 1);
  int64_t pins(AdapterId id) const;

  // Weights in host memory or a slot: a request of this adapter may be scheduled.
  bool ready(AdapterId id) const;
  bool on_device(AdapterId id) const { return slots_.placed(id); }
  // Starts loading a pinned adapter that is not ready (host tier permitting: an unpinned host copy is
  // evicted when full; none evictable: nothing starts, and a later call tries again). Returns whether
  // the adapter is ready or loading afterwards.
  bool prefetch(AdapterId id);
  struct LoadFailure {
    AdapterId id;
    std::string error;
  };
  // Takes the loads the loader thread finished; returns those that failed (their requests should fail).
  std::vector<LoadFailure> poll();
  // Waits (bounded) for the loader thread's current loads; for tests and shutdown.
  void wait_for_loads();
  // Called on the loader thread after each load it finishes (the result is then ready for poll()); it
  // must be quick and must not call into the registry. Set before loads start.
  void set_load_listener(std::function<void()> listener);

  // Device tier, for one step: places the step's adapters (see AdapterSlots::ensure).
  bool ensure(uint64_t step, std::span<const AdapterId> ids);
  // Starts copying a ready adapter's weights into a device slot while steps run (AdapterSlots::prefetch;
  // `keep`: adapters whose slots must not be taken). True when it is on the device or uploading.
  bool prefetch_device(AdapterId id, std::span<const AdapterId> keep);
  // Copies adapters in host memory that are in no slot into empty slots (registration order), one at a
  // time and only while no other copy is under way (synchronous copies: all that fit), so slots are not
  // left idle while adapters could use them.
  void fill_free_slots();
  // Finishes the device uploads that are done; returns how many.
  int poll_uploads() { return slots_.poll_uploads(); }
  bool uploading(AdapterId id) const { return slots_.uploading(id); }
  void retire(uint64_t step) { slots_.retire(step); }
  int32_t slot_of(AdapterId id) const { return slots_.slot_of(id); }
  const LoraAdapter* adapter_in_slot(int32_t slot) const { return slots_.adapter_in(slot); }
  int64_t num_slots() const { return slots_.num_slots(); }

  std::vector<AdapterEntryInfo> list() const;  // registered (not removed) adapters, by name
  AdapterRegistryStats stats() const;
  const Options& options() const { return options_; }
  // For tests: empty when every invariant holds (names map to live entries, pins never negative, removed
  // entries only while pinned, the host tier within --max-cpu-loras except for pinned or unloadable
  // copies, the slots' own invariants).
  std::string check_invariants() const;

 private:
  struct Entry {
    AdapterId id;
    std::string name, path;
    Loader loader;
    std::shared_ptr<LoraAdapter> host;
    int64_t max_rank = 0;
    bool has_expert_lora = false;
    int64_t pins = 0;
    bool removed = false;
    bool loading = false;
    uint64_t last_use = 0;
  };
  struct Done {
    uint64_t version = 0;
    std::shared_ptr<LoraAdapter> adapter;
    std::string error;
    double seconds = 0;
  };
  Entry& entry(AdapterId id);
  const Entry& entry(AdapterId id) const;
  AdapterId register_entry(Entry e);
  void maybe_erase(Entry& e);  // a removed entry whose pins are gone
  bool make_host_room();       // evicts one unpinned host copy when the tier is full
  int64_t host_count() const;
  void finish_load(Done d, std::vector<LoadFailure>* failures);
  void loader_main();

  Options options_;
  AdapterSlots slots_;
  std::map<std::string, AdapterId> by_name_;
  std::unordered_map<uint64_t, Entry> entries_;
  uint64_t next_version_ = 1;
  uint64_t clock_ = 0;
  AdapterRegistryStats counters_;

  // Loader thread: jobs in, results out.
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<uint64_t, Loader>> jobs_;
  std::vector<Done> done_;
  int64_t busy_ = 0;
  bool stop_ = false;
  std::function<void()> load_listener_;
  std::thread thread_;
};

}  // namespace polylora
