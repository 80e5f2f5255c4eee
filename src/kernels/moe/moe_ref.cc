// kernels/moe/moe_ref.cc: reference routing and experts, one token and one expert at a time.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/activation/activation.h"
#include "kernels/linear/linear.h"
#include "kernels/lora/lora_stack.h"
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

// Slot-stacked expert LoRA of (slot s, expert e) on one gate/up row (down == false: x [H] -> gu [2I]) or
// one down row (x = the activation [I] -> y [H]).
void add_stack_lora(const MoeLoraStack& st, int64_t E, int64_t H, int64_t I, bool interleaved, int32_t s,
                    int32_t e, bool down, const float* x, float* y) {
  if (st.empty() || s < 0 || s >= st.slots) return;
  const int64_t R = st.rank, se = static_cast<int64_t>(s) * E + e;
  const float* scale = st.scale + se * 3;
  const int slices = down ? 1 : st.gu_slices;
  const int64_t in = down ? I : H, out = down ? H : 2 * I;
  const void* A = down ? st.a_down : st.a_gu;
  const void* B = down ? st.b_down : st.b_gu;
  const int64_t a0 = se * slices * R * in, b0 = se * out * R;
  std::vector<float> mid(static_cast<size_t>(slices * R));
  for (int64_t j = 0; j < slices * R; ++j) {
    float acc = 0.0f;
    for (int64_t k = 0; k < in; ++k) acc += stack_at(A, st.dtype, a0 + j * in + k) * x[k];
    mid[static_cast<size_t>(j)] = acc;
  }
  for (int64_t n = 0; n < out; ++n) {
    const int slice = down ? 0 : (slices == 1 ? 0 : (interleaved ? static_cast<int>(n & 1) : n >= I ? 1 : 0));
    const float sc = scale[down ? 2 : slice];
    if (sc == 0.0f) continue;
    float acc = 0.0f;
    for (int64_t r = 0; r < R; ++r) acc += stack_at(B, st.dtype, b0 + n * R + r) * mid[static_cast<size_t>(slice * R + r)];
    y[n] += sc * acc;
  }
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
          ids[k] = static_cast<int32_t>(idx[k] - a.id_begin);
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
          ids[k] = static_cast<int32_t>(idx[k] - a.id_begin);
          w[k] /= sum;
        }
        break;
      }
    }
  }
}

void moe_experts(const MoeExpertsArgs& in) {
  if (route_and_norm_around(
          in, [](const RouteArgs& r) { route(r); }, [](const MoeExpertsArgs& a) { moe_experts(a); },
          [](const AddRmsNormArgs& n) { add_rms_norm(n); }))
    return;
  const MoeExpertsArgs& a = in;
  int64_t H = a.hidden, I = a.inter;
  std::vector<float> gu(static_cast<size_t>(2 * I)), h(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t t = 0; t < a.m; ++t) {
    const float* x = a.x + t * a.ldx;
    float* out = a.out + t * a.ldo;
    std::fill(out, out + H, 0.0f);
    int32_t slot = a.token_slots ? a.token_slots[t] : -1;
    for (int64_t k = 0; k < a.top_k; ++k) {
      int32_t e = a.ids[t * a.top_k + k];
      if (e < 0 || e >= a.num_experts) continue;  // another rank's expert
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
      const bool stack = !a.lora_stack.empty() && slot >= 0;
      const bool interleaved = a.act == ExpertAct::kGptOssSwiglu;
      if (stack) add_stack_lora(a.lora_stack, a.num_experts, H, I, interleaved, slot, e, false, x, gu.data());
      if (lora && !stack) {
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
      if (stack) add_stack_lora(a.lora_stack, a.num_experts, H, I, interleaved, slot, e, true, h.data(), y.data());
      if (lora && !stack) add_lora(lora->down, h.data(), y.data());
      float w = a.weights[t * a.top_k + k];
      for (int64_t i = 0; i < H; ++i) out[i] += w * y[i];
    }
  }
}

}  // namespace polylora::kernels::ref
