// kernels/moe/moe_cpu.cc: CPU fast path of MoE routing and experts.
// route(): per token softmax and a partial top-k selection (same numerics and tie order as the reference).
// moe_experts(): (token, k) pairs counting-sorted by (expert, adapter slot), input rows gathered in that
// order; the gate_up products of all experts with tokens run as one cpu::linear_batch job (the down products
// as another), LoRA per (expert, slot) sub-range with cpu::lora_apply, the activation over all rows at once,
// then a weighted scatter-add. Each phase is one OpenMP region; regions never nest.
// Must not: allocate per call beyond the calling thread's scratch; touch experts that received no token.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/activation/activation.h"
#include "kernels/cpu_simd.h"
#include "kernels/linear/linear.h"
#include "kernels/moe/moe.h"

namespace polylora::kernels::cpu {
namespace {

// The k largest values of v, largest first, ties to the lower index (as a stable sort descending).
void top_k(const float* v, int64_t n, int64_t k, std::vector<char>& taken, int32_t* idx) {
  taken.assign(static_cast<size_t>(n), 0);
  for (int64_t j = 0; j < k; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < n; ++e) {
      if (!taken[e] && (best < 0 || v[e] > v[best])) best = e;
    }
    taken[best] = 1;
    idx[j] = static_cast<int32_t>(best);
  }
}

void route_token(const RouteArgs& a, int64_t t, std::vector<float>& probs, std::vector<char>& taken) {
  const float* logits = a.logits + t * a.num_experts;
  int32_t* ids = a.ids + t * a.top_k;
  float* w = a.weights + t * a.top_k;
  switch (a.scoring) {
    case RouterScoring::kSoftmaxTopK: {
      probs.resize(static_cast<size_t>(a.num_experts));
      float mx = *std::max_element(logits, logits + a.num_experts);
      float sum = 0.0f;
      for (int64_t e = 0; e < a.num_experts; ++e) sum += probs[e] = std::exp(logits[e] - mx);
      for (float& p : probs) p /= sum;
      top_k(probs.data(), a.num_experts, a.top_k, taken, ids);
      float total = 0.0f;
      for (int64_t k = 0; k < a.top_k; ++k) total += probs[ids[k]];
      for (int64_t k = 0; k < a.top_k; ++k) w[k] = a.renormalize ? probs[ids[k]] / total : probs[ids[k]];
      break;
    }
    case RouterScoring::kTopKSoftmax: {
      top_k(logits, a.num_experts, a.top_k, taken, ids);
      float mx = logits[ids[0]];
      float sum = 0.0f;
      for (int64_t k = 0; k < a.top_k; ++k) sum += w[k] = std::exp(logits[ids[k]] - mx);
      for (int64_t k = 0; k < a.top_k; ++k) w[k] /= sum;
      break;
    }
  }
  if (a.id_begin != 0)
    for (int64_t k = 0; k < a.top_k; ++k) ids[k] = static_cast<int32_t>(ids[k] - a.id_begin);
}

// Per-call scratch of moe_experts, owned by the calling thread and grown as needed. Rows are in the
// sorted (expert, slot, token) order of the (token, k) pairs.
struct MoeScratch {
  std::vector<int64_t> offsets;  // [num_keys + 1] start of each (expert, slot) key in the sorted order
  std::vector<int32_t> tokens;   // [m·top_k] token of each sorted row
  std::vector<float> weights;    // [m·top_k] routing weight of each sorted row
  std::vector<float> x;          // [m·top_k, H] gathered inputs
  std::vector<float> gu;         // [m·top_k, 2I]
  std::vector<float> h;          // [m·top_k, I]
  std::vector<float> y;          // [m·top_k, H]
  std::vector<LinearArgs> jobs;  // products of one phase, one or two per active expert
};

void add_lora(const LoraView& l, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t rows) {
  if (l.empty() || rows == 0) return;
  lora_apply({.x = x, .ldx = ldx, .y = y, .ldy = ldy, .rows = nullptr, .num_rows = rows, .lora = l});
}

}  // namespace

void route(const RouteArgs& a) {
  bool parallel = a.m > 16 && !omp_in_parallel();
#pragma omp parallel if (parallel)
  {
    thread_local std::vector<float> probs;
    thread_local std::vector<char> taken;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < a.m; ++t) route_token(a, t, probs, taken);
  }
}

void moe_experts(const MoeExpertsArgs& in) {
  if (route_and_norm_around(
          in, [](const RouteArgs& r) { route(r); }, [](const MoeExpertsArgs& a) { moe_experts(a); },
          [](const AddRmsNormArgs& n) { add_rms_norm(n); }))
    return;
  // Slot-stacked LoRA: F32 stacks become a table of views into the stack (no copy); BF16 stacks and
  // separate gate/up LoRA on interleaved gate/up rows go through the reference.
  const MoeLoraStack& st = in.lora_stack;
  if (!st.empty() && in.token_slots) {
    const bool interleaved = in.act == ExpertAct::kGptOssSwiglu;
    if (st.dtype != DType::kF32 || (st.gu_slices == 2 && interleaved)) return ref::moe_experts(in);
    const int64_t E = in.num_experts, H = in.hidden, I = in.inter, R = st.rank;
    thread_local std::vector<ExpertLoraView> table;
    table.assign(static_cast<size_t>(st.slots * E), {});
    const auto* ag = static_cast<const float*>(st.a_gu);
    const auto* bg = static_cast<const float*>(st.b_gu);
    const auto* ad = static_cast<const float*>(st.a_down);
    const auto* bd = static_cast<const float*>(st.b_down);
    for (int64_t se = 0; se < st.slots * E; ++se) {
      const float* sc = st.scale + se * 3;
      ExpertLoraView& v = table[static_cast<size_t>(se)];
      const float* a0 = ag + se * st.gu_slices * R * H;
      const float* b0 = bg + se * 2 * I * R;
      if (st.gu_slices == 1) {
        if (sc[0] != 0.0f) v.gate_up = {a0, b0, R, H, 2 * I, sc[0]};
      } else {
        if (sc[0] != 0.0f) v.gate = {a0, b0, R, H, I, sc[0]};
        if (sc[1] != 0.0f) v.up = {a0 + R * H, b0 + I * R, R, H, I, sc[1]};
      }
      if (sc[2] != 0.0f) v.down = {ad + se * R * I, bd + se * H * R, R, I, H, sc[2]};
    }
    MoeExpertsArgs a = in;
    a.lora_stack = {};
    a.lora = table.data();
    a.num_slots = st.slots;
    return moe_experts(a);
  }
  const MoeExpertsArgs& a = in;
  int64_t H = a.hidden, I = a.inter, E = a.num_experts, K = a.top_k;
  bool has_lora = a.token_slots && a.lora && a.num_slots > 0;
  int64_t S = has_lora ? a.num_slots : 0;
  int64_t keys_per_expert = S + 1;  // key (expert e, slot s) = e·(S+1) + s + 1; slot −1 → e·(S+1)
  thread_local MoeScratch scratch;
  MoeScratch& sc = scratch;  // a plain reference, so OpenMP threads below share the caller's scratch

  bool parallel_zero = a.m * H >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel_zero)
  for (int64_t t = 0; t < a.m; ++t) std::memset(a.out + t * a.ldo, 0, static_cast<size_t>(H) * sizeof(float));

  // Counting sort of the (token, k) pairs by key; stable, so tokens stay ascending within a key. Pairs of
  // other ranks' experts (ids outside [0, E)) take the last key, past every row computed here.
  int64_t num_keys = E * keys_per_expert;
  auto key_of = [&](int64_t t, int64_t k) -> int64_t {
    int32_t e = a.ids[t * K + k];
    if (e < 0 || e >= E) return num_keys;
    int32_t slot = has_lora ? a.token_slots[t] : -1;
    if (slot >= S) slot = -1;
    return e * keys_per_expert + (slot < 0 ? 0 : slot + 1);
  };
  sc.offsets.assign(static_cast<size_t>(num_keys + 2), 0);
  for (int64_t t = 0; t < a.m; ++t) {
    for (int64_t k = 0; k < K; ++k) ++sc.offsets[key_of(t, k) + 1];
  }
  for (int64_t i = 0; i <= num_keys; ++i) sc.offsets[i + 1] += sc.offsets[i];
  sc.tokens.resize(static_cast<size_t>(a.m * K));
  sc.weights.resize(static_cast<size_t>(a.m * K));
  {
    std::vector<int64_t>& fill = sc.offsets;  // advanced while filling, restored below
    for (int64_t t = 0; t < a.m; ++t) {
      for (int64_t k = 0; k < K; ++k) {
        int64_t pos = fill[key_of(t, k)]++;
        sc.tokens[pos] = static_cast<int32_t>(t);
        sc.weights[pos] = a.weights[t * K + k];
      }
    }
    for (int64_t i = num_keys + 1; i > 0; --i) fill[i] = fill[i - 1];
    fill[0] = 0;
  }

  const int64_t total =
      sc.offsets[num_keys];  // the pairs of this rank's experts (all without expert parallelism)
  sc.x.resize(static_cast<size_t>(total * H));
  sc.gu.resize(static_cast<size_t>(total * 2 * I));
  sc.h.resize(static_cast<size_t>(total * I));
  sc.y.resize(static_cast<size_t>(total * H));
  bool parallel_rows = total * H >= simd::kMinParallelWork && !omp_in_parallel();
#pragma omp parallel for schedule(static) if (parallel_rows)
  for (int64_t i = 0; i < total; ++i) std::copy_n(a.x + sc.tokens[i] * a.ldx, H, sc.x.data() + i * H);

  auto expert_rows = [&](int64_t e) {
    return std::pair{sc.offsets[e * keys_per_expert], sc.offsets[(e + 1) * keys_per_expert]};
  };
  // Adapter slot s of expert e: rows [r0, r0 + rows) of the sorted order.
  auto slot_rows = [&](int64_t e, int64_t s) {
    int64_t r0 = sc.offsets[e * keys_per_expert + s + 1];
    return std::pair{r0, sc.offsets[e * keys_per_expert + s + 2] - r0};
  };

  // gate_up (or gate and up) of every expert with tokens, as one parallel job.
  sc.jobs.clear();
  for (int64_t e = 0; e < E; ++e) {
    auto [begin, end] = expert_rows(e);
    if (begin == end) continue;
    const ExpertView& ex = a.experts[e];
    const float* x = sc.x.data() + begin * H;
    float* gu = sc.gu.data() + begin * 2 * I;
    if (!ex.gate_up.empty()) {
      sc.jobs.push_back({.x = x,
                         .m = end - begin,
                         .ldx = H,
                         .w = ex.gate_up,
                         .bias = ex.gate_up_bias,
                         .y = gu,
                         .ldy = 2 * I});
    } else {
      sc.jobs.push_back(
          {.x = x, .m = end - begin, .ldx = H, .w = ex.gate, .bias = nullptr, .y = gu, .ldy = 2 * I});
      sc.jobs.push_back(
          {.x = x, .m = end - begin, .ldx = H, .w = ex.up, .bias = nullptr, .y = gu + I, .ldy = 2 * I});
    }
  }
  linear_batch(sc.jobs.data(), static_cast<int64_t>(sc.jobs.size()));
  for (int64_t e = 0; e < E && S > 0; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      const ExpertLoraView& lv = a.lora[s * E + e];
      auto [r0, rows] = slot_rows(e, s);
      const float* xs = sc.x.data() + r0 * H;
      float* gu = sc.gu.data() + r0 * 2 * I;
      add_lora(lv.gate_up, xs, H, gu, 2 * I, rows);
      add_lora(lv.gate, xs, H, gu, 2 * I, rows);
      add_lora(lv.up, xs, H, gu + I, 2 * I, rows);
    }
  }

  // The activation over all rows at once (every row has the same [2I] layout).
  switch (a.act) {
    case ExpertAct::kSiluGate:
      silu_and_mul({.gate = sc.gu.data(),
                    .ld_gate = 2 * I,
                    .up = sc.gu.data() + I,
                    .ld_up = 2 * I,
                    .out = sc.h.data(),
                    .ld_out = I,
                    .m = total,
                    .n = I});
      break;
    case ExpertAct::kGptOssSwiglu:
      gpt_oss_swiglu({.gate_up = sc.gu.data(),
                      .ld_in = 2 * I,
                      .out = sc.h.data(),
                      .ld_out = I,
                      .m = total,
                      .n = I,
                      .alpha = a.swiglu_alpha,
                      .limit = a.swiglu_limit});
      break;
  }

  sc.jobs.clear();
  for (int64_t e = 0; e < E; ++e) {
    auto [begin, end] = expert_rows(e);
    if (begin == end) continue;
    sc.jobs.push_back({.x = sc.h.data() + begin * I,
                       .m = end - begin,
                       .ldx = I,
                       .w = a.experts[e].down,
                       .bias = a.experts[e].down_bias,
                       .y = sc.y.data() + begin * H,
                       .ldy = H});
  }
  linear_batch(sc.jobs.data(), static_cast<int64_t>(sc.jobs.size()));
  for (int64_t e = 0; e < E && S > 0; ++e) {
    for (int64_t s = 0; s < S; ++s) {
      auto [r0, rows] = slot_rows(e, s);
      add_lora(a.lora[s * E + e].down, sc.h.data() + r0 * I, I, sc.y.data() + r0 * H, H, rows);
    }
  }

  // Weighted scatter-add; threads own column ranges of out, so no two write the same element.
  constexpr int64_t kCols = 256;
  int64_t num_col_blocks = (H + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (parallel_rows && num_col_blocks > 1)
  for (int64_t cb = 0; cb < num_col_blocks; ++cb) {
    int64_t c0 = cb * kCols, nc = std::min(kCols, H - c0);
    for (int64_t i = 0; i < total; ++i) {
      simd::axpy(sc.weights[i], sc.y.data() + i * H + c0, a.out + sc.tokens[i] * a.ldo + c0, nc);
    }
  }
}

}  // namespace polylora::kernels::cpu
