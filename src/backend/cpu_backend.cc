// backend/cpu_backend.cc: the CPU backend: host memory and kernels::cpu (OpenMP, SIMD, OpenBLAS).
#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "common/error.h"
#include "common/int8.h"

namespace polylora {
namespace {

uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-stddev·√3, stddev·√3], in parallel; deterministic for a seed and thread count.
void fill_random_bf16(uint16_t* dst, size_t n, float stddev, uint64_t seed) {
#pragma omp parallel
  {
    int threads = omp_get_num_threads(), tid = omp_get_thread_num();
    size_t begin = n * static_cast<size_t>(tid) / static_cast<size_t>(threads);
    size_t end = n * static_cast<size_t>(tid + 1) / static_cast<size_t>(threads);
    uint64_t state = seed * 0x2545f4914f6cdd1dull + (static_cast<uint64_t>(tid) << 40) + 1;
    for (size_t i = begin; i < end; ++i) {
      double u = static_cast<double>(splitmix(state) >> 11) * (1.0 / 9007199254740992.0);
      dst[i] = f32_to_bf16(static_cast<float>((2.0 * u - 1.0) * 1.7320508 * stddev));
    }
  }
}

class CpuBackend final : public Backend {
 public:
  ~CpuBackend() override {
    for (auto& [p, n] : blocks_) release(p, n);
  }
  std::string name() const override { return "cpu"; }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  DType weight_dtype() const override { return DType::kBF16; }
  std::unique_ptr<Backend> make_peer(int) const override { return std::make_unique<CpuBackend>(); }

  void* alloc(size_t bytes) override {
    size_t rounded = (bytes + 255) / 256 * 256;
    if (rounded == 0) rounded = 256;
    void* p = nullptr;
    if (rounded >= kMmapThreshold) {
      // Large buffers (the KV cache): anonymous pages are zero and only touched memory is resident.
      p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) fail("out of host memory allocating {} bytes", bytes);
    } else {
      p = std::aligned_alloc(256, rounded);
      if (!p) fail("out of host memory allocating {} bytes", bytes);
      std::memset(p, 0, rounded);
    }
    blocks_.emplace_back(p, rounded);
    allocated_ += rounded;
    return p;
  }
  void free(void* ptr) override {
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].first == ptr) {
        allocated_ -= blocks_[i].second;
        release(ptr, blocks_[i].second);
        blocks_[i] = blocks_.back();
        blocks_.pop_back();
        return;
      }
    }
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void synchronize() override {}
  kernels::WeightView matrix_from_host_as(const kernels::WeightView& host, DType) override { return host; }
  kernels::WeightView random_matrix(int64_t rows, int64_t cols, float stddev, uint64_t seed) override {
    size_t n = static_cast<size_t>(rows * cols);
    auto* p = static_cast<uint16_t*>(alloc(n * 2));
    fill_random_bf16(p, n, stddev, seed);
    return {p, DType::kBF16, rows, cols};
  }
  const float* vector_from_host(const float* host, size_t n) override {
    auto* p = static_cast<float*>(alloc(n * sizeof(float)));
    std::memcpy(p, host, n * sizeof(float));
    return p;
  }
  size_t allocated_bytes() const override { return allocated_; }

  void embedding(const kernels::EmbeddingArgs& a) override { kernels::cpu::embedding(a); }
  void linear(const kernels::LinearArgs& a) override { kernels::cpu::linear(a); }
  void rms_norm(const kernels::RmsNormArgs& a) override { kernels::cpu::rms_norm(a); }
  void add_rms_norm(const kernels::AddRmsNormArgs& a) override { kernels::cpu::add_rms_norm(a); }
  void rope(const kernels::RopeArgs& a) override { kernels::cpu::rope(a); }
  void write_kv(const kernels::KvWriteArgs& a) override { kernels::cpu::write_kv(a); }
  void rope_kv_write(const kernels::RopeKvWriteArgs& a) override { kernels::cpu::rope_kv_write(a); }
  void attention(const kernels::AttentionArgs& a) override { kernels::cpu::attention(a); }
  void silu_and_mul(const kernels::SiluAndMulArgs& a) override { kernels::cpu::silu_and_mul(a); }
  void gpt_oss_swiglu(const kernels::GptOssSwigluArgs& a) override { kernels::cpu::gpt_oss_swiglu(a); }
  void lora_apply(const kernels::LoraApplyArgs& a) override { kernels::cpu::lora_apply(a); }
  void lora_batch(const kernels::LoraBatchArgs& a) override { kernels::cpu::lora_batch(a); }
  // Only where a test asks (set_dense_lora_ext_min_rows), through the reference: the model's side of the
  // extended products (model/lora_dense_ext.h) checked on the CPU.
  bool dense_lora_ext(int64_t tokens, int64_t tail_cols) const override {
    return dense_lora_ext_min_rows_ > 0 && tokens >= dense_lora_ext_min_rows_ && tail_cols > 0;
  }
  void linear_lora_ext(const kernels::LinearLoraExtArgs& a) override {
    kernels::ref::linear_lora_ext(a, !dense_lora_ext_exact_);
  }
  DType lora_stack_dtype() const override {
    return dense_lora_ext_min_rows_ > 0 ? DType::kBF16 : DType::kF32;
  }
  void route(const kernels::RouteArgs& a) override { kernels::cpu::route(a); }
  void moe_experts(const kernels::MoeExpertsArgs& a) override { kernels::cpu::moe_experts(a); }
  void add_inplace(float* y, const float* x, int64_t n) override {
#pragma omp parallel for simd if (n > 65536)
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void gather_rows(const float* src, const int32_t* rows, int64_t num_rows, int64_t cols,
                   float* dst) override {
    for (int64_t r = 0; r < num_rows; ++r)
      std::memcpy(dst + r * cols, src + static_cast<int64_t>(rows[r]) * cols, static_cast<size_t>(cols) * 4);
  }
  void feed_tokens(int32_t* dst, const int32_t* pairs, int64_t n, const int32_t* src) override {
    for (int64_t i = 0; i < n; ++i) dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
  }
  void sample(const kernels::SampleArgs& a) override { kernels::ref::sample(a); }
  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = x + r * cols;
      int64_t best = 0;
      for (int64_t i = 1; i < cols; ++i)
        if (row[i] > row[best] || (std::isnan(row[best]) && !std::isnan(row[i]))) best = i;
      ids[r] = static_cast<int32_t>(best);
    }
  }

 private:
  static constexpr size_t kMmapThreshold = size_t{1} << 20;
  static void release(void* p, size_t n) {
    if (n >= kMmapThreshold)
      munmap(p, n);
    else
      std::free(p);
  }
  std::vector<std::pair<void*, size_t>> blocks_;
  size_t allocated_ = 0;
};

}  // namespace

void* Backend::alloc_host(size_t bytes) {
  size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  void* p = std::aligned_alloc(256, rounded);
  if (!p) fail("cannot allocate {} bytes of host memory", bytes);
  std::memset(p, 0, rounded);
  return p;
}

void Backend::free_host(void* ptr) {
  std::free(ptr);
}

void Backend::linear_lora_ext(const kernels::LinearLoraExtArgs&) {
  fail("{}: the dense LoRA as extra K columns runs on CUDA only", name());
}

void Backend::fill_zero(void* ptr, size_t bytes) {
  if (bytes > 0) std::memset(ptr, 0, bytes);
}

void Backend::copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                      size_t rows) {
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<std::byte*>(dst) + r * dst_pitch,
                static_cast<const std::byte*>(src) + r * src_pitch, width);
}

kernels::WeightView Backend::random_mxfp4(int64_t rows, int64_t cols, uint8_t scale, uint64_t seed) {
  const auto n = static_cast<size_t>(rows * cols);
  std::vector<uint8_t> codes(n / 2), scales(n / kMxfp4BlockSize, scale);
  uint64_t state = seed * 0x2545f4914f6cdd1dull + 1;
  for (size_t i = 0; i < codes.size(); i += 8) {
    const uint64_t r = splitmix(state);
    std::memcpy(codes.data() + i, &r, std::min<size_t>(8, codes.size() - i));
  }
  void* c = alloc(codes.size());
  void* s = alloc(scales.size());
  copy_to_device(c, codes.data(), codes.size());
  copy_to_device(s, scales.data(), scales.size());
  return {c, DType::kU8, rows, cols, static_cast<const uint8_t*>(s)};
}

kernels::WeightView Backend::quantize_int8(const kernels::WeightView& w) {
  CHECK_MSG(w.dtype == DType::kF32 || w.dtype == DType::kF16 || w.dtype == DType::kBF16,
            "quantize_int8: a {} matrix cannot be quantized (expected F32, F16 or BF16)",
            dtype_name(w.dtype));
  const int64_t rows = w.rows, cols = w.cols;
  const size_t codes_bytes = (static_cast<size_t>(rows * cols) + 255) / 256 * 256;
  auto* base = static_cast<std::byte*>(alloc(codes_bytes + static_cast<size_t>(rows) * sizeof(float)));
  auto* codes = reinterpret_cast<int8_t*>(base);
  auto* scales = reinterpret_cast<float*>(base + codes_bytes);
#pragma omp parallel if (rows * cols >= (int64_t{1} << 16))
  {
    std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      w.row_to_f32(r, row.data());
      scales[r] = int8_quantize_row(row.data(), cols, codes + r * cols);
    }
  }
  kernels::WeightView q{codes, DType::kI8, rows, cols};
  q.row_scales = scales;
  return q;
}

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  switch (options.device) {
    case DeviceKind::kCpu:
      return make_cpu_backend();
    case DeviceKind::kCuda:
      return make_cuda_backend(options);
  }
  return nullptr;
}

#ifndef POLYLORA_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions&) {
  fail(
      "--device cuda: this polylora build has no CUDA support (the CUDA toolkit was not found at build "
      "time); "
      "use --device cpu");
}
int cuda_device_count() {
  return 0;
}
#endif

}  // namespace polylora
