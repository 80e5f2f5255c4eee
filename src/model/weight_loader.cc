// model/weight_loader.cc: parameter fetching with name/shape checks, and random dummy weights.
#include "model/weight_loader.h"

#include <omp.h>

#include <cmath>
#include <cstring>

#include "common/error.h"

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

}  // namespace

WeightLoader::WeightLoader(const Checkpoint* checkpoint, ModelWeights& weights, uint64_t seed)
    : checkpoint_(checkpoint), weights_(weights), seed_(seed) {}

bool WeightLoader::has(const std::string& name) const { return checkpoint_ && checkpoint_->find(name); }

const TensorInfo& WeightLoader::tensor(const std::string& name, const std::vector<int64_t>& shape) {
  const TensorInfo* t = checkpoint_->find(name);
  if (!t)
    fail("checkpoint {} does not match its config: tensor '{}' (expected shape {}) is missing",
         checkpoint_->location(), name, shape_str(shape));
  if (t->shape != shape)
    fail("checkpoint {} does not match its config: tensor '{}' has shape {}, expected {}", checkpoint_->location(),
         name, t->shape_string(), shape_str(shape));
  used_.insert(name);
  return *t;
}

uint16_t* WeightLoader::alloc16(size_t n) {
  weights_.owned.emplace_back(new uint16_t[n]);
  weights_.num_bytes += n * 2;
  return weights_.owned.back().get();
}

void WeightLoader::fill_random(uint16_t* dst, size_t n, float scale) {
  uint64_t base = seed_++ * 0x2545f4914f6cdd1dull + 1;
#pragma omp parallel
  {
    int threads = omp_get_num_threads(), tid = omp_get_thread_num();
    size_t begin = n * static_cast<size_t>(tid) / static_cast<size_t>(threads);
    size_t end = n * static_cast<size_t>(tid + 1) / static_cast<size_t>(threads);
    uint64_t state = base ^ (static_cast<uint64_t>(tid) << 40);
    for (size_t i = begin; i < end; ++i) {
      // Uniform in [-scale·√3, scale·√3]: standard deviation `scale`.
      double u = static_cast<double>(splitmix(state) >> 11) * (1.0 / 9007199254740992.0);
      dst[i] = f32_to_bf16(static_cast<float>((2.0 * u - 1.0) * 1.7320508 * scale));
    }
  }
}

kernels::WeightView WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols) {
  if (dummy()) {
    uint16_t* buf = alloc16(static_cast<size_t>(rows * cols));
    fill_random(buf, static_cast<size_t>(rows * cols), 0.02f);
    return {buf, DType::kBF16, rows, cols};
  }
  const TensorInfo& t = tensor(name, {rows, cols});
  weights_.num_bytes += t.num_bytes;
  return {t.data, t.dtype, rows, cols};
}

std::vector<float> WeightLoader::vector(const std::string& name, int64_t n, float fill) {
  std::vector<float> v(static_cast<size_t>(n));
  if (dummy()) {
    uint64_t state = seed_++;
    for (auto& x : v) {
      double u = static_cast<double>(splitmix(state) >> 11) * (1.0 / 9007199254740992.0);
      x = fill + static_cast<float>((2.0 * u - 1.0) * 0.02);
    }
  } else {
    const TensorInfo& t = tensor(name, {n});
    convert_to_f32(t.data, t.dtype, v.size(), v.data());
  }
  weights_.num_bytes += v.size() * sizeof(float);
  return v;
}

kernels::WeightView WeightLoader::expert_transposed(const std::string& name, int64_t num_experts, int64_t a,
                                                    int64_t b, int64_t expert) {
  size_t n = static_cast<size_t>(a * b);
  if (dummy()) {
    uint16_t* buf = alloc16(n);
    fill_random(buf, n, 0.02f);
    return {buf, DType::kBF16, b, a};
  }
  const TensorInfo& t = tensor(name, {num_experts, a, b});
  size_t esize = dtype_size(t.dtype);
  const char* src = static_cast<const char*>(t.data) + static_cast<size_t>(expert) * n * esize;
  if (t.dtype == DType::kF32) {
    weights_.owned_f32.emplace_back(new float[n]);
    float* dst = weights_.owned_f32.back().get();
    const float* s = reinterpret_cast<const float*>(src);
    for (int64_t i = 0; i < a; ++i)
      for (int64_t j = 0; j < b; ++j) dst[j * a + i] = s[i * b + j];
    weights_.num_bytes += n * 4;
    return {dst, DType::kF32, b, a};
  }
  uint16_t* dst = alloc16(n);
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) dst[j * a + i] = s[i * b + j];
  return {dst, t.dtype, b, a};
}

std::vector<float> WeightLoader::expert_vector(const std::string& name, int64_t num_experts, int64_t n,
                                               int64_t expert) {
  std::vector<float> v(static_cast<size_t>(n));
  if (dummy()) {
    uint64_t state = seed_++;
    for (auto& x : v) x = static_cast<float>((static_cast<double>(splitmix(state) >> 11) / 9007199254740992.0 - 0.5) * 0.04);
  } else {
    const TensorInfo& t = tensor(name, {num_experts, n});
    const char* src = static_cast<const char*>(t.data) + static_cast<size_t>(expert * n) * dtype_size(t.dtype);
    convert_to_f32(src, t.dtype, v.size(), v.data());
  }
  weights_.num_bytes += v.size() * sizeof(float);
  return v;
}

void WeightLoader::finish() const {
  if (dummy()) return;
  for (const std::string& name : checkpoint_->names()) {
    if (used_.count(name)) continue;
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;
    fail("checkpoint {} does not match its config: tensor '{}' is not a parameter of this model (check "
         "num_hidden_layers, num_experts and tie_word_embeddings in config.json)",
         checkpoint_->location(), name);
  }
}

}  // namespace polylora
