// kernels/sampling/sampling_cuda.cu: the sampling op (sampling.h) on CUDA. Every kernel runs a grid of
// (chunks, rows): several blocks per row, each over a contiguous chunk of the vocabulary, so a batch of
// one row still spreads over the chip. Per-row results of a kernel are combined with atomics (integer
// sums, maxima of order keys) and, where a decision needs all of them, by the last block of the row to
// finish (a per-row counter; threadfence before the count, so that block sees every other block's
// writes), which also re-zeroes what it consumed. Kernels, in stream order:
//   prepare  (tiles of 2048): raw max; edits, the row's bitmask + temperature into the processed copy;
//            its max / argmax;
//            the first histogram (top 11 key bits) of the top-N and top_k selectors.
//   round x num_rounds: per running selector either a histogram round (2048 bins in shared memory,
//            non-zero bins flushed to the row's global histogram; the last block finds the crossing bin
//            with a block scan and advances the selector) or, once at most kSampleGatherCap elements lie
//            at or above its bucket, a gather round: the elements are collected (warp-aggregated
//            appends) and the last block sorts them (bitonic, shared memory) and finishes the search:
//            the sorted top-N; or the top_k key, top_p's pivot over the survivors and the draw itself.
//            A row whose selectors are done makes its blocks return at once.
//   draw     (rows not drawn by a gather) fixed-point weight of the kept ids per chunk; the last block
//            finds the chunk and then the id where the cumulative weight passes floor(u * total).
//   finish   rank and log-sum-exp sums (and the top-N when no gather sorted them); the last block
//            writes the packed results.
// By default the phases run in one cooperative kernel (as many blocks as fit on the device, striding
// over the (row, chunk) work items, a grid barrier between phases, and the rounds stopping as soon as
// no row has a selector left): one launch, so a batch of one row costs little more than its work.
// SampleArgs::fused = false launches a kernel per phase and round instead.
// Chunk sizes depend on the batch (about 1024 work items a phase) but results do not: every sum is
// exact, and the gather path selects exactly what the radix rounds would.
#include <algorithm>
#include <atomic>

#include "kernels/cuda_util.cuh"
#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_block.cuh"
#include "kernels/sampling/sampling_math.h"
#include "kernels/sampling/sampling_select.cuh"

namespace polylora::kernels::cuda {
namespace {

using namespace sampling;
using namespace sampling_block;
using namespace sampling_select;

// --- phases: one (row, chunk) work item each; a kernel per phase or all in the fused kernel -------------

__device__ bool m_valid_of(const SampleRowParams& p, const SampleRowState& st) {
  return p.mode == static_cast<int32_t>(SampleMode::kRandom) && best_value(st.proc_best) > kNegInf;
}

// Whether a later round has work for the row.
__device__ bool row_active(const SampleRowParams& p, const SampleRowState& st) {
  auto live = [](int32_t s) {
    return s == kSelectorRunning || s == kSelectorGather || s == kSelectorPending;
  };
  return live(st.sel[kSelectRaw].status) ||
         (m_valid_of(p, st) && (live(st.sel[kSelectTopK].status) || live(st.sel[kSelectTopP].status)));
}

__device__ void prepare_phase(const Launch& c, int64_t row, int tile_idx, int ntiles, ull* smem) {
  __syncthreads();  // smem of the block's previous work item
  const SampleRowParams& p = c.a.params[row];
  SampleRowState* stp = c.a.state + row;
  __shared__ ull st_words[kStateWords];
  SampleRowState& st = *reinterpret_cast<SampleRowState*>(st_words);
  load_state(st, stp);
  const int64_t base = static_cast<int64_t>(tile_idx) * kPrepTile;
  const int len = static_cast<int>(min64(kPrepTile, c.vocab - base));
  const float* raw = c.a.logits + row * c.a.ld + base;
  const bool forced = p.mode == static_cast<int32_t>(SampleMode::kForced);
  // First histograms (digit = key >> 21) of the selectors that start running.
  const bool raw_hist = st.sel[kSelectRaw].status == kSelectorRunning;
  const bool k_hist = !forced && st.sel[kSelectTopK].status == kSelectorRunning;
  const int32_t tp = st.sel[kSelectTopP].status;
  const bool last_needed =
      raw_hist || k_hist || (c.count_active && (tp == kSelectorRunning || tp == kSelectorPending));
  float* tile = reinterpret_cast<float*>(smem);
  uint32_t* s_raw = reinterpret_cast<uint32_t*>(smem + kPrepTile / 2);
  uint32_t* s_cnt = s_raw + kSampleBins;
  __shared__ int32_t edit_range[2];
  if (raw_hist)
    for (int b = threadIdx.x; b < kSampleBins; b += kThreads) s_raw[b] = 0;
  if (k_hist)
    for (int b = threadIdx.x; b < kSampleBins; b += kThreads) s_cnt[b] = 0;
  __syncthreads();
  ull raw_best = 0, proc_best = 0;
  for (int i = threadIdx.x; i < len; i += kThreads) {
    const float x = raw[i];
    tile[i] = x;
    if (x == x) {
      const uint32_t key = order_key(x);
      raw_best = max(raw_best, static_cast<ull>(key));
      if (raw_hist) atomicAdd(&s_raw[key >> 21], 1u);
    }
  }
  if (!forced) {
    if (threadIdx.x == 0) {
      // This tile's edits: the row's edits are ascending by token.
      int32_t lo = p.edit_begin, hi = p.edit_end;
      while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (c.a.edits[mid].token < base)
          lo = mid + 1;
        else
          hi = mid;
      }
      int32_t lo2 = lo, hi2 = p.edit_end;
      while (lo2 < hi2) {
        const int32_t mid = lo2 + (hi2 - lo2) / 2;
        if (c.a.edits[mid].token < base + len)
          lo2 = mid + 1;
        else
          hi2 = mid;
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
    // Structured output: the row's allowed-token bitmask (kPrepTile is a multiple of 32, so a tile
    // starts at a word).
    const uint32_t* bits =
        p.mask_row >= 0 ? c.a.masks + static_cast<int64_t>(p.mask_row) * c.a.mask_words + base / 32 : nullptr;
    for (int i = threadIdx.x; i < len; i += kThreads) {
      float v = tile[i];
      if (bits && !(__ldg(bits + (i >> 5)) >> (i & 31) & 1u)) v = kNegInf;
      if (divide) v = fdiv(v, p.temperature);
      if (random) proc[i] = v;
      if (v == v) {
        const uint32_t key = order_key(v);
        proc_best = max(proc_best, static_cast<ull>(best_key(key, base + i)));
        if (k_hist && v > kNegInf) atomicAdd(&s_cnt[key >> 21], 1u);
      }
    }
  }
  raw_best = block_max_u64(raw_best);
  proc_best = block_max_u64(proc_best);
  if (threadIdx.x == 0) {
    if (raw_best) atomicMax(&stp->raw_max_key, static_cast<uint32_t>(raw_best));
    if (proc_best) atomicMax(reinterpret_cast<ull*>(&stp->proc_best), proc_best);
  }
  if (!last_needed) return;  // the same for every block of the row
  __syncthreads();
  uint32_t* g_raw = c.hist_raw + row * kSampleBins;
  uint32_t* g_cnt = c.hist_proc + row * kSampleBins;
  for (int b = threadIdx.x; b < kSampleBins; b += kThreads) {
    if (raw_hist && s_raw[b]) atomicAdd(g_raw + b, s_raw[b]);
    if (k_hist && s_cnt[b]) atomicAdd(g_cnt + b, s_cnt[b]);
  }
  if (!last_block_of_row(c.counters + row, ntiles)) return;
  load_state(st, stp);  // with every block's maxima
  if (raw_hist || k_hist)
    decide_histograms(c, row, st, raw_hist, k_hist ? kSelectTopK : -1, false, kSampleBins, kSampleBins,
                      p.top_p);
  if (c.count_active && threadIdx.x == 0 && row_active(p, st)) atomicAdd(c.active, 1u);
  store_state(stp, st);
}

__device__ void round_phase(const Launch& c, int64_t row, int chunk, int nchunks, ull* s_buf, int round) {
  __syncthreads();  // smem of the block's previous work item
  const SampleRowParams& p = c.a.params[row];
  SampleRowState* stp = c.a.state + row;
  __shared__ ull st_words[kStateWords];
  SampleRowState& st = *reinterpret_cast<SampleRowState*>(st_words);
  load_state(st, stp);
  const SampleSelector sraw = st.sel[kSelectRaw];
  const int raw_mode = sraw.status == kSelectorRunning  ? kHist
                       : sraw.status == kSelectorGather ? kGather
                                                        : kNone;
  const float m = best_value(st.proc_best);
  const bool m_valid = m_valid_of(p, st);
  int which = -1;
  if (m_valid) {
    const int32_t k_status = st.sel[kSelectTopK].status, p_status = st.sel[kSelectTopP].status;
    if (k_status == kSelectorRunning || k_status == kSelectorGather)
      which = kSelectTopK;
    else if (p_status == kSelectorRunning || p_status == kSelectorGather)
      which = kSelectTopP;
  }
  if (raw_mode == kNone && which < 0) return;  // the same for every block of the row
  const SampleSelector sproc = which >= 0 ? st.sel[which] : SampleSelector{};
  const int proc_mode = which < 0 ? kNone : sproc.status == kSelectorRunning ? kHist : kGather;
  const bool use_mass = proc_mode == kHist && sproc.mass_mode != 0;
  const int32_t id_bits = c.id_bits;
  // top_p's domain: valid, at least the top_k key, passing min_p; top_k's: valid.
  const uint32_t dom_key = which == kSelectTopP ? max(st.k_key, block_min_p_key(m, p.log_min_p)) : 0;

  // Histograms during the pass; the last block's sort buffer afterwards.
  uint32_t* s_raw = reinterpret_cast<uint32_t*>(s_buf);
  uint32_t* s_cnt = s_raw + kSampleBins;
  ull* s_mass = s_buf + kSampleBins;
  const int32_t raw_lo = raw_mode == kHist ? next_low_bit(sraw.shift, id_bits) : 0;
  const int32_t proc_lo = proc_mode == kHist ? next_low_bit(sproc.shift, id_bits) : 0;
  const int raw_bins = raw_mode == kHist ? 1 << (sraw.shift - raw_lo) : 0;
  const int proc_bins = proc_mode == kHist ? 1 << (sproc.shift - proc_lo) : 0;
  for (int b = threadIdx.x; b < raw_bins; b += kThreads) s_raw[b] = 0;
  for (int b = threadIdx.x; b < proc_bins; b += kThreads) s_cnt[b] = 0;
  if (use_mass)
    for (int b = threadIdx.x; b < proc_bins; b += kThreads) s_mass[b] = 0;
  __syncthreads();

  const int64_t begin = static_cast<int64_t>(chunk) * c.chunk;
  const int64_t end = min64(begin + c.chunk, c.vocab);
  const float* raw = c.a.logits + row * c.a.ld;
  const float* proc = c.proc + row * c.vocab;
  const int32_t raw_mask = raw_mode == kHist ? digit_mask(sraw.shift, raw_lo) : 0;
  const int32_t proc_mask = proc_mode == kHist ? digit_mask(sproc.shift, proc_lo) : 0;
  const uint64_t raw_min = selector_threshold(sraw), proc_min = selector_threshold(sproc);
  ull* raw_buf = c.cand_raw + row * kSampleGatherCap;
  ull* proc_buf = c.cand_proc + row * kSampleGatherCap;
  for (int64_t at = begin; at < end; at += kThreads * kUnroll) {  // the same trip count for every lane
    float xr[kUnroll], xp[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = at + u * kThreads + threadIdx.x;
      xr[u] = raw_mode != kNone && i < end ? raw[i] : nan_f();
      xp[u] = proc_mode != kNone && i < end ? proc[i] : kNegInf;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = at + u * kThreads + threadIdx.x;
      if (raw_mode != kNone) {
        const float x = xr[u];
        const uint64_t comp = x == x ? composite_key(order_key(x), i, id_bits) : 0;
        if (raw_mode == kHist) {
          if (x == x && (comp >> sraw.shift) == sraw.prefix)
            atomicAdd(&s_raw[(comp >> raw_lo) & raw_mask], 1u);
        } else {
          warp_append(x == x && comp >= raw_min, comp, &stp->sel[kSelectRaw].gathered, raw_buf);
        }
      }
      if (proc_mode != kNone) {
        const float v = xp[u];
        const uint32_t key = order_key(v);
        const bool in = v > kNegInf && key >= dom_key;
        const uint64_t comp = composite_key(key, i, id_bits);
        if (proc_mode == kHist) {
          if (in && (comp >> sproc.shift) == sproc.prefix) {
            const int b = static_cast<int>((comp >> proc_lo) & proc_mask);
            atomicAdd(&s_cnt[b], 1u);
            if (use_mass) atomicAdd(&s_mass[b], static_cast<ull>(weight_of(v, m, c.mass_shift)));
          }
        } else {
          warp_append(in && comp >= proc_min, comp, &stp->sel[which].gathered, proc_buf);
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
  if (!last_block_of_row(c.counters + row, nchunks)) return;

  load_state(st, stp);  // with the gathered counts
  if (raw_mode == kHist || proc_mode == kHist)
    decide_histograms(c, row, st, raw_mode == kHist, proc_mode == kHist ? which : -1, use_mass, raw_bins,
                      proc_bins, p.top_p);
  // s_buf is free from here on (the histograms were flushed).
  if (raw_mode == kGather) finish_raw_gather(c, row, st, s_buf);
  if (proc_mode == kGather) finish_proc_gather(c, row, p, st, which, s_buf);
  if (c.count_active && threadIdx.x == 0 && row_active(p, st)) atomicAdd(c.active + round + 1, 1u);
  store_state(stp, st);
}

__device__ void draw_phase(const Launch& c, int64_t row, int chunk, int nchunks) {
  const SampleRowParams& p = c.a.params[row];
  if (p.mode != static_cast<int32_t>(SampleMode::kRandom)) return;
  __syncthreads();  // st_words of the block's previous work item
  SampleRowState* stp = c.a.state + row;
  __shared__ ull st_words[kStateWords];
  SampleRowState& st = *reinterpret_cast<SampleRowState*>(st_words);
  load_state(st, stp);
  if (st.token >= 0) return;  // drawn by a gather round
  const uint64_t proc_best = st.proc_best;
  const float m = best_value(proc_best);
  if (!(m > kNegInf)) {  // nothing valid: the CPU sampler's fallbacks
    if (chunk == 0 && threadIdx.x == 0) stp->token = p.filtered ? best_id(proc_best) : 0;
    return;
  }
  const bool top_p = st.sel[kSelectTopP].status == kSelectorDone;
  const uint64_t top_p_min = selector_threshold(st.sel[kSelectTopP]);
  const uint32_t dom_key = max(st.k_key, block_min_p_key(m, p.log_min_p));
  const float* proc = c.proc + row * c.vocab;
  auto weight_v = [&](float v, int64_t i) -> ull {
    if (!(v > kNegInf)) return 0;
    const uint32_t key = order_key(v);
    if (key < dom_key) return 0;
    if (top_p && composite_key(key, i, c.id_bits) < top_p_min) return 0;
    return weight_of(v, m, c.mass_shift);
  };
  const int64_t begin = static_cast<int64_t>(chunk) * c.chunk;
  const int64_t end = min64(begin + c.chunk, c.vocab);
  ull local = 0;
  for (int64_t at = begin; at < end; at += kThreads * kUnroll) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = at + u * kThreads + threadIdx.x;
      v[u] = i < end ? proc[i] : kNegInf;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) local += weight_v(v[u], at + u * kThreads + threadIdx.x);
  }
  const ull chunk_sum = block_sum_u64(local);
  ull* sums = c.chunk_sums + row * c.max_chunks;
  if (threadIdx.x == 0) sums[chunk] = chunk_sum;
  if (!last_block_of_row(c.counters + row, nchunks)) return;

  // The chunk holding the target: chunks ascending, a contiguous run of them per thread.
  __shared__ int64_t s_chunk;
  __shared__ ull s_before;
  __shared__ int32_t s_token;
  const int per = (nchunks + kThreads - 1) / kThreads;
  const int c0 = min(static_cast<int>(threadIdx.x) * per, nchunks), c1 = min(c0 + per, nchunks);
  ull mine = 0;
  for (int k = c0; k < c1; ++k) mine += __ldcg(sums + k);
  ull total = 0;
  const ull excl = block_exclusive_scan_u64(mine, &total);
  const ull target = draw_target(uniform_bits(p.seed, p.step), total);  // < total (total > 0)
  if (threadIdx.x == 0) {
    s_chunk = nchunks - 1;
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
  for (int64_t i = s0; i < s1; ++i) seg_sum += weight_v(proc[i], i);
  ull chunk_total = 0;
  const ull seg_before = s_before + block_exclusive_scan_u64(seg_sum, &chunk_total);
  if (seg_before <= target && target < seg_before + seg_sum) {
    ull acc = seg_before;
    for (int64_t i = s0; i < s1; ++i) {
      acc += weight_v(proc[i], i);
      if (acc > target) {
        s_token = static_cast<int32_t>(i);
        break;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) stp->token = s_token >= 0 ? s_token : static_cast<int32_t>(ce - 1);
}

__device__ void finish_phase(const Launch& c, int64_t row, int chunk, int nchunks, ull* s_cand) {
  __syncthreads();  // smem of the block's previous work item
  const SampleRowParams& p = c.a.params[row];
  SampleRowState* stp = c.a.state + row;
  __shared__ ull st_words[kStateWords];
  SampleRowState& st = *reinterpret_cast<SampleRowState*>(st_words);
  load_state(st, stp);
  int32_t token = 0;
  switch (static_cast<SampleMode>(p.mode)) {
    case SampleMode::kForced:
      token = p.forced_token;
      break;
    case SampleMode::kGreedy:
      token = best_id(st.proc_best);
      break;
    case SampleMode::kRandom:
      token = st.token;
      break;
  }
  int32_t* out = c.a.out;
  if (!p.want_logprobs) {
    if (chunk == 0 && threadIdx.x == 0) out[c.out.ids + row] = token;
    return;
  }
  const float* raw = c.a.logits + row * c.a.ld;
  const float raw_tok = raw[token];
  const float m_raw = st.raw_max_key ? key_float(st.raw_max_key) : kNegInf;
  const bool lse_on = isfinite(m_raw);
  // The top-N: sorted by a gather round, or collected here (selected by radix rounds alone).
  const uint32_t sorted = st.raw_sorted;
  const bool gather = p.num_top > 0 && sorted == 0 && st.sel[kSelectRaw].status == kSelectorDone;
  const uint64_t top_min = selector_threshold(st.sel[kSelectRaw]);
  ull* cand = c.cand_raw + row * kSampleGatherCap;
  const int64_t begin = static_cast<int64_t>(chunk) * c.chunk;
  const int64_t end = min64(begin + c.chunk, c.vocab);
  ull rank = 0, sum = 0;
  for (int64_t at = begin; at < end; at += kThreads * kUnroll) {
    float x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = at + u * kThreads + threadIdx.x;
      x[u] = i < end ? raw[i] : nan_f();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      rank += x[u] >= raw_tok;
      if (x[u] != x[u]) continue;
      if (lse_on) sum += weight_of(x[u], m_raw, c.mass_shift);
      if (gather) {
        const int64_t i = at + u * kThreads + threadIdx.x;
        const uint64_t comp = composite_key(order_key(x[u]), i, c.id_bits);
        if (comp >= top_min) {
          const uint32_t slot = atomicAdd(&stp->num_cand, 1u);
          if (slot < kSampleGatherCap) cand[slot] = comp;
        }
      }
    }
  }
  rank = block_sum_u64(rank);
  sum = block_sum_u64(sum);
  if (threadIdx.x == 0) {
    atomicAdd(&stp->rank, static_cast<uint32_t>(rank));
    atomicAdd(reinterpret_cast<ull*>(&stp->lse_sum), sum);
  }
  if (!last_block_of_row(c.counters + row, nchunks)) return;

  int n_cand = static_cast<int>(sorted);
  if (gather) n_cand = static_cast<int>(min64(__ldcg(&stp->num_cand), kSampleMaxTop));
  const uint32_t rank_total = __ldcg(&stp->rank);
  const ull lse_sum = __ldcg(reinterpret_cast<const ull*>(&stp->lse_sum));
  const double lse =
      lse_on ? static_cast<double>(m_raw) + log(ldexp(static_cast<double>(lse_sum), -c.mass_shift))
             : static_cast<double>(m_raw);
  if (gather) {
    load_and_sort(s_cand, cand, n_cand, true);
  } else {
    for (int j = threadIdx.x; j < n_cand; j += kThreads) s_cand[j] = __ldcg(cand + j);
    __syncthreads();
  }
  const int n_out = min(n_cand, p.num_top);
  const int64_t top_at = row * c.a.shape.max_top;
  for (int j = threadIdx.x; j < n_out; j += kThreads) {
    const int32_t id = composite_id(s_cand[j], c.id_bits);
    out[c.out.top_ids + top_at + j] = id;
    out[c.out.top_logprobs + top_at + j] =
        __float_as_int(static_cast<float>(static_cast<double>(raw[id]) - lse));
  }
  if (threadIdx.x == 0) {
    out[c.out.ids + row] = token;
    out[c.out.logprob + row] = __float_as_int(static_cast<float>(static_cast<double>(raw_tok) - lse));
    out[c.out.rank + row] = static_cast<int32_t>(rank_total);
    out[c.out.num_top + row] = n_out;
  }
}

// --- kernels ---------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) prepare_kernel(const Launch c) {
  __shared__ __align__(16) ull smem[kPrepTile / 2 + kSampleBins];
  prepare_phase(c, blockIdx.y, blockIdx.x, gridDim.x, smem);
}
__global__ void __launch_bounds__(kThreads) round_kernel(const Launch c, int round) {
  __shared__ __align__(16) ull smem[kSampleGatherCap];
  round_phase(c, blockIdx.y, blockIdx.x, gridDim.x, smem, round);
}
__global__ void __launch_bounds__(kThreads) draw_kernel(const Launch c) {
  draw_phase(c, blockIdx.y, blockIdx.x, gridDim.x);
}
__global__ void __launch_bounds__(kThreads) finish_kernel(const Launch c) {
  __shared__ __align__(16) ull smem[kSampleMaxTop];
  finish_phase(c, blockIdx.y, blockIdx.x, gridDim.x, smem);
}

// Every block of the grid waits for all (the grid is co-resident: a cooperative launch). bar[0] counts
// arrivals, bar[1] is the generation.
__device__ void grid_barrier(uint32_t* bar) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile uint32_t* gen = bar + 1;
    const uint32_t g = *gen;
    __threadfence();
    if (atomicAdd(bar, 1u) == gridDim.x - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == g) __nanosleep(64);
    }
    __threadfence();
  }
  __syncthreads();
}

// All phases in one persistent kernel; work items (row, chunk) are strided over the grid.
__global__ void __launch_bounds__(kThreads, 4) fused_kernel(const Launch c) {
  __shared__ __align__(16) ull smem[kSampleGatherCap];
  const int64_t rows = c.a.rows;
  const int64_t tiles = c.prep_tiles, chunks = c.chunks;
  for (int64_t it = blockIdx.x; it < rows * tiles; it += gridDim.x)
    prepare_phase(c, it / tiles, static_cast<int>(it % tiles), static_cast<int>(tiles), smem);
  grid_barrier(c.barrier);
  for (int r = 0; r < c.a.num_rounds; ++r) {
    if (__ldcg(c.active + r) == 0) break;  // no row needs another round (read alike by every block)
    for (int64_t it = blockIdx.x; it < rows * chunks; it += gridDim.x)
      round_phase(c, it / chunks, static_cast<int>(it % chunks), static_cast<int>(chunks), smem, r);
    grid_barrier(c.barrier);
  }
  if (c.a.any_random) {
    for (int64_t it = blockIdx.x; it < rows * chunks; it += gridDim.x)
      draw_phase(c, it / chunks, static_cast<int>(it % chunks), static_cast<int>(chunks));
    grid_barrier(c.barrier);
  }
  for (int64_t it = blockIdx.x; it < rows * chunks; it += gridDim.x)
    finish_phase(c, it / chunks, static_cast<int>(it % chunks), static_cast<int>(chunks), smem);
  // Nobody reads the activity counts after the last barrier: zero them for the next call.
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (int r = 0; r <= kMaxRounds; ++r) c.active[r] = 0;
}

int64_t chunk_elems(int64_t rows, int64_t vocab) {
  const int64_t per_row = std::max<int64_t>(1, kTargetBlocks / rows);
  int64_t chunk = (vocab + per_row - 1) / per_row;
  chunk = (chunk + kSampleMinChunk - 1) / kSampleMinChunk * kSampleMinChunk;
  return std::clamp<int64_t>(chunk, kSampleMinChunk, kMaxChunk);
}

// Blocks of fused_kernel that fit on the device at once (cached per device).
int64_t fused_grid_limit() {
  static std::atomic<int64_t> cache[64];
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  KERNEL_CHECK(dev >= 0 && dev < 64, "sample: device index out of range");
  int64_t n = cache[dev].load(std::memory_order_relaxed);
  if (n == 0) {
    int per_sm = 0, sms = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fused_kernel, kThreads, 0));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int coop = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
    n = coop ? static_cast<int64_t>(per_sm) * sms : -1;
    cache[dev].store(n, std::memory_order_relaxed);
  }
  return n;
}

}  // namespace

void sample(const SampleArgs& a, const CudaContext& ctx) {
  if (a.rows == 0) return;
  KERNEL_CHECK(a.rows <= a.shape.max_rows && a.rows <= 65535, "sample: more rows than the scratch holds");
  KERNEL_CHECK(a.shape.vocab > 0 && a.shape.vocab <= kSampleMaxVocab, "sample: vocabulary size out of range");
  KERNEL_CHECK(a.shape.max_top >= 0 && a.shape.max_top <= kSampleMaxTop, "sample: max_top out of range");
  KERNEL_CHECK(a.num_rounds >= 0 && a.num_rounds <= kMaxRounds, "sample: num_rounds out of range");
  const SampleScratchLayout layout = sample_scratch_layout(a.shape);
  char* base = static_cast<char*>(a.scratch);
  Launch c;
  c.a = a;
  c.vocab = a.shape.vocab;
  c.id_bits = sample_id_bits(c.vocab);
  c.mass_shift = sample_mass_shift(c.vocab);
  c.chunk = chunk_elems(a.rows, c.vocab);
  c.chunks = (c.vocab + c.chunk - 1) / c.chunk;
  c.prep_tiles = (c.vocab + kPrepTile - 1) / kPrepTile;
  c.proc = reinterpret_cast<float*>(base + layout.proc);
  c.hist_raw = reinterpret_cast<uint32_t*>(base + layout.hist_raw);
  c.hist_proc = reinterpret_cast<uint32_t*>(base + layout.hist_proc);
  c.hist_mass = reinterpret_cast<ull*>(base + layout.hist_mass);
  c.counters = reinterpret_cast<uint32_t*>(base + layout.counters);
  c.chunk_sums = reinterpret_cast<ull*>(base + layout.chunk_sums);
  c.max_chunks = layout.max_chunks;
  c.cand_raw = reinterpret_cast<ull*>(base + layout.cand_raw);
  c.cand_proc = reinterpret_cast<ull*>(base + layout.cand_proc);
  c.barrier = reinterpret_cast<uint32_t*>(base + layout.control);
  c.active = c.barrier + 2;
  c.out = sample_out_layout(a.rows, a.shape.max_top);
  cudaStream_t st = cuda_util::stream(ctx);
  // Fused when every work item of a phase fits in one wave of co-resident blocks (small batches, where
  // launch and tail latency dominate); larger batches stream better as a kernel per phase (measured on an
  // H200: fused 63 us vs 80 us at 1 row, but 144 vs 129 us at 16 rows and 358 vs 255 us at 64).
  const int64_t limit = a.fused ? fused_grid_limit() : -1;
  const int64_t items = a.rows * std::max(c.chunks, c.prep_tiles);
  if (limit > 0 && items <= limit) {
    c.count_active = true;
    const auto grid = static_cast<unsigned>(std::min(limit, items));
    void* params[] = {&c};
    CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(fused_kernel), dim3(grid),
                                           dim3(kThreads), params, 0, st));
    return;
  }
  const auto rows = static_cast<unsigned>(a.rows);
  const dim3 prep_grid(static_cast<unsigned>(c.prep_tiles), rows);
  const dim3 grid(static_cast<unsigned>(c.chunks), rows);
  prepare_kernel<<<prep_grid, kThreads, 0, st>>>(c);
  CUDA_CHECK_LAUNCH();
  for (int32_t r = 0; r < a.num_rounds; ++r) {
    round_kernel<<<grid, kThreads, 0, st>>>(c, r);
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
