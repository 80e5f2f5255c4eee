// model/weight_loader.h: fetches named parameters for an architecture file, from a checkpoint or as
// random values (--load-format dummy), checking each name and shape against the config, and places them
// in backend memory. Errors name the first mismatch: a missing tensor, a wrong shape, or (at finish())
// a tensor of the checkpoint that the architecture does not use.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace polylora {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

class WeightLoader {
 public:
  // checkpoint: nullptr in dummy mode. weights: receives owned host buffers.
  WeightLoader(const Checkpoint* checkpoint, Backend& backend, ModelWeights& weights, uint64_t seed = 0);

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
  // Row e of a 2-D tensor [E, n] as f32 (per-expert biases).
  const float* expert_vector(const std::string& name, int64_t num_experts, int64_t n, int64_t expert);
  // Copies a host array of expert views into backend memory.
  const kernels::ExpertView* experts_to_device(const std::vector<kernels::ExpertView>& experts);
  // Throws if the checkpoint holds a tensor nothing asked for.
  void finish() const;

 private:
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape);
  const float* upload(const std::vector<float>& v);

  const Checkpoint* checkpoint_;
  Backend& backend_;
  ModelWeights& weights_;
  uint64_t seed_;
  std::set<std::string> used_;
};

}  // namespace polylora
