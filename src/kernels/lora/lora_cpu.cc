// kernels/lora/lora_cpu.cc: CPU fast path of unmerged LoRA: rows gathered into thread-local scratch,
// shrink (x·Aᵀ) and expand (·Bᵀ, scaled, added into y) as two small sgemms per chunk of rows (SIMD dot
// products for a handful of rows), chunks in parallel. Row indices are assumed distinct.
// Must not: allocate per call beyond thread-local scratch; nest OpenMP regions.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu_simd.h"
#include "kernels/lora/lora.h"
#include "kernels/lora/lora_stack.h"

namespace polylora::kernels::cpu {
namespace {

constexpr int64_t kDotRows = 4;       // up to this many rows: dot products instead of sgemm
constexpr int64_t kRowsPerTask = 64;  // rows per parallel chunk

// LoRA of rows [i0, i1) of the args' row list (or of rows i0..i1−1 when it is null).
void lora_chunk(const LoraApplyArgs& a, int64_t i0, int64_t i1) {
  const LoraView& l = a.lora;
  int64_t num = i1 - i0;
  thread_local std::vector<float> xs, mid, ys;
  mid.resize(static_cast<size_t>(num * l.rank));
  if (num <= kDotRows) {
    for (int64_t i = 0; i < num; ++i) {
      int64_t row = a.rows ? a.rows[i0 + i] : i0 + i;
      const float* x = a.x + row * a.ldx;
      float* mr = mid.data() + i * l.rank;
      for (int64_t r = 0; r < l.rank; ++r) mr[r] = simd::dot(l.a + r * l.in, x, l.in);
      float* y = a.y + row * a.ldy;
      for (int64_t o = 0; o < l.out; ++o) y[o] += l.scale * simd::dot(l.b + o * l.rank, mr, l.rank);
    }
    return;
  }
  simd::blas_single_threaded();
  const float* x = a.x + i0 * a.ldx;
  int64_t ldx = a.ldx;
  if (a.rows) {
    xs.resize(static_cast<size_t>(num * l.in));
    for (int64_t i = 0; i < num; ++i) std::copy_n(a.x + a.rows[i0 + i] * a.ldx, l.in, xs.data() + i * l.in);
    x = xs.data();
    ldx = l.in;
  }
  int n = static_cast<int>(num), rank = static_cast<int>(l.rank), in = static_cast<int>(l.in),
      out = static_cast<int>(l.out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rank, in, 1.0f, x, static_cast<int>(ldx), l.a, in,
              0.0f, mid.data(), rank);
  if (!a.rows) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, rank, l.scale, mid.data(), rank, l.b, rank,
                1.0f, a.y + i0 * a.ldy, static_cast<int>(a.ldy));
    return;
  }
  ys.resize(static_cast<size_t>(num * l.out));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, rank, l.scale, mid.data(), rank, l.b, rank,
              0.0f, ys.data(), out);
  for (int64_t i = 0; i < num; ++i)
    simd::axpy(1.0f, ys.data() + i * l.out, a.y + a.rows[i0 + i] * a.ldy, l.out);
}

}  // namespace

void lora_apply(const LoraApplyArgs& a) {
  const LoraView& l = a.lora;
  if (l.empty() || a.num_rows <= 0 || l.rank <= 0) return;
  int64_t num_chunks = (a.num_rows + kRowsPerTask - 1) / kRowsPerTask;
  bool parallel = num_chunks > 1 && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t c = 0; c < num_chunks; ++c) {
    lora_chunk(a, c * kRowsPerTask, std::min(a.num_rows, (c + 1) * kRowsPerTask));
  }
}

// F32 stacks: each slot's tokens through lora_apply with the slot's matrices as views (BF16 stacks, which
// the CPU backend does not use, go through the reference).
void lora_batch(const LoraBatchArgs& a) {
  if (a.m <= 0) return;
  for (int i = 0; i < a.num; ++i)
    if (!a.w[i].empty() && a.w[i].dtype != DType::kF32) return ref::lora_batch(a);
  thread_local std::vector<std::vector<int32_t>> rows;
  int64_t slots = 0;
  for (int i = 0; i < a.num; ++i) slots = std::max(slots, a.w[i].slots);
  rows.resize(static_cast<size_t>(slots));
  for (auto& r : rows) r.clear();
  for (int64_t t = 0; t < a.m; ++t) {
    const int32_t s = a.token_slots[t];
    if (s >= 0 && s < slots) rows[static_cast<size_t>(s)].push_back(static_cast<int32_t>(t));
  }
  for (int64_t s = 0; s < slots; ++s) {
    const auto& r = rows[static_cast<size_t>(s)];
    if (r.empty()) continue;
    for (int i = 0; i < a.num; ++i) {
      const LoraView v = stack_view(a.w[i], static_cast<int32_t>(s));
      if (v.empty()) continue;
      lora_apply({.x = a.x, .ldx = a.ldx, .y = a.y[i], .ldy = a.ldy[i], .rows = r.data(),
                  .num_rows = static_cast<int64_t>(r.size()), .lora = v});
    }
  }
}

}  // namespace polylora::kernels::cpu
