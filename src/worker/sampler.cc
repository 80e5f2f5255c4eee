// worker/sampler.cc: the sampler's row processing (see sampler.h for the order and semantics).
// Scratch memory is per thread and grown on demand; the count / seen arrays are all-zero between uses.
// Must not: keep request state between calls.
#include "worker/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "common/error.h"

namespace polylora {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Below this many logits in a batch, sampling stays on the calling thread.
constexpr int64_t kParallelMinElements = 1 << 18;
// top_p sorts at most this many candidates outright; more are first binned by logit (kTopPBinsPerUnit
// bins per unit below the max, the last bin open-ended) so only the bin where the cumulative probability
// crosses top_p is sorted.
constexpr size_t kTopPSortAll = 2048;
constexpr int32_t kTopPBins = 4096;
constexpr float kTopPBinsPerUnit = 128.0f;
// When more than 1 / kScanKeptRatio of the vocabulary survives filtering, the kept ids are listed by a
// scan in id order instead of sorting them.
constexpr size_t kScanKeptRatio = 16;
// Up to this k, filtering finds the k-th largest logit with a heap before collecting candidates.
constexpr int64_t kHeapTopK = 1024;
// Above this k, top_ids() partially sorts an id array instead of keeping a small insertion buffer.
constexpr int64_t kInsertionTopK = 32;

struct Candidate {
  float logit;
  int32_t id;
};

// Descending logit, ascending id on ties.
inline bool better(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

struct Scratch {
  std::vector<float> raw;        // [vocab] unprocessed logits of the row (when log-probs are asked)
  std::vector<float> weights;    // [vocab] exp(logit - max) for an unfiltered draw
  std::vector<int32_t> counts;   // [vocab] output token counts; zero between uses
  std::vector<uint8_t> seen;     // [vocab] 1 when seen in prompt or output; zero between uses
  std::vector<int32_t> touched;  // distinct output ids of the row
  std::vector<Candidate> cand;   // filtering candidates
  std::vector<int32_t> kept;     // ids kept by filtering, ascending
};

Scratch& scratch(int64_t vocab) {
  thread_local Scratch s;
  auto n = static_cast<size_t>(vocab);
  if (s.counts.size() < n) {
    s.counts.resize(n, 0);
    s.seen.resize(n, 0);
  }
  return s;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// exp(x) for x <= 0 (Cephes' expf: a degree-6 polynomial on [-ln2/2, ln2/2] times 2^n, ~1 ulp); 0 for
// x < -87 and for -inf. The range test works on the bits (for negative floats a larger magnitude is a
// larger signed int32) and rounding uses the 1.5·2^23 trick, so `#pragma omp simd` loops vectorise it
// without -fno-trapping-math.
inline float exp_nonpositive(float x) {
  constexpr int32_t kMinBits = std::bit_cast<int32_t>(-87.0f);
  const int32_t bits = std::bit_cast<int32_t>(x);
  const int32_t underflow = -static_cast<int32_t>((bits > kMinBits) & (bits < 0));  // all ones: below -87
  const float xc = std::bit_cast<float>((bits & ~underflow) | (kMinBits & underflow));
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return std::bit_cast<float>(std::bit_cast<int32_t>(y * scale) & ~underflow);
}

inline void check_id(int32_t id, int64_t vocab) {
  CHECK_MSG(id >= 0 && id < vocab, "token id {} outside the vocabulary (size {})", id, vocab);
}

float max_logit(const float* logits, int64_t vocab) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < vocab; ++i) m = logits[i] > m ? logits[i] : m;
  return m;
}

// Inverse CDF: the first j whose cumulative weight exceeds u * total (weights[j] belongs to id_at(j));
// the last positive weight if rounding leaves the scan short of the target.
template <typename IdAt>
int32_t inverse_cdf(const float* weights, size_t n, double total, IdAt id_at, double u) {
  double target = u * total;
  double cum = 0;
  int32_t last = -1;
  for (size_t j = 0; j < n; ++j) {
    if (weights[j] <= 0) continue;
    cum += weights[j];
    last = id_at(j);
    if (cum > target) return last;
  }
  return last;
}

// Draw over every finite logit (no filtering asked).
int32_t sample_all(const float* logits, int64_t vocab, double u, std::vector<float>& weights) {
  float m = max_logit(logits, vocab);
  if (m == kNegInf) return 0;
  weights.resize(static_cast<size_t>(vocab));
  float* w = weights.data();
  double total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < vocab; ++i) {
    w[i] = exp_nonpositive(logits[i] - m);
    total += w[i];
  }
  return inverse_cdf(
      weights.data(), static_cast<size_t>(vocab), total, [](size_t j) { return static_cast<int32_t>(j); }, u);
}

// Draw over the ids in `kept` (ascending), in the same arithmetic as sample_all().
int32_t sample_kept(const float* logits, std::span<const int32_t> kept, double u,
                    std::vector<float>& weights) {
  if (kept.empty()) return 0;
  float m = kNegInf;
  for (int32_t id : kept) m = logits[id] > m ? logits[id] : m;
  if (m == kNegInf) return kept.front();
  weights.resize(kept.size());
  double total = 0;
  for (size_t j = 0; j < kept.size(); ++j) total += weights[j] = exp_nonpositive(logits[kept[j]] - m);
  return inverse_cdf(
      weights.data(), kept.size(), total, [&](size_t j) { return kept[j]; }, u);
}

// The k-th largest finite logit (-inf when fewer than k are finite), with a min-heap of k values.
float kth_largest(const float* logits, int64_t vocab, int64_t k) {
  thread_local std::vector<float> heap;
  heap.clear();
  const auto greater = std::greater<float>();
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (!(l > kNegInf)) continue;
    if (static_cast<int64_t>(heap.size()) < k) {
      heap.push_back(l);
      std::push_heap(heap.begin(), heap.end(), greater);
    } else if (l > heap.front()) {
      std::pop_heap(heap.begin(), heap.end(), greater);
      heap.back() = l;
      std::push_heap(heap.begin(), heap.end(), greater);
    }
  }
  return static_cast<int64_t>(heap.size()) == k ? heap.front() : kNegInf;
}

// Orders the candidates so that the shortest prefix of the descending order (lower id first on ties)
// whose probability, renormalised over the candidates, reaches top_p comes first, and drops the rest.
void top_p_prefix(std::vector<Candidate>& cand, float m, double top_p) {
  auto weight = [m](const Candidate& c) { return static_cast<double>(exp_nonpositive(c.logit - m)); };
  if (cand.size() <= kTopPSortAll) {
    double total = 0;
    for (const Candidate& c : cand) total += weight(c);
    std::sort(cand.begin(), cand.end(), better);
    const double target = top_p * total;
    double cum = 0;
    size_t keep = 0;
    while (keep < cand.size() && cum < target) cum += weight(cand[keep++]);
    cand.resize(std::max<size_t>(keep, 1));
    return;
  }
  // Bins in descending logit order: every bin before the crossing bin is kept whole, every bin after it
  // dropped; only the crossing bin is sorted, to find the worst token kept.
  auto bin_of = [m](const Candidate& c) {
    const float b = (m - c.logit) * kTopPBinsPerUnit;
    return b < static_cast<float>(kTopPBins - 1) ? static_cast<int32_t>(b) : kTopPBins - 1;
  };
  thread_local std::vector<double> bin_mass;
  bin_mass.assign(kTopPBins, 0.0);
  double total = 0;
  for (const Candidate& c : cand) {
    const double w = weight(c);
    bin_mass[bin_of(c)] += w;
    total += w;
  }
  const double target = top_p * total;
  double cum = 0;
  int32_t crossing = 0;
  while (crossing < kTopPBins - 1 && cum + bin_mass[crossing] < target) cum += bin_mass[crossing++];
  thread_local std::vector<Candidate> bin;
  bin.clear();
  for (const Candidate& c : cand)
    if (bin_of(c) == crossing) bin.push_back(c);
  std::sort(bin.begin(), bin.end(), better);
  size_t keep = 0;
  while (keep < bin.size() && (keep == 0 || cum < target)) cum += weight(bin[keep++]);
  const Candidate worst = bin[keep - 1];
  std::erase_if(cand, [&](const Candidate& c) { return better(worst, c); });
}

// min_p, top_k, top_p on `logits`. Returns true when nothing is filtered (every finite logit is kept and
// `kept` is untouched); otherwise fills `kept` with the surviving ids, ascending.
bool filter(const float* logits, int64_t vocab, double min_p, int64_t top_k, double top_p,
            std::vector<Candidate>& cand, std::vector<int32_t>& kept) {
  const bool use_min_p = min_p > 0.0;
  const bool use_top_k = top_k > 0 && top_k < vocab;
  const bool use_top_p = top_p < 1.0;
  if (!use_min_p && !use_top_k && !use_top_p) return true;
  kept.clear();
  const float m = max_logit(logits, vocab);
  if (m == kNegInf) return false;
  // min_p: prob_i >= min_p * max_prob  <=>  logit_i - max_logit >= log(min_p).
  const double log_min_p = use_min_p ? std::log(min_p) : -std::numeric_limits<double>::infinity();
  // top_k keeps every candidate whose logit is >= the k-th best (ties at the boundary are kept, as
  // vLLM's). min_p survivors are a prefix of the descending order, so the k-th best overall, when it
  // passes min_p, is also the k-th best survivor. Small k: found with a heap before collecting.
  float kth = kNegInf;
  const bool kth_first = use_top_k && top_k <= kHeapTopK;
  if (kth_first) kth = kth_largest(logits, vocab, top_k);
  cand.clear();
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (l > kNegInf && l >= kth && static_cast<double>(l) - m >= log_min_p)
      cand.push_back({l, static_cast<int32_t>(i)});
  }
  if (use_top_k && !kth_first && cand.size() > static_cast<size_t>(top_k)) {
    auto kth_it = cand.begin() + (top_k - 1);
    std::nth_element(cand.begin(), kth_it, cand.end(), better);
    const float v = kth_it->logit;
    auto tail = std::partition(kth_it + 1, cand.end(), [v](const Candidate& c) { return c.logit >= v; });
    cand.erase(tail, cand.end());
  }
  if (use_top_p && cand.size() > 1) top_p_prefix(cand, m, top_p);
  kept.reserve(cand.size());
  if (cand.size() * kScanKeptRatio < static_cast<size_t>(vocab)) {
    for (const Candidate& c : cand) kept.push_back(c.id);
    std::sort(kept.begin(), kept.end());
    return false;
  }
  // Many survivors: they are exactly the tokens at least as good as the worst of them (every step keeps
  // a prefix of the descending order), so a scan lists them in id order without sorting.
  if (cand.empty()) return false;
  const Candidate worst = *std::min_element(
      cand.begin(), cand.end(), [](const Candidate& a, const Candidate& b) { return better(b, a); });
  for (int64_t i = 0; i < vocab; ++i)
    if (better({logits[i], static_cast<int32_t>(i)}, worst) || i == worst.id)
      kept.push_back(static_cast<int32_t>(i));
  return false;
}

}  // namespace

uint64_t assign_seed(const SamplingParams& params) {
  if (params.seed) return *params.seed;
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

double sampler_uniform(uint64_t seed, int64_t step) {
  uint64_t h = splitmix64(splitmix64(seed) + static_cast<uint64_t>(step));
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

double log_sum_exp(const float* logits, int64_t vocab) {
  const float m = max_logit(logits, vocab);
  if (!std::isfinite(m)) return m;
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < vocab; ++i) sum += exp_nonpositive(logits[i] - m);
  return m + std::log(sum);
}

std::vector<int32_t> top_ids(const float* logits, int64_t vocab, int64_t k) {
  k = std::min(k, vocab);
  if (k <= 0) return {};
  std::vector<int32_t> ids;
  if (k > kInsertionTopK) {
    ids.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) ids[i] = static_cast<int32_t>(i);
    auto by_logit = [logits](int32_t a, int32_t b) { return better({logits[a], a}, {logits[b], b}); };
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_logit);
    ids.resize(static_cast<size_t>(k));
    return ids;
  }
  // Small k: an insertion buffer, best first. Ids arrive ascending, so a tie never displaces an earlier id.
  ids.reserve(static_cast<size_t>(k));
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (static_cast<int64_t>(ids.size()) == k && !(l > logits[ids.back()])) continue;
    if (static_cast<int64_t>(ids.size()) == k) ids.pop_back();
    auto pos = std::find_if(ids.begin(), ids.end(), [&](int32_t j) { return l > logits[j]; });
    ids.insert(pos, static_cast<int32_t>(i));
  }
  return ids;
}

void apply_min_tokens(float* logits, int64_t vocab, const SamplingParams& params, int64_t num_output,
                      std::span<const int32_t> eos_ids) {
  if (num_output >= params.min_tokens) return;
  for (int32_t id : params.stop_token_ids) {
    check_id(id, vocab);
    logits[id] = kNegInf;
  }
  if (params.ignore_eos) return;
  for (int32_t id : eos_ids) {
    check_id(id, vocab);
    logits[id] = kNegInf;
  }
}

void apply_logit_bias(float* logits, int64_t vocab, const SamplingParams& params) {
  for (const auto& [id, bias] : params.logit_bias) {
    check_id(id, vocab);
    logits[id] += static_cast<float>(bias);
  }
}

void apply_allowed_token_ids(float* logits, int64_t vocab, const SamplingParams& params) {
  if (params.allowed_token_ids.empty()) return;
  std::vector<float> keep(params.allowed_token_ids.size());
  for (size_t i = 0; i < keep.size(); ++i) {
    check_id(params.allowed_token_ids[i], vocab);
    keep[i] = logits[params.allowed_token_ids[i]];
  }
  std::fill(logits, logits + vocab, kNegInf);
  for (size_t i = 0; i < keep.size(); ++i) logits[params.allowed_token_ids[i]] = keep[i];
}

void apply_grammar_mask(float* logits, int64_t vocab, std::span<const uint32_t> mask) {
  if (mask.empty()) return;
  CHECK_MSG(mask.size() * 32 >= static_cast<size_t>(vocab), "grammar mask of {} words for vocabulary {}", mask.size(),
            vocab);
  for (int64_t w = 0; w * 32 < vocab; ++w) {
    const uint32_t bits = mask[static_cast<size_t>(w)];
    if (bits == 0xFFFFFFFFu) continue;
    const int64_t end = std::min<int64_t>(vocab, w * 32 + 32);
    for (int64_t i = w * 32; i < end; ++i)
      if (!(bits >> (i - w * 32) & 1u)) logits[i] = kNegInf;
  }
}

void apply_bad_words(float* logits, int64_t vocab, const SamplingParams& params,
                     std::span<const int32_t> output_ids) {
  for (const auto& word : params.bad_words_token_ids) {
    if (word.empty() || word.size() > output_ids.size() + 1) continue;
    const size_t prefix = word.size() - 1;
    if (std::equal(word.begin(), word.begin() + static_cast<std::ptrdiff_t>(prefix),
                   output_ids.end() - static_cast<std::ptrdiff_t>(prefix))) {
      check_id(word.back(), vocab);
      logits[word.back()] = kNegInf;
    }
  }
}

void apply_penalties(float* logits, int64_t vocab, const SamplingParams& params,
                     std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids) {
  const bool use_rep = params.repetition_penalty != 1.0;
  const bool use_freq = params.frequency_penalty != 0.0;
  const bool use_pres = params.presence_penalty != 0.0;
  if (!use_rep && !use_freq && !use_pres) return;
  Scratch& s = scratch(vocab);
  s.touched.clear();
  for (int32_t id : output_ids) {
    check_id(id, vocab);
    if (s.counts[id]++ == 0) s.touched.push_back(id);
  }
  if (use_rep) {
    const auto rep = static_cast<float>(params.repetition_penalty);
    auto penalize = [&](int32_t id) {
      if (s.seen[id]) return;
      s.seen[id] = 1;
      logits[id] = logits[id] > 0 ? logits[id] / rep : logits[id] * rep;
    };
    for (int32_t id : prompt_ids) {
      check_id(id, vocab);
      penalize(id);
    }
    for (int32_t id : s.touched) penalize(id);
    for (int32_t id : prompt_ids) s.seen[id] = 0;
    for (int32_t id : s.touched) s.seen[id] = 0;
  }
  const auto freq = static_cast<float>(params.frequency_penalty);
  const auto pres = static_cast<float>(params.presence_penalty);
  for (int32_t id : s.touched) {
    if (use_freq) logits[id] -= freq * static_cast<float>(s.counts[id]);
    if (use_pres) logits[id] -= pres;
    s.counts[id] = 0;
  }
}

int32_t argmax(const float* logits, int64_t vocab) {
  const float m = max_logit(logits, vocab);
  for (int64_t i = 0; i < vocab; ++i)
    if (logits[i] == m) return static_cast<int32_t>(i);
  return 0;
}

std::vector<int32_t> filter_min_p_top_k_top_p(const float* logits, int64_t vocab, double min_p, int64_t top_k,
                                              double top_p) {
  std::vector<Candidate> cand;
  std::vector<int32_t> kept;
  if (filter(logits, vocab, min_p, top_k, top_p, cand, kept)) {
    for (int64_t i = 0; i < vocab; ++i)
      if (logits[i] > kNegInf) kept.push_back(static_cast<int32_t>(i));
  }
  return kept;
}

int32_t sample_from(const float* logits, std::span<const int32_t> kept, double u) {
  std::vector<float> weights;
  return sample_kept(logits, kept, u, weights);
}

Sampler::Sampler(int64_t vocab_size) : vocab_size_(vocab_size) {
  CHECK(vocab_size > 0);
}

SampleResult Sampler::sample_row(const SamplerRow& row) const {
  CHECK(row.logits != nullptr && row.params != nullptr);
  const SamplingParams& params = *row.params;
  const int64_t vocab = vocab_size_;
  float* logits = row.logits;
  Scratch& s = scratch(vocab);
  SampleResult result;

  // (1) Raw log-probs: of the logits before any processing.
  double lse = 0;
  if (params.logprobs) {
    lse = log_sum_exp(logits, vocab);
    for (int32_t id : top_ids(logits, vocab, *params.logprobs))
      result.top.push_back({id, static_cast<float>(logits[id] - lse)});
    s.raw.assign(logits, logits + vocab);
  }

  // (2)-(4) Logits processors and penalties.
  const auto num_output = static_cast<int64_t>(row.output_ids.size());
  apply_min_tokens(logits, vocab, params, num_output, row.eos_ids);
  apply_logit_bias(logits, vocab, params);
  apply_allowed_token_ids(logits, vocab, params);
  apply_bad_words(logits, vocab, params, row.output_ids);
  apply_grammar_mask(logits, vocab, row.grammar_mask);
  apply_penalties(logits, vocab, params, row.prompt_ids, row.output_ids);

  if (params.greedy()) {
    result.token = argmax(logits, vocab);  // (5)
  } else {
    const auto temperature = static_cast<float>(params.temperature);  // (6)
    if (temperature != 1.0f)
      for (int64_t i = 0; i < vocab; ++i) logits[i] /= temperature;
    const double u = sampler_uniform(row.seed, num_output);
    if (filter(logits, vocab, params.min_p, params.top_k, params.top_p, s.cand, s.kept)) {  // (7)-(9)
      result.token = sample_all(logits, vocab, u, s.weights);                               // (10)
    } else if (s.kept.empty()) {
      result.token = argmax(logits, vocab);
    } else {
      result.token = sample_kept(logits, s.kept, u, s.weights);
    }
  }

  if (params.logprobs) {
    const float raw = s.raw[result.token];
    result.logprob = static_cast<float>(raw - lse);
    int64_t rank = 0;
    const float* raw_logits = s.raw.data();
#pragma omp simd reduction(+ : rank)
    for (int64_t i = 0; i < vocab; ++i) rank += raw_logits[i] >= raw;
    result.rank = rank;
  }
  return result;
}

std::vector<SampleResult> Sampler::sample(std::span<const SamplerRow> rows) const {
  std::vector<SampleResult> results(rows.size());
  const auto num_rows = static_cast<int64_t>(rows.size());
  const bool parallel = num_rows > 1 && num_rows * vocab_size_ >= kParallelMinElements;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t r = 0; r < num_rows; ++r) results[r] = sample_row(rows[r]);
  return results;
}

SampleResult Sampler::prompt_logprob(const float* logits, int64_t vocab, int32_t token, int64_t top_k) {
  check_id(token, vocab);
  const double lse = log_sum_exp(logits, vocab);
  SampleResult result;
  result.token = token;
  result.logprob = static_cast<float>(logits[token] - lse);
  int64_t rank = 0;
  const float token_logit = logits[token];
#pragma omp simd reduction(+ : rank)
  for (int64_t i = 0; i < vocab; ++i) rank += logits[i] >= token_logit;
  result.rank = rank;
  for (int32_t id : top_ids(logits, vocab, top_k))
    result.top.push_back({id, static_cast<float>(logits[id] - lse)});
  return result;
}

}  // namespace polylora
