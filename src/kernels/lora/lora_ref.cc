// kernels/lora/lora_ref.cc: reference LoRA shrink + expand.
#include <cstddef>
#include <vector>

#include "kernels/lora/lora.h"
#include "kernels/lora/lora_stack.h"

namespace polylora::kernels::ref {

void lora_apply(const LoraApplyArgs& a) {
  const LoraView& l = a.lora;
  std::vector<float> mid(static_cast<size_t>(l.rank));
  for (int64_t i = 0; i < a.num_rows; ++i) {
    int64_t row = a.rows ? a.rows[i] : i;
    const float* x = a.x + row * a.ldx;
    for (int64_t r = 0; r < l.rank; ++r) {
      float acc = 0.0f;
      for (int64_t k = 0; k < l.in; ++k) acc += l.a[r * l.in + k] * x[k];
      mid[r] = acc;
    }
    float* y = a.y + row * a.ldy;
    for (int64_t o = 0; o < l.out; ++o) {
      float acc = 0.0f;
      for (int64_t r = 0; r < l.rank; ++r) acc += l.b[o * l.rank + r] * mid[r];
      y[o] += l.scale * acc;
    }
  }
}

void lora_batch(const LoraBatchArgs& a) {
  for (int i = 0; i < a.num; ++i) {
    const LoraStack& w = a.w[i];
    if (w.empty() || w.rank == 0) continue;
    std::vector<float> mid(static_cast<size_t>(w.rank));
    for (int64_t t = 0; t < a.m; ++t) {
      const int32_t s = a.token_slots[t];
      if (s < 0 || s >= w.slots || w.scale[s] == 0.0f) continue;
      const float* x = a.x + t * a.ldx;
      for (int64_t r = 0; r < w.rank; ++r) {
        float acc = 0.0f;
        for (int64_t k = 0; k < w.in; ++k) acc += stack_at(w.a, w.dtype, (s * w.rank + r) * w.in + k) * x[k];
        mid[r] = acc;
      }
      float* y = a.y[i] + t * a.ldy[i];
      for (int64_t o = 0; o < w.out; ++o) {
        float acc = 0.0f;
        for (int64_t r = 0; r < w.rank; ++r) acc += stack_at(w.b, w.dtype, (s * w.out + o) * w.rank + r) * mid[r];
        y[o] += w.scale[s] * acc;
      }
    }
  }
}

void lora_shrink(const LoraBatchArgs& a, float* tmp, int64_t ld_tmp) {
  int64_t first = 0;
  for (int i = 0; i < a.num; ++i) {
    const LoraStack& w = a.w[i];
    for (int64_t t = 0; t < a.m; ++t) {
      const int32_t s = a.token_slots[t];
      if (s < 0 || s >= w.slots) continue;
      bool any = false;  // the row is written when some module of the group has LoRA for the slot
      for (int j = 0; j < a.num; ++j) any = any || a.w[j].scale[s] != 0.0f;
      if (!any) continue;
      const float* x = a.x + t * a.ldx;
      for (int64_t r = 0; r < w.rank; ++r) {
        float acc = 0.0f;
        for (int64_t k = 0; k < w.in; ++k) acc += stack_at(w.a, w.dtype, (s * w.rank + r) * w.in + k) * x[k];
        tmp[t * ld_tmp + first + r] = acc;
      }
    }
    first += w.rank;
  }
}

void lora_expand_in(const LoraExpandIn& l, int64_t m, float* out, int64_t ld_out) {
  if (!l.active()) return;
  const LoraStack& w = l.w;
  for (int64_t t = 0; t < m; ++t) {
    const int32_t s = l.token_slots[t];
    if (s < 0 || s >= w.slots || w.scale[s] == 0.0f) continue;
    const float* mid = l.tmp + t * l.ld_tmp + l.first;
    for (int64_t o = 0; o < w.out; ++o) {
      float acc = 0.0f;
      for (int64_t r = 0; r < w.rank; ++r)
        acc += stack_at(w.b, w.dtype, (s * w.out + o) * w.rank + r) * mid[r];
      out[t * ld_out + o] += w.scale[s] * acc;
    }
  }
}

std::vector<float> with_lora_term(const LoraExpandIn& l, const float* in, int64_t m, int64_t ld) {
  const int64_t n = l.w.out;
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t t = 0; t < m; ++t)
    for (int64_t o = 0; o < n; ++o) out[static_cast<size_t>(t * n + o)] = in[t * ld + o];
  lora_expand_in(l, m, out.data(), n);
  return out;
}

}  // namespace polylora::kernels::ref
