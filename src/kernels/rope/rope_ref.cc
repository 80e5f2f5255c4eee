// kernels/rope/rope_ref.cc: reference RoPE. The angle is the fp32 product pos·inv_freq, as torch computes it.
// rope_kv_write is spelled as the op sequence it replaces (the reference norm, rope and KV write on a copy of
// k), so the fused kernels are checked against the unfused spec.
#include <cmath>
#include <vector>

#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"

namespace polylora::kernels::ref {

void rope(const RopeArgs& a) {
  int64_t half = a.head_dim / 2;
  for (int64_t t = 0; t < a.m; ++t) {
    float pos = static_cast<float>(a.positions[t]);
    for (int64_t h = 0; h < a.num_heads; ++h) {
      float* x = a.x + t * a.ldx + h * a.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float angle = pos * a.inv_freq[i];
        float c = static_cast<float>(std::cos(static_cast<double>(angle))) * a.attention_scaling;
        float s = static_cast<float>(std::sin(static_cast<double>(angle))) * a.attention_scaling;
        float x1 = x[i];
        float x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

RopeKvWriteNoLora apply_lora_terms(const RopeKvWriteArgs& a) {
  RopeKvWriteNoLora r{.args = a};
  lora_expand_in(a.lora_q, a.m, a.q, a.ldq);
  if (a.lora_k.active()) {
    r.k = with_lora_term(a.lora_k, a.k, a.m, a.ldk);
    r.args.k = r.k.data();
    r.args.ldk = a.lora_k.w.out;
  }
  if (a.lora_v.active()) {
    r.v = with_lora_term(a.lora_v, a.v, a.m, a.ldv);
    r.args.v = r.v.data();
    r.args.ldv = a.lora_v.w.out;
  }
  r.args.lora_q = r.args.lora_k = r.args.lora_v = {};
  return r;
}

void rope_kv_write(const RopeKvWriteArgs& a) {
  if (a.lora_q.active() || a.lora_k.active() || a.lora_v.active())
    return rope_kv_write(ref::apply_lora_terms(a).args);
  const int64_t d = a.head_dim, kv_row = a.num_kv_heads * d;
  std::vector<float> k(static_cast<size_t>(a.m * kv_row));  // k is only read: rotate a dense copy
  for (int64_t t = 0; t < a.m; ++t)
    for (int64_t i = 0; i < kv_row; ++i) k[t * kv_row + i] = a.k[t * a.ldk + i];
  if (a.q_norm) {
    for (int64_t t = 0; t < a.m; ++t)
      rms_norm({.x = a.q + t * a.ldq,
                .ldx = d,
                .y = a.q + t * a.ldq,
                .ldy = d,
                .m = a.num_heads,
                .n = d,
                .w = a.q_norm,
                .eps = a.eps});
    rms_norm({.x = k.data(),
              .ldx = d,
              .y = k.data(),
              .ldy = d,
              .m = a.m * a.num_kv_heads,
              .n = d,
              .w = a.k_norm,
              .eps = a.eps});
  }
  rope({.x = a.q,
        .ldx = a.ldq,
        .m = a.m,
        .num_heads = a.num_heads,
        .head_dim = d,
        .positions = a.positions,
        .inv_freq = a.inv_freq,
        .attention_scaling = a.attention_scaling});
  rope({.x = k.data(),
        .ldx = kv_row,
        .m = a.m,
        .num_heads = a.num_kv_heads,
        .head_dim = d,
        .positions = a.positions,
        .inv_freq = a.inv_freq,
        .attention_scaling = a.attention_scaling});
  write_kv({.k = k.data(),
            .ldk = kv_row,
            .v = a.v,
            .ldv = a.ldv,
            .m = a.m,
            .slot_mapping = a.slot_mapping,
            .cache = a.cache});
}

}  // namespace polylora::kernels::ref
