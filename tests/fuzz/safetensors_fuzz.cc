// fuzz-sources: src/runtime/safetensors.cc
// tests/fuzz/safetensors_fuzz.cc: libFuzzer target for SafetensorsFile::parse on arbitrary bytes.
// Owns: proving the parser either throws polylora::Error or returns tensors whose every byte lies inside
// the input (each byte is read, so AddressSanitizer sees any out-of-bounds view).
// Must not: catch anything but polylora::Error (any other exception or crash is a finding).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "common/error.h"
#include "runtime/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const polylora::DType kAllDTypes[] = {polylora::DType::kF32,  polylora::DType::kF16,
                                               polylora::DType::kBF16, polylora::DType::kI32,
                                               polylora::DType::kI64,  polylora::DType::kU8};
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    auto file = polylora::SafetensorsFile::parse(bytes, "fuzz-input", kAllDTypes);
    uint8_t sum = 0;
    for (const polylora::TensorInfo& t : file->tensors()) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      if (t.num_bytes > 0 && (p < data || p + t.num_bytes > data + size)) std::abort();
      for (size_t i = 0; i < t.num_bytes; ++i) sum = static_cast<uint8_t>(sum + p[i]);
      if (file->find(t.name) != &t) std::abort();
      if (static_cast<size_t>(t.numel()) * polylora::dtype_size(t.dtype) != t.num_bytes) std::abort();
      (void)t.shape_string();
    }
    volatile uint8_t sink = sum;
    (void)sink;
  } catch (const polylora::Error&) {
  }
  return 0;
}
