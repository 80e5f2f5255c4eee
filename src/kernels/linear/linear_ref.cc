// kernels/linear/linear_ref.cc: reference dense matrix product (the executable spec).
#include <cstddef>
#include <vector>

#include "common/dtype.h"

#include "kernels/linear/linear.h"

namespace polylora::kernels::ref {

void linear(const LinearArgs& a) {
  std::vector<float> row(static_cast<size_t>(a.w.cols));
  for (int64_t n = 0; n < a.w.rows; ++n) {
    a.w.row_to_f32(n, row.data());
    for (int64_t i = 0; i < a.m; ++i) {
      const float* x = a.x + i * a.ldx;
      float acc = 0.0f;
      for (int64_t k = 0; k < a.w.cols; ++k) acc += x[k] * row[k];
      a.y[i * a.ldy + n] = acc + (a.bias ? a.bias[n] : 0.0f);
    }
  }
  if (a.lora_shrink != nullptr) lora_shrink(*a.lora_shrink, a.lora_tmp, a.lora_ld_tmp);
}

void linear_lora_ext(const LinearLoraExtArgs& a, bool round_bf16) {
  const int64_t cols = a.w.cols, m = a.m;
  const LoraBatchArgs& g = a.shrink;
  int64_t ranks = 0;
  for (int i = 0; i < g.num; ++i) ranks += g.w[i].rank;
  std::vector<float> tmp(static_cast<size_t>(m * ranks), 0.0f);
  if (g.num > 0 && ranks > 0) lora_shrink(g, tmp.data(), ranks);
  auto round = [round_bf16](float v) { return round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; };
  // The extended input rows, as the GPU builds them.
  std::vector<float> xe(static_cast<size_t>(m * cols), 0.0f);
  for (int64_t t = 0; t < m; ++t) {
    float* row = xe.data() + t * cols;
    for (int64_t c = 0; c < a.k; ++c) row[c] = round(a.x[t * a.ldx + c]);
    if (a.bias_col >= 0) row[a.bias_col] = row[a.bias_col + 1] = 1.0f;
    const int32_t s = g.num > 0 ? g.token_slots[t] : -1;
    int64_t first = 0;
    for (int i = 0; i < g.num; ++i) {
      const LoraStack& w = g.w[i];
      if (s >= 0 && s < w.slots && w.scale[s] != 0.0f)
        for (int64_t r = 0; r < w.rank; ++r)
          row[a.tail[i] + s * w.rank + r] =
              round(w.scale[s] * tmp[static_cast<size_t>(t * ranks + first + r)]);
      first += w.rank;
    }
  }
  std::vector<float> wrow(static_cast<size_t>(cols));
  for (int64_t n = 0; n < a.w.rows; ++n) {
    a.w.row_to_f32(n, wrow.data());
    for (int64_t t = 0; t < m; ++t) {
      const float* row = xe.data() + t * cols;
      float acc = 0.0f;
      for (int64_t c = 0; c < cols; ++c) acc += row[c] * wrow[c];
      a.y[t * a.ldy + n] = acc;
    }
  }
}

}  // namespace polylora::kernels::ref
