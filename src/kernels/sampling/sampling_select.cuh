// kernels/sampling/sampling_select.cuh: the state shared by the CUDA sampling kernels (sampling_cuda.cu) and
// the decisions the last block of a row takes for its selectors: the launch's buffers and sizes (Launch),
// the row state's copy in and out of shared memory, the crossing bins after a histogram round (and the
// switch to a gather once few elements are left), and the end of a gather round (the sorted top-N; top_k,
// min_p and top_p's kept prefix and the draw over it). Included from sampling_cuda.cu only. Must not:
// depend on anything above common/.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_block.cuh"
#include "kernels/sampling/sampling_math.h"

namespace polylora::kernels::cuda::sampling_select {

using namespace sampling;
using namespace sampling_block;

constexpr int kUnroll = 4;
constexpr int kPrepTile = 2048;
constexpr int64_t kMaxChunk = 32768;
constexpr int64_t kTargetBlocks = 1024;
constexpr int kMaxRounds = 8;
constexpr int kStateWords = static_cast<int>(sizeof(SampleRowState) / sizeof(ull));
static_assert(sizeof(SampleRowState) % sizeof(ull) == 0, "SampleRowState is copied as 8-byte words");
static_assert(kSampleGatherCap * sizeof(ull) >=
                  2 * kSampleBins * sizeof(uint32_t) + kSampleBins * sizeof(ull),
              "the sort buffer doubles as the histograms");
static_assert(kSampleGatherCap >= kSampleMaxTop, "a gather holds the top-N");

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
  ull* cand_raw = nullptr;
  ull* cand_proc = nullptr;
  uint32_t* barrier = nullptr;  // [2] the fused kernel's grid barrier
  uint32_t* active = nullptr;   // [kMaxRounds + 1] rows with work left after prepare / each round
  bool count_active = false;    // the fused kernel: count them
  int64_t chunks = 0;           // work items per row in round / draw / finish
  int64_t prep_tiles = 0;       // work items per row in prepare
  SampleOutLayout out;
};

enum Mode : int { kNone = 0, kHist = 1, kGather = 2 };

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ float nan_f() {
  return __int_as_float(0x7fffffff);
}

// The last block's copy of its row's state (read through L2: other blocks' atomics are not in this
// SM's L1), written back by store_state().
__device__ void load_state(SampleRowState& st, const SampleRowState* stp) {
  if (threadIdx.x == 0) {
    auto* dst = reinterpret_cast<ull*>(&st);
    const auto* src = reinterpret_cast<const ull*>(stp);
    for (int w = 0; w < kStateWords; ++w) dst[w] = __ldcg(src + w);
  }
  __syncthreads();
}
__device__ void store_state(SampleRowState* stp, const SampleRowState& st) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const auto* src = reinterpret_cast<const ull*>(&st);
    auto* dst = reinterpret_cast<ull*>(stp);
    for (int w = 0; w < kStateWords; ++w) dst[w] = src[w];
  }
}

// min_p_key() computed once per block.
__device__ uint32_t block_min_p_key(float m, double log_min_p) {
  __shared__ uint32_t key;
  __syncthreads();
  if (threadIdx.x == 0) key = min_p_key(m, log_min_p);
  __syncthreads();
  return key;
}

__device__ __forceinline__ int32_t digit_mask(int32_t shift, int32_t lo) {
  return (1 << (shift - lo)) - 1;
}

// After a histogram round (in the last block): the crossings of the selectors that made one, their
// advance (to gather mode when at most kSampleGatherCap elements lie at or above the new bucket), and the
// global histograms zeroed again. st is the block's shared copy of the row's state.
__device__ void decide_histograms(const Launch& c, int64_t row, SampleRowState& st, bool raw_hist, int which,
                                  bool use_mass, int raw_bins, int proc_bins, double top_p) {
  uint32_t* g_raw = c.hist_raw + row * kSampleBins;
  uint32_t* g_cnt = c.hist_proc + row * kSampleBins;
  ull* g_mass = c.hist_mass + row * kSampleBins;
  SelectorCrossing raw_cross{}, proc_cross{};
  ull raw_need = st.sel[kSelectRaw].need, proc_need = which >= 0 ? st.sel[which].need : 0;
  if (raw_hist) raw_cross = block_crossing(g_raw, nullptr, raw_bins, raw_need, false, 0.0, &raw_need);
  if (which >= 0)
    proc_cross = block_crossing(g_cnt, use_mass ? g_mass : nullptr, proc_bins, proc_need,
                                which == kSelectTopP, top_p, &proc_need);
  if (threadIdx.x == 0) {
    auto to_gather = [&](int s, const SelectorCrossing& x) {
      SampleSelector& sel = st.sel[s];
      if (sel.status == kSelectorRunning && x.found &&
          static_cast<uint64_t>(sel.count_above) + x.bin_count <= static_cast<uint64_t>(kSampleGatherCap)) {
        sel.status = kSelectorGather;
        sel.gathered = 0;
      }
    };
    if (raw_hist) {
      selector_decide(st, kSelectRaw, c.id_bits, raw_cross);
      to_gather(kSelectRaw, raw_cross);
    }
    if (which >= 0) {
      st.sel[which].need = proc_need;
      selector_decide(st, which, c.id_bits, proc_cross);
      to_gather(which, proc_cross);
    }
  }
  for (int b = threadIdx.x; b < raw_bins; b += kThreads) g_raw[b] = 0;
  for (int b = threadIdx.x; b < proc_bins; b += kThreads) {
    g_cnt[b] = 0;
    if (use_mass) g_mass[b] = 0;
  }
  __syncthreads();
}

// Loads the n gathered candidates of buf into s, pads to a power of two with `pad` and sorts.
__device__ int load_and_sort(ull* s, const ull* buf, int n, bool descending) {
  const int p = pow2_at_least(max(n, 1));
  for (int j = threadIdx.x; j < p; j += kThreads)
    s[j] = j < n ? __ldcg(buf + j) : (descending ? 0ull : ~0ull);
  __syncthreads();
  block_sort(s, p, descending);
  return p;
}

// A gather round of the top-N selector: the candidates sorted, the best target of them kept in order.
__device__ void finish_raw_gather(const Launch& c, int64_t row, SampleRowState& st, ull* s) {
  SampleSelector& sel = st.sel[kSelectRaw];
  const int n = static_cast<int>(min64(sel.gathered, kSampleGatherCap));
  ull* buf = c.cand_raw + row * kSampleGatherCap;
  load_and_sort(s, buf, n, true);
  const int keep = static_cast<int>(min64(n, static_cast<int64_t>(sel.target)));
  for (int j = threadIdx.x; j < keep; j += kThreads) buf[j] = s[j];
  __syncthreads();
  if (threadIdx.x == 0) {
    sel.status = kSelectorDone;
    sel.prefix = keep > 0 ? s[keep - 1] : 0;
    sel.shift = 0;
    st.raw_sorted = static_cast<uint32_t>(keep);
  }
  __syncthreads();
}

// A gather round of top_k or top_p: the candidates sorted best first; the kept ids are a prefix of them
// (top_k's tie included, min_p passed, top_p's shortest prefix reaching its mass); then the draw over
// them in ascending id order. Sets the token.
__device__ void finish_proc_gather(const Launch& c, int64_t row, const SampleRowParams& p, SampleRowState& st,
                                   int which, ull* s) {
  const int32_t id_bits = c.id_bits;
  const int32_t shift = c.mass_shift;
  const float m = best_value(st.proc_best);
  SampleSelector& sel = st.sel[which];
  const int n = static_cast<int>(min64(sel.gathered, kSampleGatherCap));
  load_and_sort(s, c.cand_proc + row * kSampleGatherCap, n, true);
  const uint32_t minp_key = block_min_p_key(m, p.log_min_p);
  auto weight = [&](ull comp) -> ull {
    return weight_of(key_float(static_cast<uint32_t>(comp >> id_bits)), m, shift);
  };
  __shared__ uint32_t s_k_key;
  __shared__ int s_kept;
  if (threadIdx.x == 0) s_k_key = st.k_key;
  __syncthreads();
  bool top_p = which == kSelectTopP;
  ull top_p_target = which == kSelectTopP ? sel.target : 0;
  if (which == kSelectTopK) {
    if (threadIdx.x == 0) s_k_key = static_cast<uint32_t>(s[sel.target - 1] >> id_bits);
    __syncthreads();
    top_p = st.sel[kSelectTopP].status == kSelectorPending;
  }
  // The survivors of top_k and min_p: a prefix of the sorted candidates.
  const uint32_t dom_key = max(s_k_key, minp_key);
  ull in_dom = 0;
  for (int j = threadIdx.x; j < n; j += kThreads) in_dom += static_cast<uint32_t>(s[j] >> id_bits) >= dom_key;
  const int n_dom = static_cast<int>(block_sum_u64(in_dom));
  int kept = n_dom;
  if (top_p && n_dom > 0) {
    ull total = 0;
    if (which == kSelectTopK) {
      // top_p's mass target over the survivors.
      block_first_cumulative(s, n_dom, ~0ull, false, weight, &total);
      top_p_target = top_p_need(total, p.top_p);
    }
    kept = block_first_cumulative(s, n_dom, top_p_target, false, weight, &total) + 1;
  }
  if (threadIdx.x == 0) {
    s_kept = kept;
    if (which == kSelectTopK) {
      st.k_key = s_k_key;
      sel.status = kSelectorDone;
    }
    SampleSelector& tp = st.sel[kSelectTopP];
    if (top_p) {
      tp.status = kSelectorDone;
      tp.prefix = kept > 0 ? s[kept - 1] : 0;
      tp.shift = 0;
    }
  }
  __syncthreads();
  kept = s_kept;
  // The draw: the kept ids ascending, (id << 32 | key) so that the key stays at hand.
  const int pk = pow2_at_least(max(kept, 1));
  ull mine[kSampleGatherCap / kThreads];
  int count = 0;
  for (int j = threadIdx.x; j < pk; j += kThreads)
    mine[count++] =
        j < kept ? (static_cast<ull>(composite_id(s[j], id_bits)) << 32) | (s[j] >> id_bits) : ~0ull;
  __syncthreads();
  count = 0;
  for (int j = threadIdx.x; j < pk; j += kThreads) s[j] = mine[count++];
  __syncthreads();
  block_sort(s, pk, false);
  auto weight_by_id = [&](ull packed) -> ull {
    return weight_of(key_float(static_cast<uint32_t>(packed)), m, shift);
  };
  ull total = 0;
  block_first_cumulative(s, kept, ~0ull, false, weight_by_id, &total);
  const ull target = draw_target(uniform_bits(p.seed, p.step), total);
  const int at = block_first_cumulative(s, kept, target, true, weight_by_id, &total);
  if (threadIdx.x == 0) st.token = kept > 0 ? static_cast<int32_t>(s[at] >> 32) : best_id(st.proc_best);
  __syncthreads();
}

}  // namespace polylora::kernels::cuda::sampling_select
