// model/weight_loader.h: fetches named parameters for an architecture file, from a checkpoint or as
// random values (--load-format dummy), checking each name and shape against the config.
// Errors name the first mismatch: a missing tensor, a wrong shape, or (at finish()) a tensor of the
// checkpoint that the architecture does not use.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "model/weights.h"

namespace polylora {

enum class LoadFormat { kAuto, kSafetensors, kDummy };

class WeightLoader {
 public:
  // checkpoint: nullptr in dummy mode. weights: receives owned buffers.
  WeightLoader(const Checkpoint* checkpoint, ModelWeights& weights, uint64_t seed = 0);

  bool dummy() const { return checkpoint_ == nullptr; }
  bool has(const std::string& name) const;
  // A 2-D matrix [rows, cols] (zero-copy from the checkpoint).
  kernels::WeightView matrix(const std::string& name, int64_t rows, int64_t cols);
  // A 1-D vector as f32. In dummy mode: `fill` + small noise when fill != 0, else small random values.
  std::vector<float> vector(const std::string& name, int64_t n, float fill);
  // Expert e of a 3-D tensor [E, a, b] stored (in, out): returns it transposed as [b, a] (out, in).
  kernels::WeightView expert_transposed(const std::string& name, int64_t num_experts, int64_t a, int64_t b,
                                        int64_t expert);
  // Row e of a 2-D tensor [E, n] as f32 (per-expert biases).
  std::vector<float> expert_vector(const std::string& name, int64_t num_experts, int64_t n, int64_t expert);
  // Throws if the checkpoint holds a tensor nothing asked for.
  void finish() const;

 private:
  const TensorInfo& tensor(const std::string& name, const std::vector<int64_t>& shape);
  uint16_t* alloc16(size_t n);
  void fill_random(uint16_t* dst, size_t n, float scale);

  const Checkpoint* checkpoint_;
  ModelWeights& weights_;
  uint64_t seed_;
  std::set<std::string> used_;
};

}  // namespace polylora
