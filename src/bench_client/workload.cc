// bench_client/workload.cc: see workload.h.
#include "bench_client/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

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

std::string read_whole_file(const std::string& path, const std::string& dataset) {
  if (path.empty()) fail("--dataset-name {} needs --dataset-path", dataset);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--dataset-path: cannot open {}", path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// Random content of n tokens: ids from token_pool when it is not empty (exact length), else n words.
void fill_random(BenchRequest& request, int64_t n, const std::vector<int32_t>& token_pool, std::mt19937_64& rng) {
  if (!token_pool.empty()) {
    std::uniform_int_distribution<size_t> pick(0, token_pool.size() - 1);
    for (int64_t i = 0; i < n; ++i) request.prompt_token_ids.push_back(token_pool[pick(rng)]);
  } else {
    const auto& words = random_words();
    std::uniform_int_distribution<size_t> pick(0, words.size() - 1);
    for (int64_t i = 0; i < n; ++i) {
      if (!request.prompt_text.empty()) request.prompt_text += ' ';
      request.prompt_text += words[pick(rng)];
    }
  }
}

// vLLM's maybe_oversample_requests: repeat random samples until there are num_prompts.
void oversample(std::vector<BenchRequest>& requests, int64_t num_prompts, uint64_t seed,
                const std::string& dataset) {
  if (requests.empty()) fail("--dataset-name {}: no usable request in the dataset", dataset);
  std::mt19937_64 rng(seed ^ kLengthStream);
  size_t have = requests.size();
  std::uniform_int_distribution<size_t> pick(0, have - 1);
  while (static_cast<int64_t>(requests.size()) < num_prompts) requests.push_back(requests[pick(rng)]);
}

void check_num_prompts(int64_t num_prompts) {
  if (num_prompts < 1) fail("--num-prompts must be at least 1 (got {})", num_prompts);
}

}  // namespace

int64_t count_words(const std::string& text) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : text) {
    bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in_word) ++n;
    in_word = !space;
  }
  return n;
}

std::vector<BenchRequest> load_sharegpt(const DatasetOptions& options, const TokenCountFn& count,
                                        const std::string& model) {
  check_num_prompts(options.num_prompts);
  if (options.sharegpt_output_len && *options.sharegpt_output_len < 1)
    fail("--sharegpt-output-len must be at least 1 (got {})", *options.sharegpt_output_len);
  auto data = nlohmann::json::parse(read_whole_file(options.path, "sharegpt"), nullptr, false);
  if (!data.is_array()) fail("--dataset-path {}: a ShareGPT file is a JSON list of conversations", options.path);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& entry : data) {
    if (!entry.is_object() || !entry.contains("conversations") || !entry["conversations"].is_array()) continue;
    const auto& turns = entry["conversations"];
    if (turns.size() < 2) continue;
    auto value = [](const nlohmann::json& turn) -> std::optional<std::string> {
      if (turn.is_object() && turn.contains("value") && turn["value"].is_string()) return turn["value"];
      return std::nullopt;
    };
    auto prompt = value(turns[0]), completion = value(turns[1]);
    if (prompt && completion) pairs.emplace_back(*prompt, *completion);
  }
  std::mt19937_64 rng(options.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  std::vector<BenchRequest> requests;
  for (const auto& [prompt, completion] : pairs) {
    if (static_cast<int64_t>(requests.size()) >= options.num_prompts) break;
    int64_t prompt_len = count(prompt);
    int64_t output_len = options.sharegpt_output_len ? *options.sharegpt_output_len : count(completion);
    // vLLM's is_valid_sequence(min_len=4, max_prompt_len=1024, max_total_len=2048).
    bool too_short = prompt_len < 4 || (!options.sharegpt_output_len && output_len < 4);
    if (too_short || prompt_len > 1024 || prompt_len + output_len > 2048) continue;
    BenchRequest request;
    request.prompt_text = prompt;
    request.prompt_len = prompt_len;
    request.output_len = output_len;
    request.model = model;
    requests.push_back(std::move(request));
  }
  oversample(requests, options.num_prompts, options.seed, "sharegpt");
  return requests;
}

std::vector<BenchRequest> load_custom(const DatasetOptions& options, const TokenCountFn& count,
                                      const std::string& model) {
  check_num_prompts(options.num_prompts);
  if (options.custom_output_len < 1) fail("--custom-output-len must be at least 1 (got {})", options.custom_output_len);
  std::stringstream lines(read_whole_file(options.path, "custom"));
  std::vector<std::string> prompts;
  std::string line;
  for (size_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto item = nlohmann::json::parse(line, nullptr, false);
    if (!item.is_object() || !item.contains("prompt") || !item["prompt"].is_string())
      fail("--dataset-path {} line {}: a custom dataset is JSONL with a \"prompt\" string per line", options.path,
           number);
    prompts.push_back(item["prompt"]);
  }
  std::mt19937_64 rng(options.seed);
  std::shuffle(prompts.begin(), prompts.end(), rng);
  std::vector<BenchRequest> requests;
  for (const auto& prompt : prompts) {
    if (static_cast<int64_t>(requests.size()) >= options.num_prompts) break;
    BenchRequest request;
    request.prompt_text = prompt;
    request.prompt_len = count(prompt);
    request.output_len = options.custom_output_len;
    request.model = model;
    requests.push_back(std::move(request));
  }
  oversample(requests, options.num_prompts, options.seed, "custom");
  return requests;
}

std::vector<BenchRequest> load_sonnet(const DatasetOptions& options, const TokenCountFn& count,
                                      const std::string& model) {
  check_num_prompts(options.num_prompts);
  std::stringstream text(read_whole_file(options.path, "sonnet"));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(text, line)) lines.push_back(line + "\n");
  if (lines.empty()) fail("--dataset-path {}: the sonnet file has no lines", options.path);
  double total = 0;
  for (const auto& l : lines) total += static_cast<double>(count(l));
  double avg_len = std::max(total / static_cast<double>(lines.size()), 1e-9);
  const std::string base_prompt = "Pick as many lines as you can from these poem lines:\n";
  int64_t base_offset = count(base_prompt);
  if (options.sonnet_input_len <= base_offset)
    fail("--sonnet-input-len {} must be larger than the base prompt's {} tokens", options.sonnet_input_len,
         base_offset);
  if (options.sonnet_output_len < 1) fail("--sonnet-output-len must be at least 1");
  auto num_input_lines =
      static_cast<int64_t>(std::round(static_cast<double>(options.sonnet_input_len - base_offset) / avg_len));
  auto num_prefix_lines = std::max<int64_t>(
      static_cast<int64_t>(std::round(static_cast<double>(options.sonnet_prefix_len - base_offset) / avg_len)), 0);
  num_prefix_lines = std::min<int64_t>(num_prefix_lines, static_cast<int64_t>(lines.size()));
  if (num_input_lines < num_prefix_lines)
    fail("--sonnet-input-len {} must not be below --sonnet-prefix-len {}", options.sonnet_input_len,
         options.sonnet_prefix_len);
  std::string prefix = base_prompt;
  for (int64_t i = 0; i < num_prefix_lines; ++i) prefix += lines[static_cast<size_t>(i)];
  std::mt19937_64 rng(options.seed);
  std::uniform_int_distribution<size_t> pick(0, lines.size() - 1);
  std::vector<BenchRequest> requests;
  for (int64_t attempt = 0; static_cast<int64_t>(requests.size()) < options.num_prompts; ++attempt) {
    if (attempt > 100 * options.num_prompts + 1000)
      fail("--dataset-name sonnet: no prompt of at most --sonnet-input-len {} tokens could be made",
           options.sonnet_input_len);
    std::string prompt = prefix;
    for (int64_t i = num_prefix_lines; i < num_input_lines; ++i) prompt += lines[pick(rng)];
    int64_t prompt_len = count(prompt);
    if (prompt_len > options.sonnet_input_len) continue;
    BenchRequest request;
    request.prompt_text = std::move(prompt);
    request.prompt_len = prompt_len;
    request.output_len = options.sonnet_output_len;
    request.model = model;
    requests.push_back(std::move(request));
  }
  return requests;
}

std::vector<BenchRequest> make_prefix_repetition_requests(const DatasetOptions& options,
                                                          const std::vector<int32_t>& token_pool,
                                                          const std::string& model) {
  check_num_prompts(options.num_prompts);
  const auto& o = options;
  if (o.prefix_repetition_num_prefixes < 1) fail("--prefix-repetition-num-prefixes must be at least 1");
  if (o.prefix_repetition_prefix_len < 0 || o.prefix_repetition_suffix_len < 0 ||
      o.prefix_repetition_prefix_len + o.prefix_repetition_suffix_len < 1)
    fail("--prefix-repetition-prefix-len and -suffix-len must not be negative, and not both 0");
  if (o.prefix_repetition_output_len < 1) fail("--prefix-repetition-output-len must be at least 1");
  std::mt19937_64 rng(o.seed);
  std::vector<BenchRequest> prefixes(static_cast<size_t>(o.prefix_repetition_num_prefixes));
  for (auto& prefix : prefixes) fill_random(prefix, o.prefix_repetition_prefix_len, token_pool, rng);
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    BenchRequest request = prefixes[static_cast<size_t>(i) % prefixes.size()];
    fill_random(request, o.prefix_repetition_suffix_len, token_pool, rng);
    request.prompt_len = o.prefix_repetition_prefix_len + o.prefix_repetition_suffix_len;
    request.output_len = o.prefix_repetition_output_len;
    request.model = model;
    requests.push_back(std::move(request));
  }
  std::shuffle(requests.begin(), requests.end(), rng);
  return requests;
}

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
  if (config.prefix_len < 0) fail("--random-prefix-len must not be negative (got {})", config.prefix_len);
  BenchRequest prefix;
  fill_random(prefix, config.prefix_len, token_pool, content_rng);

  std::vector<BenchRequest> requests(static_cast<size_t>(config.num_prompts));
  for (auto& request : requests) {
    int64_t drawn = input_dist(length_rng);
    request.output_len = output_dist(length_rng);
    request.model = default_model;
    request.prompt_token_ids = prefix.prompt_token_ids;
    request.prompt_text = prefix.prompt_text;
    fill_random(request, drawn, token_pool, content_rng);
    request.prompt_len = config.prefix_len + drawn;
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

std::optional<RampUp> parse_ramp_up(const std::string& name) {
  if (name == "linear") return RampUp::kLinear;
  if (name == "exponential") return RampUp::kExponential;
  return std::nullopt;
}

double ramp_up_rate(RampUp strategy, double start_rps, double end_rps, int64_t index, int64_t num_requests) {
  double progress = num_requests > 1 ? static_cast<double>(index) / static_cast<double>(num_requests - 1) : 0.0;
  switch (strategy) {
    case RampUp::kLinear:
      return start_rps + (end_rps - start_rps) * progress;
    case RampUp::kExponential:
      return start_rps * std::pow(end_rps / start_rps, progress);
  }
  return start_rps;
}

std::vector<double> ramp_up_arrival_times(int64_t num_requests, RampUp strategy, double start_rps,
                                          double end_rps, double burstiness, uint64_t seed) {
  if (num_requests < 0) fail("the number of requests must not be negative (got {})", num_requests);
  if (!(start_rps >= 0) || !(end_rps > 0) || std::isinf(start_rps) || std::isinf(end_rps))
    fail("--ramp-up-start-rps and --ramp-up-end-rps must be finite, the end positive (got {} and {})", start_rps,
         end_rps);
  if (start_rps > end_rps) fail("--ramp-up-start-rps {} must not exceed --ramp-up-end-rps {}", start_rps, end_rps);
  if (strategy == RampUp::kExponential && start_rps == 0)
    fail("--ramp-up-strategy exponential needs --ramp-up-start-rps above 0");
  if (!(burstiness > 0) || std::isinf(burstiness)) fail("--burstiness must be positive (got {})", burstiness);
  std::vector<double> times(static_cast<size_t>(num_requests), 0.0);
  std::mt19937_64 rng(seed ^ kArrivalStream);
  for (size_t i = 1; i < times.size(); ++i) {
    double rate = ramp_up_rate(strategy, start_rps, end_rps, static_cast<int64_t>(i - 1), num_requests);
    // A linear ramp from 0: the first gap takes the next request's rate instead of an infinite wait.
    if (rate <= 0) rate = ramp_up_rate(strategy, start_rps, end_rps, static_cast<int64_t>(i), num_requests);
    std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
    times[i] = times[i - 1] + gap(rng);
  }
  return times;
}

}  // namespace polylora::bench_client
