// backend/backend.h: where a forward pass runs (CPU or CUDA): device memory and the op calls.
// Owns: the interface the model's single forward pass is written against. Every op takes the kernel
// argument structs of kernels/<op>/ whose pointers are in this backend's memory (host memory for the
// CPU backend, device memory for CUDA). Allocations live until the backend is destroyed.
// Must not: know about models, adapters or requests (it sees pointers and shapes only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/linear/linear.h"
#include "kernels/lora/lora.h"
#include "kernels/moe/moe.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"

namespace polylora {

enum class DeviceKind { kCpu, kCuda };

struct BackendOptions {
  DeviceKind device = DeviceKind::kCpu;
  int device_index = 0;
  // Storage type of weight matrices on the device: kBF16 (default on CUDA: bf16 GEMMs with f32
  // accumulation) or kF32 (--dtype float32). The CPU backend keeps checkpoint dtypes (zero-copy).
  DType weight_dtype = DType::kBF16;
  // BF16 weights: products of at most this many token rows take activations as a hi + lo pair of bf16
  // (near-f32 results; decode and short prefills, where the extra tensor-core work is nearly free), larger
  // ones (compute-bound prefill chunks) round them to one bf16 as Hugging Face's bf16 forward does. 0:
  // never split; a huge value: always. The environment variable POLYLORA_BF16_SPLIT_MAX_ROWS overrides it.
  int64_t bf16_split_max_rows = kernels::CudaContext::kBf16SplitMaxRowsDefault;
};

// One block of a weight upload (the staged loader, model/weight_upload.h): `rows` x `cols` values of
// `src_dtype`, row-major and contiguous in a staging buffer, stored in backend memory at `dst` as
// `dst_dtype`: element (i, j) at dst[i * dst_ld + j], or transposed at dst[j * dst_ld + i] (dst_ld in
// elements). Conversions: F32/F16/BF16 -> F32/BF16, and any dtype to itself (exact).
struct UploadBlock {
  int64_t rows = 0;
  int64_t cols = 0;
  DType src_dtype = DType::kBF16;
  void* dst = nullptr;
  DType dst_dtype = DType::kBF16;
  int64_t dst_ld = 0;
  bool transpose = false;
};
// Fails (CHECK) unless `b` is a valid block for a staging buffer of `buffer_bytes` (every implementation
// checks its blocks with it).
void check_upload_block(const UploadBlock& b, size_t buffer_bytes);

// Host staging buffers for weight uploads and the uploads out of them (Backend::make_upload_staging).
// Reader threads fill buffer(i); one thread (the owner) queues upload(i, ...) and finally finish(). On CUDA
// the buffers are page-locked and the uploads are queued on copy and conversion streams of their own, so
// they overlap the reads; a buffer may be refilled once wait(i) returned (any thread may call it). The
// destructor waits for uploads still queued before it frees the buffers (also after an error).
class UploadStaging {
 public:
  virtual ~UploadStaging() = default;
  virtual int num_buffers() const = 0;
  virtual size_t buffer_bytes() const = 0;
  virtual std::byte* buffer(int i) = 0;
  // Blocks until no queued upload reads buffer i any more.
  virtual void wait(int i) = 0;
  // Queues the upload of `block`, whose values are the first bytes of buffer i (at most buffer_bytes()).
  virtual void upload(int i, const UploadBlock& block) = 0;
  // Waits for every upload; their results are then visible to everything queued on the backend later.
  virtual void finish() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "cpu" or "cuda:0 (NVIDIA H200)"
  virtual DeviceKind kind() const = 0;
  // The GPU this backend runs on (-1: none, the CPU), and its queue (a cudaStream_t on CUDA: where a
  // communicator of tensor parallelism queues its collectives so they are ordered with the ops; nullptr
  // on the CPU).
  virtual int device_index() const { return -1; }
  virtual void* queue_handle() const { return nullptr; }
  // Another backend like this one (same weight dtype and options) on GPU `device` (tensor parallelism: a
  // rank's backend); the CPU backend makes another CPU backend and ignores `device`.
  virtual std::unique_ptr<Backend> make_peer(int device) const = 0;
  // Weight matrices handed to matrix_from_host() are stored in this dtype (kCpu: as given).
  virtual DType weight_dtype() const = 0;

  // Memory. alloc() returns zeroed memory aligned to 256 bytes.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;                                           // memory from alloc()
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;  // host -> backend
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;    // backend -> host, waits
  virtual void synchronize() = 0;
  // A weight matrix from host memory (any float dtype); the CPU backend returns the host pointer as is
  // (zero-copy from a mapping), others copy (and convert to weight_dtype()).
  kernels::WeightView matrix_from_host(const kernels::WeightView& host) {
    return matrix_from_host_as(host, weight_dtype());
  }
  // The same, stored as `target` on devices that convert (the CPU backend keeps the host view: it computes
  // in f32 from any dtype). Used to keep MoE router weights in f32 on the GPU.
  virtual kernels::WeightView matrix_from_host_as(const kernels::WeightView& host, DType target) = 0;
  // A [rows, cols] matrix of random values (uniform, standard deviation `stddev`) in weight_dtype(),
  // made on the device (--load-format dummy).
  virtual kernels::WeightView random_matrix(int64_t rows, int64_t cols, float stddev, uint64_t seed) = 0;
  // A [rows, cols] MXFP4 matrix (kernels/tensor_view.h; cols a multiple of 32) of random codes, every code
  // equally likely, and every scale byte `scale` (--load-format dummy on an MXFP4 config). Default: made on
  // the host and copied.
  virtual kernels::WeightView random_mxfp4(int64_t rows, int64_t cols, uint8_t scale, uint64_t seed);
  // Weight matrix `w` (F32, F16 or BF16, in this backend's memory) quantized to INT8 (common/int8.h:
  // per-row symmetric scales), as a new view whose codes [rows, cols] and f32 row scales [rows] are one
  // allocation starting at `data`; `w` is left as it is (the caller frees it). Default (host memory, the
  // CPU): rows in parallel with OpenMP; CUDA: on the device, the same bytes.
  virtual kernels::WeightView quantize_int8(const kernels::WeightView& w);
  // An f32 vector from host memory (norm weights, biases, sinks).
  virtual const float* vector_from_host(const float* host, size_t n) = 0;
  // Bytes allocated so far.
  virtual size_t allocated_bytes() const = 0;
  // Free and total device memory in bytes ({0, 0} where not meaningful, e.g. on the CPU).
  virtual std::pair<size_t, size_t> memory_info() const { return {0, 0}; }

  // Staging for weight uploads: `num_buffers` buffers of `buffer_bytes`. Uploads are ordered after
  // everything queued on the backend before this call (allocations included). Default (host memory, the
  // CPU): plain buffers, each upload done at once on the calling thread.
  virtual std::unique_ptr<UploadStaging> make_upload_staging(int num_buffers, size_t buffer_bytes);

  // Zeroes `bytes` of backend memory, queued like an op. Default (host memory): memset.
  virtual void fill_zero(void* ptr, size_t bytes);
  // Backend memory -> backend memory, queued like an op: `rows` rows of `width` bytes from src (rows
  // `src_pitch` bytes apart) to dst (rows `dst_pitch` bytes apart). Default (host memory): memcpy per row.
  virtual void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t rows);
  // Asynchronous host -> backend copy, queued before the ops that follow; the host buffer may be reused
  // as soon as it returns (pageable source). Default: the synchronous copy.
  virtual void copy_to_device_async(void* dst, const void* src, size_t bytes) {
    copy_to_device(dst, src, bytes);
  }
  // Host memory for asynchronous copies: page-locked on CUDA (so copies from and to it run without the
  // host waiting), plain zeroed memory elsewhere; aligned to 256 bytes. Freed with free_host().
  virtual void* alloc_host(size_t bytes);
  virtual void free_host(void* ptr);
  // Asynchronous backend -> host copy into alloc_host() memory, queued after the ops before it; the data
  // is there once an event recorded after it has completed. Default: the synchronous copy.
  virtual void copy_to_host_async(void* dst, const void* src, size_t bytes) { copy_to_host(dst, src, bytes); }
  // Events: markers in the backend's queue. record_event() marks the point after everything queued so far;
  // wait_event() blocks the host until that point has run; event_done() asks without blocking. Where ops
  // run synchronously (the CPU) events are null handles and every wait returns at once.
  virtual void* create_event() { return nullptr; }
  virtual void destroy_event(void* event) {}
  virtual void record_event(void* event) {}
  virtual void wait_event(void* event) {}
  virtual bool event_done(void* event) { return true; }
  // Seconds of backend time between two completed events (0 where not measured).
  virtual double event_elapsed(void* start, void* end) { return 0; }

  // Recorded op sequences (CUDA graphs). Between begin_capture() and end_capture() the ops are recorded,
  // not run; nothing may allocate, free, copy synchronously or synchronize in between. end_capture()
  // returns a handle (nullptr when capture failed; the ops were then not run either), run_graph() replays
  // it. A captured graph holds the workspace pointer it saw: it is valid while workspace_epoch() is
  // unchanged (the epoch moves whenever the workspace is reallocated).
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual void* end_capture() { return nullptr; }
  virtual void run_graph(void* graph) {}
  virtual void destroy_graph(void* graph) {}
  virtual uint64_t workspace_epoch() const { return 0; }
  // Dry run (for recording graphs without running the step first): while on, ops reserve the workspace
  // they need but queue no kernel, so a capture right after finds every buffer in place. Only meaningful
  // where graphs exist (CUDA); the CPU runs its ops regardless.
  void set_dry_run(bool on) { dry_run_ = on; }
  bool dry_run() const { return dry_run_; }
  // GPU time of what is queued between gpu_timer_start() and gpu_timer_stop() (which waits for it), in
  // seconds; 0 where not measured (the CPU).
  virtual void gpu_timer_start() {}
  virtual double gpu_timer_stop() { return 0; }

  // Ops (see kernels/<op>/*.h for the semantics; all pointers in backend memory).
  // Steps of at most this many tokens run the dense q/k/v and o LoRA split over other ops (model/decoder.cc):
  // the shrink with the projection (kernels::LinearArgs::lora_shrink), the expand inside rope_kv_write and
  // add_rms_norm (kernels::LoraExpandIn), so it adds no launch of its own (decode). The backend's default
  // (CUDA 64, the CPU 0: lora_batch), or what set_split_dense_lora_max_rows set (tests; -1: the default).
  int64_t split_dense_lora_max_rows() const {
    return split_dense_lora_max_rows_ >= 0 ? split_dense_lora_max_rows_ : default_split_dense_lora_max_rows();
  }
  void set_split_dense_lora_max_rows(int64_t rows) { split_dense_lora_max_rows_ = rows; }

  // The ops queued from here on belong to a step of `tokens` tokens with LoRA kernels (lora true) or not.
  // CUDA launches a LoRA step's kernels without programmatic dependent launch above the tuned
  // lora_pdl_max_tokens (POLYLORA_PDL_LORA=1 keeps it always): on the H200, batch-1 decode of GPT-OSS-20B
  // with an adapter took 3.336 ms per step with PDL against 3.202 without before the expert LoRA's delta
  // mode, while the base model gains from it (2.580 vs 2.681 ms; docs/pdl.md); with delta mode, steps of 1
  // and 4 tokens gain from it again (session 36), and since the expand-fused activation is launched plainly
  // every size does (H100, session 47: the bound is now unlimited). Others ignore it.
  virtual void set_lora_step(bool lora, int64_t tokens) { (void)lora, (void)tokens; }

  virtual void embedding(const kernels::EmbeddingArgs& args) = 0;
  virtual void linear(const kernels::LinearArgs& args) = 0;
  // Products of the same input (q, k and v): the same results as linear() on each (up to the order of
  // partial sums where a backend fuses them), which is what this default does. CUDA streams them in one
  // launch at decode sizes (kernels::cuda::linear_group).
  virtual void linear_group(std::span<const kernels::LinearArgs> group) {
    for (const kernels::LinearArgs& a : group) linear(a);
  }
  virtual void rms_norm(const kernels::RmsNormArgs& args) = 0;
  // The residual add fused with the next norm: x += delta, then y = rms_norm(x) · w (one launch for
  // add_inplace then rms_norm, with the same results).
  virtual void add_rms_norm(const kernels::AddRmsNormArgs& args) = 0;
  virtual void rope(const kernels::RopeArgs& args) = 0;
  virtual void write_kv(const kernels::KvWriteArgs& args) = 0;
  // Optional q/k per-head norms, RoPE on q (in place) and k, and the KV-cache write of k and v, in one op
  // (what rms_norm twice, rope twice and write_kv did).
  virtual void rope_kv_write(const kernels::RopeKvWriteArgs& args) = 0;
  virtual void attention(const kernels::AttentionArgs& args) = 0;
  virtual void silu_and_mul(const kernels::SiluAndMulArgs& args) = 0;
  virtual void gpt_oss_swiglu(const kernels::GptOssSwigluArgs& args) = 0;
  virtual void lora_apply(const kernels::LoraApplyArgs& args) = 0;
  virtual void lora_batch(const kernels::LoraBatchArgs& args) = 0;
  // The dense LoRA as extra K columns of its product (kernels::LinearLoraExtArgs, model/lora_dense_ext.h):
  // whether steps of `tokens` tokens take it with `tail_cols` tail columns per product (CUDA: past the
  // bf16 split rows, from lora_dense_ext_min_rows (tuned, or what set_dense_lora_ext_min_rows set), up to
  // lora_dense_ext_max_cols; the CPU only from what set_dense_lora_ext_min_rows set, through the
  // reference; never elsewhere), and the op (elsewhere an error). Asked when the stacks are reserved
  // (whether to make the extended matrices) and per step.
  virtual bool dense_lora_ext(int64_t tokens, int64_t tail_cols) const {
    (void)tokens, (void)tail_cols;
    return false;
  }
  virtual void linear_lora_ext(const kernels::LinearLoraExtArgs& args);
  // Tests: steps of from `rows` tokens take it (0: never; -1: the backend's default); exact (the CPU): the
  // reference op without its bf16 rounding, so the model's side of the path can be compared exactly.
  void set_dense_lora_ext_min_rows(int64_t rows, bool exact = false) {
    dense_lora_ext_min_rows_ = rows;
    dense_lora_ext_exact_ = exact;
  }
  // The dtype of the LoRA stacks (model/lora_stacks.h): BF16 on CUDA with BF16/F16 weights, else F32 (the
  // CPU's sgemm paths), except BF16 on the CPU where a test runs the extended products there (they take
  // BF16 stacks; its lora_batch runs BF16 stacks through the reference).
  virtual DType lora_stack_dtype() const {
    return kind() == DeviceKind::kCuda && weight_dtype() != DType::kF32 ? DType::kBF16 : DType::kF32;
  }
  virtual void route(const kernels::RouteArgs& args) = 0;
  virtual void moe_experts(const kernels::MoeExpertsArgs& args) = 0;
  // y[i] += x[i] for i < n (residual connections).
  virtual void add_inplace(float* y, const float* x, int64_t n) = 0;
  // dst[r] = src[rows[r]] for r < num_rows, rows of `cols` floats (gathering the rows whose logits are
  // wanted).
  virtual void gather_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols,
                           float* dst) = 0;
  // ids[r] = the first index of the largest value of row r of x [rows, cols] (greedy sampling on the
  // device: only the ids come back).
  virtual void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids) = 0;
  // dst[pairs[2i]] = src[pairs[2i + 1]] for i < n: token ids that a step sampled on the device become
  // inputs of the next step without a trip through the host (asynchronous scheduling).
  virtual void feed_tokens(int32_t* dst, const int32_t* pairs, int64_t n, const int32_t* src) = 0;
  // Samples rows of logits in backend memory with the CPU sampler's semantics (kernels/sampling/sampling.h;
  // worker/device_sampler.h builds the arguments). CUDA: queued kernels; CPU: the same algorithm's host
  // version (kernels::ref::sample), run at once.
  virtual void sample(const kernels::SampleArgs& args) = 0;

 protected:
  virtual int64_t default_split_dense_lora_max_rows() const { return 0; }
  bool dry_run_ = false;
  int64_t dense_lora_ext_min_rows_ = -1;
  bool dense_lora_ext_exact_ = false;

 private:
  int64_t split_dense_lora_max_rows_ = -1;
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws polylora::Error when CUDA support is not compiled in, or no GPU / driver is present.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
// Number of CUDA devices usable now (0 without a driver or without CUDA support in this build).
int cuda_device_count();

}  // namespace polylora
