// model/lora_stacks.h: the adapters' weights in backend memory, slot-stacked for the batched LoRA kernels
// (kernels/lora/lora.h LoraStack, kernels/moe/moe.h MoeLoraStack): per layer and module one tensor for A
// and one for B over every slot, padded to the reserved rank, in the serving dtype (BF16 where the
// backend's weights are BF16/F16, else F32), and the scales per slot (per slot and expert for experts,
// 0 where a slot has no LoRA: the kernels skip it). Every module the model has is reserved (q/k/v/o, dense
// gate/up/down, the experts' gate/up and down), so any adapter fits and CUDA graphs captured with the
// stacks serve any mix of slots.
// upload() copies one adapter into one slot through page-locked staging buffers on the backend's upload
// streams (never inside a forward pass) and waits for it; begin_upload() does the same copy on a thread
// of its own (its own staging buffers and streams) while steps run, and finish_upload() makes the slot
// live once it is done; clear() zeroes a slot's scales.
// Must not: decide which adapter takes which slot (lora/adapter_slots.h does), or run kernels.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "config/model_config.h"
#include "kernels/lora/lora.h"
#include "kernels/moe/moe.h"
#include "lora/adapter.h"

namespace polylora {

class LoraStacks {
 public:
  LoraStacks(Backend& backend, const ModelConfig& config);
  ~LoraStacks();
  LoraStacks(const LoraStacks&) = delete;
  LoraStacks& operator=(const LoraStacks&) = delete;

  // Allocates the stacks for `slots` slots of rank `rank` (rounded up to a multiple of 8), freeing any
  // previous ones (their contents are lost: every slot is empty afterwards). The caller makes sure no
  // queued step reads the old ones.
  void reserve(int64_t slots, int64_t rank);
  bool reserved() const { return slots_ > 0; }
  int64_t slots() const { return slots_; }
  int64_t rank() const { return rank_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return bytes_; }
  // Bytes reserve(slots, rank) would allocate.
  size_t bytes_for(int64_t slots, int64_t rank) const;
  // Moves every time the stacks are reallocated (graphs hold their pointers).
  uint64_t epoch() const { return epoch_; }

  // Copies `adapter` into `slot` (its max_rank <= rank(), slot < slots()), waiting for the copies. No
  // step in flight may read the slot.
  void upload(int32_t slot, const LoraAdapter& adapter);
  // Asynchronous upload: queues the copy of `adapter` into `slot` on the upload thread and returns; the
  // slot's scales are zeroed first, so steps launched meanwhile skip it (no step may use it until
  // finish_upload). upload_done() says whether the copy is done (never blocks); finish_upload() waits for
  // it, then writes the slot's scales (steps launched afterwards see the adapter). The adapter is kept
  // alive until finish_upload. A slot with an upload pending must not be uploaded again or cleared before
  // finish_upload. An error of the copy is thrown by finish_upload.
  // `delay_ms` holds the copy back that long first (tests: a slow copy).
  void begin_upload(int32_t slot, std::shared_ptr<const LoraAdapter> adapter, int delay_ms = 0);
  bool upload_pending(int32_t slot) const;
  bool upload_done(int32_t slot) const;
  void finish_upload(int32_t slot);
  // Waits for every queued copy (finish_upload is still to be called for each).
  void wait_uploads();
  // The copies done by the upload thread: their count and total seconds (from the start of a copy to its
  // end, queueing excluded).
  struct UploadTiming {
    int64_t count = 0;
    double seconds = 0;
    size_t bytes = 0;        // bytes written into the stacks
    int64_t from_image = 0;  // copies out of a host image (the others converted through the staging)
  };
  UploadTiming upload_timing() const;
  // The slot holds nothing from now on (its scales are 0); the adapter leaving it gets its host image.
  void clear(int32_t slot);

  // Host images, for asynchronous uploads: when an adapter leaves a slot (another adapter's upload takes
  // it) the upload thread, once no copy waits, converts its weights once into plain host memory laid out
  // as one slot's regions of the stacks, and every later upload of that adapter copies out of it (memcpy
  // into the staging buffers by the fill threads, then the bus) with no per-value conversion. Images are
  // made on eviction, not on the first upload: while every adapter keeps its slot they would never be
  // read. The memory is not page-locked: pinning hundreds of MB while steps run stalls the engine's CUDA
  // calls on the driver's locks (session 43, H100: a batch-1 decode step went from 2.75 to 6.8 ms while
  // page-locked images were made), and the staging buffers are page-locked already. Session 42's swap
  // through the staging path with conversion: 71 ms per 370 MB GPT-OSS-20B adapter (5.2 GB/s). An image
  // lives while its adapter object does (the registry's host tier or a slot holds it), within a budget of
  // host bytes (the least recently uploaded images go first; an adapter larger than the budget, or a failed
  // allocation, takes the staging path). 0 turns images off. Default: a quarter of the host's memory on
  // CUDA, 0 on the CPU (its stacks are host memory already); env POLYLORA_LORA_HOST_IMAGE_GB (GB, may be
  // fractional).
  void set_host_image_budget(size_t bytes) { image_budget_.store(bytes); }
  size_t host_image_budget() const { return image_budget_.load(); }
  // Fill threads of the asynchronous uploads, each with its own staging buffers (and an image's parts:
  // one per thread); only before the first begin_upload. Default 8 (at most the cores); env
  // POLYLORA_LORA_UPLOAD_THREADS (1 to 64) for A/B runs.
  void set_upload_threads(size_t n);
  // Images held now and their bytes.
  int64_t host_images() const { return image_count_.load(); }
  // Waits until the copies queued and the images asked for are done (tests).
  void wait_host_images();
  size_t host_image_bytes() const { return image_bytes_.load(); }
  // Whether `slot` holds this adapter (the same object and registry version; unregistered adapters, of
  // version 0, never match, so they are copied at every use).
  bool holds(int32_t slot, const LoraAdapter& adapter) const;
  // Moves whenever slot's contents change (an adapter made live in it, or the slot cleared), so copies of
  // the slot's weights kept elsewhere (model/lora_dense_ext.h) know when to copy them again.
  uint64_t slot_version(int32_t slot) const { return versions_.at(static_cast<size_t>(slot)); }

  // The stack of a dense module of a layer (empty when the model has no such module there), and of a MoE
  // layer's experts (empty for dense layers).
  kernels::LoraStack dense(int64_t layer, LoraModule module) const;
  kernels::MoeLoraStack experts(int64_t layer) const;

 private:
  struct Dense {
    void* a = nullptr;
    void* b = nullptr;
    int64_t in = 0, out = 0;
  };
  struct Experts {
    void* a_gu = nullptr;
    void* b_gu = nullptr;
    void* a_down = nullptr;
    void* b_down = nullptr;
  };
  struct Held {
    const LoraAdapter* adapter = nullptr;
    uint64_t generation = 0;
    // The adapter of an asynchronous upload (its image is asked for when it leaves the slot).
    std::weak_ptr<const LoraAdapter> owner;
  };
  // One slot's region of a stack tensor: base + slot · slot_bytes.
  struct Dst {
    std::byte* base = nullptr;
    size_t slot_bytes = 0;
    int32_t slot = 0;
    std::byte* ptr() const { return base + static_cast<size_t>(slot) * slot_bytes; }
  };
  // Where write_weights' values go: the staging buffers (and from there the stacks), nowhere (counting the
  // bytes in image_off), or a host image at image + image_off (each region recorded in segments).
  enum class Sink { kStaging, kCount, kImage };
  struct ImageSegment {
    std::byte* base = nullptr;  // the region of slot s is base + s · slot_bytes
    size_t slot_bytes = 0;
    size_t image_off = 0;
    size_t bytes = 0;
  };
  struct HostImage {
    std::weak_ptr<const LoraAdapter> adapter;
    const LoraAdapter* key = nullptr;
    uint64_t generation = 0;
    std::unique_ptr<std::byte[]> data;  // plain host memory
    size_t bytes = 0;
    std::vector<std::vector<ImageSegment>> parts;  // the segments written by each fill thread
    uint64_t last_use = 0;
  };
  // Staging buffers and the next one to fill: one set for the calling thread, one for the upload thread.
  struct Stager {
    std::unique_ptr<UploadStaging> staging;
    int next = 0;
    Sink sink = Sink::kStaging;
    std::byte* image = nullptr;
    size_t image_off = 0;
    std::vector<ImageSegment> segments;
  };
  struct Job {
    int32_t slot = 0;
    std::shared_ptr<const LoraAdapter> adapter;
    bool done = false;
    std::string error;
    int delay_ms = 0;
  };
  void release();
  void upload_scales();
  // The next staging buffer of `st` once no queued copy reads it (its index in *index); n f32 values
  // stored at dst in the stacks' dtype (rounded to BF16 or copied); a rows x cols block of buffer i
  // queued for dst.
  static constexpr int kStagingBuffers = 4;  // per stager
  // fn(k) for k in [0, n): k = 0 on the calling thread, the others on threads of their own; the first error
  // (in k order) is thrown once all are done.
  static void on_threads(size_t n, const std::function<void(size_t)>& fn);
  static std::byte* take_buffer(Stager& st, int* index);
  void store_values(const float* src, int64_t n, std::byte* dst) const;
  static void submit(Stager& st, int i, void* dst, int64_t rows, int64_t cols, DType dtype);
  // Writes rows [0, rows) of `cols` f32 values, produced by fill(row, dst), to dst (stack dtype) through
  // the stager's buffers. Returns the bytes written.
  template <typename Fill>
  size_t put(Stager& st, Dst dst, int64_t rows, int64_t cols, const Fill& fill);
  // Writes `total` values to dst (stack dtype) from runs of f32 values: src(offset) gives the source of
  // value `offset` and how many values follow it contiguously.
  template <typename Src>
  size_t put_runs(Stager& st, Dst dst, int64_t total, const Src& src);
  // The weights (A and B rows) of `adapter` into `slot`, through `st`, waiting for the copies; touches
  // neither the scales nor held_ (safe on the upload thread). Returns the bytes written.
  // Layers l with l % stride == first only.
  size_t write_weights(Stager& st, int32_t slot, const LoraAdapter& adapter, int64_t first = 0,
                       int64_t stride = 1);
  // write_weights split by layer over the upload stagers, one thread each (the host-side fill of the
  // staging buffers is what limits a copy).
  size_t write_weights_parallel(int32_t slot, const LoraAdapter& adapter);
  // The adapter's host image (upload thread); with `build`, made now if it has none. nullptr where images
  // are off, there is none (and not `build`), the adapter does not fit the budget or the host memory
  // cannot be had.
  const HostImage* host_image(const std::shared_ptr<const LoraAdapter>& adapter, bool build);
  // An image's regions copied into `slot` through the fill threads' staging buffers, waited for; returns
  // the bytes.
  size_t upload_from_image(int32_t slot, const HostImage& image);
  void free_image(HostImage& image);
  void free_images();
  // The slot's scales from `adapter` (zeros for what it does not adapt), uploaded; held_ updated.
  void activate(int32_t slot, const LoraAdapter& adapter);
  void zero_scales(int32_t slot);
  // Forgets what the slot holds; returns the adapter of its last asynchronous upload if it is alive, not
  // `incoming` and images are on (its image is to be asked for: it may come back), else nullptr.
  std::shared_ptr<const LoraAdapter> leave(int32_t slot, const std::shared_ptr<const LoraAdapter>& incoming);
  void upload_main();
  // Under mu_: the upload thread runs (started if it is not), to take the jobs just queued.
  void start_upload_thread_locked();
  void stop_upload_thread();

  Backend& be_;
  ModelConfig config_;
  DType dtype_ = DType::kF32;
  int gu_slices_ = 1;
  int64_t slots_ = 0, rank_ = 0;
  size_t bytes_ = 0;
  uint64_t epoch_ = 0;
  std::vector<std::array<Dense, kNumLoraModules>> dense_;  // [layer][module]
  std::vector<Experts> experts_;                           // [layer]
  std::vector<void*> allocations_;
  // Scales, host mirror and device copy: dense [layer][module][slot], then experts
  // [layer][slot][expert][3].
  std::vector<float> scales_;
  float* d_scales_ = nullptr;
  size_t experts_scale_offset_ = 0;
  std::vector<Held> held_;
  std::vector<uint64_t> versions_;  // slot_version()
  Stager main_;
  // The upload thread: jobs queued by begin_upload (the front one is copied; finished ones wait for
  // finish_upload), and the staging buffers of its fill threads, made with the stacks.
  std::vector<Stager> async_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool stop_ = false;
  UploadTiming timing_;
  std::thread thread_;
  // Host images: used by the upload thread only (and by release() once it is idle).
  std::vector<HostImage> images_;
  // Images to build once no copy waits (an adapter leaving a slot asks for one), under mu_.
  std::deque<std::weak_ptr<const LoraAdapter>> image_jobs_;
  bool image_building_ = false;
  uint64_t image_clock_ = 0;
  bool image_logged_ = false;
  std::atomic<size_t> image_budget_{0};
  size_t upload_threads_ = 1;  // set_upload_threads, else default_upload_threads()
  std::atomic<size_t> image_bytes_{0};
  std::atomic<int64_t> image_count_{0};
};

}  // namespace polylora
