// tests/kernels/lora_stack_util.h: random slot-stacked LoRA for the stack tests (tests/kernels on the CPU,
// tests/gpu): per-slot adapters of different ranks zero-padded into LoraStack / MoeLoraStack tensors in F32
// or BF16, the same values (bf16-rounded for BF16 stacks) as the old per-adapter LoraView / ExpertLoraView
// tables (the independent formulation the stacked kernels are checked against), token -> slot patterns
// (contiguous runs, interleaved, −1 tokens), and the old per-slot dense path (ref::lora_apply on each
// slot's rows).
// Must not: hold test logic of its own op (no expectations here).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "kernels/kernel_test_util.h"
#include "kernels/linear/linear.h"
#include "kernels/lora/lora.h"
#include "kernels/moe/moe.h"

namespace polylora::kernels::test {

// A stack tensor in `dtype`: bits() what the stacked kernels read, f32 the values the old path sees
// (bf16-rounded for BF16, so both paths multiply identical numbers). Zero-initialised (the rank padding).
struct StackBuffer {
  DType dtype = DType::kF32;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  StackBuffer(DType d, size_t n) : dtype(d), f32(n, 0.0f), bf16(d == DType::kBF16 ? n : 0, 0) {}
  // Stores v (rounded to bf16 for BF16) and returns the value stored.
  float set(size_t i, float v) {
    if (dtype == DType::kBF16) {
      bf16[i] = f32_to_bf16(v);
      v = bf16_to_f32(bf16[i]);
    }
    f32[i] = v;
    return v;
  }
  const void* bits() const {
    return dtype == DType::kBF16 ? static_cast<const void*>(bf16.data())
                                 : static_cast<const void*>(f32.data());
  }
  size_t bytes() const { return f32.size() * dtype_size(dtype); }
};

// ---- Dense: one module's stack [slots, rank, in] / [slots, out, rank] ----
// ranks[s] (<= rank; 0: the slot has no LoRA on this module, scale 0); scales[s] used where ranks[s] > 0.
// A values uniform in ±a_range, B in ±b_range.
struct DenseStack {
  int64_t slots, rank, in, out;
  std::vector<int64_t> ranks;
  StackBuffer a, b;
  std::vector<float> scale;
  std::vector<std::vector<float>> old_a, old_b;  // per slot: [ranks[s], in], [out, ranks[s]] (unpadded)

  DenseStack(int64_t slots_, int64_t rank_, int64_t in_, int64_t out_, std::vector<int64_t> ranks_,
             const std::vector<float>& scales, DType dtype, uint32_t seed, float a_range = 0.5f,
             float b_range = 0.5f)
      : slots(slots_),
        rank(rank_),
        in(in_),
        out(out_),
        ranks(std::move(ranks_)),
        a(dtype, static_cast<size_t>(slots_ * rank_ * in_)),
        b(dtype, static_cast<size_t>(slots_ * out_ * rank_)),
        scale(static_cast<size_t>(slots_), 0.0f),
        old_a(static_cast<size_t>(slots_)),
        old_b(static_cast<size_t>(slots_)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> da(-a_range, a_range), db(-b_range, b_range);
    for (int64_t s = 0; s < slots; ++s) {
      int64_t r = ranks[s];
      if (r < 0 || r > rank) throw std::invalid_argument("DenseStack: adapter rank outside 0 .. stack rank");
      if (r == 0) continue;
      scale[s] = scales[s];
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < in; ++j)
          old_a[s].push_back(a.set(static_cast<size_t>((s * rank + i) * in + j), da(rng)));
      old_b[s].resize(static_cast<size_t>(out * r));
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < r; ++i)
          old_b[s][o * r + i] = b.set(static_cast<size_t>((s * out + o) * rank + i), db(rng));
    }
  }
  DenseStack(const DenseStack&) = delete;
  DenseStack& operator=(const DenseStack&) = delete;

  // Host pointers (the GPU test replaces a, b, scale by device copies).
  LoraStack stack() const {
    return {.a = a.bits(),
            .b = b.bits(),
            .dtype = a.dtype,
            .scale = scale.data(),
            .slots = slots,
            .rank = rank,
            .in = in,
            .out = out};
  }
  // The old path's view of slot s (empty: no LoRA there).
  LoraView view(int64_t s) const {
    if (ranks[s] == 0) return {};
    return {.a = old_a[s].data(),
            .b = old_b[s].data(),
            .rank = ranks[s],
            .in = in,
            .out = out,
            .scale = scale[s]};
  }
};

// The old path: for every module i and slot s with LoRA there, ref::lora_apply on the rows of slot s.
// args' pointers are host memory; stacks[i] the module's DenseStack.
inline void old_lora_batch(const LoraBatchArgs& args, const std::vector<const DenseStack*>& stacks) {
  for (int i = 0; i < args.num; ++i) {
    const DenseStack& st = *stacks[i];
    for (int64_t s = 0; s < st.slots; ++s) {
      LoraView v = st.view(s);
      if (v.empty()) continue;
      std::vector<int32_t> rows;
      for (int64_t t = 0; t < args.m; ++t)
        if (args.token_slots[t] == s) rows.push_back(static_cast<int32_t>(t));
      if (rows.empty()) continue;
      ref::lora_apply({.x = args.x,
                       .ldx = args.ldx,
                       .y = args.y[i],
                       .ldy = args.ldy[i],
                       .rows = rows.data(),
                       .num_rows = static_cast<int64_t>(rows.size()),
                       .lora = v});
    }
  }
}

// Token -> slot: the first half in contiguous runs of `run` tokens over `order`, the rest round-robin over
// `order` (interleaved). `order` may hold −1 (base-model tokens).
inline std::vector<int32_t> slot_pattern(int64_t m, const std::vector<int32_t>& order, int64_t run) {
  std::vector<int32_t> s(static_cast<size_t>(m));
  int64_t half = m / 2;
  for (int64_t t = 0; t < half; ++t) s[t] = order[(t / run) % order.size()];
  for (int64_t t = half; t < m; ++t) s[t] = order[(t - half) % order.size()];
  return s;
}

// ---- MoE: one layer's expert LoRA for every slot ----
// Per (slot, expert): ranks of the gate/up slices r0 (gu_slices 1: the only one), r1 (gu_slices 2) and of
// down rd (each <= rank; 0: none there, scale 0) and their scales.
struct ExpertLoraSpec {
  int64_t r0 = 0, r1 = 0, rd = 0;
  float s0 = 0.5f, s1 = 0.5f, sd = 0.5f;
};

struct MoeStack {
  int64_t slots, experts, rank, hidden, inter;
  int gu_slices;
  bool interleaved;  // gate/up rows alternate (ExpertAct::kGptOssSwiglu)
  StackBuffer a_gu, b_gu, a_down, b_down;
  std::vector<float> scale;             // [slots, E, 3]
  std::deque<std::vector<float>> mats;  // the old views' matrices (stable addresses)
  std::vector<ExpertLoraView> views;    // [slots · E], the old path's table

  // gu_slices 2 with interleaved rows has no gate/up form in ExpertLoraView (gate and up are the halves
  // there): its old view is one gate_up LoRA of rank r0 + r1, A = [A0; A1], B row n = scale_sl(n) · B[n] in
  // the columns of its slice sl(n) = n & 1, zero in the other slice's, view scale 1.
  // unused_slice1_scale: written at [s, e, 1] when gu_slices is 1 (the kernels must not read it).
  MoeStack(int64_t slots_, int64_t experts_, int64_t rank_, int64_t hidden_, int64_t inter_, int gu_slices_,
           bool interleaved_, DType dtype, const std::function<ExpertLoraSpec(int64_t s, int64_t e)>& spec,
           uint32_t seed, float a_range = 0.3f, float b_range = 0.3f, float unused_slice1_scale = 0.0f)
      : slots(slots_),
        experts(experts_),
        rank(rank_),
        hidden(hidden_),
        inter(inter_),
        gu_slices(gu_slices_),
        interleaved(interleaved_),
        a_gu(dtype, static_cast<size_t>(slots_ * experts_ * gu_slices_ * rank_ * hidden_)),
        b_gu(dtype, static_cast<size_t>(slots_ * experts_ * 2 * inter_ * rank_)),
        a_down(dtype, static_cast<size_t>(slots_ * experts_ * rank_ * inter_)),
        b_down(dtype, static_cast<size_t>(slots_ * experts_ * hidden_ * rank_)),
        scale(static_cast<size_t>(slots_ * experts_ * 3), 0.0f),
        views(static_cast<size_t>(slots_ * experts_)) {
    const int64_t H = hidden, I = inter, R = rank, G = gu_slices;
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> da(-a_range, a_range), db(-b_range, b_range);
    auto slice_of = [&](int64_t n) -> int64_t {
      return G == 1 ? 0 : (interleaved ? (n & 1) : (n >= I ? 1 : 0));
    };
    for (int64_t s = 0; s < slots; ++s) {
      for (int64_t e = 0; e < experts; ++e) {
        const ExpertLoraSpec sp = spec(s, e);
        for (int64_t r : {sp.r0, sp.r1, sp.rd})
          if (r < 0 || r > R) throw std::invalid_argument("MoeStack: adapter rank outside 0 .. stack rank");
        const int64_t se = s * experts + e;
        const int64_t rg[2] = {sp.r0, G == 2 ? sp.r1 : 0};
        const float sg[2] = {sp.s0, sp.s1};
        float* sc = &scale[static_cast<size_t>(se * 3)];
        sc[0] = rg[0] > 0 ? sg[0] : 0.0f;
        sc[1] = G == 2 ? (rg[1] > 0 ? sg[1] : 0.0f) : unused_slice1_scale;
        sc[2] = sp.rd > 0 ? sp.sd : 0.0f;
        // gate/up shrink rows: slice g at rows g·R .. g·R + rg[g] − 1 of a_gu[s, e]
        std::vector<float> ag[2];
        for (int64_t g = 0; g < G; ++g)
          for (int64_t i = 0; i < rg[g]; ++i)
            for (int64_t j = 0; j < H; ++j)
              ag[g].push_back(a_gu.set(static_cast<size_t>(((se * G + g) * R + i) * H + j), da(rng)));
        // gate/up expand: row n uses the first rg[slice(n)] columns
        std::vector<std::vector<float>> bg(static_cast<size_t>(2 * I));
        for (int64_t n = 0; n < 2 * I; ++n) {
          int64_t g = slice_of(n);
          for (int64_t i = 0; i < rg[g]; ++i)
            bg[n].push_back(b_gu.set(static_cast<size_t>((se * 2 * I + n) * R + i), db(rng)));
        }
        ExpertLoraView& v = views[static_cast<size_t>(se)];
        if (G == 1) {
          if (rg[0] > 0) {
            mats.push_back(ag[0]);
            const float* pa = mats.back().data();
            mats.emplace_back();
            for (int64_t n = 0; n < 2 * I; ++n)
              mats.back().insert(mats.back().end(), bg[n].begin(), bg[n].end());
            v.gate_up = {
                .a = pa, .b = mats.back().data(), .rank = rg[0], .in = H, .out = 2 * I, .scale = sg[0]};
          }
        } else if (!interleaved) {
          for (int64_t g = 0; g < 2; ++g) {
            if (rg[g] == 0) continue;
            mats.push_back(ag[g]);
            const float* pa = mats.back().data();
            mats.emplace_back();
            for (int64_t n = g * I; n < (g + 1) * I; ++n)
              mats.back().insert(mats.back().end(), bg[n].begin(), bg[n].end());
            LoraView lv{.a = pa, .b = mats.back().data(), .rank = rg[g], .in = H, .out = I, .scale = sg[g]};
            (g == 0 ? v.gate : v.up) = lv;
          }
        } else if (rg[0] + rg[1] > 0) {
          const int64_t rr = rg[0] + rg[1];
          mats.push_back(ag[0]);
          mats.back().insert(mats.back().end(), ag[1].begin(), ag[1].end());
          const float* pa = mats.back().data();
          mats.emplace_back(static_cast<size_t>(2 * I * rr), 0.0f);
          std::vector<float>& fb = mats.back();
          for (int64_t n = 0; n < 2 * I; ++n) {
            int64_t g = slice_of(n), off = g == 0 ? 0 : rg[0];
            for (int64_t i = 0; i < rg[g]; ++i) fb[n * rr + off + i] = sg[g] * bg[n][i];
          }
          v.gate_up = {.a = pa, .b = fb.data(), .rank = rr, .in = H, .out = 2 * I, .scale = 1.0f};
        }
        if (sp.rd > 0) {
          mats.emplace_back();
          for (int64_t i = 0; i < sp.rd; ++i)
            for (int64_t j = 0; j < I; ++j)
              mats.back().push_back(a_down.set(static_cast<size_t>((se * R + i) * I + j), da(rng)));
          const float* pa = mats.back().data();
          mats.emplace_back(static_cast<size_t>(H * sp.rd));
          for (int64_t o = 0; o < H; ++o)
            for (int64_t i = 0; i < sp.rd; ++i)
              mats.back()[o * sp.rd + i] = b_down.set(static_cast<size_t>((se * H + o) * R + i), db(rng));
          v.down = {.a = pa, .b = mats.back().data(), .rank = sp.rd, .in = I, .out = H, .scale = sp.sd};
        }
      }
    }
  }
  MoeStack(const MoeStack&) = delete;
  MoeStack& operator=(const MoeStack&) = delete;

  // Host pointers (the GPU test replaces them by device copies).
  MoeLoraStack stack() const {
    return {.a_gu = a_gu.bits(),
            .b_gu = b_gu.bits(),
            .a_down = a_down.bits(),
            .b_down = b_down.bits(),
            .dtype = a_gu.dtype,
            .scale = scale.data(),
            .slots = slots,
            .rank = rank,
            .gu_slices = gu_slices};
  }
};

struct StackMoeCase {
  int64_t m = 1, hidden = 64, inter = 48, num_experts = 6, top_k = 2, rank = 6;
  DType weight_dtype = DType::kF32;
  DType stack_dtype = DType::kF32;
  int gu_slices = 1;
  ExpertAct act = ExpertAct::kGptOssSwiglu;
  bool fused = true;
  bool biases = true;
  int64_t slots = 5;                   // >= 5 (see moe_spec)
  float weight_scale = 0.2f;           // base weights uniform in ±weight_scale
  float lora_a = 0.3f, lora_b = 0.3f;  // LoRA A and B uniform in ±these
};

// Slot 0: LoRA on every expert, ranks varying by expert; slot 1: expert 4 none at all, expert 2 down only,
// expert 3 gate/up slice 1 only (gu_slices 2) or gate/up only (gu_slices 1); slot 2: no expert LoRA (an
// attention-only adapter); slot 3: LoRA everywhere, no tokens; slot 4: LoRA only on experts >= E/2 (and one
// token of it routed to experts below E/2 only); slots 5 and up: LoRA everywhere.
inline ExpertLoraSpec moe_spec(int64_t s, int64_t e, int64_t E, int64_t R, int gu_slices) {
  auto r = [&](int64_t v) { return 1 + ((v + 3 * (s >= 5 ? s : 0)) % R + R) % R; };  // 1 .. R
  ExpertLoraSpec sp{.r0 = r(e), .r1 = r(R - 1 - e), .rd = r(2 * e + 1), .s0 = 0.5f, .s1 = -0.75f, .sd = 1.5f};
  switch (s) {
    case 1:
      if (e == 4) sp = {};
      if (e == 2) sp.r0 = sp.r1 = 0;
      if (e == 3) {
        sp.rd = 0;
        if (gu_slices == 2) sp.r0 = 0;
      }
      sp.s1 = 1.25f;
      break;
    case 2:
      sp = {};
      break;
    case 4:
      if (e < E / 2) sp = {};
      sp.s0 = -0.5f;
      break;
    default:
      break;
  }
  return sp;
}

struct MoeFixture {
  std::vector<TestWeight> weights;
  std::vector<std::vector<float>> biases;
  std::vector<ExpertView> experts;
  std::vector<float> x, w;
  std::vector<int32_t> ids, slots;
  int64_t ldx = 0, ldo = 0;
  int64_t forced_token = -1;  // slot 4, routed to experts without LoRA in slot 4
};

// Base experts (weights in c.weight_dtype), x, routing (expert 0 never routed unless top_k == E) and token
// slots (slot_pattern over 0, −1, 1, 4, 2, 0, 4, 5, ..., slots − 1, runs of 2: slot 3 has no tokens); the
// first token of slot 4 is routed to experts below E/2, which have no LoRA in slot 4.
inline void make_fixture(const StackMoeCase& c, MoeFixture& f) {
  const int64_t H = c.hidden, I = c.inter, E = c.num_experts, K = c.top_k, m = c.m;
  f.weights.reserve(static_cast<size_t>(4 * E));
  f.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    uint32_t seed = static_cast<uint32_t>(100 + e * 10);
    ExpertView& ex = f.experts[e];
    if (c.fused) {
      f.weights.push_back(make_weight(2 * I, H, c.weight_dtype, seed, c.weight_scale));
      ex.gate_up = f.weights.back().view;
    } else {
      f.weights.push_back(make_weight(I, H, c.weight_dtype, seed + 1, c.weight_scale));
      ex.gate = f.weights.back().view;
      f.weights.push_back(make_weight(I, H, c.weight_dtype, seed + 2, c.weight_scale));
      ex.up = f.weights.back().view;
    }
    f.weights.push_back(make_weight(H, I, c.weight_dtype, seed + 3, c.weight_scale));
    ex.down = f.weights.back().view;
    if (c.biases) {
      f.biases.push_back(random_vec(static_cast<size_t>(2 * I), seed + 4));
      ex.gate_up_bias = c.fused ? f.biases.back().data() : nullptr;
      f.biases.push_back(random_vec(static_cast<size_t>(H), seed + 5));
      ex.down_bias = f.biases.back().data();
    }
  }
  f.ldx = H + 2;
  f.ldo = H + 1;
  f.x = random_vec(static_cast<size_t>(m * f.ldx), 1, -2.0f, 2.0f);
  f.w = random_vec(static_cast<size_t>(m * K), 2, 0.0f, 1.0f);
  f.ids.resize(static_cast<size_t>(m * K));
  std::mt19937 rng(3);
  for (int64_t t = 0; t < m; ++t) {
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    if (K < E) order.erase(std::find(order.begin(), order.end(), 0));  // expert 0 gets no token
    for (int64_t k = 0; k < K; ++k) f.ids[t * K + k] = order[k];
  }
  std::vector<int32_t> order = {0, -1, 1, 4, 2, 0, 4};
  for (int64_t s = 5; s < c.slots; ++s) order.push_back(static_cast<int32_t>(s));
  f.slots = slot_pattern(m, order, 2);
  if (K < E / 2) {
    for (int64_t t = 0; t < m; ++t) {
      if (f.slots[t] != 4) continue;
      for (int64_t k = 0; k < K; ++k) f.ids[t * K + k] = static_cast<int32_t>(E / 2 - 1 - k);
      f.forced_token = t;
      break;
    }
  }
}

// True when token t's output gets any LoRA (its slot has LoRA on one of its experts).
inline bool token_has_lora(const MoeFixture& f, const MoeStack& st, int64_t t, int64_t K) {
  int32_t s = f.slots[t];
  if (s < 0) return false;
  for (int64_t k = 0; k < K; ++k) {
    const float* sc = &st.scale[static_cast<size_t>((s * st.experts + f.ids[t * K + k]) * 3)];
    if (sc[0] != 0 || (st.gu_slices == 2 && sc[1] != 0) || sc[2] != 0) return true;
  }
  return false;
}

// The case's MoeStack (moe_spec; slice-1 scales of gu_slices 1 set to 3, which the kernels must ignore).
inline std::unique_ptr<MoeStack> make_moe_stack(const StackMoeCase& c, uint32_t seed = 77) {
  const int64_t E = c.num_experts, R = c.rank;
  const int gu = c.gu_slices;
  return std::make_unique<MoeStack>(
      c.slots, E, R, c.hidden, c.inter, gu, c.act == ExpertAct::kGptOssSwiglu, c.stack_dtype,
      [&](int64_t s, int64_t e) { return moe_spec(s, e, E, R, gu); }, seed, c.lora_a, c.lora_b,
      /*unused_slice1_scale=*/3.0f);
}

// ---- The dense LoRA as extra K columns (kernels::LinearLoraExtArgs) ----
// One case in host memory: num modules (outputs 200, 64, 33: q/k/v stacked, or one: o) over k = 136 inputs,
// 8 slots of stack rank 16 (adapters of ranks 1..16, one slot without LoRA per module, slot 3 without
// tokens, tokens of slot −1), BF16 weights W with a random f32 bias; the extended matrix as
// model/lora_dense_ext.h lays it out (W, module i's B at tail[i] + s · 16 in its rows, bias hi / lo,
// padded to 8 columns); the group (every module, or all but the middle one: its tail columns then read
// zeros). base: the f32 product of the unrounded x with W plus the bias; before: base plus the old per-slot
// LoRA of the group (what the model computed before the extension).
struct ExtCase {
  static constexpr int64_t S = 8, R = 16, k = 136, ldx = k + 4;
  int64_t m = 0, n = 0, cols = 0, bias_col = 0;
  int64_t outs[3] = {200, 64, 33}, row0[3] = {}, tail[3] = {};
  std::vector<std::unique_ptr<DenseStack>> stacks;
  std::vector<int> group;
  std::vector<float> x, bias, base, before;
  std::vector<uint16_t> w16, wext;
  std::vector<int32_t> slots;

  ExtCase(int64_t m_, int num, bool skip_middle) : m(m_) {
    const std::vector<int64_t> ranks[3] = {
        {16, 1, 8, 16, 3, 0, 15, 7}, {5, 16, 0, 2, 16, 1, 4, 16}, {1, 14, 16, 16, 6, 16, 2, 0}};
    const std::vector<float> scales = {0.5f, 1.0f, -0.75f, 2.0f, 0.25f, 1.5f, -1.0f, 0.8f};
    int64_t col = k;
    for (int i = 0; i < num; ++i) {
      stacks.push_back(std::make_unique<DenseStack>(S, R, k, outs[i], ranks[i], scales, DType::kBF16,
                                                    static_cast<uint32_t>(300 + i), 0.4f, 0.6f));
      row0[i] = n;
      n += outs[i];
      tail[i] = col;
      col += S * R;
      if (!(skip_middle && i == 1)) group.push_back(i);
    }
    bias_col = col;
    cols = (col + 2 + 7) / 8 * 8;
    x = random_vec(static_cast<size_t>(m * ldx), 31);
    bias = random_vec(static_cast<size_t>(n), 32);
    const std::vector<float> wf = random_vec(static_cast<size_t>(n * k), 33);
    wext.assign(static_cast<size_t>(n * cols), 0);
    w16.resize(static_cast<size_t>(n * k));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) wext[r * cols + c] = w16[r * k + c] = f32_to_bf16(wf[r * k + c]);
      wext[r * cols + bias_col] = f32_to_bf16(bias[r]);
      wext[r * cols + bias_col + 1] = f32_to_bf16(bias[r] - bf16_to_f32(wext[r * cols + bias_col]));
    }
    for (int i = 0; i < num; ++i)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t o = 0; o < outs[i]; ++o)
          for (int64_t r = 0; r < R; ++r)
            wext[(row0[i] + o) * cols + tail[i] + s * R + r] = stacks[i]->b.bf16[(s * outs[i] + o) * R + r];
    slots = slot_pattern(m, {0, -1, 1, 2, 4, 5, 6, 7}, 5);
    base.resize(static_cast<size_t>(m * n));
    ref::linear({.x = x.data(),
                 .m = m,
                 .ldx = ldx,
                 .w = WeightView{.data = w16.data(), .dtype = DType::kBF16, .rows = n, .cols = k},
                 .bias = bias.data(),
                 .y = base.data(),
                 .ldy = n});
    before = base;
    LoraBatchArgs a{.x = x.data(), .ldx = ldx, .m = m, .token_slots = slots.data(), .num = 0};
    std::vector<const DenseStack*> sp;
    for (int i : group) {
      a.w[a.num] = stacks[i]->stack();
      a.y[a.num] = before.data() + row0[i];
      a.ldy[a.num++] = n;
      sp.push_back(stacks[i].get());
    }
    old_lora_batch(a, sp);
  }
  // The op's arguments in host memory, writing y [m, n].
  LinearLoraExtArgs args(float* y) const {
    LinearLoraExtArgs h{.x = x.data(), .m = m, .ldx = ldx, .k = k, .y = y, .ldy = n};
    h.w = WeightView{.data = wext.data(), .dtype = DType::kBF16, .rows = n, .cols = cols};
    h.bias_col = bias_col;
    h.shrink = {.x = x.data(), .ldx = ldx, .m = m, .token_slots = slots.data(), .num = 0};
    for (int i : group) {
      h.shrink.w[h.shrink.num] = stacks[i]->stack();
      h.tail[h.shrink.num++] = tail[i];
    }
    return h;
  }
  // Per token: the largest |got − before| and |before − base| over the token's outputs, over the rms of
  // its `before` row.
  struct RowError {
    double err = 0, effect = 0;
  };
  std::vector<RowError> row_errors(const std::vector<float>& got) const {
    std::vector<RowError> out(static_cast<size_t>(m));
    for (int64_t t = 0; t < m; ++t) {
      double sq = 0, err = 0, effect = 0;
      for (int64_t o = 0; o < n; ++o) {
        const double e = before[t * n + o];
        sq += e * e;
        err = std::max(err, std::fabs(e - got[t * n + o]));
        effect = std::max(effect, std::fabs(e - base[t * n + o]));
      }
      const double rms = std::sqrt(sq / static_cast<double>(n));
      out[static_cast<size_t>(t)] = {err / rms, effect / rms};
    }
    return out;
  }
};

}  // namespace polylora::kernels::test
