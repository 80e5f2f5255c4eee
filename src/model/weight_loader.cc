// model/weight_loader.cc: parameter fetching with name/shape checks, and random dummy weights.
#include "model/weight_loader.h"

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

constexpr float kDummyStddev = 0.02f;

}  // namespace

WeightLoader::WeightLoader(const Checkpoint* checkpoint, Backend& backend, ModelWeights& weights,
                           uint64_t seed)
    : checkpoint_(checkpoint), backend_(backend), weights_(weights), seed_(seed) {}

bool WeightLoader::has(const std::string& name) const {
  return checkpoint_ && checkpoint_->find(name);
}

const TensorInfo& WeightLoader::tensor(const std::string& name, const std::vector<int64_t>& shape) {
  const TensorInfo* t = checkpoint_->find(name);
  if (!t)
    fail("checkpoint {} does not match its config: tensor '{}' (expected shape {}) is missing",
         checkpoint_->location(), name, shape_str(shape));
  if (t->shape != shape)
    fail("checkpoint {} does not match its config: tensor '{}' has shape {}, expected {}",
         checkpoint_->location(), name, t->shape_string(), shape_str(shape));
  used_.insert(name);
  return *t;
}

const float* WeightLoader::upload(const std::vector<float>& v) {
  weights_.num_bytes += v.size() * sizeof(float);
  return backend_.vector_from_host(v.data(), v.size());
}

kernels::WeightView WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols, bool keep_f32) {
  kernels::WeightView view;
  if (dummy()) {
    view = backend_.random_matrix(rows, cols, kDummyStddev, seed_++);
  } else {
    const TensorInfo& t = tensor(name, {rows, cols});
    view = keep_f32 ? backend_.matrix_from_host_as({t.data, t.dtype, rows, cols}, DType::kF32)
                    : backend_.matrix_from_host({t.data, t.dtype, rows, cols});
  }
  weights_.num_bytes += static_cast<size_t>(rows * cols) * dtype_size(view.dtype);
  return view;
}

const float* WeightLoader::vector(const std::string& name, int64_t n, float fill) {
  std::vector<float> v(static_cast<size_t>(n));
  if (dummy()) {
    uint64_t state = seed_++;
    for (auto& x : v) {
      double u = static_cast<double>(splitmix(state) >> 11) * (1.0 / 9007199254740992.0);
      x = fill + static_cast<float>((2.0 * u - 1.0) * kDummyStddev);
    }
  } else {
    const TensorInfo& t = tensor(name, {n});
    convert_to_f32(t.data, t.dtype, v.size(), v.data());
  }
  return upload(v);
}

kernels::WeightView WeightLoader::expert_transposed(const std::string& name, int64_t num_experts, int64_t a,
                                                    int64_t b, int64_t expert) {
  if (dummy()) return matrix(name, b, a);
  size_t n = static_cast<size_t>(a * b);
  const TensorInfo& t = tensor(name, {num_experts, a, b});
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
  kernels::WeightView view = backend_.matrix_from_host(host);
  weights_.num_bytes += n * dtype_size(view.dtype);
  if (view.data != host.data) {  // copied to the device: the host copy is no longer needed
    if (t.dtype == DType::kF32)
      weights_.owned_f32.pop_back();
    else
      weights_.owned.pop_back();
  }
  return view;
}

const float* WeightLoader::expert_vector(const std::string& name, int64_t num_experts, int64_t n,
                                         int64_t expert) {
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
  }
  return upload(v);
}

const kernels::ExpertView* WeightLoader::experts_to_device(const std::vector<kernels::ExpertView>& experts) {
  size_t bytes = experts.size() * sizeof(kernels::ExpertView);
  void* p = backend_.alloc(bytes);
  backend_.copy_to_device(p, experts.data(), bytes);
  return static_cast<const kernels::ExpertView*>(p);
}

void WeightLoader::finish() const {
  if (dummy()) return;
  for (const std::string& name : checkpoint_->names()) {
    if (used_.count(name)) continue;
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0) continue;
    fail(
        "checkpoint {} does not match its config: tensor '{}' is not a parameter of this model (check "
        "num_hidden_layers, num_experts and tie_word_embeddings in config.json)",
        checkpoint_->location(), name);
  }
}

}  // namespace polylora
