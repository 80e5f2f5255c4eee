// lora/adapter_slots.cc: slot placement with LRU eviction of slots no step in flight uses.
#include "lora/adapter_slots.h"

#include <algorithm>
#include <exception>
#include <set>

#include "common/error.h"

namespace polylora {

AdapterSlots::AdapterSlots(int64_t num_slots, AdapterDevice* device)
    : slots_(static_cast<size_t>(std::max<int64_t>(num_slots, 1))), device_(device) {}

AdapterSlots::~AdapterSlots() {
  for (Slot& s : slots_) {
    try {
      finish(s);
    } catch (const std::exception&) {  // a failed copy: nothing reads the slot any more
    }
  }
}

int32_t AdapterSlots::slot_of(AdapterId id) const {
  if (id.base()) return -1;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].id == id) return static_cast<int32_t>(i);
  return -1;
}

const LoraAdapter* AdapterSlots::adapter_in(int32_t slot) const {
  if (slot < 0 || slot >= static_cast<int32_t>(slots_.size())) return nullptr;
  return slots_[static_cast<size_t>(slot)].weights.get();
}

bool AdapterSlots::placed(AdapterId id) const {
  int32_t slot = slot_of(id);
  return slot >= 0 && !slots_[static_cast<size_t>(slot)].uploading;
}

bool AdapterSlots::uploading(AdapterId id) const {
  int32_t slot = slot_of(id);
  return slot >= 0 && slots_[static_cast<size_t>(slot)].uploading;
}

void AdapterSlots::finish(Slot& s) {
  if (!s.uploading) return;
  if (device_) device_->finish_upload(static_cast<int32_t>(&s - slots_.data()));
  s.uploading = false;
  --stats_.uploading;
  ++stats_.uploads;
}

int AdapterSlots::poll_uploads() {
  int n = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.uploading || (device_ && !device_->upload_done(static_cast<int32_t>(i)))) continue;
    finish(s);
    ++n;
  }
  return n;
}

std::vector<int32_t> AdapterSlots::takeable(const std::set<AdapterId>& protect) const {
  std::vector<int32_t> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.in_flight == 0 && !s.uploading && (s.id.base() || !protect.count(s.id)))
      out.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(out.begin(), out.end(), [&](int32_t a, int32_t b) {
    const Slot &x = slots_[static_cast<size_t>(a)], &y = slots_[static_cast<size_t>(b)];
    if (x.id.base() != y.id.base()) return x.id.base();
    return x.last_use < y.last_use;
  });
  return out;
}

bool AdapterSlots::has_free_slot() const {
  return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.id.base(); });
}

bool AdapterSlots::prefetch(AdapterId id, std::shared_ptr<const LoraAdapter> weights,
                            std::span<const AdapterId> keep, bool free_only) {
  if (id.base() || slot_of(id) >= 0) return true;
  CHECK_MSG(weights != nullptr, "adapter version {} is prefetched without host weights", id.version);
  const std::vector<int32_t> order = takeable(std::set<AdapterId>(keep.begin(), keep.end()));
  if (order.empty() || (free_only && !slots_[static_cast<size_t>(order[0])].id.base())) return false;
  const int32_t best = order[0];
  Slot& s = slots_[static_cast<size_t>(best)];
  free_slot(s);
  s.id = id;
  s.weights = std::move(weights);
  s.last_use = ++clock_;  // not the first victim of the next prefetch
  s.uploading = true;
  ++stats_.uploading;
  ++stats_.resident;
  if (device_)
    device_->begin_upload(best, s.weights);
  return true;
}

void AdapterSlots::free_slot(Slot& s) {
  CHECK_MSG(s.in_flight == 0, "adapter slot freed while a step in flight uses it");
  if (s.id.base()) return;
  finish(s);  // an upload under way completes first (its copy writes the slot)
  if (device_) device_->free_adapter_slot(static_cast<int32_t>(&s - slots_.data()));
  s = Slot{};
  ++stats_.evictions;
  --stats_.resident;
}

bool AdapterSlots::place(uint64_t step, std::span<const AdapterId> ids,
                         const std::function<std::shared_ptr<const LoraAdapter>(AdapterId)>& weights_of) {
  std::set<AdapterId> wanted;
  for (AdapterId id : ids)
    if (!id.base()) wanted.insert(id);
  // Which slots the step needs, and which it may take: free ones first, then LRU among idle ones.
  std::vector<AdapterId> missing;
  for (AdapterId id : wanted)
    if (slot_of(id) < 0) missing.push_back(id);
  const std::vector<int32_t> candidates = takeable(wanted);
  if (candidates.size() < missing.size()) return false;
  for (size_t k = 0; k < missing.size(); ++k) {
    Slot& s = slots_[static_cast<size_t>(candidates[k])];
    std::shared_ptr<const LoraAdapter> w = weights_of(missing[k]);
    CHECK_MSG(w != nullptr, "adapter version {} is placed without host weights", missing[k].version);
    free_slot(s);
    s.id = missing[k];
    s.weights = std::move(w);
    if (device_) device_->upload_adapter(candidates[k], *s.weights);
    ++stats_.uploads;
    ++stats_.resident;
  }
  ++clock_;
  std::vector<int32_t> used;
  for (AdapterId id : wanted) {
    int32_t slot = slot_of(id);
    Slot& s = slots_[static_cast<size_t>(slot)];
    finish(s);  // prefetched and still copying: the step waits for it
    s.last_use = clock_;
    ++s.in_flight;
    used.push_back(slot);
  }
  steps_.emplace_back(step, std::move(used));
  return true;
}

void AdapterSlots::retire(uint64_t step) {
  auto it = std::find_if(steps_.begin(), steps_.end(), [&](const auto& e) { return e.first == step; });
  if (it == steps_.end()) return;
  for (int32_t slot : it->second) {
    Slot& s = slots_[static_cast<size_t>(slot)];
    CHECK(s.in_flight > 0);
    --s.in_flight;
    if (s.in_flight == 0 && s.drop_when_idle) free_slot(s);
  }
  steps_.erase(it);
}

void AdapterSlots::drop(AdapterId id) {
  int32_t slot = slot_of(id);
  if (slot < 0) return;
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.in_flight > 0)
    s.drop_when_idle = true;
  else
    free_slot(s);
}

std::string AdapterSlots::check_invariants() const {
  std::set<AdapterId> seen;
  std::vector<int64_t> uses(slots_.size(), 0);
  for (const auto& [step, used] : steps_)
    for (int32_t slot : used) ++uses[static_cast<size_t>(slot)];
  int64_t resident = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.in_flight != uses[i])
      return "slot " + std::to_string(i) + " counts " + std::to_string(s.in_flight) + " steps in flight, " +
             std::to_string(uses[i]) + " are";
    if (s.id.base()) {
      if (s.in_flight > 0) return "empty slot " + std::to_string(i) + " is used by a step in flight";
      continue;
    }
    ++resident;
    if (!seen.insert(s.id).second) return "adapter version " + std::to_string(s.id.version) + " is in two slots";
    if (!s.weights) return "slot " + std::to_string(i) + " holds no weights";
    if (s.uploading && s.in_flight > 0) return "slot " + std::to_string(i) + " is used while uploading";
    if (s.drop_when_idle && s.in_flight == 0) return "slot " + std::to_string(i) + " outlived its drop";
  }
  if (resident != stats_.resident) return "resident slot count is off";
  int64_t uploading = 0;
  for (const Slot& s : slots_) uploading += s.uploading;
  if (uploading != stats_.uploading) return "uploading slot count is off";
  return "";
}

}  // namespace polylora
