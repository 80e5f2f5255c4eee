// kernels/sampling/sampling.h: sampling a batch of logits rows where they live (device memory on CUDA),
// with the semantics of worker/sampler.h (vLLM v1 order): raw log-probs (log_softmax of the unprocessed
// logits) of the chosen token with its rank and the top-N raw log-probs; min_tokens masking, logit_bias
// and repetition / frequency / presence penalties (given as a compact per-row edit list built on the
// host), a structured-output bitmask per row (disallowed tokens -inf); then greedy argmax, or temperature, min_p, top_k, top_p and an inverse-CDF draw with the
// counter-based uniform of sampler_uniform(seed, step). Forced rows (prompt logprobs) report the raw
// log-prob, rank and top-N of a given token and draw nothing.
//
// Algorithm (the same in ref:: and cuda::, so both give identical results):
//   1. prepare: per row the raw maximum; edits and temperature applied to a copy of the row (the
//      "processed" logits, scratch), its maximum m and argmax (lowest id on ties).
//   2. selection rounds: thresholds are found by a radix search over 2048-bin histograms of an
//      order-preserving 32-bit key of the float value, extended below by (id_mask - id) so that every
//      element has a distinct "composite" key and (value descending, id ascending) is composite
//      descending. Three rounds decide the value (11 + 11 + 10 bits), two more the id among tied values
//      (skipped when the whole tie is taken). A selector either counts (the N-th largest: top-N raw
//      log-probs, top_k) or accumulates probability mass (top_p: the shortest descending prefix whose
//      mass reaches top_p, lower id first on ties). Mass is exact integer arithmetic in fixed point
//      (weight_fix of exp(p - m), the CPU sampler's own exp), so sums do not depend on the order or
//      the split of the work: results are identical at any batch size and on any backend.
//      top_k (value only, ties kept) runs first; top_p runs over the survivors of min_p and top_k.
//      CUDA shortcut: once at most kSampleGatherCap elements lie at or above a selector's bucket (after
//      one or two rounds for the usual top-N, top_k and peaked top_p), they are gathered and sorted in one
//      block, which finishes the selection (and, for top_k / top_p, the draw) exactly as the rounds would.
//   3. draw: the kept ids (valid, >= the top_k key, passing min_p, at or above the top_p pivot) in
//      ascending id order; the first whose cumulative fixed-point weight exceeds
//      floor(u * total) for the uniform u of sampler_uniform(seed, step).
//   4. finish: rank (#{raw >= raw[token]}), log-sum-exp (fixed point, then double), the top-N raw
//      candidates sorted best first; results written to a packed output (sample_out_layout()).
// Differences from worker::Sampler are limited to rounding at boundaries: the CPU sums weights in double
// in a fixed order; here they are rounded to multiples of 2^-mass_shift and summed exactly. A draw or a
// top_p cut whose target falls within ~1e-12 of a boundary may differ; everything else is equal.
//
// Must not: depend on anything above common/; allocate or synchronize (scratch comes from the caller).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda_context.h"

namespace polylora::kernels {

enum class SampleMode : int32_t {
  kGreedy = 0,  // argmax of the processed logits
  kRandom = 1,  // temperature, min_p, top_k, top_p, then a seeded draw
  kForced = 2,  // no sampling: forced_token's raw log-prob, rank and top-N (prompt logprobs)
};

// SampleEdit::flags
inline constexpr int32_t kEditMask = 1;    // min_tokens: the logit becomes -inf first
inline constexpr int32_t kEditRepeat = 2;  // repetition penalty (seen in prompt or output)

// One token of a row whose logit the processors change. Applied in the CPU sampler's order: mask, the
// biases in list order, the repetition penalty (logit > 0: divided, else multiplied), then
// frequency_penalty * count and presence_penalty (when count > 0 and the row uses them).
struct SampleEdit {
  int32_t token = 0;
  int32_t flags = 0;       // kEditMask | kEditRepeat
  int32_t count = 0;       // occurrences in the output so far
  int32_t bias_begin = 0;  // biases[bias_begin, bias_end) are added in order (logit_bias entries)
  int32_t bias_end = 0;
};

// SampleRowParams::penalty_flags
inline constexpr int32_t kPenaltyRepetition = 1;
inline constexpr int32_t kPenaltyFrequency = 2;
inline constexpr int32_t kPenaltyPresence = 4;

// One row's settings, built on the host (worker/device_sampler.cc) from SamplingParams.
struct SampleRowParams {
  int32_t mode = 0;           // SampleMode
  int32_t forced_token = 0;   // kForced: the token reported
  int32_t want_logprobs = 0;  // 1: logprob and rank of the token (and num_top alternatives) are reported
  int32_t num_top = 0;        // raw top log-probs reported, 0 .. max_top (<= vocab)
  float temperature = 1.0f;   // kRandom: processed logits are divided by it when != 1
  int32_t top_k = 0;          // kRandom: 0 = off, else 0 < top_k < vocab
  double log_min_p = 0;       // kRandom: log(min_p); -inf = off
  double top_p = 1.0;         // kRandom: >= 1 = off
  int32_t filtered = 0;       // kRandom: 1 when min_p, top_k or top_p is on (picks the all -inf fallback)
  int32_t penalty_flags = 0;  // kPenalty* the row uses
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t edit_begin = 0;  // edits[edit_begin, edit_end): this row's edits, ascending distinct tokens
  int32_t edit_end = 0;
  uint64_t seed = 0;  // the request's generator seed
  int64_t step = 0;   // tokens generated so far (the uniform's counter)
  // Structured output: row mask_row of SampleArgs::masks is this row's allowed-token bitmask (bit i of
  // word i / 32 set = token i allowed); every other token's processed logit is -inf. -1: no mask.
  int32_t mask_row = -1;
  int32_t pad = 0;
};

// SampleSelector::status
inline constexpr int32_t kSelectorIdle = 0;
inline constexpr int32_t kSelectorPending = 1;  // top_p waits for top_k
inline constexpr int32_t kSelectorRunning = 2;
inline constexpr int32_t kSelectorDone = 3;
// CUDA only: the bucket and everything above it hold at most kSampleGatherCap elements, so the next
// round collects them (composite >= prefix << shift) and its last block finishes the search by sorting.
inline constexpr int32_t kSelectorGather = 4;
// SampleRowState::selector indices
inline constexpr int kSelectRaw = 0;   // the num_top best raw logits (count)
inline constexpr int kSelectTopK = 1;  // the top_k-th best processed value (count, value only)
inline constexpr int kSelectTopP = 2;  // the top_p pivot (mass, then count among its ties)

// One radix search. While running, the elements still in play are those whose composite key has
// `prefix` above bit `shift`; `need` is the count (or fixed-point mass) still to cover among them, from
// the top. When done, the selected elements are those with composite >= prefix << shift.
struct SampleSelector {
  uint64_t prefix = 0;
  uint64_t need = 0;    // mass selectors start at 0: top_p * total, set by the first round
  uint64_t target = 0;  // the whole need (N, top_k, or top_p's mass target once known)
  int32_t shift = 0;
  int32_t status = kSelectorIdle;
  int32_t mass_mode = 0;
  uint32_t count_above = 0;  // domain elements above the bucket (in earlier rounds' higher bins)
  uint32_t gathered = 0;     // CUDA: candidates collected by a gather round
  int32_t pad = 0;
};

// Per-row working state: initialised on the host by init_sample_row_state() before every call and
// uploaded with the params; the kernels fill the rest.
struct SampleRowState {
  uint32_t raw_max_key = 0;  // order key of the largest raw logit (0: none, all NaN)
  uint32_t k_key = 0;        // top_k: order key of the top_k-th best processed value (0: no cut)
  uint64_t proc_best = 0;    // (order key << 32) | (0xffffffff - id) of the processed argmax (0: none)
  SampleSelector sel[3];
  uint64_t draw_total = 0;  // fixed-point weight of the kept ids
  uint64_t lse_sum = 0;     // fixed-point sum of exp(raw - raw max)
  uint32_t rank = 0;
  uint32_t num_cand = 0;    // top-N candidates gathered by the finish phase
  int32_t token = -1;       // kRandom: the drawn id (-1 until drawn)
  uint32_t raw_sorted = 0;  // CUDA: the top-N already sorted by a gather round (cand_raw[0, raw_sorted))
};

// Where the per-row results go: one array of 32-bit words, `rows` entries per array (rows of the call).
struct SampleOutLayout {
  int64_t ids = 0;           // int32 [rows]: the token (first, so that its address does not move)
  int64_t logprob = 0;       // float [rows]: raw log-prob of the token (when want_logprobs)
  int64_t rank = 0;          // int32 [rows]
  int64_t num_top = 0;       // int32 [rows]: alternatives written (num_top, fewer only for NaN rows)
  int64_t top_ids = 0;       // int32 [rows, max_top], best first, lower id first on ties
  int64_t top_logprobs = 0;  // float [rows, max_top]
  int64_t words = 0;         // total size; the ids alone are the first `rows` words
};
inline SampleOutLayout sample_out_layout(int64_t rows, int64_t max_top) {
  SampleOutLayout l;
  l.ids = 0;
  l.logprob = rows;
  l.rank = 2 * rows;
  l.num_top = 3 * rows;
  l.top_ids = 4 * rows;
  l.top_logprobs = 4 * rows + rows * max_top;
  l.words = 4 * rows + 2 * rows * max_top;
  return l;
}

// Scratch: sized by sample_scratch_bytes() for up to max_rows rows; zeroed once before its first use
// (Backend::alloc zeroes), and every call leaves the parts that must be zero zeroed again.
struct SampleShape {
  int64_t max_rows = 0;
  int64_t vocab = 0;
  int64_t max_top = 0;  // at most kSampleMaxTop
};
inline constexpr int64_t kSampleMaxTop = 1024;
inline constexpr int64_t kSampleMaxVocab = int64_t{1} << 22;
inline constexpr int kSampleBins = 2048;
// CUDA: the most candidates a gather round collects and sorts in one block (>= kSampleMaxTop).
inline constexpr int kSampleGatherCap = 4096;
// Blocks cover at least this many elements of a row (the CUDA chunking; see sampling_cuda.cu).
inline constexpr int64_t kSampleMinChunk = 1024;

struct SampleScratchLayout {
  size_t proc = 0;        // float [max_rows, vocab]: processed logits of kRandom rows
  size_t hist_raw = 0;    // uint32 [max_rows, kSampleBins]
  size_t hist_proc = 0;   // uint32 [max_rows, kSampleBins]
  size_t hist_mass = 0;   // uint64 [max_rows, kSampleBins]
  size_t counters = 0;    // uint32 [max_rows]: blocks done in the current kernel
  size_t chunk_sums = 0;  // uint64 [max_rows, max_chunks]
  size_t cand_raw = 0;    // uint64 [max_rows, kSampleGatherCap]: raw composites (top-N)
  size_t cand_proc = 0;   // uint64 [max_rows, kSampleGatherCap]: processed composites (top_k / top_p)
  size_t control = 0;     // uint32 [16]: CUDA grid barrier and per-round activity counts
  size_t bytes = 0;
  int64_t max_chunks = 0;
};
SampleScratchLayout sample_scratch_layout(const SampleShape& shape);
inline size_t sample_scratch_bytes(const SampleShape& shape) {
  return sample_scratch_layout(shape).bytes;
}

struct SampleArgs {
  const float* logits = nullptr;  // [rows, ld] raw f32 logits, row r at logits + r * ld; read only
  int64_t ld = 0;
  int64_t rows = 0;  // <= shape.max_rows
  SampleShape shape;
  const SampleRowParams* params = nullptr;  // [rows]
  SampleRowState* state = nullptr;          // [rows], from init_sample_row_state(); updated
  const SampleEdit* edits = nullptr;        // the rows' edit ranges
  const float* biases = nullptr;            // the edits' bias ranges
  // Allowed-token bitmasks of the rows with a mask_row: [num_masks, mask_words] uint32, mask_words >=
  // ceil(vocab / 32); applied after the edits (the CPU sampler's apply_grammar_mask).
  const uint32_t* masks = nullptr;
  int64_t mask_words = 0;
  int32_t num_rounds = 0;                   // CUDA round kernels: sample_num_rounds(params, rows)
  bool any_random = true;                   // false: no row is kRandom (the draw phase is skipped)
  // CUDA: every phase in one cooperative kernel (grid barriers between phases, rounds stop once no row
  // needs one); false: one kernel per phase and round. Same results.
  bool fused = true;
  void* scratch = nullptr;  // sample_scratch_bytes(shape) bytes, 256-byte aligned
  int32_t* out = nullptr;   // [sample_out_layout(rows, shape.max_top).words]
};

// The state a row starts a call with.
SampleRowState init_sample_row_state(const SampleRowParams& params, int64_t vocab);
// Round kernels the CUDA version launches for these rows (the first histogram of top-N and top_k is
// made by its prepare kernel): 0 without selectors, 2 (top_k), 4 (top-N), 5 (top_p), 7 (top_k then top_p).
// The host version runs rounds until every selector is done.
int32_t sample_num_rounds(const SampleRowParams* params, int64_t rows);
// Bits of the id part of composite keys: ceil(log2(vocab)), at least 1.
int32_t sample_id_bits(int64_t vocab);
// Fixed-point scale of weights (2^shift = 1.0): 44 bits, fewer for huge vocabularies so that a sum over
// a row fits 64 bits.
int32_t sample_mass_shift(int64_t vocab);

namespace ref {
// The algorithm above on host memory, one row after another.
void sample(const SampleArgs& args);
}  // namespace ref
namespace cuda {
// Queued on ctx.stream; no allocation, no synchronization.
void sample(const SampleArgs& args, const CudaContext& ctx);
}  // namespace cuda

}  // namespace polylora::kernels
