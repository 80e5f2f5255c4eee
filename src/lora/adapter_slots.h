// lora/adapter_slots.h: the device tier: --max-loras slots an adapter's weights are uploaded into.
// Owns: which adapter each slot holds, LRU order, and which steps in flight use each slot. ensure()
// places every adapter of one step (an adapter already in a slot stays there; a missing one takes a free
// slot or the least recently used slot that no step in flight uses and that this step does not need);
// retire() is called when a step's results are back. A slot a step in flight uses is never freed or
// overwritten. The device side is behind AdapterDevice, which the backend's model implements.
// Model: TensorRT-LLM batch_manager/peftCacheManager (ensureBatch, markRequestDone).
// Must not: load adapters from disk or decide which requests run (the scheduler does).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "lora/adapter.h"
#include "lora/adapter_id.h"

namespace polylora {

// What the device does for the slot manager: copy an adapter's weights into slot s (a step launched
// afterwards must see them), and forget slot s (the caller guarantees no step in flight reads it).
// Asynchronous uploads: begin_upload starts the copy and returns (no step uses the slot until
// finish_upload), upload_done polls it without blocking, finish_upload waits for it and makes the slot
// usable by steps launched afterwards. The defaults copy synchronously in begin_upload.
class AdapterDevice {
 public:
  virtual ~AdapterDevice() = default;
  virtual void upload_adapter(int32_t slot, const LoraAdapter& adapter) = 0;
  virtual void free_adapter_slot(int32_t slot) = 0;
  virtual void begin_upload(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
    upload_adapter(slot, *adapter);
  }
  virtual bool upload_done(int32_t /*slot*/) { return true; }
  virtual void finish_upload(int32_t /*slot*/) {}
  // Copies done asynchronously so far: count, seconds spent copying, bytes written (0 when synchronous).
  struct UploadTiming {
    int64_t count = 0;
    double seconds = 0;
    size_t bytes = 0;
    int64_t from_image = 0;  // copies out of a host image (LoraStacks)
  };
  virtual UploadTiming upload_timing() const { return {}; }
};

struct SlotStats {
  int64_t uploads = 0;    // host -> device copies finished
  int64_t evictions = 0;  // a slot overwritten or freed while holding an adapter
  int64_t resident = 0;   // slots holding an adapter now (uploading ones included)
  int64_t uploading = 0;  // slots whose copy is under way
};

class AdapterSlots {
 public:
  // device may be null (then slots are bookkeeping only).
  AdapterSlots(int64_t num_slots, AdapterDevice* device);
  // Waits for the copies still under way (the device outlives the slot manager; its next owner may
  // reuse the slots).
  ~AdapterSlots();
  AdapterSlots(const AdapterSlots&) = delete;
  AdapterSlots& operator=(const AdapterSlots&) = delete;

  // Places the adapters a step uses (base-model ids are ignored, duplicates allowed) and marks those
  // slots used by `step` until retire(step). weights_of(id) gives the host copy to upload for an adapter
  // that is not in a slot. Returns false, changing nothing, when more slots are needed than are free of
  // steps in flight (the caller completes the step in flight and calls again).
  template <typename WeightsOf>
  bool ensure(uint64_t step, std::span<const AdapterId> ids, const WeightsOf& weights_of);
  // The step's results are back: its slots may be reused.
  void retire(uint64_t step);
  // Starts copying adapter `id` (host copy `weights`) into a slot while steps run: a free slot, else
  // the least recently used one that no step in flight uses, that holds no adapter of `keep` and that
  // is not uploading. True when it is placed or uploading afterwards; false when no slot can be taken
  // now. The adapter is not placed() until poll_uploads() (or ensure()) sees the copy done.
  // With free_only, only an empty slot is taken.
  bool prefetch(AdapterId id, std::shared_ptr<const LoraAdapter> weights, std::span<const AdapterId> keep,
                bool free_only = false);
  bool has_free_slot() const;
  // Finishes the uploads whose copies are done (never waits); returns how many.
  int poll_uploads();
  bool uploading(AdapterId id) const;
  // The slot of a placed or uploading adapter, or -1.
  int32_t slot_of(AdapterId id) const;
  // The host copy kept alive for the slot (kernels on the CPU read it in place).
  const LoraAdapter* adapter_in(int32_t slot) const;
  // In a slot with its copy done: steps may use it.
  bool placed(AdapterId id) const;
  // Frees the adapter's slot now, or when the last step in flight using it retires (unloaded adapters).
  void drop(AdapterId id);
  int64_t num_slots() const { return static_cast<int64_t>(slots_.size()); }
  const SlotStats& stats() const { return stats_; }
  AdapterDevice::UploadTiming upload_timing() const {
    return device_ ? device_->upload_timing() : AdapterDevice::UploadTiming{};
  }
  // For tests: empty when every invariant holds (an adapter in one slot at most, in-flight counts match
  // the steps not yet retired, dropped adapters are gone once no step uses them).
  std::string check_invariants() const;

 private:
  struct Slot {
    AdapterId id;
    std::shared_ptr<const LoraAdapter> weights;
    uint64_t last_use = 0;
    int64_t in_flight = 0;  // steps in flight that use it
    bool drop_when_idle = false;
    bool uploading = false;  // begin_upload called, finish_upload not yet
  };
  void finish(Slot& s);  // waits for the slot's upload, if any
  // Slots that may be given to another adapter: no step in flight uses them, no copy is under way and
  // they hold no adapter of `protect`; free ones first, then least recently used.
  std::vector<int32_t> takeable(const std::set<AdapterId>& protect) const;
  bool place(uint64_t step, std::span<const AdapterId> ids,
             const std::function<std::shared_ptr<const LoraAdapter>(AdapterId)>& weights_of);
  void free_slot(Slot& s);

  std::vector<Slot> slots_;
  AdapterDevice* device_;
  std::vector<std::pair<uint64_t, std::vector<int32_t>>> steps_;  // in flight: step -> slots it uses
  uint64_t clock_ = 0;
  SlotStats stats_;
};

template <typename WeightsOf>
bool AdapterSlots::ensure(uint64_t step, std::span<const AdapterId> ids, const WeightsOf& weights_of) {
  return place(step, ids, std::function<std::shared_ptr<const LoraAdapter>(AdapterId)>(weights_of));
}

}  // namespace polylora
