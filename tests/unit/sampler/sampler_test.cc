// tests/unit/sampler/sampler_test.cc: the sampler against hand-made and brute-force expectations:
// per-request reproducibility whatever the batch, exact kept sets of min_p / top_k / top_p (ties and
// boundaries), the empirical distribution against softmax (also on a real llama-tiny logits row), exact
// penalty / logit_bias / min_tokens effects, greedy = argmax, raw log-probs, ranks and prompt log-probs.
#include "worker/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/model.h"
#include "worker/kv_storage.h"

namespace polylora {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<double> log_softmax(const std::vector<float>& logits) {
  double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(l - m);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - m - std::log(sum);
  return out;
}

std::vector<double> softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double m = -1e300;
  for (float l : logits) m = std::max(m, l / temperature);
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp(logits[i] / temperature - m);
  for (double& x : p) x /= sum;
  return p;
}

std::vector<int32_t> filter(const std::vector<float>& logits, double min_p, int64_t top_k, double top_p) {
  return filter_min_p_top_k_top_p(logits.data(), static_cast<int64_t>(logits.size()), min_p, top_k, top_p);
}

using Ids = std::vector<int32_t>;

// --- Randomness -------------------------------------------------------------------------------------

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A stand-in model: the logits depend only on the sequence's tokens (prompt and output), as a real
// model's do, so any difference across batches can only come from the sampler.
void fake_logits(const std::vector<int32_t>& prompt, const std::vector<int32_t>& output, float* logits,
                 int64_t vocab) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : prompt) h = mix(h ^ static_cast<uint64_t>(t));
  for (int32_t t : output) h = mix(h ^ static_cast<uint64_t>(t));
  for (int64_t i = 0; i < vocab; ++i) logits[i] = static_cast<float>(mix(h + i) >> 40) * 0x1.0p-24f * 4.0f;
  for (int k = 0; k < 8; ++k) logits[mix(h * 31 + k) % vocab] += 3.0f;  // a few likely tokens
}

struct FakeRequest {
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
  uint64_t seed = 0;
};

FakeRequest make_request(std::vector<int32_t> prompt, SamplingParams params) {
  FakeRequest r{std::move(params), std::move(prompt), {}, 0};
  r.seed = assign_seed(r.params);
  return r;
}

// Decodes every request for `steps` steps, all in one batch per step.
void decode(const Sampler& sampler, std::vector<FakeRequest*> batch, int steps) {
  const int64_t vocab = sampler.vocab_size();
  const std::vector<int32_t> eos = {2};
  std::vector<std::vector<float>> logits(batch.size(), std::vector<float>(vocab));
  for (int step = 0; step < steps; ++step) {
    std::vector<SamplerRow> rows;
    for (size_t i = 0; i < batch.size(); ++i) {
      fake_logits(batch[i]->prompt, batch[i]->output, logits[i].data(), vocab);
      rows.push_back(
          {logits[i].data(), &batch[i]->params, batch[i]->prompt, batch[i]->output, eos, batch[i]->seed});
    }
    auto results = sampler.sample(rows);
    for (size_t i = 0; i < batch.size(); ++i) batch[i]->output.push_back(results[i].token);
  }
}

TEST(SamplerRandomness, SeededRequestIsReproducibleInAnyBatch) {
  constexpr int64_t kVocab = 32768;  // x 8 rows: large enough for the parallel path
  constexpr int kSteps = 48;
  Sampler sampler(kVocab);
  SamplingParams seeded;
  seeded.seed = 42;
  seeded.temperature = 0.9;
  seeded.top_p = 0.95;
  seeded.top_k = 500;
  seeded.presence_penalty = 0.5;
  const std::vector<int32_t> prompt = {11, 12, 13};

  FakeRequest alone = make_request(prompt, seeded);
  decode(sampler, {&alone}, kSteps);

  // The same request among seven others (unseeded, greedy, other seeds, other filters), at two positions.
  for (size_t position : {size_t{0}, size_t{5}}) {
    std::vector<FakeRequest> others;
    for (int k = 0; k < 7; ++k) {
      SamplingParams p;
      p.temperature = k == 1 ? 0.0 : 0.5 + 0.2 * k;
      if (k % 3 == 0) p.seed = 1000 + k;
      if (k == 2) p.min_p = 0.1;
      if (k == 4) p.top_k = 3;
      if (k == 5) p.repetition_penalty = 1.2;
      others.push_back(make_request({static_cast<int32_t>(100 + k), 7}, p));
    }
    FakeRequest again = make_request(prompt, seeded);
    std::vector<FakeRequest*> batch;
    for (auto& o : others) batch.push_back(&o);
    batch.insert(batch.begin() + static_cast<std::ptrdiff_t>(position), &again);
    decode(sampler, batch, kSteps);
    EXPECT_EQ(again.output, alone.output) << "position " << position;
  }

  // Two copies of the request in one batch also agree; a different seed gives a different sequence.
  FakeRequest copy1 = make_request(prompt, seeded), copy2 = make_request(prompt, seeded);
  SamplingParams other_seed = seeded;
  other_seed.seed = 43;
  FakeRequest different = make_request(prompt, other_seed);
  decode(sampler, {&copy1, &different, &copy2}, kSteps);
  EXPECT_EQ(copy1.output, alone.output);
  EXPECT_EQ(copy2.output, alone.output);
  EXPECT_NE(different.output, alone.output);
}

TEST(SamplerRandomness, UniformIsAPureFunctionOfSeedAndStep) {
  EXPECT_EQ(sampler_uniform(7, 3), sampler_uniform(7, 3));
  EXPECT_NE(sampler_uniform(7, 3), sampler_uniform(7, 4));
  EXPECT_NE(sampler_uniform(7, 3), sampler_uniform(8, 3));
  // Uniform on [0, 1): mean 1/2 and variance 1/12 within 5 sigma over 200k steps.
  constexpr int kN = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kN; ++i) {
    double u = sampler_uniform(12345, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
  }
  EXPECT_NEAR(sum / kN, 0.5, 5 * std::sqrt(1.0 / 12 / kN));
  EXPECT_NEAR(sum_sq / kN - 0.25, 1.0 / 12, 0.002);
}

TEST(SamplerRandomness, AssignSeedKeepsGivenSeedAndDrawsOtherwise) {
  SamplingParams p;
  p.seed = 99;
  EXPECT_EQ(assign_seed(p), 99u);
  SamplingParams unseeded;
  std::set<uint64_t> seeds;
  for (int i = 0; i < 16; ++i) seeds.insert(assign_seed(unseeded));
  EXPECT_EQ(seeds.size(), 16u);
}

// --- Filtering ----------------------------------------------------------------------------------------

TEST(SamplerFilter, TopKKeepsEveryTokenTiedWithTheKth) {
  const std::vector<float> logits = {1, 3, 2, 3, 0, 2};
  EXPECT_EQ(filter(logits, 0, 1, 1.0), (Ids{1, 3}));
  EXPECT_EQ(filter(logits, 0, 2, 1.0), (Ids{1, 3}));
  EXPECT_EQ(filter(logits, 0, 3, 1.0), (Ids{1, 2, 3, 5}));
  EXPECT_EQ(filter(logits, 0, 5, 1.0), (Ids{0, 1, 2, 3, 5}));
  EXPECT_EQ(filter(logits, 0, 6, 1.0), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(filter(logits, 0, 100, 1.0), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(filter(logits, 0, -1, 1.0), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(filter(logits, 0, 0, 1.0), (Ids{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(filter({0.5f, 4.0f, -1.0f, 3.9f}, 0, 1, 1.0), (Ids{1}));
  // -inf logits are never kept, even when k exceeds the finite ones.
  EXPECT_EQ(filter({-kInf, 1.0f, -kInf, 0.0f}, 0, 3, 1.0), (Ids{1, 3}));
  EXPECT_EQ(filter({-kInf, 1.0f, -kInf, 0.0f}, 0, -1, 1.0), (Ids{1, 3}));
}

TEST(SamplerFilter, TopPKeepsShortestPrefixReachingP) {
  // Four equal logits: probabilities exactly 1/4; ties are broken by lower id.
  const std::vector<float> flat = {0, 0, 0, 0};
  EXPECT_EQ(filter(flat, 0, -1, 0.1), (Ids{0}));
  EXPECT_EQ(filter(flat, 0, -1, 0.25), (Ids{0}));
  EXPECT_EQ(filter(flat, 0, -1, 0.2500001), (Ids{0, 1}));
  EXPECT_EQ(filter(flat, 0, -1, 0.5), (Ids{0, 1}));
  EXPECT_EQ(filter(flat, 0, -1, 0.5000001), (Ids{0, 1, 2}));
  EXPECT_EQ(filter(flat, 0, -1, 0.75), (Ids{0, 1, 2}));
  EXPECT_EQ(filter(flat, 0, -1, 0.99), (Ids{0, 1, 2, 3}));
  EXPECT_EQ(filter(flat, 0, -1, 1.0), (Ids{0, 1, 2, 3}));
  // Probabilities 0.05, 0.5, 0.15, 0.3 (ids 0..3): descending order is 1, 3, 2, 0.
  std::vector<float> logits;
  for (double p : {0.05, 0.5, 0.15, 0.3}) logits.push_back(static_cast<float>(std::log(p)));
  EXPECT_EQ(filter(logits, 0, -1, 0.3), (Ids{1}));
  EXPECT_EQ(filter(logits, 0, -1, 0.49), (Ids{1}));
  EXPECT_EQ(filter(logits, 0, -1, 0.51), (Ids{1, 3}));
  EXPECT_EQ(filter(logits, 0, -1, 0.79), (Ids{1, 3}));
  EXPECT_EQ(filter(logits, 0, -1, 0.81), (Ids{1, 2, 3}));
  EXPECT_EQ(filter(logits, 0, -1, 0.94), (Ids{1, 2, 3}));
  EXPECT_EQ(filter(logits, 0, -1, 0.96), (Ids{0, 1, 2, 3}));
}

TEST(SamplerFilter, MinPComparesWithMaxProbability) {
  const std::vector<float> logits = {0, -1, -2, -3, 0};  // relative probs 1, e^-1, e^-2, e^-3, 1
  EXPECT_EQ(filter(logits, 0.0, -1, 1.0), (Ids{0, 1, 2, 3, 4}));
  EXPECT_EQ(filter(logits, std::exp(-1.5), -1, 1.0), (Ids{0, 1, 4}));
  EXPECT_EQ(filter(logits, std::exp(-2.5), -1, 1.0), (Ids{0, 1, 2, 4}));
  EXPECT_EQ(filter(logits, 1.0, -1, 1.0), (Ids{0, 4}));  // both maxima are kept
  EXPECT_EQ(filter({5, 1, 4.9f}, 1.0, -1, 1.0), (Ids{0}));
}

TEST(SamplerFilter, StepsComposeInVllmOrderWithRenormalisation) {
  // Four tokens at 0 and four at -0.5. top_k=4 keeps the first four; top_p is then computed on the
  // renormalised survivors (1/4 each), so 0.5 keeps two. Without renormalisation it would keep four.
  const std::vector<float> logits = {-0.5f, 0, -0.5f, 0, 0, -0.5f, 0, -0.5f};
  EXPECT_EQ(filter(logits, 0, 4, 1.0), (Ids{1, 3, 4, 6}));
  EXPECT_EQ(filter(logits, 0, 4, 0.5), (Ids{1, 3}));
  // min_p first: it removes the -0.5 tokens (e^-0.5 < 0.7) before top_k counts.
  EXPECT_EQ(filter(logits, 0.7, 6, 1.0), (Ids{1, 3, 4, 6}));
  EXPECT_EQ(filter(logits, 0.7, 6, 0.75), (Ids{1, 3, 4}));
  // top_k=1 and top_p tiny keep the best token only.
  EXPECT_EQ(filter({0.1f, 0.3f, 0.2f}, 0, 1, 1.0), (Ids{1}));
  EXPECT_EQ(filter({0.1f, 0.3f, 0.2f}, 0, -1, 1e-9), (Ids{1}));
}

// Brute force: full sort, min_p, top_k with ties, top_p on the renormalised survivors.
Ids reference_filter(const std::vector<float>& logits, double min_p, int64_t top_k, double top_p) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double m = logits[order[0]];
  Ids kept;
  for (int32_t id : order)
    if (min_p <= 0 || std::exp(logits[id] - m) >= min_p) kept.push_back(id);
  if (top_k > 0 && static_cast<size_t>(top_k) < kept.size()) {
    float v = logits[kept[top_k - 1]];
    size_t n = static_cast<size_t>(top_k);
    while (n < kept.size() && logits[kept[n]] >= v) ++n;
    kept.resize(n);
  }
  if (top_p < 1.0) {
    double total = 0;
    for (int32_t id : kept) total += std::exp(logits[id] - m);
    double cum = 0;
    size_t n = 0;
    while (n < kept.size() && cum < top_p * total) cum += std::exp(logits[kept[n++]] - m);
    kept.resize(std::max<size_t>(n, 1));
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

TEST(SamplerFilter, MatchesBruteForceOnLargeVocabularies) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 24; ++trial) {
    const int64_t vocab = trial % 2 ? 200000 : 3000;
    std::normal_distribution<float> normal(0.0f, trial % 3 ? 1.0f : 4.0f);
    std::vector<float> logits(vocab);
    for (float& l : logits) l = std::round(normal(rng) * 8.0f) / 8.0f;  // quantised: many ties
    const double min_p = trial % 4 == 0 ? 0.0 : std::uniform_real_distribution<double>(0.0, 0.2)(rng);
    const int64_t top_k = trial % 5 == 0 ? -1 : std::uniform_int_distribution<int64_t>(1, 5000)(rng);
    const double top_p = trial % 3 == 1 ? 1.0 : std::uniform_real_distribution<double>(0.05, 0.999)(rng);
    EXPECT_EQ(filter(logits, min_p, top_k, top_p), reference_filter(logits, min_p, top_k, top_p))
        << "trial " << trial << " min_p " << min_p << " top_k " << top_k << " top_p " << top_p;
  }
}

// --- Distribution ---------------------------------------------------------------------------------------

// Draws kDraws tokens through Sampler::sample_row (step i uses uniform i of the seed) and checks every
// token's frequency against `expected` within 5 sigma (plus 1e-4), and the chi-square statistic over
// tokens with expected count >= 5 against df + 6·sqrt(2·df).
void check_distribution(const std::vector<float>& logits, SamplingParams params,
                        const std::vector<double>& expected) {
  constexpr int kDraws = 200000;
  const auto vocab = static_cast<int64_t>(logits.size());
  Sampler sampler(vocab);
  params.seed = 2024;
  std::vector<int32_t> history(kDraws, 0);
  std::vector<float> row(logits.size());
  std::vector<int64_t> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    row = logits;
    SamplerRow r{row.data(), &params, {}, std::span<const int32_t>(history.data(), i), {}, *params.seed};
    ++counts[sampler.sample_row(r).token];
  }
  double chi2 = 0;
  int64_t df = -1;
  for (size_t t = 0; t < logits.size(); ++t) {
    const double p = expected[t];
    const double p_hat = static_cast<double>(counts[t]) / kDraws;
    if (p == 0) {
      EXPECT_EQ(counts[t], 0) << "token " << t << " has probability 0";
      continue;
    }
    EXPECT_LE(std::fabs(p_hat - p), 5 * std::sqrt(p * (1 - p) / kDraws) + 1e-4) << "token " << t;
    const double e = p * kDraws;
    if (e >= 5) {
      chi2 += (counts[t] - e) * (counts[t] - e) / e;
      ++df;
    }
  }
  if (df > 0) {
    EXPECT_LE(chi2, df + 6 * std::sqrt(2.0 * df)) << "df " << df;
  }
}

TEST(SamplerDistribution, TemperatureOneMatchesSoftmax) {
  std::vector<float> logits(64);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  for (float& l : logits) l = normal(rng);
  check_distribution(logits, SamplingParams{}, softmax(logits));
}

TEST(SamplerDistribution, TemperatureAndTopKMatchRenormalisedSoftmax) {
  std::vector<float> logits(64);
  std::mt19937_64 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& l : logits) l = normal(rng);
  SamplingParams params;
  params.temperature = 0.7;
  params.top_k = 10;
  Ids kept = filter(logits, 0, 10, 1.0);
  ASSERT_EQ(kept.size(), 10u);
  std::vector<double> expected = softmax(logits, 0.7);
  double mass = 0;
  for (int32_t id : kept) mass += expected[id];
  std::vector<double> renorm(logits.size(), 0.0);
  for (int32_t id : kept) renorm[id] = expected[id] / mass;
  check_distribution(logits, params, renorm);
}

TEST(SamplerDistribution, RealModelLogitsRowMatchesSoftmax) {
  auto model = Model::load(std::string(POLYLORA_TEST_DATA) + "/models/llama-tiny");
  const int64_t vocab = model->config().vocab_size;
  // The whole row after the last prompt token, from one forward pass of the model (the engine hands out
  // only the top log-probs, and this test needs every logit).
  const std::vector<int32_t> prompt = {1, 15, 27, 300, 42, 7};
  const auto len = static_cast<int32_t>(prompt.size());
  KvStorage kv(model->config(), model->backend(), 1, 16);
  ForwardBatch b;
  b.token_ids = prompt;
  for (int32_t p = 0; p < len; ++p) {
    b.positions.push_back(p);
    b.slot_mapping.push_back(p);
  }
  b.query_start = {0, len};
  b.context_lens = {len};
  b.block_tables = {0};
  b.max_blocks_per_seq = 1;
  b.adapter_slots = {-1};
  b.logits_rows = {len - 1};
  std::vector<float> row(static_cast<size_t>(vocab));
  model->forward(b, kv.views(), {}, row.data());
  check_distribution(row, SamplingParams{}, softmax(row));
}

// --- Processing ----------------------------------------------------------------------------------------

TEST(SamplerProcessing, BiasAndPenaltiesChangeExactlyTheRightLogits) {
  constexpr int64_t kVocab = 40;
  std::vector<float> original(kVocab);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (float& l : original) l = normal(rng);
  original[9] = 0.0f;  // zero logit: multiplied (unchanged) by the repetition penalty
  SamplingParams params;
  params.temperature = 0.0;  // greedy: the row holds the processed logits afterwards
  params.repetition_penalty = 1.3;
  params.frequency_penalty = 0.4;
  params.presence_penalty = -0.25;
  params.logit_bias = {{3, 2.5}, {7, -1.5}, {20, 0.75}};
  const std::vector<int32_t> prompt = {1, 5, 5, 9, 3};
  const std::vector<int32_t> output = {5, 7, 7, 7, 12, 30};

  std::vector<double> expected(original.begin(), original.end());
  for (const auto& [id, bias] : params.logit_bias) expected[id] += bias;
  std::map<int32_t, int> counts;
  for (int32_t t : output) ++counts[t];
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  for (int32_t t : output) seen.insert(t);
  for (int32_t t : seen) expected[t] = expected[t] > 0 ? expected[t] / 1.3 : expected[t] * 1.3;
  for (const auto& [t, c] : counts) expected[t] -= 0.4 * c + -0.25;

  std::vector<float> row = original;
  Sampler sampler(kVocab);
  SamplerRow r{row.data(), &params, prompt, output, {}, 0};
  int32_t token = sampler.sample_row(r).token;
  for (int64_t t = 0; t < kVocab; ++t) {
    bool touched = seen.count(static_cast<int32_t>(t)) || t == 3 || t == 7 || t == 20;
    if (!touched) {
      EXPECT_EQ(row[t], original[t]) << "token " << t << " must not change";
    } else {
      EXPECT_NEAR(row[t], expected[t], 1e-5) << "token " << t;
    }
  }
  EXPECT_EQ(row[9], 0.0f);
  EXPECT_EQ(token, std::max_element(expected.begin(), expected.end()) - expected.begin());

  // Each step on its own.
  std::vector<float> only_bias = original;
  apply_logit_bias(only_bias.data(), kVocab, params);
  for (int64_t t = 0; t < kVocab; ++t) {
    double bias = t == 3 ? 2.5 : t == 7 ? -1.5 : t == 20 ? 0.75 : 0.0;
    EXPECT_NEAR(only_bias[t], original[t] + bias, 1e-6) << "token " << t;
  }
  SamplingParams only_presence;
  only_presence.presence_penalty = 1.0;
  std::vector<float> presence = original;
  apply_penalties(presence.data(), kVocab, only_presence, prompt, output);
  for (int64_t t = 0; t < kVocab; ++t)
    EXPECT_EQ(presence[t], counts.count(static_cast<int32_t>(t)) ? original[t] - 1.0f : original[t]) << t;
  // Scratch state does not leak into the next call: the same call again gives the same change.
  std::vector<float> presence2 = original;
  apply_penalties(presence2.data(), kVocab, only_presence, prompt, output);
  EXPECT_EQ(presence2, presence);
}

TEST(SamplerProcessing, MinTokensMasksEosAndStopIdsUntilReached) {
  constexpr int64_t kVocab = 16;
  const std::vector<int32_t> eos = {2, 9};
  SamplingParams params;
  params.temperature = 0.0;
  params.min_tokens = 3;
  params.stop_token_ids = {4};
  std::vector<float> base(kVocab, 0.0f);
  base[2] = 10.0f;  // EOS is the best token
  base[9] = 9.0f;
  base[4] = 8.0f;
  base[6] = 1.0f;
  Sampler sampler(kVocab);
  std::vector<int32_t> output;
  for (int step = 0; step < 4; ++step) {
    std::vector<float> row = base;
    SamplerRow r{row.data(), &params, {}, output, eos, 0};
    int32_t token = sampler.sample_row(r).token;
    if (step < 3) {
      EXPECT_EQ(token, 6) << "step " << step;
      for (int32_t id : {2, 4, 9}) EXPECT_EQ(row[id], -kInf) << "step " << step << " id " << id;
      for (int32_t id = 0; id < kVocab; ++id)
        if (id != 2 && id != 4 && id != 9) {
          EXPECT_EQ(row[id], base[id]);
        }
    } else {
      EXPECT_EQ(token, 2);
      EXPECT_EQ(row, base);
    }
    output.push_back(token == 2 ? 2 : 6);
  }
  // ignore_eos: EOS stays, stop ids are still masked.
  params.ignore_eos = true;
  std::vector<float> row = base;
  SamplerRow r{row.data(), &params, {}, {}, eos, 0};
  EXPECT_EQ(sampler.sample_row(r).token, 2);
  EXPECT_EQ(row[4], -kInf);
  EXPECT_EQ(row[2], 10.0f);
  // Random sampling never draws a masked id.
  SamplingParams random = params;
  random.ignore_eos = false;
  random.temperature = 1.0;
  random.seed = 5;
  for (int i = 0; i < 200; ++i) {
    std::vector<float> row2 = base;
    std::vector<int32_t> history(static_cast<size_t>(i % 3), 6);
    SamplerRow r2{row2.data(), &random, {}, history, eos, static_cast<uint64_t>(i)};
    int32_t token = sampler.sample_row(r2).token;
    EXPECT_TRUE(token != 2 && token != 4 && token != 9) << token;
  }
}

TEST(SamplerProcessing, GreedyIsArgmaxWithLowestIdOnTies) {
  std::mt19937_64 rng(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  constexpr int64_t kVocab = 5000;
  Sampler sampler(kVocab);
  for (double temperature : {0.0, 1e-6}) {
    SamplingParams params;
    params.temperature = temperature;
    params.top_k = 5;  // ignored by greedy
    std::vector<std::vector<float>> rows(6, std::vector<float>(kVocab));
    std::vector<SamplerRow> batch;
    std::vector<int32_t> expected;
    for (auto& row : rows) {
      for (float& l : row) l = normal(rng);
      expected.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
      batch.push_back({row.data(), &params, {}, {}, {}, rng()});
    }
    auto results = sampler.sample(batch);
    for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(results[i].token, expected[i]);
  }
  EXPECT_EQ(argmax(std::vector<float>{1, 7, 3, 7, 7}.data(), 5), 1);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf, -2}.data(), 3), 2);
}

TEST(SamplerLogprobs, RawLogprobsIgnoreProcessing) {
  constexpr int64_t kVocab = 300;
  std::mt19937_64 rng(6);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> original(kVocab);
  for (float& l : original) l = normal(rng);
  const int32_t lowest =
      static_cast<int32_t>(std::min_element(original.begin(), original.end()) - original.begin());
  const std::vector<double> lp = log_softmax(original);
  std::vector<int32_t> order(kVocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return original[a] > original[b]; });

  Sampler sampler(kVocab);
  for (double temperature : {0.0, 0.5, 1.5}) {
    SamplingParams params;
    params.temperature = temperature;
    params.logprobs = 5;
    params.frequency_penalty = 1.0;
    params.top_p = 0.9;
    params.seed = 77;
    if (temperature == 0.0) params.logit_bias = {{lowest, 100.0}};  // forces the worst raw token
    std::vector<float> row = original;
    const std::vector<int32_t> output = {order[0], order[1]};
    SamplerRow r{row.data(), &params, {}, output, {}, 77};
    SampleResult result = sampler.sample_row(r);
    if (temperature == 0.0) {
      EXPECT_EQ(result.token, lowest);
      EXPECT_EQ(result.rank, kVocab);
    }
    EXPECT_NEAR(result.logprob, lp[result.token], 1e-5);
    int64_t rank = 0;
    for (float l : original) rank += l >= original[result.token];
    EXPECT_EQ(result.rank, rank);
    ASSERT_EQ(result.top.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(result.top[i].id, order[i]);
      EXPECT_NEAR(result.top[i].logprob, lp[order[i]], 1e-5);
    }
  }
  // logprobs=0: the sampled token only; unset: nothing.
  SamplingParams zero;
  zero.temperature = 0.0;
  zero.logprobs = 0;
  std::vector<float> row = original;
  SampleResult r0 = sampler.sample_row({row.data(), &zero, {}, {}, {}, 0});
  EXPECT_TRUE(r0.top.empty());
  EXPECT_EQ(r0.rank, 1);
  EXPECT_NEAR(r0.logprob, lp[order[0]], 1e-5);
}

TEST(SamplerLogprobs, PromptLogprobRankAndTopK) {
  const std::vector<float> logits = {1, 3, 2, 3, 0};
  const std::vector<double> lp = log_softmax(logits);
  SampleResult r = Sampler::prompt_logprob(logits.data(), 5, 2, 2);
  EXPECT_EQ(r.token, 2);
  EXPECT_EQ(r.rank, 3);  // 3, 3, 2
  EXPECT_NEAR(r.logprob, lp[2], 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 3);
  EXPECT_NEAR(r.top[0].logprob, lp[1], 1e-6);
  EXPECT_EQ(Sampler::prompt_logprob(logits.data(), 5, 3, 0).rank, 2);  // ties count against the token
  EXPECT_EQ(Sampler::prompt_logprob(logits.data(), 5, 4, 0).rank, 5);
  EXPECT_TRUE(Sampler::prompt_logprob(logits.data(), 5, 4, 0).top.empty());
  EXPECT_EQ(Sampler::prompt_logprob(logits.data(), 5, 0, 9).top.size(), 5u);
}

TEST(SamplerLogprobs, TopIdsMatchStableSortForSmallAndLargeK) {
  std::mt19937_64 rng(8);
  std::vector<float> logits(20000);
  for (float& l : logits) l = static_cast<float>(rng() % 50);  // many ties
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (int64_t k : {1, 5, 20, 32, 33, 500}) {
    Ids got = top_ids(logits.data(), static_cast<int64_t>(logits.size()), k);
    EXPECT_EQ(got, Ids(order.begin(), order.begin() + k)) << "k " << k;
  }
  const std::vector<float> lp_row = {0.5f, -1.0f, 2.0f};
  EXPECT_NEAR(log_sum_exp(lp_row.data(), 3), std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0)), 1e-6);
}

}  // namespace
}  // namespace polylora
