// common/dtype.h: element types of tensors and scalar conversions (bf16/f16 <-> f32).
// Must not: know about models or CUDA.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace polylora {

// kI8: INT8 weight codes of --quantization int8 (common/int8.h; a WeightView of this dtype carries its row
// scales), never a checkpoint dtype.
enum class DType : uint8_t { kF32, kF16, kBF16, kI32, kI64, kU8, kI8 };

constexpr size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 1;
  }
  return 0;
}

// The safetensors spelling ("F32", "BF16", ...).
constexpr std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name);

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, NaN preserved.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t v);
uint16_t f32_to_f16(float f);

// Converts n elements of `dtype` at `src` to f32.
void convert_to_f32(const void* src, DType dtype, size_t n, float* dst);

}  // namespace polylora
