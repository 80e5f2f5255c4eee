// lora/adapter_registry.cc: registration, pins with deferred unload, the host LRU tier and the loader
// thread.
#include "lora/adapter_registry.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"

namespace polylora {

const char* adapter_tier_name(AdapterTier tier) {
  switch (tier) {
    case AdapterTier::kDevice:
      return "gpu";
    case AdapterTier::kHost:
      return "cpu";
    case AdapterTier::kDisk:
      return "disk";
  }
  return "disk";
}

AdapterRegistry::AdapterRegistry(const Options& options, AdapterDevice* device)
    : options_(options), slots_(options.max_loras, device) {
  if (options_.load_thread) thread_ = std::thread([this] { loader_main(); });
}

AdapterRegistry::~AdapterRegistry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

AdapterRegistry::Entry& AdapterRegistry::entry(AdapterId id) {
  auto it = entries_.find(id.version);
  CHECK_MSG(it != entries_.end(), "adapter version {} is not registered", id.version);
  return it->second;
}
const AdapterRegistry::Entry& AdapterRegistry::entry(AdapterId id) const {
  auto it = entries_.find(id.version);
  CHECK_MSG(it != entries_.end(), "adapter version {} is not registered", id.version);
  return it->second;
}

AdapterId AdapterRegistry::register_entry(Entry e) {
  if (by_name_.count(e.name)) fail("an adapter named '{}' is already loaded", e.name);
  e.id = AdapterId{next_version_++};
  e.last_use = ++clock_;
  AdapterId id = e.id;
  by_name_[e.name] = id;
  entries_.emplace(id.version, std::move(e));
  return id;
}

AdapterId AdapterRegistry::add(std::shared_ptr<LoraAdapter> adapter, Loader reload) {
  CHECK(adapter != nullptr);
  Entry e;
  e.name = adapter->name;
  e.path = adapter->path;
  e.loader = std::move(reload);
  e.max_rank = adapter->max_rank;
  e.has_expert_lora = adapter->has_expert_lora;
  e.host = std::move(adapter);
  if (by_name_.count(e.name)) fail("an adapter named '{}' is already loaded", e.name);
  // Room in the host tier if an unpinned copy can go; otherwise it stays above the limit or, with a
  // loader, goes to disk at once.
  bool room = host_count() < options_.max_cpu_loras || make_host_room();
  if (!room && e.loader) e.host.reset();
  AdapterId id = register_entry(std::move(e));
  Entry& r = entry(id);
  if (r.host) {
    r.host->generation = id.version;
    ++counters_.loads_host;
  }
  return id;
}

AdapterId AdapterRegistry::add_on_disk(const std::string& name, const std::string& path, Loader load) {
  CHECK(load != nullptr);
  Entry e;
  e.name = name;
  e.path = path;
  e.loader = std::move(load);
  return register_entry(std::move(e));
}

bool AdapterRegistry::remove(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return false;
  Entry& e = entry(it->second);
  by_name_.erase(it);
  e.removed = true;
  maybe_erase(e);
  return true;
}

void AdapterRegistry::maybe_erase(Entry& e) {
  if (!e.removed || e.pins > 0 || e.loading) return;
  slots_.drop(e.id);  // now, or when the last step in flight using it retires
  entries_.erase(e.id.version);
}

std::optional<AdapterId> AdapterRegistry::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

const std::string& AdapterRegistry::name_of(AdapterId id) const {
  static const std::string kBase;
  if (id.base()) return kBase;
  return entry(id).name;
}

void AdapterRegistry::pin(AdapterId id, int64_t n) {
  if (id.base()) return;
  Entry& e = entry(id);
  e.pins += n;
  e.last_use = ++clock_;
}

void AdapterRegistry::unpin(AdapterId id, int64_t n) {
  if (id.base()) return;
  Entry& e = entry(id);
  CHECK_MSG(e.pins >= n, "adapter '{}' unpinned more often than pinned", e.name);
  e.pins -= n;
  maybe_erase(e);
}

int64_t AdapterRegistry::pins(AdapterId id) const {
  auto it = entries_.find(id.version);
  return it == entries_.end() ? 0 : it->second.pins;
}

bool AdapterRegistry::ready(AdapterId id) const {
  if (id.base()) return true;
  auto it = entries_.find(id.version);
  return it != entries_.end() && (it->second.host || slots_.placed(id));
}

int64_t AdapterRegistry::host_count() const {
  int64_t n = 0;
  for (const auto& [v, e] : entries_) n += (e.host != nullptr) + e.loading;
  return n;
}

bool AdapterRegistry::make_host_room() {
  // The least recently used host copy that no request pins and that can be read again; copies that sit
  // in a device slot go last (the slot keeps them alive, so dropping them frees nothing yet).
  Entry* victim = nullptr;
  auto rank = [&](const Entry& e) { return std::make_pair(slots_.placed(e.id), e.last_use); };
  for (auto& [v, e] : entries_) {
    if (!e.host || e.pins > 0 || !e.loader) continue;
    if (!victim || rank(e) < rank(*victim)) victim = &e;
  }
  if (!victim) return false;
  victim->host.reset();
  ++counters_.evictions_host;
  maybe_erase(*victim);
  return true;
}

bool AdapterRegistry::prefetch(AdapterId id) {
  if (ready(id)) return true;
  Entry& e = entry(id);
  if (e.loading) return true;
  if (!e.loader) return false;
  if (host_count() >= options_.max_cpu_loras && !make_host_room()) return false;
  e.loading = true;
  if (!options_.load_thread) {
    auto start = std::chrono::steady_clock::now();
    Done d;
    d.version = id.version;
    try {
      d.adapter = e.loader();
    } catch (const std::exception& ex) {
      d.error = ex.what();
    }
    d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(d));
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.emplace_back(id.version, e.loader);
  }
  cv_.notify_one();
  return true;
}

void AdapterRegistry::loader_main() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (stop_) return;
    auto [version, loader] = std::move(jobs_.front());
    jobs_.pop_front();
    ++busy_;
    lock.unlock();
    Done d;
    d.version = version;
    auto start = std::chrono::steady_clock::now();
    try {
      d.adapter = loader();
    } catch (const std::exception& ex) {
      d.error = ex.what();
    }
    d.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    --busy_;
    done_.push_back(std::move(d));
    done_cv_.notify_all();
    if (load_listener_) {
      std::function<void()> listener = load_listener_;
      lock.unlock();
      listener();
      lock.lock();
    }
  }
}

void AdapterRegistry::set_load_listener(std::function<void()> listener) {
  std::lock_guard<std::mutex> lock(mu_);
  load_listener_ = std::move(listener);
}

void AdapterRegistry::wait_for_loads() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return jobs_.empty() && busy_ == 0; });
}

void AdapterRegistry::finish_load(Done d, std::vector<LoadFailure>* failures) {
  auto it = entries_.find(d.version);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  e.loading = false;
  if (!d.error.empty() || !d.adapter) {
    ++counters_.load_failures;
    if (failures) failures->push_back({e.id, d.error.empty() ? "the adapter loader returned nothing" : d.error});
    maybe_erase(e);
    return;
  }
  d.adapter->generation = e.id.version;
  e.max_rank = d.adapter->max_rank;
  e.has_expert_lora = d.adapter->has_expert_lora;
  e.host = std::move(d.adapter);
  e.last_use = ++clock_;
  ++counters_.loads_host;
  ++counters_.latency_count;
  counters_.latency_sum += d.seconds;
  for (size_t i = 0; i < AdapterRegistryStats::kLatencyBounds.size(); ++i)
    if (d.seconds <= AdapterRegistryStats::kLatencyBounds[i]) ++counters_.latency_buckets[i];
  maybe_erase(e);
}

std::vector<AdapterRegistry::LoadFailure> AdapterRegistry::poll() {
  std::vector<Done> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(done_);
  }
  std::vector<LoadFailure> failures;
  for (Done& d : done) finish_load(std::move(d), &failures);
  return failures;
}

bool AdapterRegistry::ensure(uint64_t step, std::span<const AdapterId> ids) {
  for (AdapterId id : ids)
    if (!id.base()) entry(id).last_use = ++clock_;
  return slots_.ensure(step, ids, [&](AdapterId id) -> std::shared_ptr<const LoraAdapter> {
    return entry(id).host;
  });
}

bool AdapterRegistry::prefetch_device(AdapterId id, std::span<const AdapterId> keep) {
  if (id.base() || slots_.slot_of(id) >= 0) return true;
  Entry& e = entry(id);
  if (!e.host) return false;  // on disk: prefetch() brings it to the host first
  e.last_use = ++clock_;
  return slots_.prefetch(id, e.host, keep);
}

void AdapterRegistry::fill_free_slots() {
  // One copy at a time, and none while another is under way: copies for queued requests go first.
  if (!slots_.has_free_slot() || slots_.stats().uploading > 0) return;
  std::vector<uint64_t> versions;
  for (const auto& [v, e] : entries_)
    if (e.host && !e.removed && slots_.slot_of(e.id) < 0) versions.push_back(v);
  std::sort(versions.begin(), versions.end());
  for (uint64_t v : versions) {
    Entry& e = entries_.at(v);
    slots_.prefetch(e.id, e.host, {}, /*free_only=*/true);
    if (slots_.stats().uploading > 0 || !slots_.has_free_slot()) break;  // synchronous copies: go on
  }
}

std::vector<AdapterEntryInfo> AdapterRegistry::list() const {
  std::vector<AdapterEntryInfo> out;
  for (const auto& [name, id] : by_name_) {
    const Entry& e = entry(id);
    AdapterEntryInfo info;
    info.id = id;
    info.name = name;
    info.path = e.path;
    info.max_rank = e.max_rank;
    info.has_expert_lora = e.has_expert_lora;
    info.tier = slots_.placed(id) ? AdapterTier::kDevice : e.host ? AdapterTier::kHost : AdapterTier::kDisk;
    info.loading = e.loading;
    info.pins = e.pins;
    out.push_back(std::move(info));
  }
  return out;
}

AdapterRegistryStats AdapterRegistry::stats() const {
  AdapterRegistryStats s = counters_;
  s.registered = static_cast<int64_t>(by_name_.size());
  s.loads_device = slots_.stats().uploads;
  s.evictions_device = slots_.stats().evictions;
  s.resident_device = slots_.stats().resident;
  s.uploading_device = slots_.stats().uploading;
  const AdapterDevice::UploadTiming t = slots_.upload_timing();
  s.upload_count = t.count;
  s.upload_seconds = t.seconds;
  s.upload_bytes = static_cast<double>(t.bytes);
  s.uploads_from_image = t.from_image;
  for (const auto& [v, e] : entries_) {
    if (e.removed) continue;
    if (e.host)
      ++s.resident_host;
    else if (!slots_.placed(e.id))
      ++s.on_disk;
  }
  return s;
}

std::string AdapterRegistry::check_invariants() const {
  for (const auto& [name, id] : by_name_) {
    auto it = entries_.find(id.version);
    if (it == entries_.end()) return "adapter '" + name + "' maps to no entry";
    if (it->second.removed || it->second.name != name) return "adapter '" + name + "' maps to a stale entry";
  }
  int64_t reloadable = 0;
  for (const auto& [v, e] : entries_) {
    if (e.pins < 0) return "adapter '" + e.name + "' has negative pins";
    if (e.removed && e.pins == 0 && !e.loading) return "removed adapter '" + e.name + "' outlived its pins";
    if (e.host && e.host->generation != e.id.version) return "adapter '" + e.name + "' holds another version";
    reloadable += (e.host && e.loader) + e.loading;
  }
  // Only copies that cannot be read again (registered from memory) may take the tier past its limit.
  if (reloadable > options_.max_cpu_loras)
    return "the host tier holds " + std::to_string(reloadable) + " reloadable adapters, above --max-cpu-loras " +
           std::to_string(options_.max_cpu_loras);
  return slots_.check_invariants();
}

}  // namespace polylora
