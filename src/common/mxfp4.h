// common/mxfp4.h: the MXFP4 format as OpenAI's GPT-OSS checkpoints ship it and Hugging Face decodes it
// (transformers.integrations.mxfp4.convert_moe_packed_tensors): each byte holds two 4-bit E2M1 codes, the
// low nibble first (the even element); each run of 32 values along a row shares one E8M0 scale byte s,
// value = e2m1(code) · 2^(s − 127). A matrix [rows, cols] (cols a multiple of 32) is stored as codes
// [rows, cols / 2] bytes and scales [rows, cols / 32] bytes. Scalar decoding only; the kernels' fast paths
// decode in registers. Must not: know about models or CUDA.
#pragma once

#include <cmath>
#include <cstdint>

namespace polylora {

inline constexpr int64_t kMxfp4BlockSize = 32;  // values sharing one scale
inline constexpr int64_t kMxfp4BlockBytes = 16;  // bytes of codes per block

// Code -> value (E2M1: sign, 2 exponent bits, 1 mantissa bit).
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(s − 127) exactly (s = 0 gives the subnormal 2^-127, s = 255 gives +inf as torch.ldexp does).
inline float mxfp4_scale(uint8_t s) {
  return std::ldexp(1.0f, static_cast<int>(s) - 127);
}

// The 256 scale values (a table for the decoders' inner loops).
inline const float* mxfp4_scale_table() {
  static const auto* table = [] {
    static float t[256];
    for (int s = 0; s < 256; ++s) t[s] = mxfp4_scale(static_cast<uint8_t>(s));
    return t;
  }();
  return table;
}

// Element c of one row (codes: the row's cols / 2 bytes; scales: its cols / 32 bytes).
inline float mxfp4_at(const uint8_t* codes, const uint8_t* scales, int64_t c) {
  const uint8_t byte = codes[c / 2];
  const int code = (c & 1) ? (byte >> 4) : (byte & 0xf);
  return kE2m1Values[code] * mxfp4_scale(scales[c / kMxfp4BlockSize]);
}

// A whole row of n values (n a multiple of 32) into dst[n].
inline void mxfp4_decode_row(const uint8_t* codes, const uint8_t* scales, int64_t n, float* dst) {
  const float* table = mxfp4_scale_table();
  for (int64_t b = 0; b < n / kMxfp4BlockSize; ++b) {
    const float s = table[scales[b]];
    const uint8_t* q = codes + b * kMxfp4BlockBytes;
    float* d = dst + b * kMxfp4BlockSize;
    for (int i = 0; i < kMxfp4BlockBytes; ++i) {
      d[2 * i] = kE2m1Values[q[i] & 0xf] * s;
      d[2 * i + 1] = kE2m1Values[q[i] >> 4] * s;
    }
  }
}

}  // namespace polylora
