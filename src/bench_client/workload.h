// bench_client/workload.h: what a benchmark sends and when: the random dataset (prompt and output
// lengths, prompt contents), the adapter ("model" field) of each request, and Poisson/gamma arrival times.
// Owns: deterministic (seeded) generation of the request list and the arrival schedule.
// Must not: do I/O or know about HTTP (the runner sends what this produces).
#pragma once

#include <cstdint>
#include <functional>
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
// --random-prefix-len tokens shared by every prompt come first (vLLM: total input = prefix + drawn length).
struct RandomDatasetConfig {
  int64_t num_prompts = 1000;
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  int64_t prefix_len = 0;    // --random-prefix-len
  uint64_t seed = 0;
};

// Counts (or encodes) a text prompt's tokens: a local tokenizer (--tokenizer), the server's POST
// /tokenize, or one token per whitespace-separated word as the last resort.
using TokenCountFn = std::function<int64_t(const std::string& text)>;

// Everything the file-based and synthetic datasets other than `random` need (vLLM's flag names).
struct DatasetOptions {
  std::string name = "random";  // random | sharegpt | custom | sonnet | prefix_repetition
  std::string path;             // --dataset-path
  int64_t num_prompts = 1000;
  uint64_t seed = 0;
  std::optional<int64_t> sharegpt_output_len;  // --sharegpt-output-len (default: the gpt turn's length)
  int64_t custom_output_len = 256;             // --custom-output-len
  bool custom_skip_chat_template = false;      // --custom-skip-chat-template
  int64_t sonnet_input_len = 550;              // --sonnet-input-len
  int64_t sonnet_output_len = 150;             // --sonnet-output-len
  int64_t sonnet_prefix_len = 200;             // --sonnet-prefix-len
  int64_t prefix_repetition_prefix_len = 256;  // --prefix-repetition-prefix-len
  int64_t prefix_repetition_suffix_len = 256;  // --prefix-repetition-suffix-len
  int64_t prefix_repetition_num_prefixes = 10;
  int64_t prefix_repetition_output_len = 128;
};

// vLLM's ShareGPT dataset: a JSON list of {"conversations": [{"from": "human", "value": ...},
// {"from": "gpt", "value": ...}, ...]}; entries with fewer than two turns are dropped, the rest shuffled
// with the seed; the first turn is the prompt and the second's token count the output length unless
// --sharegpt-output-len. Sequences failing vLLM's is_valid_sequence (prompt or output < 4 tokens, prompt >
// 1024, prompt + output > 2048; the output check skipped with an explicit output length) are skipped.
// Fewer valid entries than num_prompts are oversampled (repeated) as vLLM does.
std::vector<BenchRequest> load_sharegpt(const DatasetOptions& options, const TokenCountFn& count,
                                        const std::string& model);

// vLLM's custom dataset: JSONL, one object with a "prompt" string per line; output --custom-output-len.
std::vector<BenchRequest> load_custom(const DatasetOptions& options, const TokenCountFn& count,
                                      const std::string& model);

// vLLM's sonnet dataset: the lines of a text file. Every prompt is "Pick as many lines as you can from these
// poem lines:\n" + the first lines (about --sonnet-prefix-len tokens, shared) + random lines up to about
// --sonnet-input-len tokens; output --sonnet-output-len. (The runner applies the chat template for the
// completions backends, as vLLM, when it has a local tokenizer.)
std::vector<BenchRequest> load_sonnet(const DatasetOptions& options, const TokenCountFn& count,
                                      const std::string& model);

// vLLM's prefix_repetition dataset: num_prefixes random prefixes of prefix_len tokens, each request one of
// them (round-robin over the shuffled list) + its own random suffix of suffix_len tokens. With a non-empty
// token_pool the prompts are token ids, else random words (about one token each).
std::vector<BenchRequest> make_prefix_repetition_requests(const DatasetOptions& options,
                                                          const std::vector<int32_t>& token_pool,
                                                          const std::string& model);

// vLLM's burstgpt dataset (bench_client/burstgpt.cc): the BurstGPT CSV at options.path; rows of model
// GPT-4 with a response, sampled with the seed (with replacement when num_prompts exceeds them); each
// request's input and output lengths are its row's Request and Response tokens. Prompts are token ids from
// token_pool in vLLM's (i + j) pattern, or words when the pool is empty.
std::vector<BenchRequest> load_burstgpt(const DatasetOptions& options, const std::vector<int32_t>& token_pool,
                                        const std::string& model);
// One token per whitespace-separated word: the fallback count.
int64_t count_words(const std::string& text);

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

// vLLM's --ramp-up-strategy: the rate of request i is start + (end - start) * i / (n - 1) (linear) or
// start * (end / start) ^ (i / (n - 1)) (exponential); the gap before request i is gamma-distributed with
// shape burstiness and mean 1 / rate(i - 1) (vLLM sleeps after each request at that request's rate).
enum class RampUp { kLinear, kExponential };
std::optional<RampUp> parse_ramp_up(const std::string& name);
double ramp_up_rate(RampUp strategy, double start_rps, double end_rps, int64_t index, int64_t num_requests);
std::vector<double> ramp_up_arrival_times(int64_t num_requests, RampUp strategy, double start_rps,
                                          double end_rps, double burstiness, uint64_t seed);

}  // namespace polylora::bench_client
