// bench_client/burstgpt.cc: vLLM's `--dataset-name burstgpt`: request and response lengths from the
// BurstGPT trace (a CSV with the columns Timestamp, Model, Request tokens, Response tokens, Total tokens,
// Log Type).
#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "bench_client/workload.h"
#include "common/error.h"

namespace polylora::bench_client {
namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  for (std::string cell; std::getline(ss, cell, ',');) {
    while (!cell.empty() && (cell.back() == '\r' || cell.back() == ' ')) cell.pop_back();
    while (!cell.empty() && cell.front() == ' ') cell.erase(cell.begin());
    cells.push_back(cell);
  }
  return cells;
}

int64_t cell_int(const std::string& cell, const std::string& path, size_t line) {
  try {
    size_t used = 0;
    double v = std::stod(cell, &used);
    if (used == cell.size()) return static_cast<int64_t>(v);
  } catch (const std::exception&) {
  }
  fail("--dataset-path {}: line {}: '{}' is not a token count", path, line, cell);
}

}  // namespace

std::vector<BenchRequest> load_burstgpt(const DatasetOptions& options, const std::vector<int32_t>& token_pool,
                                        const std::string& model) {
  if (options.num_prompts < 1) fail("--num-prompts must be at least 1");
  if (options.path.empty()) fail("--dataset-name burstgpt needs --dataset-path (the BurstGPT CSV file)");
  std::ifstream in(options.path);
  if (!in) fail("--dataset-path {}: cannot read the file", options.path);
  std::string line;
  if (!std::getline(in, line)) fail("--dataset-path {}: the file is empty", options.path);
  std::vector<std::string> header = split_csv_line(line);
  auto column = [&](const char* name) {
    auto it = std::find(header.begin(), header.end(), name);
    if (it == header.end()) fail("--dataset-path {}: no '{}' column (a BurstGPT CSV is expected)", options.path, name);
    return static_cast<size_t>(it - header.begin());
  };
  size_t model_col = column("Model"), request_col = column("Request tokens"), response_col = column("Response tokens");
  // As vLLM: the GPT-4 rows that did not fail (response tokens > 0).
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (size_t n = 2; std::getline(in, line); ++n) {
    if (line.empty() || line == "\r") continue;
    std::vector<std::string> cells = split_csv_line(line);
    size_t need = std::max({model_col, request_col, response_col});
    if (cells.size() <= need) fail("--dataset-path {}: line {} has {} cells", options.path, n, cells.size());
    if (cells[model_col] != "GPT-4") continue;
    int64_t input = cell_int(cells[request_col], options.path, n), output = cell_int(cells[response_col], options.path, n);
    if (output <= 0 || input <= 0) continue;
    rows.emplace_back(input, output);
  }
  if (rows.empty()) fail("--dataset-path {}: no GPT-4 row with a response", options.path);
  // vLLM samples rows (with replacement when it needs more than there are), seeded.
  std::mt19937_64 rng(options.seed);
  std::vector<std::pair<int64_t, int64_t>> picked;
  if (options.num_prompts <= static_cast<int64_t>(rows.size())) {
    std::shuffle(rows.begin(), rows.end(), rng);
    picked.assign(rows.begin(), rows.begin() + options.num_prompts);
  } else {
    std::uniform_int_distribution<size_t> pick(0, rows.size() - 1);
    for (int64_t i = 0; i < options.num_prompts; ++i) picked.push_back(rows[pick(rng)]);
  }
  // The prompt of request i: token j is (i + j) modulo the vocabulary (vLLM), here modulo the token pool
  // (ids the server's tokenizer gives for plain words); without one, words in the same pattern.
  std::vector<BenchRequest> requests;
  const auto& words = random_words();
  for (size_t i = 0; i < picked.size(); ++i) {
    BenchRequest r;
    r.prompt_len = picked[i].first;
    r.output_len = picked[i].second;
    r.model = model;
    for (int64_t j = 0; j < r.prompt_len; ++j) {
      size_t k = i + static_cast<size_t>(j);
      if (!token_pool.empty())
        r.prompt_token_ids.push_back(token_pool[k % token_pool.size()]);
      else
        r.prompt_text += (j ? " " : "") + words[k % words.size()];
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

}  // namespace polylora::bench_client
