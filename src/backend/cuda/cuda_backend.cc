// backend/cuda/cuda_backend.cc: the CUDA backend: cudaMalloc'd memory, one stream, one cuBLAS handle, a
// growable workspace, and the kernels' cuda:: entry points. Plain C++ (g++) against the CUDA runtime and
// cuBLAS headers: fmt (common/error.h) does not compile under nvcc, so the kernels live in *.cu files.
// Numerics: activations stay f32 throughout (the residual stream, norms, attention, the KV cache and all
// intermediates); weights are stored in weight_dtype() (BF16 by default, F32 for --dtype float32). In BF16
// mode the inputs of the weight products (dense and expert GEMMs) enter the tensor cores as a hi + lo pair
// of bf16 (up to BackendOptions::bf16_split_max_rows token rows; larger ones one bf16 each) and the products
// accumulate and write f32 (MXFP4 expert products take bf16-rounded activations at every size:
// docs/mxfp4.md); in F32 mode every product is exact fp32 (no TF32). Must not: know about models, adapters or
// requests.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <algorithm>
#include <atomic>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_ops.h"
#include "common/error.h"
#include "kernels/cuda_context.h"
#include "kernels/tuning.h"

#define CUDA_CHECK(expr)                                                                        \
  do {                                                                                          \
    cudaError_t cuda_check_err_ = (expr);                                                       \
    if (cuda_check_err_ != cudaSuccess)                                                         \
      ::polylora::check_failed(__FILE__, __LINE__, #expr, cudaGetErrorString(cuda_check_err_)); \
  } while (0)
#define CUBLAS_CHECK(expr)                                                                          \
  do {                                                                                              \
    cublasStatus_t cublas_check_st_ = (expr);                                                       \
    if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::polylora::check_failed(__FILE__, __LINE__, #expr, cublasGetStatusString(cublas_check_st_)); \
  } while (0)

namespace polylora {
namespace {

namespace k = kernels;

// Host -> device weight conversion goes through the workspace in chunks of at most this many bytes.
constexpr size_t kStagingBytes = size_t{64} << 20;

// Weight-upload staging (UploadStaging): page-locked host buffers, a device scratch buffer per host buffer,
// and two streams of its own: `copy_` runs the host -> device copies, `convert_` the conversions and
// transposes out of the scratch buffers. Per buffer i, event copied_[i] marks its copy done (the host
// buffer may then be refilled: wait()) and converted_[i] marks the conversion out of scratch i done (the
// next copy into scratch i waits for it on the device). A block stored as it is read (same dtype, not
// transposed) goes straight from the host buffer to its destination.
class CudaUploadStaging final : public UploadStaging {
 public:
  CudaUploadStaging(int device, cudaStream_t after, int num_buffers, size_t buffer_bytes)
      : device_(device), bytes_(buffer_bytes) {
    const auto n = static_cast<size_t>(num_buffers);
    host_.assign(n, nullptr);
    scratch_.assign(n, nullptr);
    copied_.assign(n, nullptr);
    converted_.assign(n, nullptr);
    try {
      CUDA_CHECK(cudaSetDevice(device_));
      CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
      CUDA_CHECK(cudaStreamCreateWithFlags(&convert_, cudaStreamNonBlocking));
      for (size_t i = 0; i < n; ++i) {
        cudaError_t err = cudaHostAlloc(&host_[i], bytes_, cudaHostAllocDefault);
        if (err != cudaSuccess) {
          cudaGetLastError();
          host_[i] = nullptr;
          fail("cannot allocate {} page-locked staging buffers of {} bytes for loading weights: {}", n,
               bytes_, cudaGetErrorString(err));
        }
        err = cudaMalloc(&scratch_[i], bytes_);
        if (err != cudaSuccess) {
          cudaGetLastError();
          scratch_[i] = nullptr;
          fail("out of GPU memory allocating {} staging buffers of {} bytes for loading weights: {}", n,
               bytes_, cudaGetErrorString(err));
        }
        CUDA_CHECK(cudaEventCreateWithFlags(&copied_[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&converted_[i], cudaEventDisableTiming));
      }
      // Uploads come after everything already queued on the backend's stream (the zeroing of the
      // destinations by alloc() included).
      cudaEvent_t ready = nullptr;
      CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      cudaError_t err = cudaEventRecord(ready, after);
      if (err == cudaSuccess) err = cudaStreamWaitEvent(copy_, ready, 0);
      if (err == cudaSuccess) err = cudaStreamWaitEvent(convert_, ready, 0);
      cudaEventDestroy(ready);  // released once the waits have seen it
      CUDA_CHECK(err);
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaUploadStaging() override { release(); }

  int num_buffers() const override { return static_cast<int>(host_.size()); }
  size_t buffer_bytes() const override { return bytes_; }
  std::byte* buffer(int i) override { return static_cast<std::byte*>(host_.at(static_cast<size_t>(i))); }
  void wait(int i) override { CUDA_CHECK(cudaEventSynchronize(copied_.at(static_cast<size_t>(i)))); }
  void upload(int i, const UploadBlock& b) override {
    check_upload_block(b, bytes_);
    const auto idx = static_cast<size_t>(i);
    const size_t n = static_cast<size_t>(b.rows * b.cols);
    if (n == 0) return;
    CUDA_CHECK(cudaSetDevice(device_));  // the calling thread may not have made the backend
    const size_t ssize = dtype_size(b.src_dtype), dsize = dtype_size(b.dst_dtype);
    if (b.src_dtype == b.dst_dtype && !b.transpose) {
      if (b.dst_ld == b.cols) {
        CUDA_CHECK(cudaMemcpyAsync(b.dst, host_[idx], n * ssize, cudaMemcpyHostToDevice, copy_));
      } else {
        const size_t width = static_cast<size_t>(b.cols) * ssize;
        CUDA_CHECK(cudaMemcpy2DAsync(b.dst, static_cast<size_t>(b.dst_ld) * dsize, host_[idx], width, width,
                                     static_cast<size_t>(b.rows), cudaMemcpyHostToDevice, copy_));
      }
      CUDA_CHECK(cudaEventRecord(copied_[idx], copy_));
      return;
    }
    CUDA_CHECK(cudaStreamWaitEvent(copy_, converted_[idx], 0));  // scratch idx is free again
    CUDA_CHECK(cudaMemcpyAsync(scratch_[idx], host_[idx], n * ssize, cudaMemcpyHostToDevice, copy_));
    CUDA_CHECK(cudaEventRecord(copied_[idx], copy_));
    CUDA_CHECK(cudaStreamWaitEvent(convert_, copied_[idx], 0));
    cuda_backend::upload_block(scratch_[idx], b.src_dtype, b.rows, b.cols, b.dst, b.dst_dtype, b.dst_ld,
                               b.transpose, convert_);
    CUDA_CHECK(cudaEventRecord(converted_[idx], convert_));
  }
  void finish() override {
    CUDA_CHECK(cudaStreamSynchronize(copy_));
    CUDA_CHECK(cudaStreamSynchronize(convert_));
  }

 private:
  // Waits for everything queued (errors ignored: this also runs after a failure), then frees it all.
  void release() {
    cudaSetDevice(device_);
    if (copy_) cudaStreamSynchronize(copy_);
    if (convert_) cudaStreamSynchronize(convert_);
    for (void* p : host_)
      if (p) cudaFreeHost(p);
    for (void* p : scratch_)
      if (p) cudaFree(p);
    for (cudaEvent_t e : copied_)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : converted_)
      if (e) cudaEventDestroy(e);
    if (copy_) cudaStreamDestroy(copy_);
    if (convert_) cudaStreamDestroy(convert_);
    host_.clear();
    scratch_.clear();
    copied_.clear();
    converted_.clear();
    copy_ = convert_ = nullptr;
    cudaGetLastError();
  }

  int device_;
  size_t bytes_;
  cudaStream_t copy_ = nullptr;
  cudaStream_t convert_ = nullptr;
  std::vector<void*> host_;     // page-locked, bytes_ each
  std::vector<void*> scratch_;  // device, bytes_ each
  std::vector<cudaEvent_t> copied_;
  std::vector<cudaEvent_t> converted_;
};

// Tensor parallelism puts backends of several GPUs in one process, each called from several threads (its
// rank's, the engine's, the adapter upload thread): once a backend of a GPU other than 0 exists, every
// call makes its backend's GPU current first (a thread starts on GPU 0, so until then nothing is needed;
// the calls of a single-GPU process stay as they were).
std::atomic<bool> g_several_devices{false};

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (!g_several_devices.load(std::memory_order_relaxed)) return;
    int current = -1;
    CUDA_CHECK(cudaGetDevice(&current));
    if (current != device) CUDA_CHECK(cudaSetDevice(device));
  }
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType weight_dtype, int64_t bf16_split_max_rows)
      : device_(device), weight_dtype_(weight_dtype), bf16_split_max_rows_(bf16_split_max_rows) {
    if (device_ != 0) g_several_devices.store(true);
    CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = fmt::format("cuda:{} ({})", device_, prop.name);
    // The kernels' tuned bounds are those of this device's files (kernels/tuning.h). One device per
    // process: with tensor parallelism every rank's GPU is the same model.
    k::set_tuning_device(prop.name);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&side_fork_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&side_join_, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // Kernels' counters kept zero between calls (k::CudaContext::counters), zeroed once here.
    CUDA_CHECK(cudaMalloc(&counters_, kNumCounters * sizeof(int32_t)));
    CUDA_CHECK(cudaMemsetAsync(counters_, 0, kNumCounters * sizeof(int32_t), stream_));
    // No TF32 for fp32 products; bf16 GemmEx with CUBLAS_COMPUTE_32F uses tensor cores regardless.
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  }
  ~CudaBackend() override {
    if (g_several_devices.load()) cudaSetDevice(device_);  // errors ignored, as below
    print_profile();
    // Errors are ignored here: a destructor must not throw, and the process may be shutting down.
    cudaStreamSynchronize(stream_);
    for (auto& [p, n] : blocks_) cudaFree(p);
    if (workspace_) cudaFree(workspace_);
    if (counters_) cudaFree(counters_);
    cublasDestroy(cublas_);
    cudaEventDestroy(side_fork_);
    cudaEventDestroy(side_join_);
    cudaStreamDestroy(side_stream_);  // its work was joined back into stream_, synchronized above
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  DType weight_dtype() const override { return weight_dtype_; }
  int device_index() const override { return device_; }
  void* queue_handle() const override { return stream_; }
  std::unique_ptr<Backend> make_peer(int device) const override {
    int current = 0;
    CUDA_CHECK(cudaGetDevice(&current));
    auto peer = std::make_unique<CudaBackend>(device, weight_dtype_, bf16_split_max_rows_);
    CUDA_CHECK(cudaSetDevice(current));  // the calling thread keeps its GPU
    return peer;
  }
  void fill_zero(void* ptr, size_t bytes) override {
    DeviceScope on_device(device_);
    if (bytes == 0) return;
    timed("fill_zero", [&] { CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, stream_)); });
  }
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t rows) override {
    DeviceScope on_device(device_);
    if (width == 0 || rows == 0) return;
    CUDA_CHECK(
        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice, stream_));
  }

  void* alloc(size_t bytes) override {
    DeviceScope on_device(device_);
    size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("out of GPU memory on {} allocating {} bytes ({} bytes allocated so far): {}", name_, bytes,
           allocated_, cudaGetErrorString(err));
    }
    CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream_));
    blocks_.emplace(p, rounded);
    allocated_ += rounded;
    return p;
  }
  void free(void* ptr) override {
    DeviceScope on_device(device_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFree(ptr));
    allocated_ -= it->second;
    blocks_.erase(it);
  }
  // Synchronous: the host buffer may be reused as soon as this returns.
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    DeviceScope on_device(device_);
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    DeviceScope on_device(device_);
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void synchronize() override {
    DeviceScope on_device(device_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::unique_ptr<UploadStaging> make_upload_staging(int num_buffers, size_t buffer_bytes) override {
    DeviceScope on_device(device_);
    CHECK(num_buffers > 0 && buffer_bytes > 0);
    return std::make_unique<CudaUploadStaging>(device_, stream_, num_buffers, buffer_bytes);
  }
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override {
    DeviceScope on_device(device_);
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  }

  void* alloc_host(size_t bytes) override {
    DeviceScope on_device(device_);
    void* p = nullptr;
    size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    cudaError_t err = cudaHostAlloc(&p, rounded, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      cudaGetLastError();
      fail("cannot allocate {} bytes of page-locked host memory: {}", bytes, cudaGetErrorString(err));
    }
    std::memset(p, 0, rounded);
    return p;
  }
  void free_host(void* ptr) override {
    DeviceScope on_device(device_);
    if (!ptr) return;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaFreeHost(ptr));
  }
  void copy_to_host_async(void* dst, const void* src, size_t bytes) override {
    DeviceScope on_device(device_);
    if (bytes == 0) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void* create_event() override {
    DeviceScope on_device(device_);
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
  void destroy_event(void* event) override {
    DeviceScope on_device(device_);
    if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  void record_event(void* event) override {
    DeviceScope on_device(device_);
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), stream_));
  }
  void wait_event(void* event) override {
    DeviceScope on_device(device_);
    CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  }
  bool event_done(void* event) override {
    DeviceScope on_device(device_);
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) return false;
    CUDA_CHECK(err);
    return true;
  }
  double event_elapsed(void* start, void* end) override {
    DeviceScope on_device(device_);
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
    return ms / 1e3;
  }

  // Graphs: not while POLYLORA_CUDA_PROFILE synchronizes around every op.
  bool supports_graphs() const override { return !profile_; }
  void begin_capture() override {
    DeviceScope on_device(device_);
    capturing_ = true;
    CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  void* end_capture() override {
    DeviceScope on_device(device_);
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    if (err != cudaSuccess || graph == nullptr) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      return nullptr;
    }
    cudaGraphExec_t exec = nullptr;
    err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return exec;
  }
  void run_graph(void* graph) override {
    DeviceScope on_device(device_);
    CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), stream_));
  }
  void destroy_graph(void* graph) override {
    DeviceScope on_device(device_);
    if (!graph) return;
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graph));
  }
  uint64_t workspace_epoch() const override { return workspace_epoch_; }
  void gpu_timer_start() override {
    DeviceScope on_device(device_);
    if (!timer_events_[0]) {
      CUDA_CHECK(cudaEventCreate(&timer_events_[0]));
      CUDA_CHECK(cudaEventCreate(&timer_events_[1]));
    }
    CUDA_CHECK(cudaEventRecord(timer_events_[0], stream_));
  }
  double gpu_timer_stop() override {
    DeviceScope on_device(device_);
    if (!timer_events_[0]) return 0;
    CUDA_CHECK(cudaEventRecord(timer_events_[1], stream_));
    CUDA_CHECK(cudaEventSynchronize(timer_events_[1]));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, timer_events_[0], timer_events_[1]));
    return ms / 1e3;
  }

  k::WeightView matrix_from_host_as(const k::WeightView& host, DType target) override {
    DeviceScope on_device(device_);
    switch (host.dtype) {
      case DType::kF32:
      case DType::kF16:
      case DType::kBF16:
        break;
      case DType::kI32:
      case DType::kI64:
      case DType::kU8:
      case DType::kI8:
        fail("weight matrix of dtype {} cannot be used on {} (expected F32, F16 or BF16)",
             dtype_name(host.dtype), name_);
    }
    const size_t n = static_cast<size_t>(host.rows * host.cols);
    void* dst = alloc(n * dtype_size(target));
    if (host.dtype == target) {
      copy_to_device(dst, host.data, n * dtype_size(target));
    } else {
      const size_t src_size = dtype_size(host.dtype), dst_size = dtype_size(target);
      const size_t chunk = kStagingBytes / src_size;
      ensure_workspace(std::min(n, chunk) * src_size);
      for (size_t off = 0; off < n; off += chunk) {
        size_t count = std::min(chunk, n - off);
        // Stream order: this copy waits for the previous chunk's conversion to finish reading the workspace.
        CUDA_CHECK(cudaMemcpyAsync(workspace_, static_cast<const char*>(host.data) + off * src_size,
                                   count * src_size, cudaMemcpyHostToDevice, stream_));
        cuda_backend::convert(workspace_, host.dtype, static_cast<char*>(dst) + off * dst_size, target, count,
                              stream_);
      }
      synchronize();
    }
    return {dst, target, host.rows, host.cols};
  }
  k::WeightView random_matrix(int64_t rows, int64_t cols, float stddev, uint64_t seed) override {
    DeviceScope on_device(device_);
    const size_t n = static_cast<size_t>(rows * cols);
    void* dst = alloc(n * dtype_size(weight_dtype_));
    cuda_backend::fill_random(dst, weight_dtype_, n, stddev, seed, stream_);
    return {dst, weight_dtype_, rows, cols};
  }
  k::WeightView random_mxfp4(int64_t rows, int64_t cols, uint8_t scale, uint64_t seed) override {
    DeviceScope on_device(device_);
    const size_t n = static_cast<size_t>(rows * cols);
    void* codes = alloc(n / 2);
    void* scales = alloc(n / kMxfp4BlockSize);
    cuda_backend::fill_random(codes, DType::kU8, n / 2, 0.0f, seed, stream_);
    CUDA_CHECK(cudaMemsetAsync(scales, scale, n / kMxfp4BlockSize, stream_));
    return {codes, DType::kU8, rows, cols, static_cast<const uint8_t*>(scales)};
  }
  k::WeightView quantize_int8(const k::WeightView& w) override {
    DeviceScope on_device(device_);
    CHECK_MSG(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
              "quantize_int8: a {} matrix cannot be quantized (expected F32, F16 or BF16)",
              dtype_name(w.dtype));
    const size_t codes_bytes = (static_cast<size_t>(w.rows * w.cols) + 255) / 256 * 256;
    auto* base = static_cast<char*>(alloc(codes_bytes + static_cast<size_t>(w.rows) * sizeof(float)));
    auto* scales = reinterpret_cast<float*>(base + codes_bytes);
    cuda_backend::quantize_int8(w.data, w.dtype, w.rows, w.cols, reinterpret_cast<int8_t*>(base), scales,
                                stream_);
    k::WeightView q{base, DType::kI8, w.rows, w.cols};
    q.row_scales = scales;
    return q;
  }
  const float* vector_from_host(const float* host, size_t n) override {
    DeviceScope on_device(device_);
    auto* p = static_cast<float*>(alloc(n * sizeof(float)));
    copy_to_device(p, host, n * sizeof(float));
    return p;
  }
  size_t allocated_bytes() const override { return allocated_ + workspace_bytes_; }
  int64_t default_split_dense_lora_max_rows() const override { return 64; }
  std::pair<size_t, size_t> memory_info() const override {
    DeviceScope on_device(device_);
    size_t free_bytes = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return {free_bytes, total};
  }

  void set_lora_step(bool lora, int64_t tokens) override {
    static const bool keep = [] {
      const char* e = std::getenv("POLYLORA_PDL_LORA");
      return e != nullptr && e[0] == '1' && e[1] == '\0';
    }();
    k::programmatic_launch_off() =
        lora && !keep && tokens > k::kernel_tuning(k::TuningShape{}).lora_pdl_max_tokens;
  }
  void embedding(const k::EmbeddingArgs& a) override {
    DeviceScope on_device(device_);
    timed("embedding", [&] { k::cuda::embedding(a, ctx()); });
  }
  void linear(const k::LinearArgs& a) override {
    DeviceScope on_device(device_);
    ensure_workspace(k::cuda::linear_workspace_bytes(a, ctx()));
    timed(a.m <= 64 ? "linear (m<=64)" : "linear (m>64)", [&] { k::cuda::linear(a, ctx()); });
  }
  void linear_group(std::span<const k::LinearArgs> group) override {
    DeviceScope on_device(device_);
    const auto count = static_cast<int64_t>(group.size());
    if (k::cuda::linear_group_fused(group.data(), count, ctx())) {
      timed("linear (m<=64)", [&] { k::cuda::linear_group(group.data(), count, ctx()); });  // streamed
      return;
    }
    // Product by product (through cuBLAS from one cast of a shared x where it can).
    size_t ws = 0;
    for (const k::LinearArgs& a : group) ws = std::max(ws, k::cuda::linear_workspace_bytes(a, ctx()));
    ensure_workspace(ws);
    timed(count > 0 && group[0].m <= 64 ? "linear (m<=64)" : "linear (m>64)",
          [&] { k::cuda::linear_group(group.data(), count, ctx()); });
  }
  void rms_norm(const k::RmsNormArgs& a) override {
    DeviceScope on_device(device_);
    timed("rms_norm", [&] { k::cuda::rms_norm(a, ctx()); });
  }
  void add_rms_norm(const k::AddRmsNormArgs& a) override {
    DeviceScope on_device(device_);
    timed("add_rms_norm", [&] { k::cuda::add_rms_norm(a, ctx()); });
  }
  void rope(const k::RopeArgs& a) override {
    DeviceScope on_device(device_);
    timed("rope", [&] { k::cuda::rope(a, ctx()); });
  }
  void write_kv(const k::KvWriteArgs& a) override {
    DeviceScope on_device(device_);
    timed("write_kv", [&] { k::cuda::write_kv(a, ctx()); });
  }
  void rope_kv_write(const k::RopeKvWriteArgs& a) override {
    DeviceScope on_device(device_);
    timed("rope_kv_write", [&] { k::cuda::rope_kv_write(a, ctx()); });
  }
  void attention(const k::AttentionArgs& a) override {
    DeviceScope on_device(device_);
    ensure_workspace(k::cuda::attention_workspace_bytes(a));
    timed("attention", [&] { k::cuda::attention(a, ctx(), weight_dtype_ != DType::kF32); });
  }
  void silu_and_mul(const k::SiluAndMulArgs& a) override {
    DeviceScope on_device(device_);
    timed("silu_and_mul", [&] { k::cuda::silu_and_mul(a, ctx()); });
  }
  void gpt_oss_swiglu(const k::GptOssSwigluArgs& a) override {
    DeviceScope on_device(device_);
    timed("gpt_oss_swiglu", [&] { k::cuda::gpt_oss_swiglu(a, ctx()); });
  }
  void lora_apply(const k::LoraApplyArgs& a) override {
    DeviceScope on_device(device_);
    timed("lora_apply", [&] { k::cuda::lora_apply(a, ctx()); });
  }
  void lora_batch(const k::LoraBatchArgs& a) override {
    DeviceScope on_device(device_);
    ensure_workspace(k::cuda::lora_batch_workspace_bytes(a));
    timed("lora_batch", [&] { k::cuda::lora_batch(a, ctx()); });
  }
  bool dense_lora_ext(int64_t tokens, int64_t tail_cols) const override {
    const k::KernelTuning t = k::kernel_tuning(k::TuningShape{});
    const int64_t from = dense_lora_ext_min_rows_ >= 0 ? dense_lora_ext_min_rows_ : t.lora_dense_ext_min_rows;
    return from > 0 && tokens >= from && tokens > bf16_split_max_rows_ && tail_cols > 0 &&
           tail_cols <= t.lora_dense_ext_max_cols;
  }
  void linear_lora_ext(const k::LinearLoraExtArgs& a) override {
    DeviceScope on_device(device_);
    ensure_workspace(k::cuda::linear_lora_ext_workspace_bytes(a));
    timed("linear_lora_ext", [&] { k::cuda::linear_lora_ext(a, ctx()); });
  }
  void route(const k::RouteArgs& a) override {
    DeviceScope on_device(device_);
    timed("route", [&] { k::cuda::route(a, ctx()); });
  }
  void moe_experts(const k::MoeExpertsArgs& a) override {
    DeviceScope on_device(device_);
    ensure_workspace(k::cuda::moe_experts_workspace_bytes(a, ctx()));
    const char* op = a.experts_mxfp4 ? (a.m <= 64 ? "moe_experts mxfp4 (m<=64)" : "moe_experts mxfp4 (m>64)")
                                     : (a.m <= 64 ? "moe_experts (m<=64)" : "moe_experts (m>64)");
    timed(op, [&] { k::cuda::moe_experts(a, weight_dtype_ != DType::kF32, ctx()); });
  }
  void add_inplace(float* y, const float* x, int64_t n) override {
    DeviceScope on_device(device_);
    timed("add_inplace", [&] { cuda_backend::add_inplace(y, x, n, stream_); });
  }
  void gather_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols,
                   float* dst) override {
    DeviceScope on_device(device_);
    timed("gather_rows", [&] { cuda_backend::gather_rows(src, rows, num_rows, cols, dst, stream_); });
  }
  void feed_tokens(int32_t* dst, const int32_t* pairs, int64_t n, const int32_t* src) override {
    DeviceScope on_device(device_);
    cuda_backend::feed_tokens(dst, pairs, n, src, stream_);
  }
  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids) override {
    DeviceScope on_device(device_);
    timed("argmax_rows", [&] { cuda_backend::argmax_rows(x, rows, cols, ids, stream_); });
  }
  void sample(const k::SampleArgs& a) override {
    DeviceScope on_device(device_);
    timed("sample", [&] { k::cuda::sample(a, ctx()); });
  }

 private:
  // The ops' kernels are queued through timed(), so a dry run skips them (feed_tokens and the copies are
  // step inputs, queued outside the forward pass).
  // POLYLORA_CUDA_PROFILE=1: each op is bracketed by stream synchronizations and its wall time summed per
  // op name; the totals are printed to stderr when the backend is destroyed (a diagnostic, not for serving).
  template <typename Fn>
  void timed(const char* op, Fn&& fn) {
    if (dry_run_) return;  // the caller reserved the op's workspace; nothing is queued
    if (!profile_) {
      fn();
      return;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto t0 = std::chrono::steady_clock::now();
    fn();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    auto& [seconds, calls] = profile_totals_[op];
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++calls;
  }
  void print_profile() const {
    if (!profile_) return;
    double total = 0;
    for (const auto& [op, v] : profile_totals_) total += v.first;
    std::fprintf(stderr, "polylora CUDA op profile (%s):\n", name_.c_str());
    for (const auto& [op, v] : profile_totals_)
      std::fprintf(stderr, "  %-22s %9.3f s  %5.1f%%  %8ld calls\n", op.c_str(), v.first,
                   100 * v.first / total, static_cast<long>(v.second));
  }
  bool profile_ = std::getenv("POLYLORA_CUDA_PROFILE") != nullptr;
  std::map<std::string, std::pair<double, int64_t>> profile_totals_;

  k::CudaContext ctx() const {
    return {stream_,   cublas_,      workspace_,   workspace_bytes_, bf16_split_max_rows_,
            counters_, kNumCounters, side_stream_, side_fork_,       side_join_};
  }

  // Grows the workspace (after the stream drains, since queued kernels may still use the old one). The
  // largest step sizes it once; later steps of that size or smaller reuse it without allocating.
  void ensure_workspace(size_t bytes) {
    if (bytes <= workspace_bytes_) return;
    CHECK_MSG(!capturing_, "the workspace must not grow during graph capture ({} > {} bytes)", bytes,
              workspace_bytes_);
    ++workspace_epoch_;
    size_t grown = std::max(bytes, workspace_bytes_ + workspace_bytes_ / 2);
    grown = (grown + 255) / 256 * 256;
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (workspace_) CUDA_CHECK(cudaFree(workspace_));
    workspace_ = nullptr;
    workspace_bytes_ = 0;
    cudaError_t err = cudaMalloc(&workspace_, grown);
    if (err != cudaSuccess) {
      cudaGetLastError();
      workspace_ = nullptr;
      fail("out of GPU memory on {} allocating a {}-byte workspace: {}", name_, grown,
           cudaGetErrorString(err));
    }
    workspace_bytes_ = grown;
  }

  int device_;
  DType weight_dtype_;
  int64_t bf16_split_max_rows_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  // k::CudaContext::side_stream and its fork / join events.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_join_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  static constexpr int64_t kNumCounters = 32 * 1024;  // decode attention's: (row, head) CTA rows that split
  int32_t* counters_ = nullptr;
  uint64_t workspace_epoch_ = 0;
  bool capturing_ = false;
  cudaEvent_t timer_events_[2] = {nullptr, nullptr};
  std::unordered_map<void*, size_t> blocks_;
  size_t allocated_ = 0;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    fail(
        "--device cuda: no usable CUDA GPU ({}: {}); check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or "
        "use "
        "--device cpu",
        cudaGetErrorName(err), cudaGetErrorString(err));
  }
  if (n == 0) fail("--device cuda: no CUDA GPU found; use --device cpu");
  if (options.device_index < 0 || options.device_index >= n)
    fail("--device cuda: GPU index {} does not exist ({} GPU(s) visible)", options.device_index, n);
  switch (options.weight_dtype) {
    case DType::kBF16:
    case DType::kF32:
      break;
    case DType::kF16:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      fail("--dtype {}: the CUDA backend stores weights as bfloat16 or float32",
           dtype_name(options.weight_dtype));
  }
  int64_t split_rows = options.bf16_split_max_rows;
  if (const char* env = std::getenv("POLYLORA_BF16_SPLIT_MAX_ROWS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    long long v = std::strtoll(env, &end, 10);
    if (*end != '\0' || v < 0)
      fail("POLYLORA_BF16_SPLIT_MAX_ROWS must be a number of rows >= 0 (0: never split), not '{}'", env);
    split_rows = v;
  }
  return std::make_unique<CudaBackend>(options.device_index, options.weight_dtype, split_rows);
}

}  // namespace polylora
