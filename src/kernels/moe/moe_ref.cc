// kernels/moe/moe_ref.cc: reference routing and experts, one token and one expert at a time.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/activation/activation.h"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe.h"

namespace polylora::kernels::ref {
namespace {

// Indices of the k largest values, largest first; ties keep the lower index first.
void top_k(const float* v, int64_t n, int64_t k, std::vector<int32_t>& idx) {
  idx.resize(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] > v[b]; });
  idx.resize(static_cast<size_t>(k));
}

void add_lora(const LoraView& l, const float* x, float* y) {
  if (l.empty()) return;
  LoraApplyArgs a;
  a.x = x;
  a.ldx = l.in;
  a.y = y;
  a.ldy = l.out;
  a.num_rows = 1;
  a.lora = l;
  lora_apply(a);
}

}  // namespace

void route(const RouteArgs& a) {
  std::vector<float> probs(static_cast<size_t>(a.num_experts));
  std::vector<int32_t> idx;
  for (int64_t t = 0; t < a.m; ++t) {
    const float* logits = a.logits + t * a.num_experts;
    int32_t* ids = a.ids + t * a.top_k;
    float* w = a.weights + t * a.top_k;
    switch (a.scoring) {
      case RouterScoring::kSoftmaxTopK: {
        float mx = *std::max_element(logits, logits + a.num_experts);
        float sum = 0.0f;
        for (int64_t e = 0; e < a.num_experts; ++e) sum += probs[e] = std::exp(logits[e] - mx);
        for (float& p : probs) p /= sum;
        top_k(probs.data(), a.num_experts, a.top_k, idx);
        float total = 0.0f;
        for (int64_t k = 0; k < a.top_k; ++k) total += probs[idx[k]];
        for (int64_t k = 0; k < a.top_k; ++k) {
          ids[k] = idx[k];
          w[k] = a.renormalize ? probs[idx[k]] / total : probs[idx[k]];
        }
        break;
      }
      case RouterScoring::kTopKSoftmax: {
        top_k(logits, a.num_experts, a.top_k, idx);
        float mx = logits[idx[0]];
        float sum = 0.0f;
        for (int64_t k = 0; k < a.top_k; ++k) sum += w[k] = std::exp(logits[idx[k]] - mx);
        for (int64_t k = 0; k < a.top_k; ++k) {
          ids[k] = idx[k];
          w[k] /= sum;
        }
        break;
      }
    }
  }
}

void moe_experts(const MoeExpertsArgs& a) {
  int64_t H = a.hidden, I = a.inter;
  std::vector<float> gu(static_cast<size_t>(2 * I)), h(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t t = 0; t < a.m; ++t) {
    const float* x = a.x + t * a.ldx;
    float* out = a.out + t * a.ldo;
    std::fill(out, out + H, 0.0f);
    int32_t slot = a.token_slots ? a.token_slots[t] : -1;
    for (int64_t k = 0; k < a.top_k; ++k) {
      int32_t e = a.ids[t * a.top_k + k];
      const ExpertView& ex = a.experts[e];
      const ExpertLoraView* lora =
          (slot >= 0 && a.lora && slot < a.num_slots) ? &a.lora[slot * a.num_experts + e] : nullptr;
      if (!ex.gate_up.empty()) {
        linear({.x = x,
                .m = 1,
                .ldx = H,
                .w = ex.gate_up,
                .bias = ex.gate_up_bias,
                .y = gu.data(),
                .ldy = 2 * I});
      } else {
        linear({.x = x, .m = 1, .ldx = H, .w = ex.gate, .bias = nullptr, .y = gu.data(), .ldy = I});
        linear({.x = x, .m = 1, .ldx = H, .w = ex.up, .bias = nullptr, .y = gu.data() + I, .ldy = I});
      }
      if (lora) {
        add_lora(lora->gate_up, x, gu.data());
        add_lora(lora->gate, x, gu.data());
        add_lora(lora->up, x, gu.data() + I);
      }
      switch (a.act) {
        case ExpertAct::kSiluGate:
          silu_and_mul({.gate = gu.data(),
                        .ld_gate = I,
                        .up = gu.data() + I,
                        .ld_up = I,
                        .out = h.data(),
                        .ld_out = I,
                        .m = 1,
                        .n = I});
          break;
        case ExpertAct::kGptOssSwiglu:
          gpt_oss_swiglu({.gate_up = gu.data(),
                          .ld_in = 2 * I,
                          .out = h.data(),
                          .ld_out = I,
                          .m = 1,
                          .n = I,
                          .alpha = a.swiglu_alpha,
                          .limit = a.swiglu_limit});
          break;
      }
      linear({.x = h.data(), .m = 1, .ldx = I, .w = ex.down, .bias = ex.down_bias, .y = y.data(), .ldy = H});
      if (lora) add_lora(lora->down, h.data(), y.data());
      float w = a.weights[t * a.top_k + k];
      for (int64_t i = 0; i < H; ++i) out[i] += w * y[i];
    }
  }
}

}  // namespace polylora::kernels::ref
