// bench_client/workload.h: what a benchmark sends and when: the random dataset (prompt and output
// lengths, prompt contents), the adapter ("model" field) of each request, and Poisson/gamma arrival times.
// Owns: deterministic (seeded) generation of the request list and the arrival schedule.
// Must not: do I/O or know about HTTP (the runner sends what this produces).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace polylora::bench_client {

// One request of the benchmark. Exactly one of prompt_token_ids (sent as a list of ints, so the input
// length is exact) and prompt_text is used; the token form needs a server with POST /tokenize.
struct BenchRequest {
  std::string prompt_text;
  std::vector<int32_t> prompt_token_ids;
  int64_t prompt_len = 0;  // planned input tokens (exact for token ids, one per word for text)
  int64_t output_len = 0;  // max_tokens
  std::string model;       // the request's "model" field: the base model or a LoRA adapter name
};

// vLLM's `--dataset-name random`: lengths drawn uniformly from
// [floor(len * (1 - range_ratio)), ceil(len * (1 + range_ratio))] (at least 1).
struct RandomDatasetConfig {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  uint64_t seed = 0;
};

// The words random text prompts are drawn from (common short English words, mostly one token each).
const std::vector<std::string>& random_words();

// Builds num_prompts requests with model = default_model. With a non-empty token_pool, prompts are
// prompt_len ids drawn from it; otherwise prompt_len random words joined by spaces.
std::vector<BenchRequest> make_random_requests(const RandomDatasetConfig& config,
                                               const std::vector<int32_t>& token_pool,
                                               const std::string& default_model);

enum class AdapterAssignment { kRoundRobin, kRandom };

// "round-robin" or "random"; nullopt for anything else.
std::optional<AdapterAssignment> parse_adapter_assignment(const std::string& name);

// Sets each request's model to one of adapters (round-robin in request order, or uniformly at random
// with the seed). No-op when adapters is empty.
void assign_adapters(std::vector<BenchRequest>& requests, const std::vector<std::string>& adapters,
                     AdapterAssignment assignment, uint64_t seed);

// Arrival offsets in seconds from the benchmark start, one per request, non-decreasing, the first at 0.
// Gaps are gamma-distributed with shape = burstiness and mean 1/request_rate (burstiness 1: a Poisson
// process). An infinite request_rate sends everything at once (all zeros).
std::vector<double> arrival_times(int64_t num_requests, double request_rate, double burstiness,
                                  uint64_t seed);

}  // namespace polylora::bench_client
