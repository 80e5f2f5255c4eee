// model/weight_loader.cc: parameter fetching with name/shape checks, random dummy weights, the plan mode,
// and the staged path's job recording (the pipeline itself is model/weight_upload.cc).
#include "model/weight_loader.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/mxfp4.h"

namespace polylora {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

constexpr size_t kSlotAlign = 256;  // expert slots of one allocation start 256-byte aligned, as alloc()'s

size_t round_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The "Loaded weights" line (waited_seconds < 0: loaded in the foreground).
void log_load(const UploadStats& st, double seconds, double bind_seconds, double waited_seconds) {
  const double gb = static_cast<double>(st.bytes_read) / 1e9;
  spdlog::info(
      "Loaded weights: {:.2f} GB in {:.2f} s (read+copy overlapped, {:.2f} GB/s: {:.2f} s read+copy at "
      "{:.2f} GB/s with {} reader threads and {} x {:.1f} MiB staging buffers, {:.2f} s of it staging "
      "set-up; {:.2f} s allocating device memory before){}",
      gb, seconds, gb / std::max(seconds, 1e-9), st.seconds, gb / std::max(st.seconds, 1e-9), st.num_threads,
      st.num_buffers, static_cast<double>(st.buffer_bytes) / (1 << 20), st.setup_seconds, bind_seconds,
      waited_seconds >= 0
          ? fmt::format("; in the background: the engine's start-up then waited {:.2f} s for it",
                        waited_seconds)
          : std::string());
}

}  // namespace

double dummy_uniform(uint64_t& state) {
  return 2.0 * (static_cast<double>(splitmix(state) >> 11) * (1.0 / 9007199254740992.0)) - 1.0;
}

WeightLoader::WeightLoader(const Checkpoint* checkpoint, Backend& backend, ModelWeights& weights,
                           uint64_t seed, const WeightUploadOptions& upload)
    : checkpoint_(checkpoint),
      backend_(&backend),
      weights_(weights),
      seed_(seed),
      upload_options_(upload),
      start_(std::chrono::steady_clock::now()) {
  if (!checkpoint_) {
    mode_ = Mode::kDummy;
    return;
  }
  switch (upload.path) {
    case UploadPath::kAuto:
      mode_ = backend.kind() == DeviceKind::kCpu ? Mode::kPerTensor : Mode::kStaged;
      break;
    case UploadPath::kPerTensor:
      mode_ = Mode::kPerTensor;
      break;
    case UploadPath::kStaged:
      mode_ = Mode::kStaged;
      break;
  }
  for (const std::string& name : checkpoint_->names()) ++shard_tensors_[checkpoint_->get(name).file].second;
}

void WeightLoader::shard_progress(const TensorInfo& t) {
  auto it = shard_tensors_.find(t.file);
  if (it == shard_tensors_.end() || ++it->second.first != it->second.second) return;
  ++shards_done_;
  const size_t n = shard_tensors_.size();
  // The staged path reads in finish(): here its shards are bound (allocated and queued), not yet read.
  spdlog::info("Loading safetensors checkpoint shards: {:3.0f}% Completed | {}/{} [{:.2f} s]{}",
               100.0 * static_cast<double>(shards_done_) / static_cast<double>(n), shards_done_, n,
               seconds_since(start_), mode_ == Mode::kStaged ? " (bound; read and copied next)" : "");
}

WeightLoader::WeightLoader(std::vector<ExpectedTensor>& plan, ModelWeights& weights)
    : checkpoint_(nullptr),
      backend_(nullptr),
      weights_(weights),
      seed_(0),
      mode_(Mode::kPlan),
      plan_(&plan),
      start_(std::chrono::steady_clock::now()) {}

bool WeightLoader::has(const std::string& name) const {
  return checkpoint_ && checkpoint_->find(name);
}

void WeightLoader::plan(const std::string& name, std::vector<int64_t> shape, bool is_vector, float fill,
                        ExpectedTensor::Quantized quantized) {
  if (!used_.insert(name).second) return;
  plan_->push_back({name, std::move(shape), is_vector, fill, quantized});
}

DType WeightLoader::stored_dtype(DType src, bool keep_f32) const {
  if (backend_->kind() == DeviceKind::kCpu) return src;
  return keep_f32 ? DType::kF32 : backend_->weight_dtype();
}

std::byte* WeightLoader::expert_block(const std::string& name, int64_t num_experts, size_t slot_bytes) {
  auto it = expert_blocks_.find(name);
  if (it != expert_blocks_.end()) return it->second;
  auto* p = static_cast<std::byte*>(backend_->alloc(static_cast<size_t>(num_experts) * slot_bytes));
  return expert_blocks_.emplace(name, p).first->second;
}

const TensorInfo& WeightLoader::tensor(const std::string& name, const std::vector<int64_t>& shape,
                                       bool quantized) {
  const TensorInfo* t = checkpoint_->find(name);
  if (!t)
    fail("checkpoint {} does not match its config: tensor '{}' (expected shape {}) is missing",
         checkpoint_->location(), name, shape_str(shape));
  if (quantized && t->dtype != DType::kU8)
    fail("checkpoint {}: MXFP4 tensor '{}' has dtype {}; MXFP4 blocks and scales are stored as U8", checkpoint_->location(),
         name, dtype_name(t->dtype));
  if (!quantized && t->dtype == DType::kU8)
    fail(
        "checkpoint {}: tensor '{}' has dtype U8, which only the MXFP4 expert blocks and scales may have (expected "
        "F32, F16 or BF16)",
        checkpoint_->location(), name);
  if (t->shape != shape)
    fail("checkpoint {} does not match its config: tensor '{}' has shape {}, expected {}",
         checkpoint_->location(), name, t->shape_string(), shape_str(shape));
  if (used_.insert(name).second) shard_progress(*t);
  return *t;
}

const float* WeightLoader::upload(const std::vector<float>& v) {
  weights_.num_bytes += v.size() * sizeof(float);
  return backend_->vector_from_host(v.data(), v.size());
}

kernels::WeightView WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols, bool keep_f32) {
  kernels::WeightView view;
  switch (mode_) {
    case Mode::kPlan:
      plan(name, {rows, cols});
      return {nullptr, DType::kBF16, rows, cols};
    case Mode::kDummy:
      view = backend_->random_matrix(rows, cols, kDummyStddev, seed_++);
      track(view.data, view.data);
      break;
    case Mode::kPerTensor: {
      const TensorInfo& t = tensor(name, {rows, cols});
      view = keep_f32 ? backend_->matrix_from_host_as({t.data, t.dtype, rows, cols}, DType::kF32)
                      : backend_->matrix_from_host({t.data, t.dtype, rows, cols});
      if (view.data != t.data) track(view.data, view.data);  // copied (not a view into the mapping)
      bytes_per_tensor_path_ += t.num_bytes;
      break;
    }
    case Mode::kStaged: {
      const TensorInfo& t = tensor(name, {rows, cols});
      const DType target = stored_dtype(t.dtype, keep_f32);
      void* dst = backend_->alloc(static_cast<size_t>(rows * cols) * dtype_size(target));
      jobs_.push_back({&t, 0, rows, cols, dst, target, cols, false});
      view = {dst, target, rows, cols};
      track(dst, dst);
      break;
    }
  }
  weights_.num_bytes += static_cast<size_t>(rows * cols) * dtype_size(view.dtype);
  return view;
}

const float* WeightLoader::vector(const std::string& name, int64_t n, float fill) {
  if (mode_ == Mode::kPlan) {
    plan(name, {n}, true, fill);
    return nullptr;
  }
  if (mode_ == Mode::kStaged) {
    const TensorInfo& t = tensor(name, {n});
    auto* dst = static_cast<float*>(backend_->alloc(static_cast<size_t>(n) * sizeof(float)));
    jobs_.push_back({&t, 0, 1, n, dst, DType::kF32, n, false});
    weights_.num_bytes += static_cast<size_t>(n) * sizeof(float);
    return dst;
  }
  std::vector<float> v(static_cast<size_t>(n));
  if (dummy()) {
    uint64_t state = seed_++;
    for (auto& x : v) {
      x = fill + static_cast<float>(dummy_uniform(state) * kDummyStddev);
    }
  } else {
    const TensorInfo& t = tensor(name, {n});
    convert_to_f32(t.data, t.dtype, v.size(), v.data());
    bytes_per_tensor_path_ += t.num_bytes;
  }
  return upload(v);
}

kernels::WeightView WeightLoader::expert_transposed(const std::string& name, int64_t num_experts, int64_t a,
                                                    int64_t b, int64_t expert) {
  if (mode_ == Mode::kPlan) {
    plan(name, {num_experts, a, b});
    return {nullptr, DType::kBF16, b, a};
  }
  if (dummy()) return matrix(name, b, a);
  size_t n = static_cast<size_t>(a * b);
  const TensorInfo& t = tensor(name, {num_experts, a, b});
  if (mode_ == Mode::kStaged) {
    // One allocation for all experts of the tensor; expert e's [a, b] slice is transposed on upload.
    const DType target = stored_dtype(t.dtype, false);
    const size_t slot = round_up(n * dtype_size(target), kSlotAlign);
    std::byte* block = expert_block(name, num_experts, slot);
    std::byte* dst = block + static_cast<size_t>(expert) * slot;
    jobs_.push_back(
        {&t, static_cast<uint64_t>(expert) * n * dtype_size(t.dtype), a, b, dst, target, a, true});
    track(dst, block);
    weights_.num_bytes += n * dtype_size(target);
    return {dst, target, b, a};
  }
  bytes_per_tensor_path_ += n * dtype_size(t.dtype);
  size_t esize = dtype_size(t.dtype);
  const char* src = static_cast<const char*>(t.data) + static_cast<size_t>(expert) * n * esize;
  kernels::WeightView host;
  if (t.dtype == DType::kF32) {
    weights_.owned_f32.emplace_back(new float[n]);
    float* dst = weights_.owned_f32.back().get();
    const float* s = reinterpret_cast<const float*>(src);
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) dst[j * a + i] = s[i * b + j];
    host = {dst, DType::kF32, b, a};
  } else {
    weights_.owned.emplace_back(new uint16_t[n]);
    uint16_t* dst = weights_.owned.back().get();
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) dst[j * a + i] = s[i * b + j];
    host = {dst, t.dtype, b, a};
  }
  kernels::WeightView view = backend_->matrix_from_host(host);
  weights_.num_bytes += n * dtype_size(view.dtype);
  if (view.data != host.data) {  // copied to the device: the host copy is no longer needed
    if (t.dtype == DType::kF32)
      weights_.owned_f32.pop_back();
    else
      weights_.owned.pop_back();
    track(view.data, view.data);
  }
  return view;
}

const uint8_t* WeightLoader::expert_bytes(const TensorInfo& t, int64_t num_experts, size_t bytes,
                                          int64_t expert) {
  const uint64_t offset = static_cast<uint64_t>(expert) * bytes;
  switch (mode_) {
    case Mode::kPlan:
    case Mode::kDummy:
      break;
    case Mode::kPerTensor: {
      bytes_per_tensor_path_ += bytes;
      const auto* src = static_cast<const uint8_t*>(t.data) + offset;
      if (backend_->kind() == DeviceKind::kCpu) return src;  // zero-copy
      void* dst = backend_->alloc(bytes);
      backend_->copy_to_device(dst, src, bytes);
      return static_cast<const uint8_t*>(dst);
    }
    case Mode::kStaged: {
      const size_t slot = round_up(bytes, kSlotAlign);
      std::byte* dst = expert_block(t.name, num_experts, slot) + static_cast<size_t>(expert) * slot;
      const auto n = static_cast<int64_t>(bytes);
      jobs_.push_back({&t, offset, 1, n, dst, DType::kU8, n, false});
      return reinterpret_cast<const uint8_t*>(dst);
    }
  }
  return nullptr;
}

kernels::WeightView WeightLoader::expert_mxfp4(const std::string& name, int64_t num_experts, int64_t out,
                                               int64_t in, int64_t expert) {
  const std::string blocks_name = name + "_blocks", scales_name = name + "_scales";
  const int64_t num_blocks = in / kMxfp4BlockSize;
  CHECK_MSG(in % kMxfp4BlockSize == 0, "MXFP4 matrix '{}' needs an input size that is a multiple of 32, not {}",
            name, in);
  const std::vector<int64_t> blocks_shape = {num_experts, out, num_blocks, kMxfp4BlockBytes};
  const std::vector<int64_t> scales_shape = {num_experts, out, num_blocks};
  kernels::WeightView view{nullptr, DType::kU8, out, in};
  switch (mode_) {
    case Mode::kPlan:
      plan(blocks_name, blocks_shape, false, 0, ExpectedTensor::Quantized::kMxfp4Codes);
      plan(scales_name, scales_shape, false, 0, ExpectedTensor::Quantized::kMxfp4Scales);
      return view;
    case Mode::kDummy:
      view = backend_->random_mxfp4(out, in, kDummyMxfp4Scale, seed_++);
      weights_.num_bytes += view.num_bytes();
      return view;
    case Mode::kPerTensor:
    case Mode::kStaged:
      break;
  }
  const TensorInfo* blocks = checkpoint_->find(blocks_name);
  const TensorInfo* scales = checkpoint_->find(scales_name);
  if (!blocks)
    fail(
        "checkpoint {} does not match its config: MXFP4 tensor '{}' (expected U8 {}) is missing (config.json "
        "has quantization_config.quant_method mxfp4)",
        checkpoint_->location(), blocks_name, shape_str(blocks_shape));
  if (!scales)
    fail("checkpoint {}: MXFP4 tensor '{}' has no scales: tensor '{}' (expected U8 {}) is missing",
         checkpoint_->location(), blocks_name, scales_name, shape_str(scales_shape));
  // The pair must agree before either is checked against the config: scales [E, out, n] for blocks
  // [E, out, n, 16].
  const std::vector<int64_t>& bs = blocks->shape;
  if (bs.size() != 4 || bs[3] != kMxfp4BlockBytes)
    fail("checkpoint {}: MXFP4 tensor '{}' has shape {}; MXFP4 blocks are [experts, out, in / 32, 16]",
         checkpoint_->location(), blocks_name, blocks->shape_string());
  if (scales->shape != std::vector<int64_t>(bs.begin(), bs.end() - 1))
    fail(
        "checkpoint {}: MXFP4 tensors '{}' {} and '{}' {} disagree in shape (the scales of blocks [E, out, n, "
        "16] are [E, out, n])",
        checkpoint_->location(), blocks_name, blocks->shape_string(), scales_name, scales->shape_string());
  const TensorInfo& tb = tensor(blocks_name, blocks_shape, /*quantized=*/true);
  const TensorInfo& ts = tensor(scales_name, scales_shape, /*quantized=*/true);
  view.data = expert_bytes(tb, num_experts, static_cast<size_t>(out * in / 2), expert);
  view.scales = expert_bytes(ts, num_experts, static_cast<size_t>(out * num_blocks), expert);
  weights_.num_bytes += view.num_bytes();
  return view;
}

const float* WeightLoader::expert_vector(const std::string& name, int64_t num_experts, int64_t n,
                                         int64_t expert) {
  if (mode_ == Mode::kPlan) {
    plan(name, {num_experts, n}, true, 0.0f);
    return nullptr;
  }
  if (mode_ == Mode::kStaged) {
    // The whole [E, n] tensor is uploaded (as f32, each row in its own aligned slot) at its first use.
    const TensorInfo& t = tensor(name, {num_experts, n});
    const size_t slot = round_up(static_cast<size_t>(n) * sizeof(float), kSlotAlign);
    const bool first = !expert_blocks_.count(name);
    std::byte* block = expert_block(name, num_experts, slot);
    if (first)
      jobs_.push_back(
          {&t, 0, num_experts, n, block, DType::kF32, static_cast<int64_t>(slot / sizeof(float)), false});
    weights_.num_bytes += static_cast<size_t>(n) * sizeof(float);
    return reinterpret_cast<const float*>(block + static_cast<size_t>(expert) * slot);
  }
  std::vector<float> v(static_cast<size_t>(n));
  if (dummy()) {
    uint64_t state = seed_++;
    for (auto& x : v)
      x = static_cast<float>((static_cast<double>(splitmix(state) >> 11) / 9007199254740992.0 - 0.5) * 0.04);
  } else {
    const TensorInfo& t = tensor(name, {num_experts, n});
    const char* src =
        static_cast<const char*>(t.data) + static_cast<size_t>(expert * n) * dtype_size(t.dtype);
    convert_to_f32(src, t.dtype, v.size(), v.data());
    bytes_per_tensor_path_ += static_cast<size_t>(n) * dtype_size(t.dtype);
  }
  return upload(v);
}

const kernels::ExpertView* WeightLoader::experts_to_device(const std::vector<kernels::ExpertView>& experts) {
  if (mode_ == Mode::kPlan) return nullptr;
  size_t bytes = experts.size() * sizeof(kernels::ExpertView);
  void* p = backend_->alloc(bytes);
  backend_->copy_to_device(p, experts.data(), bytes);
  return static_cast<const kernels::ExpertView*>(p);
}

void WeightLoader::track(const void* view_data, const void* allocation) {
  view_allocation_[view_data] = allocation;
  ++allocation_views_[allocation];
}

void WeightLoader::quantize_int8(kernels::WeightView& w) {
  CHECK_MSG(mode_ != Mode::kPlan, "quantize_int8 in plan mode");
  const kernels::WeightView old = w;
  w = backend_->quantize_int8(old);
  weights_.num_bytes += w.num_bytes();
  weights_.num_bytes -= old.num_bytes();
  // The host copies of transposed experts (CPU, per-tensor path) are dropped with their last view.
  auto drop_owned = [&](auto& owned) {
    for (size_t i = 0; i < owned.size(); ++i)
      if (owned[i].get() == old.data) {
        owned.erase(owned.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
  };
  drop_owned(weights_.owned);
  drop_owned(weights_.owned_f32);
  auto it = view_allocation_.find(old.data);
  if (it == view_allocation_.end()) return;  // a view into the checkpoint mapping (CPU)
  const void* allocation = it->second;
  view_allocation_.erase(it);
  if (--allocation_views_[allocation] > 0) return;
  allocation_views_.erase(allocation);
  backend_->synchronize();  // the quantizer read it
  backend_->free(const_cast<void*>(allocation));
}

void WeightLoader::finish() {
  if (mode_ == Mode::kPlan || dummy()) return;
  for (const std::string& name : checkpoint_->names()) {
    if (used_.count(name)) continue;
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;
    fail(
        "checkpoint {} does not match its config: tensor '{}' is not a parameter of this model (check "
        "num_hidden_layers, num_experts and tie_word_embeddings in config.json)",
        checkpoint_->location(), name);
  }
  if (shards_done_ < shard_tensors_.size())  // shards holding only tensors that are not parameters
    spdlog::info("Loading safetensors checkpoint shards: 100% Completed | {0}/{0} [{1:.2f} s]",
                 shard_tensors_.size(), seconds_since(start_));
  if (mode_ == Mode::kPerTensor) {
    backend_->synchronize();
    const double seconds = seconds_since(start_);
    const double gb = static_cast<double>(bytes_per_tensor_path_) / 1e9;
    if (backend_->kind() == DeviceKind::kCpu)
      spdlog::info("Loaded weights: {:.2f} GB in {:.2f} s (zero-copy views into the mapped checkpoint)", gb,
                   seconds);
    else
      spdlog::info("Loaded weights: {:.2f} GB in {:.2f} s (one synchronous copy per tensor, {:.2f} GB/s)", gb,
                   seconds, gb / std::max(seconds, 1e-9));
    return;
  }
  const double bind_seconds = seconds_since(start_);
  if (upload_options_.background) {
    uint64_t bytes = 0;
    for (const UploadJob& j : jobs_)
      bytes += static_cast<uint64_t>(j.rows * j.cols) * dtype_size(j.tensor->dtype);
    auto uploads = start_uploads(*backend_, std::move(jobs_), upload_options_);
    jobs_.clear();
    in_flight_ = std::make_unique<WeightsInFlight>(std::move(uploads), start_, bind_seconds);
    spdlog::info(
        "Loading weights: {:.2f} GB read and copied in the background ({:.2f} s allocating device memory "
        "before); the engine's start-up goes on meanwhile",
        static_cast<double>(bytes) / 1e9, bind_seconds);
    return;
  }
  const UploadStats st = run_uploads(*backend_, jobs_, upload_options_);
  jobs_.clear();
  log_load(st, seconds_since(start_), bind_seconds, -1);
}

WeightsInFlight::WeightsInFlight(std::unique_ptr<PendingUploads> uploads,
                                 std::chrono::steady_clock::time_point start, double bind_seconds)
    : uploads_(std::move(uploads)), start_(start), bind_seconds_(bind_seconds) {}

void WeightsInFlight::wait() {
  if (!uploads_) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<PendingUploads> uploads = std::move(uploads_);
  const UploadStats st = uploads->wait();
  const double waited = seconds_since(t0);
  log_load(st, bind_seconds_ + st.seconds, bind_seconds_, waited);
}

}  // namespace polylora
