// kernels/sampling/sampling_math.h: the arithmetic the sampling kernels and their host reference share,
// written once for both compilers (host and device): float bit keys, the CPU sampler's exp and counter
// RNG ported bit for bit, fixed-point weights, composite keys, the logit edits, and the radix-search
// step of a selector. Device float operations use the _rn intrinsics so that nvcc never contracts them
// into FMAs (the CPU sampler's arithmetic has none). Must not: depend on anything above common/.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/sampling/sampling.h"

#if defined(__CUDACC__)
#define POLYLORA_HD __host__ __device__ __forceinline__
#else
#define POLYLORA_HD inline
#endif

namespace polylora::kernels::sampling {

POLYLORA_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
POLYLORA_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
POLYLORA_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
POLYLORA_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
POLYLORA_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
POLYLORA_HD float fdiv(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
POLYLORA_HD uint64_t mulhi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

inline constexpr float kNegInf = -__builtin_huge_valf();
// Bits of -87.0f (exp_nonpositive's underflow bound).
inline constexpr int32_t kExpMinBits = static_cast<int32_t>(0xC2AE0000u);

// worker/sampler.cc's exp_nonpositive, operation for operation: exp(x) for x <= 0 (Cephes' polynomial
// times 2^n), 0 below -87 and for -inf.
POLYLORA_HD float exp_nonpositive(float x) {
  const int32_t bits = static_cast<int32_t>(float_bits(x));
  const int32_t underflow = -static_cast<int32_t>((bits > kExpMinBits) & (bits < 0));
  const float xc = bits_float(static_cast<uint32_t>((bits & ~underflow) | (kExpMinBits & underflow)));
  const float n = fsub(fadd(fmul(xc, 1.44269504088896341f), 12582912.0f), 12582912.0f);
  const float r = fsub(fsub(xc, fmul(n, 0.693359375f)), fmul(n, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = fadd(fmul(p, r), 1.3981999507e-3f);
  p = fadd(fmul(p, r), 8.3334519073e-3f);
  p = fadd(fmul(p, r), 4.1665795894e-2f);
  p = fadd(fmul(p, r), 1.6666665459e-1f);
  p = fadd(fmul(p, r), 5.0000001201e-1f);
  const float y = fadd(fadd(fmul(fmul(p, r), r), r), 1.0f);
  const float scale = bits_float(static_cast<uint32_t>((static_cast<int32_t>(n) + 127) << 23));
  return bits_float(float_bits(fmul(y, scale)) & ~static_cast<uint32_t>(underflow));
}

// Order-preserving key of a non-NaN float (a > b  <=>  key(a) > key(b)); -0 and +0 share one key, and
// every key is > 0 (0 means "none").
POLYLORA_HD uint32_t order_key(float f) {
  uint32_t u = float_bits(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
POLYLORA_HD float key_float(uint32_t k) {
  return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// Fixed-point weight of w in [0, 1]: round(w * 2^shift).
POLYLORA_HD uint64_t weight_fix(float w, int32_t shift) {
  const double scale = static_cast<double>(uint64_t{1} << shift);
  return static_cast<uint64_t>(static_cast<double>(w) * scale + 0.5);
}
// Weight of processed logit p under maximum m (as the CPU sampler's draw and top_p compute it).
POLYLORA_HD uint64_t weight_of(float p, float m, int32_t shift) {
  return weight_fix(exp_nonpositive(fsub(p, m)), shift);
}

// The composite key: value key above, (id_mask - id) below.
POLYLORA_HD uint64_t composite_key(uint32_t key, int64_t id, int32_t id_bits) {
  const uint64_t id_mask = (uint64_t{1} << id_bits) - 1;
  return (static_cast<uint64_t>(key) << id_bits) | (id_mask - static_cast<uint64_t>(id));
}
POLYLORA_HD int32_t composite_id(uint64_t c, int32_t id_bits) {
  const uint64_t id_mask = (uint64_t{1} << id_bits) - 1;
  return static_cast<int32_t>(id_mask - (c & id_mask));
}
// (order key << 32) | (0xffffffff - id): the maximum is the largest value, lowest id first.
POLYLORA_HD uint64_t best_key(uint32_t key, int64_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(id));
}
POLYLORA_HD int32_t best_id(uint64_t best) {
  return best == 0 ? 0 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(best));
}
POLYLORA_HD float best_value(uint64_t best) {
  return best == 0 ? kNegInf : key_float(static_cast<uint32_t>(best >> 32));
}

// worker/sampler.cc's generator: splitmix64(splitmix64(seed) + step); the uniform is (h >> 11) * 2^-53.
POLYLORA_HD uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
POLYLORA_HD uint64_t uniform_bits(uint64_t seed, int64_t step) {
  return splitmix64(splitmix64(seed) + static_cast<uint64_t>(step));
}
POLYLORA_HD double uniform_of_bits(uint64_t h) {
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}
// floor(u * total) exactly, for the uniform u of bits h: the draw's target (< total when total > 0).
POLYLORA_HD uint64_t draw_target(uint64_t h, uint64_t total) {
  return mulhi64(h & ~uint64_t{0x7FF}, total);
}

// The processors on one edited logit, in the CPU sampler's order.
POLYLORA_HD float apply_edit(float v, const SampleEdit& e, const float* biases, const SampleRowParams& p) {
  if (e.flags & kEditMask) v = kNegInf;
  for (int32_t b = e.bias_begin; b < e.bias_end; ++b) v = fadd(v, biases[b]);
  if ((e.flags & kEditRepeat) && (p.penalty_flags & kPenaltyRepetition))
    v = v > 0 ? fdiv(v, p.repetition_penalty) : fmul(v, p.repetition_penalty);
  if (e.count > 0) {
    if (p.penalty_flags & kPenaltyFrequency)
      v = fsub(v, fmul(p.frequency_penalty, static_cast<float>(e.count)));
    if (p.penalty_flags & kPenaltyPresence) v = fsub(v, p.presence_penalty);
  }
  return v;
}

// A processed value's place in the top_p domain: valid (> -inf, not NaN), at least the top_k key,
// passing min_p ((double)p - m >= log(min_p)).
POLYLORA_HD bool in_top_p_domain(float p, uint32_t key, uint32_t k_key, float m, double log_min_p) {
  return p > kNegInf && key >= k_key && static_cast<double>(p) - static_cast<double>(m) >= log_min_p;
}

// The smallest order key whose value v passes min_p against maximum m ((double)v - m >= log_min_p),
// over the non-NaN keys (the predicate is monotone in v); above every key when none passes.
POLYLORA_HD uint32_t min_p_key(float m, double log_min_p) {
  uint32_t lo = order_key(kNegInf), hi = order_key(-kNegInf) + 1;  // answer in [lo, hi]
  while (lo < hi) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (static_cast<double>(key_float(mid)) - static_cast<double>(m) >= log_min_p)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// The low bit of the digit a selector at `shift` examines next: rounds of 11, 11 and 10 value bits,
// then the id in at most two rounds of 11 bits.
POLYLORA_HD int32_t next_low_bit(int32_t shift, int32_t id_bits) {
  const int32_t id_hi = id_bits > 11 ? id_bits - 11 : 0;
  if (shift > id_bits + 21) return id_bits + 21;
  if (shift > id_bits + 10) return id_bits + 10;
  if (shift > id_bits) return id_bits;
  if (shift > id_hi) return id_hi;
  return 0;
}

POLYLORA_HD uint64_t selector_threshold(const SampleSelector& s) {
  return s.prefix << s.shift;
}

// top_p's mass target for a domain of total fixed-point mass W: ceil(top_p * W) within [1, W] (0 when
// the domain is empty).
POLYLORA_HD uint64_t top_p_need(uint64_t total, double top_p) {
  if (total == 0) return 0;
  const double t = top_p * static_cast<double>(total);
  if (!(t >= 1.0)) return 1;
  const double c = static_cast<double>(static_cast<uint64_t>(t));
  uint64_t need = static_cast<uint64_t>(t) + (c < t ? 1 : 0);
  return need > total ? total : need;
}

// Where one round's histogram crosses the selector's need, counting from the top bin.
// (A plain aggregate, so that kernels can keep one in shared memory; value-initialise it.)
struct SelectorCrossing {
  bool found;            // the bucket holds at least `need`
  int32_t bin;           // the crossing bin
  uint64_t above;        // count or mass in the bins above it
  uint32_t above_count;  // elements in the bins above it
  uint32_t bin_count;
  uint64_t bin_mass;
};

// Updates selector `which` of `st` after a round whose crossing is `c` (its need already set, for
// top_p's first round, with top_p_need()). When top_k finishes it records the key and starts top_p.
POLYLORA_HD void selector_decide(SampleRowState& st, int which, int32_t id_bits, const SelectorCrossing& c) {
  SampleSelector& s = st.sel[which];
  if (s.target == 0) s.target = s.need;
  if (!c.found) {
    // Fewer than needed in the bucket (only in a first round): the whole bucket is selected.
    s.status = kSelectorDone;
    if (which == kSelectTopK) st.k_key = 0;
  } else {
    const int32_t lo = next_low_bit(s.shift, id_bits);
    s.need -= c.above;
    s.count_above += c.above_count;
    s.prefix = (s.prefix << (s.shift - lo)) | static_cast<uint64_t>(c.bin);
    s.shift = lo;
    if (s.shift == id_bits) {  // the value is decided; the bucket is its tie
      if (which == kSelectTopK) {
        s.status = kSelectorDone;
        st.k_key = static_cast<uint32_t>(s.prefix);
      } else if (s.mass_mode) {
        const uint64_t w = c.bin_mass / c.bin_count;  // every tied element has the same weight
        const uint64_t r = (s.need + w - 1) / w;
        if (r >= c.bin_count) {
          s.status = kSelectorDone;
        } else {
          s.mass_mode = 0;
          s.need = r;
        }
      } else if (s.need == c.bin_count) {
        s.status = kSelectorDone;
      }
    }
    if (s.shift == 0) s.status = kSelectorDone;
  }
  if (which == kSelectTopK && s.status == kSelectorDone && st.sel[kSelectTopP].status == kSelectorPending)
    st.sel[kSelectTopP].status = kSelectorRunning;
}

}  // namespace polylora::kernels::sampling
