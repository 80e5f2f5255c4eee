// kernels/embedding/embedding_cpu.cc: CPU fast path of the embedding lookup: SIMD row conversion
// (BF16/F16 -> f32), parallel over tokens for large batches.
// Must not: allocate; validate ids (the caller does).
#include <omp.h>

#include <algorithm>

#include "kernels/cpu_simd.h"
#include "kernels/embedding/embedding.h"

namespace polylora::kernels::cpu {

void embedding(const EmbeddingArgs& a) {
  const auto* base = static_cast<const char*>(a.table.data);
  size_t row_bytes = static_cast<size_t>(a.table.cols) * dtype_size(a.table.dtype);
  bool parallel = a.m > 1 && a.m * a.table.cols >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < a.m; ++t) {
    const int64_t row = embedding_row(a, a.ids[t]);
    if (row < 0) {
      std::fill_n(a.out + t * a.ld_out, a.table.cols, 0.0f);
      continue;
    }
    simd::to_f32(base + static_cast<size_t>(row) * row_bytes, a.table.dtype, a.table.cols,
                 a.out + t * a.ld_out);
  }
}

}  // namespace polylora::kernels::cpu
