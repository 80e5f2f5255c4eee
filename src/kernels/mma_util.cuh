// kernels/mma_util.cuh: the tensor-core building blocks shared by the bf16 GEMM kernels (the MoE grouped
// GEMM of moe/moe_gemm_mma.cuh, the INT8 dense GEMM of linear/linear_int8_cuda.cu): the XOR-swizzled
// layout of a [rows][32] bf16 shared-memory tile, cp.async, ldmatrix and mma.sync m16n8k16 (bf16 inputs,
// f32 accumulation), and the INT8 -> bf16 widening of weight codes (exact: |q| <= 127 has 7 bits).
// Only included from .cu files. Must not: depend on anything above common/.
#pragma once

#include "kernels/cuda_util.cuh"

namespace polylora::kernels::cuda::mma {

constexpr int kBK = 32;  // one 64-byte row of a shared-memory tile = 4 chunks of 16 bytes

// Byte offset of 16-byte chunk c (0..3) of row r in a [rows][kBK] bf16 tile (XOR swizzle: the 8 rows
// an ldmatrix phase reads land in 8 distinct bank groups).
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void st_shared_v4(uint32_t addr, const uint32_t (&w)[4]) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]),
               "r"(w[3]));
}

// Signed byte j (0..3) of w as f32.
__device__ __forceinline__ float int8_lane(uint32_t w, int j) {
  return static_cast<float>(static_cast<int32_t>(w << (24 - 8 * j)) >> 24);
}

// 8 INT8 codes (the bytes of lo, then hi, the lowest first) as 8 bf16 packed in pairs (the lower k in the
// low half), exactly.
__device__ __forceinline__ void int8x8_to_bf16x8(uint32_t lo, uint32_t hi, uint32_t (&out)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t w = j < 2 ? lo : hi;
    const int b = (j & 1) * 2;
    const uint32_t e0 = __bfloat16_as_ushort(__float2bfloat16_rn(int8_lane(w, b)));
    const uint32_t e1 = __bfloat16_as_ushort(__float2bfloat16_rn(int8_lane(w, b + 1)));
    out[j] = e0 | (e1 << 16);
  }
}

// 8 MXFP4 values (one 32-bit word of E2M1 codes, the low nibble of each byte first, as common/mxfp4.h)
// times their block's scale 2^(s − 127), as 8 bf16 packed in pairs (out[j] = values 2j, 2j + 1), exactly
// wherever the product is a bf16 number (every scale but the extremes). A code's 3 magnitude bits placed
// at bf16 bits 6..8 read as e2m1(code) · 2^-126 (code 1, 0.5, as the subnormal 2^-127: E2M1's subnormal
// lines up with bf16's), its sign bit at bit 15; one bf16x2 multiply by 2^(s − 1) (s <= 128), else by
// 2^126 and then by 2^(s − 127), restores the value (mul.bf16x2 keeps subnormals; s = 255 gives inf, as
// torch.ldexp). 4 byte-permutes, 8 shifts, 4 masks and 4 or 8 multiplies for 8 values.
__device__ __forceinline__ void mxfp4x8_to_bf16x8(uint32_t codes, uint32_t s, uint32_t (&out)[4]) {
  const uint32_t even = codes & 0x0F0F0F0Fu, odd = (codes >> 4) & 0x0F0F0F0Fu;
  const uint32_t m1 = s <= 128u ? (s + 126u) << 7 : 253u << 7, m2 = s << 7;
  const __nv_bfloat162 f1 = __halves2bfloat162(__ushort_as_bfloat16(static_cast<unsigned short>(m1)),
                                               __ushort_as_bfloat16(static_cast<unsigned short>(m1)));
  const __nv_bfloat162 f2 = __halves2bfloat162(__ushort_as_bfloat16(static_cast<unsigned short>(m2)),
                                               __ushort_as_bfloat16(static_cast<unsigned short>(m2)));
#pragma unroll
  for (uint32_t j = 0; j < 4; ++j) {
    // Byte 0: even code j (low half), byte 2: odd code j (high half); bytes 1 and 3 are masked off.
    const uint32_t p = __byte_perm(even, odd, j | (j << 4) | ((j + 4) << 8) | ((j + 4) << 12));
    const uint32_t w = ((p << 6) & 0x01C001C0u) | ((p << 12) & 0x80008000u);
    __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&w), f1);
    if (s > 128u) v = __hmul2(v, f2);
    out[j] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Eight MXFP4 codes (code i in bits 4i..4i+3 of c: a block's bytes read little-endian) placed as bf16
// pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) (the first in the low half), each reading as e2m1(code) ·
// 2^-126 as in mxfp4x8_to_bf16x8 (3 magnitude bits at bf16 bits 6..8, the sign at bit 15); the caller
// multiplies by the block's factor. Pairing codes 4 apart needs no byte permute: two shifts, a mask and a
// merge per pair (one shift fewer for (c3, c7)). The k order this gives must be used for the other
// operand too (moe_gemv_mxfp4.cuh).
__device__ __forceinline__ void mxfp4x8_to_bf16_pairs(uint32_t c, uint32_t (&out)[4]) {
  constexpr uint32_t kMag = 0x01C001C0u, kSign = 0x80008000u;
  out[0] = ((c << 6) & kMag) | ((c << 12) & kSign);
  out[1] = ((c << 2) & kMag) | ((c << 8) & kSign);
  out[2] = ((c >> 2) & kMag) | ((c << 4) & kSign);
  out[3] = ((c >> 6) & kMag) | (c & kSign);
}

}  // namespace polylora::kernels::cuda::mma
