// kernels/sampling/sampling_ref.cc: the sampling op's algorithm (sampling.h) on host memory, one row at a
// time and one whole row per "block": the same phases, selection rounds, integer histograms and keys
// as the CUDA kernels, so both produce identical results. The CPU backend runs it; its tests compare it
// with worker::Sampler, which is the semantic reference.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_math.h"

namespace polylora::kernels::ref {
namespace {

using namespace sampling;

int32_t selector_bin(const SampleSelector& s, uint64_t comp, int32_t id_bits) {
  if ((comp >> s.shift) != s.prefix) return -1;
  const int32_t lo = next_low_bit(s.shift, id_bits);
  return static_cast<int32_t>((comp >> lo) & ((uint64_t{1} << (s.shift - lo)) - 1));
}

// Sequential crossing search from the top bin; mass may be null (count selectors).
SelectorCrossing find_crossing(const std::vector<uint32_t>& count, const std::vector<uint64_t>* mass,
                               uint64_t need) {
  SelectorCrossing c{};
  if (need == 0) return c;
  uint64_t acc = 0;
  uint32_t acc_count = 0;
  for (int32_t b = static_cast<int32_t>(count.size()) - 1; b >= 0; --b) {
    const uint64_t x = mass ? (*mass)[b] : count[b];
    if (acc + x >= need) {
      c.found = true;
      c.bin = b;
      c.above = acc;
      c.above_count = acc_count;
      c.bin_count = count[b];
      c.bin_mass = mass ? (*mass)[b] : 0;
      return c;
    }
    acc += x;
    acc_count += count[b];
  }
  return c;
}

void put_float(int32_t* out, int64_t at, float v) {
  std::memcpy(out + at, &v, sizeof v);
}

}  // namespace

void sample(const SampleArgs& a) {
  const int64_t vocab = a.shape.vocab;
  const int32_t id_bits = sample_id_bits(vocab);
  const int32_t mass_shift = sample_mass_shift(vocab);
  const SampleScratchLayout layout = sample_scratch_layout(a.shape);
  auto* proc_base = reinterpret_cast<float*>(static_cast<char*>(a.scratch) + layout.proc);
  const SampleOutLayout ol = sample_out_layout(a.rows, a.shape.max_top);
  std::vector<float> greedy_row;
  std::vector<uint32_t> count;
  std::vector<uint64_t> mass;

  for (int64_t r = 0; r < a.rows; ++r) {
    const SampleRowParams& p = a.params[r];
    SampleRowState& st = a.state[r];
    const float* raw = a.logits + r * a.ld;
    const auto mode = static_cast<SampleMode>(p.mode);

    // (1) prepare
    for (int64_t i = 0; i < vocab; ++i)
      if (raw[i] == raw[i]) st.raw_max_key = std::max(st.raw_max_key, order_key(raw[i]));
    float* proc = nullptr;
    if (mode != SampleMode::kForced) {
      if (mode == SampleMode::kRandom) {
        proc = proc_base + r * vocab;
      } else {
        greedy_row.resize(static_cast<size_t>(vocab));
        proc = greedy_row.data();
      }
      std::copy(raw, raw + vocab, proc);
      for (int32_t e = p.edit_begin; e < p.edit_end; ++e) {
        const SampleEdit& ed = a.edits[e];
        proc[ed.token] = apply_edit(proc[ed.token], ed, a.biases, p);
      }
      if (p.mask_row >= 0) {
        const uint32_t* bits = a.masks + static_cast<int64_t>(p.mask_row) * a.mask_words;
        for (int64_t i = 0; i < vocab; ++i)
          if (!(bits[i >> 5] >> (i & 31) & 1u)) proc[i] = kNegInf;
      }
      if (mode == SampleMode::kRandom && p.temperature != 1.0f)
        for (int64_t i = 0; i < vocab; ++i) proc[i] = fdiv(proc[i], p.temperature);
      for (int64_t i = 0; i < vocab; ++i)
        if (proc[i] == proc[i]) st.proc_best = std::max(st.proc_best, best_key(order_key(proc[i]), i));
    }
    const float m = best_value(st.proc_best);
    const bool m_valid = mode == SampleMode::kRandom && m > kNegInf;

    // (2) selection rounds, until every selector is done
    for (;;) {
      const bool raw_run = st.sel[kSelectRaw].status == kSelectorRunning;
      int which = -1;
      if (m_valid && st.sel[kSelectTopK].status == kSelectorRunning)
        which = kSelectTopK;
      else if (m_valid && st.sel[kSelectTopP].status == kSelectorRunning)
        which = kSelectTopP;
      if (!raw_run && which < 0) break;
      if (raw_run) {
        SampleSelector& s = st.sel[kSelectRaw];
        count.assign(size_t{1} << (s.shift - next_low_bit(s.shift, id_bits)), 0);
        for (int64_t i = 0; i < vocab; ++i) {
          if (raw[i] != raw[i]) continue;
          const int32_t b = selector_bin(s, composite_key(order_key(raw[i]), i, id_bits), id_bits);
          if (b >= 0) ++count[b];
        }
        selector_decide(st, kSelectRaw, id_bits, find_crossing(count, nullptr, s.need));
      }
      if (which >= 0) {
        SampleSelector& s = st.sel[which];
        const bool use_mass = s.mass_mode != 0;
        const size_t bins = size_t{1} << (s.shift - next_low_bit(s.shift, id_bits));
        count.assign(bins, 0);
        mass.assign(bins, 0);
        uint64_t total = 0;
        for (int64_t i = 0; i < vocab; ++i) {
          const float v = proc[i];
          if (!(v > kNegInf)) continue;
          const uint32_t key = order_key(v);
          if (which == kSelectTopP && !in_top_p_domain(v, key, st.k_key, m, p.log_min_p)) continue;
          const int32_t b = selector_bin(s, composite_key(key, i, id_bits), id_bits);
          if (b < 0) continue;
          ++count[b];
          if (use_mass) {
            const uint64_t w = weight_of(v, m, mass_shift);
            mass[b] += w;
            total += w;
          }
        }
        if (use_mass && s.need == 0) s.need = top_p_need(total, p.top_p);
        selector_decide(st, which, id_bits, find_crossing(count, use_mass ? &mass : nullptr, s.need));
      }
    }

    // (3) draw
    int32_t token = 0;
    switch (mode) {
      case SampleMode::kForced:
        token = p.forced_token;
        break;
      case SampleMode::kGreedy:
        token = best_id(st.proc_best);
        break;
      case SampleMode::kRandom: {
        if (!m_valid) {
          token = p.filtered ? best_id(st.proc_best) : 0;
          break;
        }
        const bool top_p = st.sel[kSelectTopP].status == kSelectorDone;
        const uint64_t top_p_min = selector_threshold(st.sel[kSelectTopP]);
        auto weight = [&](int64_t i) -> uint64_t {
          const float v = proc[i];
          if (!(v > kNegInf)) return 0;
          const uint32_t key = order_key(v);
          if (!in_top_p_domain(v, key, st.k_key, m, p.log_min_p)) return 0;
          if (top_p && composite_key(key, i, id_bits) < top_p_min) return 0;
          return weight_of(v, m, mass_shift);
        };
        uint64_t total = 0;
        for (int64_t i = 0; i < vocab; ++i) total += weight(i);
        st.draw_total = total;
        const uint64_t target = draw_target(uniform_bits(p.seed, p.step), total);
        uint64_t cum = 0;
        for (int64_t i = 0; i < vocab; ++i) {
          cum += weight(i);
          if (cum > target) {
            token = static_cast<int32_t>(i);
            break;
          }
        }
        break;
      }
    }
    st.token = token;
    a.out[ol.ids + r] = token;

    // (4) log-probs
    if (!p.want_logprobs) continue;
    const float raw_tok = raw[token];
    const float m_raw = st.raw_max_key ? key_float(st.raw_max_key) : kNegInf;
    uint32_t rank = 0;
    uint64_t sum = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      rank += raw[i] >= raw_tok;
      if (raw[i] == raw[i] && std::isfinite(m_raw)) sum += weight_of(raw[i], m_raw, mass_shift);
    }
    st.rank = rank;
    st.lse_sum = sum;
    const double lse =
        std::isfinite(m_raw) ? m_raw + std::log(std::ldexp(static_cast<double>(sum), -mass_shift)) : m_raw;
    put_float(a.out, ol.logprob + r, static_cast<float>(raw_tok - lse));
    a.out[ol.rank + r] = static_cast<int32_t>(rank);
    std::vector<uint64_t> cand;
    if (st.sel[kSelectRaw].status == kSelectorDone) {
      const uint64_t t = selector_threshold(st.sel[kSelectRaw]);
      for (int64_t i = 0; i < vocab; ++i) {
        if (raw[i] != raw[i]) continue;
        const uint64_t c = composite_key(order_key(raw[i]), i, id_bits);
        if (c >= t) cand.push_back(c);
      }
    }
    std::sort(cand.begin(), cand.end(), [](uint64_t x, uint64_t y) { return x > y; });
    const auto n = static_cast<int64_t>(std::min<size_t>(cand.size(), static_cast<size_t>(p.num_top)));
    st.num_cand = static_cast<uint32_t>(cand.size());
    a.out[ol.num_top + r] = static_cast<int32_t>(n);
    for (int64_t j = 0; j < n; ++j) {
      const int32_t id = composite_id(cand[j], id_bits);
      a.out[ol.top_ids + r * a.shape.max_top + j] = id;
      put_float(a.out, ol.top_logprobs + r * a.shape.max_top + j, static_cast<float>(raw[id] - lse));
    }
  }
}

}  // namespace polylora::kernels::ref
