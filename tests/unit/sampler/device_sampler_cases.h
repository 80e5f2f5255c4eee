// tests/unit/sampler/device_sampler_cases.h: DeviceSampler against the CPU Sampler on any backend, shared by
// tests/unit/sampler/device_sampler_test.cc (CPU backend: the op's host version) and
// tests/gpu/sampler_gpu_test.cc (CUDA kernels). Each case function uploads its logits through the backend,
// runs both samplers on the same rows and checks the results:
//   tokens: equal (greedy, forced, processors: exactly; seeded draws: at least `min_equal` of the rows,
//           the rest being fixed-point rounding at a draw or top_p boundary);
//   logprob of the token within 1e-4 (absolute), rank equal, top-N ids equal, their logprobs within 1e-4.
// Must not: hold tests of its own (the TESTs live in the two files above).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "worker/device_sampler.h"
#include "worker/sampler.h"

namespace polylora::sampler_cases {

struct Case {
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  std::vector<int32_t> eos;
  uint64_t seed = 0;
  std::optional<int32_t> forced;
  std::vector<uint32_t> mask;  // structured output: allowed-token bitmask (empty: none)
};

inline std::vector<float> normal_logits(int64_t rows, int64_t vocab, uint64_t seed, float stddev = 2.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(rows * vocab));
  for (float& x : v) x = normal(rng);
  return v;
}

// Logits rounded to multiples of 1/8: many exact ties (the id rounds of the selection).
inline std::vector<float> tied_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  std::vector<float> v = normal_logits(rows, vocab, seed, 1.5f);
  for (float& x : v) x = std::round(x * 8.0f) / 8.0f;
  return v;
}

// Logits in backend memory for the life of the object.
class DeviceRows {
 public:
  DeviceRows(Backend& be, const std::vector<float>& host) : be_(be) {
    ptr_ = static_cast<float*>(be_.alloc(std::max<size_t>(1, host.size()) * sizeof(float)));
    be_.copy_to_device(ptr_, host.data(), host.size() * sizeof(float));
  }
  ~DeviceRows() {
    be_.synchronize();
    be_.free(ptr_);
  }
  DeviceRows(const DeviceRows&) = delete;
  DeviceRows& operator=(const DeviceRows&) = delete;
  const float* get() const { return ptr_; }

 private:
  Backend& be_;
  float* ptr_ = nullptr;
};

inline std::vector<SampleResult> cpu_results(const std::vector<float>& logits, int64_t vocab,
                                             const std::vector<Case>& cases) {
  Sampler sampler(vocab);
  std::vector<SampleResult> out;
  std::vector<float> row(static_cast<size_t>(vocab));
  for (size_t r = 0; r < cases.size(); ++r) {
    const Case& c = cases[r];
    std::copy(logits.begin() + static_cast<int64_t>(r) * vocab,
              logits.begin() + static_cast<int64_t>(r + 1) * vocab, row.begin());
    if (c.forced) {
      out.push_back(
          Sampler::prompt_logprob(row.data(), vocab, *c.forced, c.params.prompt_logprobs.value_or(0)));
    } else {
      SamplerRow sr{row.data(), &c.params, c.prompt, c.output, c.eos, c.seed, c.mask};
      out.push_back(sampler.sample_row(sr));
    }
  }
  return out;
}

inline std::vector<DeviceSampleRow> device_rows(const std::vector<Case>& cases) {
  std::vector<DeviceSampleRow> rows;
  for (const Case& c : cases) rows.push_back({&c.params, c.prompt, c.output, c.eos, c.seed, c.forced, c.mask});
  return rows;
}

inline std::vector<SampleResult> device_results(DeviceSampler& ds, const float* dev_logits,
                                                const std::vector<Case>& cases) {
  const std::vector<DeviceSampleRow> rows = device_rows(cases);
  ds.launch(dev_logits, rows);
  return ds.wait();
}

// Log-probs within 1e-4, or equal (both -inf).
inline bool close(float a, float b) {
  return a == b || std::fabs(a - b) <= 1e-4f;
}

// Compares row by row; returns the number of rows whose tokens differ. Log-prob fields are compared
// where both report them (rank and logprob of the token only when the tokens agree).
inline int64_t compare(const std::vector<SampleResult>& cpu, const std::vector<SampleResult>& dev,
                       const std::vector<Case>& cases, const std::string& what) {
  EXPECT_EQ(cpu.size(), dev.size()) << what;
  int64_t differ = 0;
  for (size_t r = 0; r < std::min(cpu.size(), dev.size()); ++r) {
    const SampleResult& a = cpu[r];
    const SampleResult& b = dev[r];
    const bool logprobs = cases[r].forced.has_value() || cases[r].params.logprobs.has_value();
    if (a.token != b.token) {
      ++differ;
      continue;
    }
    if (!logprobs) {
      EXPECT_TRUE(b.top.empty() && b.rank == 0) << what << " row " << r << ": log-probs not asked for";
      continue;
    }
    EXPECT_TRUE(close(a.logprob, b.logprob))
        << what << " row " << r << ": " << a.logprob << " vs " << b.logprob;
    EXPECT_EQ(a.rank, b.rank) << what << " row " << r;
    EXPECT_EQ(a.top.size(), b.top.size()) << what << " row " << r;
    for (size_t j = 0; j < std::min(a.top.size(), b.top.size()); ++j) {
      EXPECT_EQ(a.top[j].id, b.top[j].id) << what << " row " << r << " top " << j;
      EXPECT_TRUE(close(a.top[j].logprob, b.top[j].logprob))
          << what << " row " << r << " top " << j << ": " << a.top[j].logprob << " vs " << b.top[j].logprob;
    }
  }
  return differ;
}

// Runs `cases` over `logits` on both samplers; tokens must agree on at least min_equal of the rows.
inline void check_cases(Backend& be, int64_t vocab, const std::vector<float>& logits,
                        const std::vector<Case>& cases, double min_equal, const std::string& what,
                        int64_t max_top = 20) {
  DeviceRows dev(be, logits);
  DeviceSampler ds(be, vocab, static_cast<int64_t>(cases.size()), max_top);
  const auto cpu = cpu_results(logits, vocab, cases);
  const auto got = device_results(ds, dev.get(), cases);
  const int64_t differ = compare(cpu, got, cases, what);
  const auto rows = static_cast<double>(cases.size());
  EXPECT_GE((rows - static_cast<double>(differ)) / rows, min_equal)
      << what << ": " << differ << " of " << cases.size() << " tokens differ";
}

// --- the cases -------------------------------------------------------------------------------------------

inline SamplingParams greedy(std::optional<int64_t> logprobs = std::nullopt) {
  SamplingParams p;
  p.temperature = 0.0;
  p.logprobs = logprobs;
  return p;
}

// Greedy rows: identical ids, log-probs, ranks and top-N (0, 1, 5, 20 alternatives, none).
inline void greedy_matches(Backend& be, int64_t vocab, int64_t rows) {
  const auto logits = normal_logits(rows, vocab, 11 + static_cast<uint64_t>(vocab));
  std::vector<Case> cases(static_cast<size_t>(rows));
  const std::optional<int64_t> tops[] = {std::nullopt, 0, 1, 5, 20};
  for (int64_t r = 0; r < rows; ++r) cases[r].params = greedy(tops[r % 5]);
  check_cases(be, vocab, logits, cases, 1.0, "greedy vocab " + std::to_string(vocab));
}

// Seeded draws under every filter combination (temperature, top_k, top_p, min_p), with log-probs on some.
inline std::vector<Case> seeded_cases(int64_t rows, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Case> cases(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    SamplingParams& p = cases[r].params;
    p.temperature = std::uniform_real_distribution<double>(0.3, 1.5)(rng);
    if (r % 8 == 1) p.temperature = 1.0;
    const int kind = static_cast<int>(r % 7);
    if (kind == 1 || kind == 4 || kind == 6) p.top_k = std::uniform_int_distribution<int64_t>(1, 200)(rng);
    if (kind == 5) p.top_k = std::uniform_int_distribution<int64_t>(1000, 6000)(rng);
    if (kind == 2 || kind == 4 || kind == 5)
      p.top_p = std::uniform_real_distribution<double>(0.05, 0.99)(rng);
    if (kind == 3 || kind == 6) p.min_p = std::uniform_real_distribution<double>(0.001, 0.3)(rng);
    if (r % 3 == 0) p.logprobs = static_cast<int64_t>(r % 21);
    cases[r].seed = rng();
    cases[r].output.assign(static_cast<size_t>(r % 13), 0);  // the step of the uniform
  }
  (void)vocab;
  return cases;
}

inline void seeded_matches(Backend& be, int64_t vocab, int64_t rows, bool tied, double min_equal) {
  const auto logits = tied ? tied_logits(rows, vocab, 21) : normal_logits(rows, vocab, 22, 3.0f);
  check_cases(be, vocab, logits, seeded_cases(rows, vocab, 23), min_equal,
              std::string(tied ? "tied " : "") + "seeded vocab " + std::to_string(vocab));
}

// A seeded row gives the same result alone and at any place of a batch of 64.
inline void batch_invariant(Backend& be, int64_t vocab) {
  constexpr int64_t kRows = 64;
  const auto logits = normal_logits(kRows, vocab, 31, 3.0f);
  std::vector<Case> cases = seeded_cases(kRows, vocab, 32);
  DeviceRows dev(be, logits);
  DeviceSampler ds(be, vocab, kRows, 20);
  const auto batch = device_results(ds, dev.get(), cases);
  for (int64_t r : {int64_t{0}, int64_t{5}, int64_t{33}, kRows - 1}) {
    std::vector<Case> one = {cases[r]};
    DeviceRows row(be, std::vector<float>(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab));
    const auto alone = device_results(ds, row.get(), one);
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(alone[0].token, batch[r].token) << "row " << r;
    EXPECT_EQ(alone[0].rank, batch[r].rank) << "row " << r;
    EXPECT_EQ(alone[0].logprob, batch[r].logprob) << "row " << r;
    ASSERT_EQ(alone[0].top.size(), batch[r].top.size()) << "row " << r;
    for (size_t j = 0; j < alone[0].top.size(); ++j) EXPECT_EQ(alone[0].top[j].id, batch[r].top[j].id);
  }
}

// Penalties, logit bias and min_tokens, each built to change the argmax; greedy and seeded rows.
inline void processors_match(Backend& be, int64_t vocab) {
  constexpr int64_t kRows = 12;
  std::vector<float> logits = normal_logits(kRows, vocab, 41);
  std::vector<Case> cases(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    float* row = logits.data() + r * vocab;
    const auto best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    const int32_t second = (best + 17) % static_cast<int32_t>(vocab);
    row[second] = row[best] - 0.01f;  // a close runner-up that the processors can promote
    Case& c = cases[r];
    c.params = r < 6 ? greedy(5) : SamplingParams{};
    if (r >= 6) {
      c.params.temperature = 0.05;  // nearly greedy: the processed argmax wins the seeded draw
      c.params.top_k = 3;
      c.params.logprobs = 3;
      c.seed = 1000 + static_cast<uint64_t>(r);
    }
    switch (r % 6) {
      case 0:  // repetition penalty on a positive best logit seen in the prompt
        row[best] = std::fabs(row[best]) + 1.0f;
        row[second] = row[best] - 0.01f;
        c.params.repetition_penalty = 1.5;
        c.prompt = {best, best, 3};
        break;
      case 1:  // frequency penalty on an output token
        c.params.frequency_penalty = 0.2;
        c.output = {best, best, 7};
        break;
      case 2:  // presence penalty
        c.params.presence_penalty = 0.5;
        c.output = {best};
        break;
      case 3:  // logit bias, twice on one id (added in order)
        c.params.logit_bias = {{second, 0.5}, {best, -0.25}, {second, 0.125}};
        break;
      case 4:  // min_tokens masks EOS until reached
        c.params.min_tokens = 4;
        c.eos = {best};
        c.output = {1, 2};
        break;
      case 5:  // min_tokens masks stop_token_ids; ignore_eos keeps EOS
        c.params.min_tokens = 2;
        c.params.stop_token_ids = {best};
        c.params.ignore_eos = true;
        c.eos = {second};
        break;
    }
  }
  DeviceRows dev(be, logits);
  DeviceSampler ds(be, vocab, kRows, 20);
  const auto cpu = cpu_results(logits, vocab, cases);
  const auto got = device_results(ds, dev.get(), cases);
  EXPECT_EQ(compare(cpu, got, cases, "processors"), 0);
  for (int64_t r = 0; r < kRows; ++r) {
    const float* row = logits.data() + r * vocab;
    const auto best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    EXPECT_NE(got[r].token, best) << "row " << r << ": the processors must move the argmax";
  }
}

// Forced rows (prompt logprobs) mixed with sampled ones.
inline void forced_match(Backend& be, int64_t vocab) {
  constexpr int64_t kRows = 9;
  const auto logits = normal_logits(kRows, vocab, 51);
  std::vector<Case> cases(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    if (r % 3 == 2) {
      cases[r].params = greedy(2);
      continue;
    }
    cases[r].params.prompt_logprobs = r % 4 == 0 ? std::optional<int64_t>() : std::optional<int64_t>(r * 2);
    cases[r].forced = static_cast<int32_t>((r * 7919) % vocab);
  }
  check_cases(be, vocab, logits, cases, 1.0, "forced");
}

// Launching twice before wait() returns the second launch's results; launch, wait, launch, wait works;
// device_ids() holds the last launch's ids.
inline void double_buffered(Backend& be, int64_t vocab) {
  constexpr int64_t kRows = 8;
  const auto a = normal_logits(kRows, vocab, 61), b = normal_logits(kRows, vocab, 62);
  std::vector<Case> cases(kRows);
  for (auto& c : cases) c.params = greedy(3);
  DeviceRows da(be, a), db(be, b);
  DeviceSampler ds(be, vocab, kRows, 20);
  EXPECT_TRUE(ds.wait().empty());
  const auto rows = device_rows(cases);
  const auto cpu_a = cpu_results(a, vocab, cases), cpu_b = cpu_results(b, vocab, cases);
  ds.launch(da.get(), rows);
  ds.launch(db.get(), rows);
  EXPECT_EQ(compare(cpu_b, ds.wait(), cases, "second of two launches"), 0);
  std::vector<int32_t> ids(kRows);
  be.copy_to_host(ids.data(), ds.device_ids(), ids.size() * sizeof(int32_t));
  for (int64_t r = 0; r < kRows; ++r) EXPECT_EQ(ids[r], cpu_b[r].token);
  for (int i = 0; i < 3; ++i) {
    ds.launch(da.get(), rows);
    EXPECT_EQ(compare(cpu_a, ds.wait(), cases, "alternating a"), 0);
    ds.launch(db.get(), rows);
    EXPECT_EQ(compare(cpu_b, ds.wait(), cases, "alternating b"), 0);
  }
  EXPECT_EQ(compare(cpu_b, ds.wait(), cases, "wait twice"), 0);
}

// Empirical distribution of kDraws seeded draws (step i uses uniform i) against the renormalised softmax:
// each frequency within 5 sigma (+1e-4) and chi-square <= df + 6 sqrt(2 df), as the CPU sampler's tests.
inline void distribution_matches(Backend& be, const SamplingParams& params, const std::vector<float>& row,
                                 const std::vector<double>& expected, int draws = 200000) {
  const auto vocab = static_cast<int64_t>(row.size());
  constexpr int64_t kBatch = 500;
  std::vector<float> logits;
  for (int64_t r = 0; r < kBatch; ++r) logits.insert(logits.end(), row.begin(), row.end());
  DeviceRows dev(be, logits);
  DeviceSampler ds(be, vocab, kBatch, 0);
  const std::vector<int32_t> history(static_cast<size_t>(draws), 0);
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  std::vector<DeviceSampleRow> rows(kBatch);
  for (int start = 0; start < draws; start += kBatch) {
    const int64_t n = std::min<int64_t>(kBatch, draws - start);
    for (int64_t r = 0; r < n; ++r)
      rows[r] = {&params, {},   std::span<const int32_t>(history.data(), static_cast<size_t>(start + r)),
                 {},      2024, {}, {}};
    ds.launch(dev.get(), std::span<const DeviceSampleRow>(rows.data(), static_cast<size_t>(n)));
    for (const SampleResult& res : ds.wait()) ++counts[static_cast<size_t>(res.token)];
  }
  double chi2 = 0;
  int64_t df = -1;
  for (int64_t t = 0; t < vocab; ++t) {
    const double p = expected[t];
    const double p_hat = static_cast<double>(counts[t]) / draws;
    if (p == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " has probability 0";
      continue;
    }
    EXPECT_LE(std::fabs(p_hat - p), 5 * std::sqrt(p * (1 - p) / draws) + 1e-4) << "token " << t;
    const double e = p * draws;
    if (e >= 5) {
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
      ++df;
    }
  }
  if (df > 0) {
    EXPECT_LE(chi2, df + 6 * std::sqrt(2.0 * df)) << "df " << df;
  }
}

inline std::vector<double> softmax_kept(const std::vector<float>& row, double temperature,
                                        const std::vector<int32_t>& kept) {
  double m = -1e300;
  for (int32_t id : kept) m = std::max(m, row[id] / temperature);
  std::vector<double> p(row.size(), 0.0);
  double sum = 0;
  for (int32_t id : kept) sum += p[id] = std::exp(row[id] / temperature - m);
  for (double& x : p) x /= sum;
  return p;
}

inline void distributions_match(Backend& be) {
  std::vector<float> row = normal_logits(1, 64, 71, 1.5f);
  std::vector<int32_t> all(64);
  for (int32_t i = 0; i < 64; ++i) all[i] = i;
  distribution_matches(be, SamplingParams{}, row, softmax_kept(row, 1.0, all));
  SamplingParams filtered;
  filtered.temperature = 0.7;
  filtered.top_k = 20;
  filtered.top_p = 0.9;
  filtered.min_p = 0.02;
  std::vector<float> scaled(row.size());
  for (size_t i = 0; i < row.size(); ++i) scaled[i] = row[i] / static_cast<float>(filtered.temperature);
  const auto kept =
      filter_min_p_top_k_top_p(scaled.data(), 64, filtered.min_p, filtered.top_k, filtered.top_p);
  ASSERT_GT(kept.size(), 1u);
  distribution_matches(be, filtered, row, softmax_kept(row, 0.7, kept));
}

// Rows whose every logit is -inf, or whose only finite logit is masked: the CPU sampler's fallbacks, and
// top-N over a row of ties.
inline void degenerate_rows_match(Backend& be) {
  constexpr int64_t kVocab = 3000;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits(5 * kVocab, -inf);
  logits[kVocab + 17] = 1.0f;
  logits[2 * kVocab + 5] = 2.0f;
  logits[2 * kVocab + 6] = 2.0f;  // a tie: the lower id first
  logits[3 * kVocab + 9] = 0.5f;
  std::fill(logits.begin() + 4 * kVocab, logits.end(), 0.25f);  // all equal
  std::vector<Case> cases(5);
  cases[0].params.top_k = 5;  // nothing finite, filtered: the first -inf id
  cases[1].params.top_p = 0.5;
  cases[1].params.logprobs = 3;
  cases[2].params = greedy(2);
  cases[3].params.min_tokens = 1;  // the only finite id is masked
  cases[3].eos = {9};
  cases[3].params.min_p = 0.1;
  cases[4].params.top_p = 0.3;  // ties everywhere: the lowest 30% of ids stay
  cases[4].params.logprobs = 20;
  cases[4].seed = 5;
  check_cases(be, kVocab, logits, cases, 1.0, "degenerate");
}

// Structured-output bitmasks: rows of every kind (greedy, seeded with each filter, log-probs, processors,
// a forced row, rows without a mask between them) with masks that exclude the argmax, allow one token,
// allow only ids in the last partial word, allow a random third, or allow nothing. Tokens equal the CPU
// sampler's (greedy and single-token rows exactly, seeded ones on >= min_equal of the rows), every token
// a masked row draws is allowed by its mask, and the log-probs reported are the raw (unmasked) ones.
inline std::vector<Case> masked_cases(int64_t rows, int64_t vocab, const std::vector<float>& logits,
                                      uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto words = static_cast<size_t>((vocab + 31) / 32);
  std::vector<Case> cases(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    Case& c = cases[static_cast<size_t>(r)];
    const float* row = logits.data() + r * vocab;
    const auto best = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    switch (r % 6) {
      case 0: c.params = greedy(r % 12 == 0 ? std::optional<int64_t>(4) : std::nullopt); break;
      case 1: c.params.top_k = 40; break;
      case 2: c.params.top_p = 0.9; c.params.temperature = 0.7; break;
      case 3: c.params.min_p = 0.05; c.params.logprobs = 3; break;
      case 4: c.params.temperature = 1.3; c.params.logit_bias = {{best, -0.5}}; break;
      case 5: c.params = greedy(); c.params.min_tokens = 3; c.eos = {(best + 1) % static_cast<int32_t>(vocab)}; break;
    }
    c.seed = seed + static_cast<uint64_t>(r);
    if (r % 7 == 6) continue;  // no mask
    if (r % 13 == 10) {
      c.forced = static_cast<int32_t>(r % vocab);  // a forced row reports raw log-probs; a mask is ignored
      c.params.prompt_logprobs = 2;
    }
    c.mask.assign(words, 0);
    auto allow = [&](int64_t id) { c.mask[static_cast<size_t>(id >> 5)] |= 1u << (id & 31); };
    switch (r % 5) {
      case 0:  // everything but the argmax
        std::fill(c.mask.begin(), c.mask.end(), 0xFFFFFFFFu);
        c.mask[static_cast<size_t>(best >> 5)] &= ~(1u << (best & 31));
        break;
      case 1:  // one token
        allow((best * 7 + 3) % vocab);
        break;
      case 2:  // the last partial word only (and its bits past the vocabulary, which must not matter)
        for (int64_t id = (vocab - 1) / 32 * 32; id < vocab; ++id) allow(id);
        c.mask.back() = 0xFFFFFFFFu;
        break;
      case 3:  // a random third
        for (int64_t id = 0; id < vocab; ++id)
          if (rng() % 3 == 0) allow(id);
        break;
      case 4:  // nothing (the all -inf fallbacks)
        break;
    }
  }
  return cases;
}

inline void grammar_masks_match(Backend& be, int64_t vocab, int64_t rows, double min_equal) {
  const auto logits = normal_logits(rows, vocab, 91 + static_cast<uint64_t>(vocab));
  const auto cases = masked_cases(rows, vocab, logits, 92);
  DeviceRows dev(be, logits);
  DeviceSampler ds(be, vocab, rows, 20);
  const auto cpu = cpu_results(logits, vocab, cases);
  const auto got = device_results(ds, dev.get(), cases);
  const std::string what = "masks vocab " + std::to_string(vocab);
  const int64_t differ = compare(cpu, got, cases, what);
  EXPECT_GE(static_cast<double>(rows - differ) / static_cast<double>(rows), min_equal)
      << what << ": " << differ << " of " << rows << " tokens differ";
  for (int64_t r = 0; r < rows; ++r) {
    const Case& c = cases[static_cast<size_t>(r)];
    const int32_t t = got[static_cast<size_t>(r)].token;
    const bool exact = c.params.greedy() || (!c.mask.empty() && r % 5 == 1);
    if (exact) {
      EXPECT_EQ(t, cpu[static_cast<size_t>(r)].token) << what << " row " << r;
    }
    const bool any_allowed = std::any_of(c.mask.begin(), c.mask.end(), [](uint32_t w) { return w != 0; });
    if (!c.mask.empty() && !c.forced && any_allowed && r % 5 != 2) {
      EXPECT_TRUE(c.mask[static_cast<size_t>(t >> 5)] >> (t & 31) & 1u) << what << " row " << r << " token " << t;
    }
    if (!c.mask.empty() && r % 5 == 2 && !c.forced) {
      EXPECT_GE(t, (vocab - 1) / 32 * 32) << what << " row " << r;
    }
    if (!c.forced && c.params.logprobs && t >= 0) {  // the raw log-prob of the token
      const float* row = logits.data() + r * vocab;
      double m = *std::max_element(row, row + vocab), sum = 0;
      for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i]) - m);
      EXPECT_NEAR(got[static_cast<size_t>(r)].logprob, row[t] - m - std::log(sum), 1e-4) << what << " row " << r;
    }
  }
}

}  // namespace polylora::sampler_cases
