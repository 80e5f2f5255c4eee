// kernels/sampling/sampling.cc: host helpers of the sampling op shared by every backend: the scratch
// layout, a row's initial state, the number of selection rounds, and the key / fixed-point widths.
#include <algorithm>

#include "kernels/sampling/sampling.h"
#include "kernels/sampling/sampling_math.h"

namespace polylora::kernels {
namespace {

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

}  // namespace

SampleScratchLayout sample_scratch_layout(const SampleShape& s) {
  SampleScratchLayout l;
  const auto rows = static_cast<size_t>(std::max<int64_t>(s.max_rows, 1));
  const auto vocab = static_cast<size_t>(std::max<int64_t>(s.vocab, 1));
  l.max_chunks = (std::max<int64_t>(s.vocab, 1) + kSampleMinChunk - 1) / kSampleMinChunk;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    size_t at = off;
    off += align256(bytes);
    return at;
  };
  l.proc = take(rows * vocab * sizeof(float));
  l.hist_raw = take(rows * kSampleBins * sizeof(uint32_t));
  l.hist_proc = take(rows * kSampleBins * sizeof(uint32_t));
  l.hist_mass = take(rows * kSampleBins * sizeof(uint64_t));
  l.counters = take(rows * sizeof(uint32_t));
  l.chunk_sums = take(rows * static_cast<size_t>(l.max_chunks) * sizeof(uint64_t));
  l.cand_raw = take(rows * kSampleGatherCap * sizeof(uint64_t));
  l.cand_proc = take(rows * kSampleGatherCap * sizeof(uint64_t));
  l.control = take(16 * sizeof(uint32_t));
  l.bytes = off;
  return l;
}

int32_t sample_id_bits(int64_t vocab) {
  int32_t bits = 1;
  while ((int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

int32_t sample_mass_shift(int64_t vocab) {
  return std::min<int32_t>(44, 63 - sample_id_bits(vocab));
}

SampleRowState init_sample_row_state(const SampleRowParams& p, int64_t vocab) {
  SampleRowState st;
  const int32_t start = 32 + sample_id_bits(vocab);
  for (SampleSelector& s : st.sel) s.shift = start;
  if (p.want_logprobs && p.num_top > 0) {
    st.sel[kSelectRaw].status = kSelectorRunning;
    st.sel[kSelectRaw].need = st.sel[kSelectRaw].target = static_cast<uint64_t>(p.num_top);
  }
  if (p.mode == static_cast<int32_t>(SampleMode::kRandom)) {
    const bool top_k = p.top_k > 0;
    if (top_k) {
      st.sel[kSelectTopK].status = kSelectorRunning;
      st.sel[kSelectTopK].need = st.sel[kSelectTopK].target = static_cast<uint64_t>(p.top_k);
    }
    if (p.top_p < 1.0) {
      st.sel[kSelectTopP].status = top_k ? kSelectorPending : kSelectorRunning;
      st.sel[kSelectTopP].mass_mode = 1;
    }
  }
  return st;
}

int32_t sample_num_rounds(const SampleRowParams* params, int64_t rows) {
  int32_t rounds = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const SampleRowParams& p = params[r];
    if (p.want_logprobs && p.num_top > 0) rounds = std::max(rounds, 4);
    if (p.mode != static_cast<int32_t>(SampleMode::kRandom)) continue;
    const bool top_k = p.top_k > 0, top_p = p.top_p < 1.0;
    if (top_k && top_p) rounds = std::max(rounds, 7);
    if (top_p) rounds = std::max(rounds, 5);
    if (top_k) rounds = std::max(rounds, 2);
  }
  return rounds;
}

}  // namespace polylora::kernels
