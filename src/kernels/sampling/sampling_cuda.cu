// kernels/sampling/sampling_cuda.cu: the sampling op (sampling.h) on CUDA. Every kernel runs a grid of
// (chunks, rows): several blocks per row, each over a contiguous chunk of the vocabulary, so a batch of
// one row still spreads over the chip. Per-row results of a kernel are combined with atomics (integer
// sums, maxima of order keys) and, where a decision needs all of them, by the last block of the row to
// finish (a per-row counter; threadfence before the count, so that block sees every other block's
// atomics), which also re-zeroes what it consumed. Kernels, in stream order:
//   prepare  (tiles of 2048): raw max; edits + temperature into the processed copy; its max / argmax.
//   round x num_rounds: shared-memory histograms (2048 bins) of the running selectors, flushed to the
//            row's global histogram (non-zero bins only); the last block finds the crossing bin with a
//            block scan and advances the selectors (sampling_math.h's selector_decide).
//   draw     fixed-point weight of the kept ids per chunk; the last block finds the chunk and then the
//            id where the cumulative weight passes floor(u * total).
//   finish   rank and log-sum-exp sums, top-N candidates gathered; the last block sorts them (by rank
//            counting) and writes the packed results.
// Chunk sizes depend on the batch (about 1024 blocks a kernel) but results do not: every sum is exact.
#include <algorithm>

#include "kernels/cuda_util.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_math.h"

namespace polylora::kernels::cuda {
namespace {

using namespace sampling;
using ull = unsigned long long;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPrepTile = 2048;
constexpr int64_t kMaxChunk = 32768;
constexpr int64_t kTargetBlocks = 1024;

struct Launch {
  SampleArgs a;
  int64_t vocab = 0;
  int32_t id_bits = 0;
  int32_t mass_shift = 0;
  int64_t chunk = 0;  // elements per block in round / draw / finish
  float* proc = nullptr;
  uint32_t* hist_raw = nullptr;
  uint32_t* hist_proc = nullptr;
  ull* hist_mass = nullptr;
  uint32_t* counters = nullptr;
  ull* chunk_sums = nullptr;
  int64_t max_chunks = 0;
  ull* cand = nullptr;
  SampleOutLayout out;
};

// --- block helpers (every thread of the block calls them) --------------------------------------------

__device__ __forceinline__ ull warp_max_u64(ull v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ ull warp_sum_u64(ull v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ ull block_max_u64(ull v) {
  __shared__ ull part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max_u64(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  ull r = lane < kWarps ? part[lane] : 0;
  return warp_max_u64(r);
}

__device__ ull block_sum_u64(ull v) {
  __shared__ ull part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum_u64(v);
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  ull r = lane < kWarps ? part[lane] : 0;
  return warp_sum_u64(r);
}

// Exclusive prefix sum over threadIdx.x; *total gets the block's sum.
__device__ ull block_exclusive_scan_u64(ull v, ull* total) {
  __shared__ ull part[kWarps];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ull x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const ull y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) part[warp] = x;
  __syncthreads();
  if (warp == 0) {
    ull w = lane < kWarps ? part[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const ull y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < kWarps) part[lane] = w;
  }
  __syncthreads();
  const ull before = warp > 0 ? part[warp - 1] : 0;
  *total = part[kWarps - 1];
  return before + x - v;
}

// True in the last block of its row to get here (gridDim.x blocks per row), which then sees every other
// block's writes. Resets the row's counter for the next kernel.
__device__ bool last_block_of_row(uint32_t* counter) {
  __shared__ bool is_last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t prev = atomicAdd(counter, 1u);
    is_last = prev == gridDim.x - 1;
    if (is_last) atomicExch(counter, 0u);
  }
  __syncthreads();
  const bool last = is_last;
  if (last) __threadfence();
  return last;
}

// The crossing of a global histogram (count, and mass when non-null) for `need`, from the top bin.
// When init_top_p and need == 0, need becomes top_p_need(total mass). *need_used gets the need.
__device__ SelectorCrossing block_crossing(const uint32_t* count, const ull* mass, int nbins, ull need,
                                           bool init_top_p, double top_p, ull* need_used) {
  __shared__ SelectorCrossing result;
  const int per = (nbins + kThreads - 1) / kThreads;
  const int hi = nbins - 1 - static_cast<int>(threadIdx.x) * per;
  const int lo = max(hi - per + 1, 0);
  ull sum = 0;
  for (int b = hi; b >= lo; --b) sum += mass ? __ldcg(mass + b) : __ldcg(count + b);
  ull total = 0;
  const ull excl = block_exclusive_scan_u64(sum, &total);
  if (init_top_p && need == 0) need = top_p_need(total, top_p);
  if (threadIdx.x == 0) result = SelectorCrossing{};
  __syncthreads();
  if (need >= 1 && excl < need && need <= excl + sum) {
    ull acc = excl;
    for (int b = hi; b >= lo; --b) {
      const ull x = mass ? __ldcg(mass + b) : __ldcg(count + b);
      if (acc + x >= need) {
        SelectorCrossing c{};
        c.found = true;
        c.bin = b;
        c.above = acc;
        c.bin_count = __ldcg(count + b);
        c.bin_mass = mass ? __ldcg(mass + b) : 0;
        result = c;
        break;
      }
      acc += x;
    }
  }
  __syncthreads();
  const SelectorCrossing r = result;
  *need_used = need;
  __syncthreads();
  return r;
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ __forceinline__ int32_t digit_mask(int32_t shift, int32_t lo) {
  return (1 << (shift - lo)) - 1;
}

// --- kernels ---------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) prepare_kernel(const Launch c) {
  const int64_t row = blockIdx.y;
  const SampleRowParams& p = c.a.params[row];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPrepTile;
  const int len = static_cast<int>(min64(kPrepTile, c.vocab - base));
  const float* raw = c.a.logits + row * c.a.ld + base;
  __shared__ float tile[kPrepTile];
  __shared__ int32_t edit_range[2];
  ull raw_best = 0, proc_best = 0;
  if (p.mode == static_cast<int32_t>(SampleMode::kForced)) {
    for (int i = threadIdx.x; i < len; i += kThreads) {
      const float x = raw[i];
      if (x == x) raw_best = max(raw_best, static_cast<ull>(order_key(x)));
    }
  } else {
    for (int i = threadIdx.x; i < len; i += kThreads) {
      const float x = raw[i];
      tile[i] = x;
      if (x == x) raw_best = max(raw_best, static_cast<ull>(order_key(x)));
    }
    if (threadIdx.x == 0) {
      // This tile's edits: the row's edits are ascending by token.
      int32_t lo = p.edit_begin, hi = p.edit_end;
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (c.a.edits[mid].token < base) lo = mid + 1;
        else hi = mid;
      }
      int32_t lo2 = lo, hi2 = p.edit_end;
      while (lo2 < hi2) {
        const int32_t mid = lo2 + (hi2 - lo2) / 2;
        if (c.a.edits[mid].token < base + len) lo2 = mid + 1;
        else hi2 = mid;
      }
      edit_range[0] = lo;
      edit_range[1] = lo2;
    }
    __syncthreads();
    for (int32_t e = edit_range[0] + static_cast<int32_t>(threadIdx.x); e < edit_range[1]; e += kThreads) {
      const SampleEdit ed = c.a.edits[e];
      const int j = static_cast<int>(ed.token - base);
      tile[j] = apply_edit(tile[j], ed, c.a.biases, p);
    }
    __syncthreads();
    const bool random = p.mode == static_cast<int32_t>(SampleMode::kRandom);
    const bool divide = random && p.temperature != 1.0f;
    float* proc = c.proc + row * c.vocab + base;
    for (int i = threadIdx.x; i < len; i += kThreads) {
      float v = tile[i];
      if (divide) v = fdiv(v, p.temperature);
      if (random) proc[i] = v;
      if (v == v) proc_best = max(proc_best, static_cast<ull>(best_key(order_key(v), base + i)));
    }
  }
  raw_best = block_max_u64(raw_best);
  proc_best = block_max_u64(proc_best);
  if (threadIdx.x == 0) {
    SampleRowState* st = c.a.state + row;
    if (raw_best) atomicMax(&st->raw_max_key, static_cast<uint32_t>(raw_best));
    if (proc_best) atomicMax(reinterpret_cast<ull*>(&st->proc_best), proc_best);
  }
}

__global__ void __launch_bounds__(kThreads) round_kernel(const Launch c) {
  const int64_t row = blockIdx.y;
  const SampleRowParams& p = c.a.params[row];
  SampleRowState* stp = c.a.state + row;
  const SampleSelector sraw = stp->sel[kSelectRaw];
  const bool raw_run = sraw.status == kSelectorRunning;
  const float m = best_value(stp->proc_best);
  const bool m_valid = p.mode == static_cast<int32_t>(SampleMode::kRandom) && m > kNegInf;
  int which = -1;
  if (m_valid && stp->sel[kSelectTopK].status == kSelectorRunning) which = kSelectTopK;
  else if (m_valid && stp->sel[kSelectTopP].status == kSelectorRunning) which = kSelectTopP;
  if (!raw_run && which < 0) return;  // the same for every block of the row
  const SampleSelector sproc = which >= 0 ? stp->sel[which] : SampleSelector{};
  const bool use_mass = which >= 0 && sproc.mass_mode != 0;
  const uint32_t k_key = stp->k_key;
  const int32_t id_bits = c.id_bits;

  __shared__ uint32_t s_raw[kSampleBins];
  __shared__ uint32_t s_cnt[kSampleBins];
  __shared__ ull s_mass[kSampleBins];
  const int32_t raw_lo = raw_run ? next_low_bit(sraw.shift, id_bits) : 0;
  const int32_t proc_lo = which >= 0 ? next_low_bit(sproc.shift, id_bits) : 0;
  const int raw_bins = raw_run ? 1 << (sraw.shift - raw_lo) : 0;
  const int proc_bins = which >= 0 ? 1 << (sproc.shift - proc_lo) : 0;
  for (int b = threadIdx.x; b < raw_bins; b += kThreads) s_raw[b] = 0;
  for (int b = threadIdx.x; b < proc_bins; b += kThreads) s_cnt[b] = 0;
  if (use_mass)
    for (int b = threadIdx.x; b < proc_bins; b += kThreads) s_mass[b] = 0;
  __syncthreads();

  const int64_t begin = static_cast<int64_t>(blockIdx.x) * c.chunk;
  const int64_t end = min64(begin + c.chunk, c.vocab);
  const float* raw = c.a.logits + row * c.a.ld;
  const float* proc = c.proc + row * c.vocab;
  const int32_t raw_mask = raw_run ? digit_mask(sraw.shift, raw_lo) : 0;
  const int32_t proc_mask = which >= 0 ? digit_mask(sproc.shift, proc_lo) : 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    if (raw_run) {
      const float x = raw[i];
      if (x == x) {
        const uint64_t comp = composite_key(order_key(x), i, id_bits);
        if ((comp >> sraw.shift) == sraw.prefix) atomicAdd(&s_raw[(comp >> raw_lo) & raw_mask], 1u);
      }
    }
    if (which >= 0) {
      const float v = proc[i];
      if (v > kNegInf) {
        const uint32_t key = order_key(v);
        if (which != kSelectTopP || in_top_p_domain(v, key, k_key, m, p.log_min_p)) {
          const uint64_t comp = composite_key(key, i, id_bits);
          if ((comp >> sproc.shift) == sproc.prefix) {
            const int b = static_cast<int>((comp >> proc_lo) & proc_mask);
            atomicAdd(&s_cnt[b], 1u);
            if (use_mass) atomicAdd(&s_mass[b], static_cast<ull>(weight_of(v, m, c.mass_shift)));
          }
        }
      }
    }
  }
  __syncthreads();
  uint32_t* g_raw = c.hist_raw + row * kSampleBins;
  uint32_t* g_cnt = c.hist_proc + row * kSampleBins;
  ull* g_mass = c.hist_mass + row * kSampleBins;
  for (int b = threadIdx.x; b < raw_bins; b += kThreads)
    if (s_raw[b]) atomicAdd(g_raw + b, s_raw[b]);
  for (int b = threadIdx.x; b < proc_bins; b += kThreads) {
    if (s_cnt[b]) atomicAdd(g_cnt + b, s_cnt[b]);
    if (use_mass && s_mass[b]) atomicAdd(g_mass + b, s_mass[b]);
  }
  if (!last_block_of_row(c.counters + row)) return;

  SelectorCrossing raw_cross{}, proc_cross{};
  ull raw_need = sraw.need, proc_need = sproc.need;
  if (raw_run) raw_cross = block_crossing(g_raw, nullptr, raw_bins, raw_need, false, 0.0, &raw_need);
  if (which >= 0)
    proc_cross = block_crossing(g_cnt, use_mass ? g_mass : nullptr, proc_bins, proc_need,
                                which == kSelectTopP, p.top_p, &proc_need);
  if (threadIdx.x == 0) {
    SampleRowState st = *stp;
    if (raw_run) selector_decide(st, kSelectRaw, id_bits, raw_cross);
    if (which >= 0) {
      st.sel[which].need = proc_need;
      selector_decide(st, which, id_bits, proc_cross);
    }
    *stp = st;
  }
  for (int b = threadIdx.x; b < raw_bins; b += kThreads) g_raw[b] = 0;
  for (int b = threadIdx.x; b < proc_bins; b += kThreads) {
    g_cnt[b] = 0;
    if (use_mass) g_mass[b] = 0;
  }
}

__global__ void __launch_bounds__(kThreads) draw_kernel(const Launch c) {
  const int64_t row = blockIdx.y;
  const SampleRowParams& p = c.a.params[row];
  if (p.mode != static_cast<int32_t>(SampleMode::kRandom)) return;
  SampleRowState* stp = c.a.state + row;
  const uint64_t proc_best = stp->proc_best;
  const float m = best_value(proc_best);
  if (!(m > kNegInf)) {  // nothing valid: the CPU sampler's fallbacks
    if (blockIdx.x == 0 && threadIdx.x == 0) stp->token = p.filtered ? best_id(proc_best) : 0;
    return;
  }
  const bool top_p = stp->sel[kSelectTopP].status == kSelectorDone;
  const uint64_t top_p_min = selector_threshold(stp->sel[kSelectTopP]);
  const uint32_t k_key = stp->k_key;
  const float* proc = c.proc + row * c.vocab;
  auto weight = [&](int64_t i) -> ull {
    const float v = proc[i];
    if (!(v > kNegInf)) return 0;
    const uint32_t key = order_key(v);
    if (!in_top_p_domain(v, key, k_key, m, p.log_min_p)) return 0;
    if (top_p && composite_key(key, i, c.id_bits) < top_p_min) return 0;
    return weight_of(v, m, c.mass_shift);
  };
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * c.chunk;
  const int64_t end = min64(begin + c.chunk, c.vocab);
  ull local = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) local += weight(i);
  const ull chunk_sum = block_sum_u64(local);
  ull* sums = c.chunk_sums + row * c.max_chunks;
  if (threadIdx.x == 0) sums[blockIdx.x] = chunk_sum;
  if (!last_block_of_row(c.counters + row)) return;

  // The chunk holding the target: chunks ascending, a contiguous run of them per thread.
  __shared__ int64_t s_chunk;
  __shared__ ull s_before;
  __shared__ int32_t s_token;
  const int nch = static_cast<int>(gridDim.x);
  const int per = (nch + kThreads - 1) / kThreads;
  const int c0 = min(static_cast<int>(threadIdx.x) * per, nch), c1 = min(c0 + per, nch);
  ull mine = 0;
  for (int k = c0; k < c1; ++k) mine += __ldcg(sums + k);
  ull total = 0;
  const ull excl = block_exclusive_scan_u64(mine, &total);
  const ull target = draw_target(uniform_bits(p.seed, p.step), total);  // < total (total > 0)
  if (threadIdx.x == 0) {
    s_chunk = nch - 1;
    s_before = 0;
    s_token = -1;
  }
  __syncthreads();
  if (excl <= target && target < excl + mine) {
    ull acc = excl;
    for (int k = c0; k < c1; ++k) {
      const ull x = __ldcg(sums + k);
      if (target < acc + x) {
        s_chunk = k;
        s_before = acc;
        break;
      }
      acc += x;
    }
  }
  __syncthreads();
  // Inside that chunk: a contiguous segment of ids per thread.
  const int64_t cb = s_chunk * c.chunk, ce = min64(cb + c.chunk, c.vocab);
  const int64_t seg = (ce - cb + kThreads - 1) / kThreads;
  const int64_t s0 = min64(cb + static_cast<int64_t>(threadIdx.x) * seg, ce), s1 = min64(s0 + seg, ce);
  ull seg_sum = 0;
  for (int64_t i = s0; i < s1; ++i) seg_sum += weight(i);
  ull chunk_total = 0;
  const ull seg_before = s_before + block_exclusive_scan_u64(seg_sum, &chunk_total);
  if (seg_before <= target && target < seg_before + seg_sum) {
    ull acc = seg_before;
    for (int64_t i = s0; i < s1; ++i) {
      acc += weight(i);
      if (acc > target) {
        s_token = static_cast<int32_t>(i);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) stp->token = s_token >= 0 ? s_token : static_cast<int32_t>(ce - 1);
}

__global__ void __launch_bounds__(kThreads) finish_kernel(const Launch c) {
  const int64_t row = blockIdx.y;
  const SampleRowParams& p = c.a.params[row];
  SampleRowState* stp = c.a.state + row;
  int32_t token = 0;
  switch (static_cast<SampleMode>(p.mode)) {
    case SampleMode::kForced:
      token = p.forced_token;
      break;
    case SampleMode::kGreedy:
      token = best_id(stp->proc_best);
      break;
    case SampleMode::kRandom:
      token = stp->token;
      break;
  }
  int32_t* out = c.a.out;
  if (!p.want_logprobs) {
    if (blockIdx.x == 0 && threadIdx.x == 0) out[c.out.ids + row] = token;
    return;
  }
  const float* raw = c.a.logits + row * c.a.ld;
  const float raw_tok = raw[token];
  const float m_raw = stp->raw_max_key ? key_float(stp->raw_max_key) : kNegInf;
  const bool lse_on = isfinite(m_raw);
  const bool gather = p.num_top > 0 && stp->sel[kSelectRaw].status == kSelectorDone;
  const uint64_t top_min = selector_threshold(stp->sel[kSelectRaw]);
  ull* cand = c.cand + row * c.a.shape.max_top;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * c.chunk;
  const int64_t end = min64(begin + c.chunk, c.vocab);
  ull rank = 0, sum = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float x = raw[i];
    rank += x >= raw_tok;
    if (x != x) continue;
    if (lse_on) sum += weight_of(x, m_raw, c.mass_shift);
    if (gather) {
      const uint64_t comp = composite_key(order_key(x), i, c.id_bits);
      if (comp >= top_min) {
        const uint32_t slot = atomicAdd(&stp->num_cand, 1u);
        if (slot < c.a.shape.max_top) cand[slot] = comp;
      }
    }
  }
  rank = block_sum_u64(rank);
  sum = block_sum_u64(sum);
  if (threadIdx.x == 0) {
    atomicAdd(&stp->rank, static_cast<uint32_t>(rank));
    atomicAdd(reinterpret_cast<ull*>(&stp->lse_sum), sum);
  }
  if (!last_block_of_row(c.counters + row)) return;

  __shared__ ull s_cand[kSampleMaxTop];
  const int n_cand = static_cast<int>(min64(__ldcg(&stp->num_cand), c.a.shape.max_top));
  const uint32_t rank_total = __ldcg(&stp->rank);
  const ull lse_sum = __ldcg(reinterpret_cast<const ull*>(&stp->lse_sum));
  const double lse =
      lse_on ? static_cast<double>(m_raw) + log(ldexp(static_cast<double>(lse_sum), -c.mass_shift))
             : static_cast<double>(m_raw);
  for (int j = threadIdx.x; j < n_cand; j += kThreads) s_cand[j] = __ldcg(cand + j);
  __syncthreads();
  const int n_out = min(n_cand, p.num_top);
  const int64_t top_at = row * c.a.shape.max_top;
  for (int j = threadIdx.x; j < n_cand; j += kThreads) {
    const ull cj = s_cand[j];
    int pos = 0;
    for (int k = 0; k < n_cand; ++k) pos += s_cand[k] > cj;
    if (pos < n_out) {
      const int32_t id = composite_id(cj, c.id_bits);
      out[c.out.top_ids + top_at + pos] = id;
      out[c.out.top_logprobs + top_at + pos] =
          __float_as_int(static_cast<float>(static_cast<double>(raw[id]) - lse));
    }
  }
  if (threadIdx.x == 0) {
    out[c.out.ids + row] = token;
    out[c.out.logprob + row] = __float_as_int(static_cast<float>(static_cast<double>(raw_tok) - lse));
    out[c.out.rank + row] = static_cast<int32_t>(rank_total);
    out[c.out.num_top + row] = n_out;
  }
}

int64_t chunk_elems(int64_t rows, int64_t vocab) {
  const int64_t per_row = std::max<int64_t>(1, kTargetBlocks / rows);
  int64_t chunk = (vocab + per_row - 1) / per_row;
  chunk = (chunk + kSampleMinChunk - 1) / kSampleMinChunk * kSampleMinChunk;
  return std::clamp<int64_t>(chunk, kSampleMinChunk, kMaxChunk);
}

}  // namespace

void sample(const SampleArgs& a, const CudaContext& ctx) {
  if (a.rows == 0) return;
  KERNEL_CHECK(a.rows <= a.shape.max_rows && a.rows <= 65535, "sample: more rows than the scratch holds");
  KERNEL_CHECK(a.shape.vocab > 0 && a.shape.vocab <= kSampleMaxVocab, "sample: vocabulary size out of range");
  KERNEL_CHECK(a.shape.max_top >= 0 && a.shape.max_top <= kSampleMaxTop, "sample: max_top out of range");
  KERNEL_CHECK(a.num_rounds >= 0 && a.num_rounds <= 8, "sample: num_rounds out of range");
  const SampleScratchLayout layout = sample_scratch_layout(a.shape);
  char* base = static_cast<char*>(a.scratch);
  Launch c;
  c.a = a;
  c.vocab = a.shape.vocab;
  c.id_bits = sample_id_bits(c.vocab);
  c.mass_shift = sample_mass_shift(c.vocab);
  c.chunk = chunk_elems(a.rows, c.vocab);
  c.proc = reinterpret_cast<float*>(base + layout.proc);
  c.hist_raw = reinterpret_cast<uint32_t*>(base + layout.hist_raw);
  c.hist_proc = reinterpret_cast<uint32_t*>(base + layout.hist_proc);
  c.hist_mass = reinterpret_cast<ull*>(base + layout.hist_mass);
  c.counters = reinterpret_cast<uint32_t*>(base + layout.counters);
  c.chunk_sums = reinterpret_cast<ull*>(base + layout.chunk_sums);
  c.max_chunks = layout.max_chunks;
  c.cand = reinterpret_cast<ull*>(base + layout.cand);
  c.out = sample_out_layout(a.rows, a.shape.max_top);
  cudaStream_t st = cuda_util::stream(ctx);
  const auto rows = static_cast<unsigned>(a.rows);
  const dim3 prep_grid(static_cast<unsigned>((c.vocab + kPrepTile - 1) / kPrepTile), rows);
  const dim3 grid(static_cast<unsigned>((c.vocab + c.chunk - 1) / c.chunk), rows);
  prepare_kernel<<<prep_grid, kThreads, 0, st>>>(c);
  CUDA_CHECK_LAUNCH();
  for (int32_t r = 0; r < a.num_rounds; ++r) {
    round_kernel<<<grid, kThreads, 0, st>>>(c);
    CUDA_CHECK_LAUNCH();
  }
  if (a.any_random) {
    draw_kernel<<<grid, kThreads, 0, st>>>(c);
    CUDA_CHECK_LAUNCH();
  }
  finish_kernel<<<grid, kThreads, 0, st>>>(c);
  CUDA_CHECK_LAUNCH();
}

}  // namespace polylora::kernels::cuda
