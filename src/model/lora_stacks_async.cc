// model/lora_stacks_async.cc: LoraStacks' asynchronous uploads (lora_stacks.h): the upload thread that fills
// slots while steps run (begin_upload / finish_upload, the fill threads' own staging) and the pinned host
// images of adapters that left their slot (uploaded again by copies instead of a fill).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "model/lora_stacks.h"

namespace polylora {
namespace {

constexpr size_t kAsyncStagingBytes = size_t{4} << 20;  // per fill thread

}  // namespace

void LoraStacks::start_upload_thread_locked() {
  stop_ = false;
  if (!thread_.joinable()) thread_ = std::thread([this] { upload_main(); });
}

std::shared_ptr<const LoraAdapter> LoraStacks::leave(int32_t slot,
                                                     const std::shared_ptr<const LoraAdapter>& incoming) {
  Held& held = held_[static_cast<size_t>(slot)];
  std::shared_ptr<const LoraAdapter> leaving = held.owner.lock();
  held = {};
  if (leaving == incoming || leaving == nullptr || image_budget_.load() == 0) return nullptr;
  return leaving;
}

void LoraStacks::begin_upload(int32_t slot, std::shared_ptr<const LoraAdapter> adapter, int delay_ms) {
  CHECK(adapter != nullptr);
  CHECK_MSG(slot >= 0 && slot < slots_, "LoRA slot {} outside the {} reserved", slot, slots_);
  CHECK_MSG(adapter->max_rank <= rank_, "adapter '{}' has rank {}, above the reserved {}", adapter->name,
            adapter->max_rank, rank_);
  CHECK_MSG(!upload_pending(slot), "LoRA slot {} is uploaded while an upload into it is pending", slot);
  if (async_.empty()) {  // the upload threads' staging, made on first use (after the allocations)
    async_.resize(upload_threads_);
    for (Stager& st : async_) st.staging = be_.make_upload_staging(kStagingBuffers, kAsyncStagingBytes);
  }
  // Steps launched from now on skip the slot (its stale rows are overwritten while they may run).
  if (held_[static_cast<size_t>(slot)].adapter) zero_scales(slot);
  std::shared_ptr<const LoraAdapter> leaving = leave(slot, adapter);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (leaving) image_jobs_.push_back(leaving);
    jobs_.push_back(
        {.slot = slot, .adapter = std::move(adapter), .done = false, .error = {}, .delay_ms = delay_ms});
    start_upload_thread_locked();
  }
  cv_.notify_all();
}

void LoraStacks::set_upload_threads(size_t n) {
  CHECK_MSG(n >= 1 && n <= 64, "LoRA upload threads: {} outside 1..64", n);
  CHECK_MSG(async_.empty(), "LoRA upload threads are set after the first upload");
  upload_threads_ = n;
}

void LoraStacks::upload_main() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] {
      return stop_ || !image_jobs_.empty() ||
             std::any_of(jobs_.begin(), jobs_.end(), [](const Job& j) { return !j.done; });
    });
    if (stop_) return;
    auto it = std::find_if(jobs_.begin(), jobs_.end(), [](const Job& j) { return !j.done; });
    if (it == jobs_.end()) {  // no copy waits: build the next image asked for
      std::shared_ptr<const LoraAdapter> adapter = image_jobs_.front().lock();
      image_jobs_.pop_front();
      if (!adapter) continue;  // gone meanwhile
      image_building_ = true;
      lock.unlock();
      try {
        host_image(adapter, /*build=*/true);
      } catch (const std::exception& e) {
        spdlog::warn("LoRA host image of adapter '{}' not built: {}", adapter->name, e.what());
      }
      lock.lock();
      image_building_ = false;
      cv_.notify_all();
      continue;
    }
    const int32_t slot = it->slot;
    std::shared_ptr<const LoraAdapter> adapter = it->adapter;
    const int delay_ms = it->delay_ms;
    lock.unlock();
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::string error;
    size_t bytes = 0;
    const auto t0 = std::chrono::steady_clock::now();
    bool imaged = false;
    try {
      const HostImage* image = host_image(adapter, /*build=*/false);
      imaged = image != nullptr;
      bytes = imaged ? upload_from_image(slot, *image) : write_weights_parallel(slot, *adapter);
    } catch (const std::exception& e) {
      error = e.what();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    // The job is still queued: finish_upload waits for it, release() waits for every job first.
    for (Job& j : jobs_)
      if (j.slot == slot && !j.done) {
        j.done = true;
        j.error = std::move(error);
        break;
      }
    ++timing_.count;
    timing_.seconds += seconds;
    timing_.bytes += bytes;
    if (imaged && error.empty()) ++timing_.from_image;
    cv_.notify_all();
  }
}

void LoraStacks::wait_host_images() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return image_jobs_.empty() && !image_building_ &&
           std::all_of(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.done; });
  });
}

const LoraStacks::HostImage* LoraStacks::host_image(const std::shared_ptr<const LoraAdapter>& adapter,
                                                    bool build) {
  const size_t budget = image_budget_.load();
  // Images of adapters no longer alive go first (their objects' addresses may be reused).
  for (size_t i = images_.size(); i-- > 0;)
    if (images_[i].adapter.expired()) {
      free_image(images_[i]);
      images_.erase(images_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  if (budget == 0) return nullptr;
  for (HostImage& im : images_)
    if (im.key == adapter.get() && im.generation == adapter->generation) {
      im.last_use = ++image_clock_;
      return &im;
    }
  if (!build) return nullptr;
  // Partitioned by layer over the fill threads as write_weights_parallel does; a counting pass first gives
  // each thread's offset in the image.
  const size_t n = std::max<size_t>(1, async_.size());
  std::vector<Stager> parts(n);
  size_t total = 0;
  std::vector<size_t> offsets(n, 0);
  for (size_t k = 0; k < n; ++k) {
    parts[k].sink = Sink::kCount;
    write_weights(parts[k], 0, *adapter, static_cast<int64_t>(k), static_cast<int64_t>(n));
    offsets[k] = total;
    total += parts[k].image_off;
  }
  if (total == 0 || total > budget) return nullptr;
  // The least recently uploaded images make room.
  while (image_bytes_.load() + total > budget && !images_.empty()) {
    auto lru = std::min_element(images_.begin(), images_.end(), [](const HostImage& a, const HostImage& b) {
      return a.last_use < b.last_use;
    });
    free_image(*lru);
    images_.erase(lru);
  }
  std::unique_ptr<std::byte[]> data;
  try {
    data = std::make_unique_for_overwrite<std::byte[]>(total);
  } catch (const std::exception& e) {
    spdlog::warn(
        "LoRA host images off: {} bytes of host memory for adapter '{}' could not be had ({}); uploads "
        "convert through the staging buffers",
        total, adapter->name, e.what());
    image_budget_.store(0);
    return nullptr;
  }
  HostImage im{.adapter = adapter,
               .key = adapter.get(),
               .generation = adapter->generation,
               .data = std::move(data),
               .bytes = total,
               .parts = {},
               .last_use = ++image_clock_};
  on_threads(n, [&](size_t k) {
    parts[k].sink = Sink::kImage;
    parts[k].image = im.data.get();
    parts[k].image_off = offsets[k];
    write_weights(parts[k], 0, *adapter, static_cast<int64_t>(k), static_cast<int64_t>(n));
  });
  for (Stager& p : parts) im.parts.push_back(std::move(p.segments));
  if (!image_logged_) {
    image_logged_ = true;
    spdlog::info(
        "LoRA host images: adapters that left a device slot kept in host memory in the slot layout, up to "
        "{:.1f} GB; '{}' takes {:.1f} MB",
        static_cast<double>(budget) / 1e9, adapter->name, static_cast<double>(total) / 1e6);
  }
  image_bytes_ += total;
  ++image_count_;
  images_.push_back(std::move(im));
  return &images_.back();
}

size_t LoraStacks::upload_from_image(int32_t slot, const HostImage& image) {
  const size_t n = std::min(async_.size(), image.parts.size());
  CHECK(n > 0);
  const size_t es = dtype_size(dtype_);
  on_threads(n, [&](size_t k) {
    Stager& st = async_[k];
    const size_t cap = st.staging->buffer_bytes() / es * es;
    for (size_t part = k; part < image.parts.size(); part += n)
      for (const ImageSegment& sg : image.parts[part])
        for (size_t o = 0; o < sg.bytes; o += cap) {
          const size_t len = std::min(cap, sg.bytes - o);
          int i = 0;
          std::byte* buf = take_buffer(st, &i);
          std::memcpy(buf, image.data.get() + sg.image_off + o, len);
          submit(st, i, sg.base + static_cast<size_t>(slot) * sg.slot_bytes + o, 1,
                 static_cast<int64_t>(len / es), dtype_);
        }
    st.staging->finish();
  });
  return image.bytes;
}

void LoraStacks::free_image(HostImage& image) {
  image.data.reset();
  image_bytes_ -= image.bytes;
  --image_count_;
}

void LoraStacks::free_images() {
  for (HostImage& im : images_) free_image(im);
  images_.clear();
}

bool LoraStacks::upload_pending(int32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(jobs_.begin(), jobs_.end(), [&](const Job& j) { return j.slot == slot; });
}

bool LoraStacks::upload_done(int32_t slot) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Job& j : jobs_)
    if (j.slot == slot) return j.done;
  return true;
}

void LoraStacks::finish_upload(int32_t slot) {
  std::unique_lock<std::mutex> lock(mu_);
  auto find = [&] {
    return std::find_if(jobs_.begin(), jobs_.end(), [&](const Job& j) { return j.slot == slot; });
  };
  if (find() == jobs_.end()) return;
  cv_.wait(lock, [&] { return find()->done; });
  auto it = find();
  Job job = std::move(*it);
  jobs_.erase(it);
  lock.unlock();
  if (!job.error.empty())
    fail("uploading adapter '{}' into LoRA slot {} failed: {}", job.adapter->name, slot, job.error);
  activate(slot, *job.adapter);
  held_[static_cast<size_t>(slot)].owner = job.adapter;
}

void LoraStacks::wait_uploads() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock,
           [&] { return std::all_of(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.done; }); });
}

LoraStacks::UploadTiming LoraStacks::upload_timing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timing_;
}

}  // namespace polylora
