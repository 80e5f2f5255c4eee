// model/weight_loader.h: fetches named parameters for an architecture file, from a checkpoint or as
// random values (--load-format dummy), checking each name and shape against the config, and places them
// in backend memory. Errors name the first mismatch: a missing tensor, a wrong shape, or (at finish())
// a tensor of the checkpoint that the architecture does not use.
// How checkpoint bytes reach the backend (WeightUploadOptions::path): on the CPU backend matrices are
// zero-copy views into the mapping; elsewhere the binders only allocate and record upload jobs, and
// finish() runs them through the staged pipeline (model/weight_upload.h: parallel reads overlapped with
// device copies, experts transposed and dtypes converted on the device). A planner (plan mode) records
// the names and shapes an architecture asks for without loading anything (checkpoint writers).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weight_upload.h"
#include "model/weights.h"

namespace polylora {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

// --quantization: how weight matrices are stored after loading (model/quantize.h).
enum class WeightQuantization {
  kNone,  // as the checkpoint (or the backend's weight dtype) has them
  kInt8,  // W8A16: the linear layers' and experts' matrices as INT8 with one f32 scale per output row
};

// A tensor an architecture reads, as a checkpoint holds it (plan mode).
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool is_vector = false;  // norms, biases, sinks (read as f32)
  float fill = 0;          // for vectors: the value the dummy loader centres on (1 for norm weights)
  // MXFP4 parts (U8 in the checkpoint): the E2M1 codes of `*_blocks` (random bytes), or the E8M0 scales of
  // `*_scales` (every byte kDummyMxfp4Scale).
  enum class Quantized { kNo, kMxfp4Codes, kMxfp4Scales };
  Quantized quantized = Quantized::kNo;
};

// The standard deviation of dummy float weights (uniform), and of the noise around dummy vectors' fill.
inline constexpr float kDummyStddev = 0.02f;
// The next value, uniform in [-1, 1), of the dummy weights' random stream (splitmix64 over `state`).
double dummy_uniform(uint64_t& state);

// The scale byte of dummy and randomly written MXFP4 weights: 2^-7, so that uniformly random E2M1 codes have
// a standard deviation of 0.023 (the dummy float weights': 0.02).
inline constexpr uint8_t kDummyMxfp4Scale = 120;

// A staged load left running by WeightLoader::finish() (WeightUploadOptions::background). wait() returns
// once the weights are in place on the device and logs the load as finish() would have ("Loaded weights:
// ..."), or throws the load's error (a file truncated meanwhile, a failed copy). Destroying it unwaited
// waits too (errors dropped).
class WeightsInFlight {
 public:
  WeightsInFlight(std::unique_ptr<PendingUploads> uploads, std::chrono::steady_clock::time_point start,
                  double bind_seconds);
  void wait();

 private:
  std::unique_ptr<PendingUploads> uploads_;
  std::chrono::steady_clock::time_point start_;
  double bind_seconds_;
};

class WeightLoader {
 public:
  // checkpoint: nullptr in dummy mode. weights: receives owned host buffers.
  WeightLoader(const Checkpoint* checkpoint, Backend& backend, ModelWeights& weights, uint64_t seed = 0,
               const WeightUploadOptions& upload = {});
  // Plan mode: every call records what it asks for into `plan` (each tensor once, in the order asked) and
  // returns empty views; nothing is read or allocated.
  WeightLoader(std::vector<ExpectedTensor>& plan, ModelWeights& weights);

  bool dummy() const { return checkpoint_ == nullptr; }
  bool has(const std::string& name) const;
  // A 2-D matrix [rows, cols].
  // keep_f32: store as f32 on devices that otherwise convert to bf16 (MoE routers: near-tied router
  // scores should not flip through weight rounding).
  kernels::WeightView matrix(const std::string& name, int64_t rows, int64_t cols, bool keep_f32 = false);
  // A 1-D f32 vector. In dummy mode: `fill` plus small noise.
  const float* vector(const std::string& name, int64_t n, float fill);
  // Expert e of a 3-D tensor [E, a, b] stored (in, out): returned transposed as [b, a] (out, in).
  kernels::WeightView expert_transposed(const std::string& name, int64_t num_experts, int64_t a, int64_t b,
                                        int64_t expert);
  // Expert e of an MXFP4 matrix as the checkpoint ships it: `name`_blocks U8 [E, out, in / 32, 16] (the E2M1
  // codes, two per byte) and `name`_scales U8 [E, out, in / 32]; returned as an MXFP4 view [out, in]
  // (kernels/tensor_view.h), never converted: zero-copy on the CPU, copied byte for byte elsewhere. In
  // dummy mode: random codes with scale kDummyMxfp4Scale. Errors name the tensor: blocks or scales
  // missing, not U8, or of shapes that disagree with each other or with the config.
  kernels::WeightView expert_mxfp4(const std::string& name, int64_t num_experts, int64_t out, int64_t in,
                                   int64_t expert);
  // Row e of a 2-D tensor [E, n] as f32 (per-expert biases).
  const float* expert_vector(const std::string& name, int64_t num_experts, int64_t n, int64_t expert);
  // Copies a host array of expert views into backend memory.
  const kernels::ExpertView* experts_to_device(const std::vector<kernels::ExpertView>& experts);
  // Throws if the checkpoint holds a tensor nothing asked for; then (staged path) reads and uploads every
  // tensor, and logs the time and rate of the load. With WeightUploadOptions::background the staged path
  // only starts the load (its files checked, its staging buffers made): take_in_flight() hands it over.
  void finish();
  std::unique_ptr<WeightsInFlight> take_in_flight() { return std::move(in_flight_); }
  // After finish(): replaces matrix `w` (a view this loader returned) by its INT8 copy
  // (Backend::quantize_int8, --quantization int8) and frees the memory that held `w` once no other view
  // this loader returned lives in it (an [E, ...] expert tensor: after its last expert); views into the
  // CPU's checkpoint mapping are simply no longer used. Counts the INT8 bytes in ModelWeights::num_bytes.
  void quantize_int8(kernels::WeightView& w);

 private:
  enum class Mode { kPlan, kDummy, kPerTensor, kStaged };
  // The checkpoint's tensor `name`, of `shape`; U8 only where `quantized` (MXFP4 parts), else a float dtype.
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape, bool quantized = false);
  // Expert e's bytes [offset, offset + bytes) of U8 tensor t in backend memory (zero-copy on the CPU).
  const uint8_t* expert_bytes(const TensorInfo& t, int64_t num_experts, size_t bytes, int64_t expert);
  const float* upload(const std::vector<float>& v);
  void plan(const std::string& name, std::vector<int64_t> shape, bool is_vector = false, float fill = 0,
            ExpectedTensor::Quantized quantized = ExpectedTensor::Quantized::kNo);
  // Stored dtype of a matrix of checkpoint dtype `src` (the CPU keeps checkpoint dtypes, as its
  // zero-copy views do; devices store weight_dtype(), or f32 when asked).
  DType stored_dtype(DType src, bool keep_f32) const;
  // Backend memory of a whole [E, ...] tensor loaded for its experts: E slots of `slot_bytes` each.
  std::byte* expert_block(const std::string& name, int64_t num_experts, size_t slot_bytes);

  const Checkpoint* checkpoint_;
  Backend* backend_;  // nullptr in plan mode
  ModelWeights& weights_;
  uint64_t seed_;
  WeightUploadOptions upload_options_;
  Mode mode_;
  std::vector<ExpectedTensor>* plan_ = nullptr;
  std::set<std::string> used_;
  std::vector<UploadJob> jobs_;                      // staged: queued until finish()
  std::unique_ptr<WeightsInFlight> in_flight_;       // staged, background: started by finish()
  std::map<std::string, std::byte*> expert_blocks_;  // staged: per 3-D/2-D expert tensor
  // Backend allocations holding matrices, for quantize_int8(): the allocation of each matrix view's data
  // and the number of views still in each.
  std::map<const void*, const void*> view_allocation_;
  std::map<const void*, int64_t> allocation_views_;
  void track(const void* view_data, const void* allocation);
  uint64_t bytes_per_tensor_path_ = 0;               // per-tensor path: checkpoint bytes read
  std::chrono::steady_clock::time_point start_;
  // Progress of the checkpoint's shards (files), logged as vLLM's "Loading safetensors checkpoint shards".
  void shard_progress(const TensorInfo& t);
  std::map<std::string, std::pair<size_t, size_t>> shard_tensors_;  // file -> (tensors used, tensors)
  size_t shards_done_ = 0;
};

}  // namespace polylora
