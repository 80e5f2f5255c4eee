// bench_client/workload.cc: see workload.h.
#include "bench_client/workload.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "common/error.h"

namespace polylora::bench_client {
namespace {

// Distinct seed streams, so changing one knob does not reshuffle the others.
constexpr uint64_t kLengthStream = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kAdapterStream = 0xbf58476d1ce4e5b9ULL;
constexpr uint64_t kArrivalStream = 0x94d049bb133111ebULL;

std::pair<int64_t, int64_t> length_range(int64_t len, double range_ratio) {
  int64_t low = static_cast<int64_t>(std::floor(static_cast<double>(len) * (1.0 - range_ratio)));
  int64_t high = static_cast<int64_t>(std::ceil(static_cast<double>(len) * (1.0 + range_ratio)));
  low = std::max<int64_t>(low, 1);
  return {low, std::max(low, high)};
}

}  // namespace

const std::vector<std::string>& random_words() {
  static const std::vector<std::string> kWords = {
      "the",   "of",      "and",    "to",     "in",      "is",    "you",     "that",   "it",      "he",
      "was",   "for",     "on",     "are",    "as",      "with",  "his",     "they",   "at",      "be",
      "this",  "have",    "from",   "or",     "one",     "had",   "by",      "word",   "but",     "not",
      "what",  "all",     "were",   "we",     "when",    "your",  "can",     "said",   "there",   "use",
      "an",    "each",    "which",  "she",    "do",      "how",   "their",   "if",     "will",    "up",
      "other", "about",   "out",    "many",   "then",    "them",  "these",   "so",     "some",    "her",
      "would", "make",    "like",   "him",    "into",    "time",  "has",     "look",   "two",     "more",
      "write", "go",      "see",    "number", "no",      "way",   "could",   "people", "my",      "than",
      "first", "water",   "been",   "call",   "who",     "oil",   "its",     "now",    "find",    "long",
      "down",  "day",     "did",    "get",    "come",    "made",  "may",     "part",   "over",    "new",
      "sound", "take",    "only",   "little", "work",    "know",  "place",   "year",   "live",    "me",
      "back",  "give",    "most",   "very",   "after",   "thing", "our",     "just",   "name",    "good",
      "man",   "think",   "say",    "great",  "where",   "help",  "through", "much",   "before",  "line",
      "right", "too",     "mean",   "old",    "any",     "same",  "tell",    "boy",    "follow",  "came",
      "want",  "show",    "also",   "around", "form",    "three", "small",   "set",    "put",     "end",
      "does",  "another", "well",   "large",  "must",    "big",   "even",    "such",   "because", "turn",
      "here",  "why",     "ask",    "went",   "men",     "read",  "need",    "land",   "home",    "us",
      "move",  "try",     "kind",   "hand",   "picture", "again", "change",  "off",    "play",    "spell",
      "air",   "away",    "animal", "house",  "point",   "page",  "letter",  "mother", "answer",  "found",
      "study", "still",   "learn",  "should", "world",   "high",  "every",   "near",
  };
  return kWords;
}

std::vector<BenchRequest> make_random_requests(const RandomDatasetConfig& config,
                                               const std::vector<int32_t>& token_pool,
                                               const std::string& default_model) {
  if (config.num_prompts < 1) fail("--num-prompts must be at least 1 (got {})", config.num_prompts);
  if (config.input_len < 1 || config.output_len < 1) {
    fail("--random-input-len and --random-output-len must be at least 1 (got {} and {})", config.input_len,
         config.output_len);
  }
  if (!(config.range_ratio >= 0.0 && config.range_ratio < 1.0)) {
    fail("--random-range-ratio must be in [0, 1) (got {})", config.range_ratio);
  }
  std::mt19937_64 length_rng(config.seed ^ kLengthStream);
  std::mt19937_64 content_rng(config.seed);
  auto [input_low, input_high] = length_range(config.input_len, config.range_ratio);
  auto [output_low, output_high] = length_range(config.output_len, config.range_ratio);
  std::uniform_int_distribution<int64_t> input_dist(input_low, input_high);
  std::uniform_int_distribution<int64_t> output_dist(output_low, output_high);
  const auto& words = random_words();

  std::vector<BenchRequest> requests(static_cast<size_t>(config.num_prompts));
  for (auto& request : requests) {
    request.prompt_len = input_dist(length_rng);
    request.output_len = output_dist(length_rng);
    request.model = default_model;
    if (!token_pool.empty()) {
      std::uniform_int_distribution<size_t> pick(0, token_pool.size() - 1);
      request.prompt_token_ids.resize(static_cast<size_t>(request.prompt_len));
      for (auto& id : request.prompt_token_ids) id = token_pool[pick(content_rng)];
    } else {
      std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
      for (int64_t i = 0; i < request.prompt_len; ++i) {
        if (i) request.prompt_text += ' ';
        request.prompt_text += words[pick(content_rng)];
      }
    }
  }
  return requests;
}

std::optional<AdapterAssignment> parse_adapter_assignment(const std::string& name) {
  if (name == "round-robin") return AdapterAssignment::kRoundRobin;
  if (name == "random") return AdapterAssignment::kRandom;
  return std::nullopt;
}

void assign_adapters(std::vector<BenchRequest>& requests, const std::vector<std::string>& adapters,
                     AdapterAssignment assignment, uint64_t seed) {
  if (adapters.empty()) return;
  std::mt19937_64 rng(seed ^ kAdapterStream);
  std::uniform_int_distribution<size_t> pick(0, adapters.size() - 1);
  for (size_t i = 0; i < requests.size(); ++i) {
    switch (assignment) {
      case AdapterAssignment::kRoundRobin:
        requests[i].model = adapters[i % adapters.size()];
        break;
      case AdapterAssignment::kRandom:
        requests[i].model = adapters[pick(rng)];
        break;
    }
  }
}

std::vector<double> arrival_times(int64_t num_requests, double request_rate, double burstiness,
                                  uint64_t seed) {
  if (num_requests < 0) fail("the number of requests must not be negative (got {})", num_requests);
  if (!(request_rate > 0)) fail("--request-rate must be positive or inf (got {})", request_rate);
  if (!(burstiness > 0) || std::isinf(burstiness)) fail("--burstiness must be positive (got {})", burstiness);
  std::vector<double> times(static_cast<size_t>(num_requests), 0.0);
  if (std::isinf(request_rate)) return times;
  std::mt19937_64 rng(seed ^ kArrivalStream);
  // Gamma(shape k, scale θ) has mean kθ; θ = 1 / (rate * k) gives mean 1/rate. k = 1 is exponential.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  for (size_t i = 1; i < times.size(); ++i) times[i] = times[i - 1] + gap(rng);
  return times;
}

}  // namespace polylora::bench_client
