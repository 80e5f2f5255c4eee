// bench_client/metrics.cc: see metrics.h.
#include "bench_client/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace polylora::bench_client {
namespace {

constexpr int kTableWidth = 50;

// Python's "{s:{c}^{n}}".format(...): text centred in width, the odd fill character on the right.
std::string centred(const std::string& text, char fill) {
  if (static_cast<int>(text.size()) >= kTableWidth) return text;
  size_t pad = kTableWidth - text.size();
  return std::string(pad / 2, fill) + text + std::string(pad - pad / 2, fill);
}

// Python's "{:<40} {:<10}".format(label, value).
std::string row(const std::string& label, const std::string& value) {
  return fmt::format("{:<40} {:<10}\n", label, value);
}
std::string row(const std::string& label, double value) {
  return row(label, fmt::format("{:.2f}", value));
}
std::string row(const std::string& label, int64_t value) {
  return row(label, std::to_string(value));
}

struct MetricInfo {
  const char* key;     // "ttft"
  const char* name;    // "TTFT"
  const char* header;  // the section title of the summary
  LatencyStats BenchMetrics::*stats;
};

constexpr MetricInfo kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token", &BenchMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &BenchMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &BenchMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &BenchMetrics::e2el},
};

bool selected(const std::vector<std::string>& selected_metrics, const char* key) {
  return std::find(selected_metrics.begin(), selected_metrics.end(), key) != selected_metrics.end();
}

}  // namespace

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  size_t low = static_cast<size_t>(std::floor(rank));
  size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (rank - static_cast<double>(low));
}

LatencyStats latency_stats(const std::vector<double>& values_s, const std::vector<double>& percentiles) {
  LatencyStats stats;
  if (!values_s.empty()) {
    double n = static_cast<double>(values_s.size());
    double mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
    double squares = 0;
    for (double v : values_s) squares += (v - mean) * (v - mean);
    stats.mean_ms = mean * 1000.0;
    stats.std_ms = std::sqrt(squares / n) * 1000.0;  // numpy's population std
  }
  stats.median_ms = percentile(values_s, 50.0) * 1000.0;
  for (double p : percentiles) stats.percentiles_ms.emplace_back(p, percentile(values_s, p) * 1000.0);
  return stats;
}

GoodputSlos parse_goodput(const std::vector<std::string>& items) {
  GoodputSlos slos;
  for (const auto& item : items) {
    auto colon = item.find(':');
    std::string key = item.substr(0, colon);
    if (colon == std::string::npos || (key != "ttft" && key != "tpot" && key != "e2el"))
      fail("--goodput: '{}' must be KEY:VALUE with KEY one of ttft, tpot, e2el (e.g. ttft:200 tpot:50)", item);
    std::string text = item.substr(colon + 1);
    double value = -1;
    try {
      size_t used = 0;
      value = std::stod(text, &used);
      if (used != text.size()) value = -1;
    } catch (const std::exception&) {
    }
    if (!(value >= 0) || std::isinf(value)) fail("--goodput: '{}' is not a non-negative number of ms", text);
    slos[key] = value;
  }
  return slos;
}

BenchMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                             const std::vector<double>& percentiles, const GoodputSlos& slos) {
  BenchMetrics metrics;
  int64_t good = 0;
  std::vector<double> ttfts, tpots, itls, e2els;
  for (const auto& outcome : outcomes) {
    if (!outcome.success) {
      ++metrics.failed;
      continue;
    }
    ++metrics.completed;
    metrics.total_input += outcome.prompt_len;
    metrics.total_output += outcome.output_tokens;
    if (outcome.output_tokens > 1) {
      tpots.push_back((outcome.latency - outcome.ttft) / static_cast<double>(outcome.output_tokens - 1));
    }
    itls.insert(itls.end(), outcome.itl.begin(), outcome.itl.end());
    ttfts.push_back(outcome.ttft);
    e2els.push_back(outcome.latency);
    if (!slos.empty()) {
      double tpot = outcome.output_tokens > 1
                        ? (outcome.latency - outcome.ttft) / static_cast<double>(outcome.output_tokens - 1)
                        : 0.0;
      bool ok = true;
      for (const auto& [key, limit_ms] : slos) {
        double value = key == "ttft" ? outcome.ttft : key == "tpot" ? tpot : outcome.latency;
        ok = ok && value <= limit_ms / 1000.0;
      }
      good += ok ? 1 : 0;
    }
  }
  if (!slos.empty()) metrics.request_goodput = duration_s > 0 ? static_cast<double>(good) / duration_s : 0.0;
  if (duration_s > 0) {
    metrics.request_throughput = static_cast<double>(metrics.completed) / duration_s;
    metrics.output_throughput = static_cast<double>(metrics.total_output) / duration_s;
    metrics.total_token_throughput =
        static_cast<double>(metrics.total_input + metrics.total_output) / duration_s;
  }
  metrics.ttft = latency_stats(ttfts, percentiles);
  metrics.tpot = latency_stats(tpots, percentiles);
  metrics.itl = latency_stats(itls, percentiles);
  metrics.e2el = latency_stats(e2els, percentiles);

  // Peak rates over one-second buckets from the first request start (vLLM counts content chunks).
  if (!outcomes.empty()) {
    double first_start = outcomes.front().start_time, last_end = 0;
    for (const auto& o : outcomes) {
      first_start = std::min(first_start, o.start_time);
      last_end = std::max(last_end, o.start_time + o.latency);
    }
    size_t num_buckets = static_cast<size_t>(std::ceil(last_end - first_start)) + 1;
    std::vector<double> tokens(num_buckets, 0), concurrent(num_buckets, 0);
    auto bucket_of = [&](double t) { return static_cast<size_t>(std::max(0.0, t - first_start)); };
    for (const auto& o : outcomes) {
      if (!o.success) continue;
      double token_time = o.start_time + o.ttft;
      if (bucket_of(token_time) < num_buckets) tokens[bucket_of(token_time)] += 1;
      for (double gap : o.itl) {
        token_time += gap;
        if (bucket_of(token_time) < num_buckets) tokens[bucket_of(token_time)] += 1;
      }
      size_t end_bucket = std::min(bucket_of(o.start_time + o.latency), num_buckets - 1);
      for (size_t b = bucket_of(o.start_time); b <= end_bucket; ++b) concurrent[b] += 1;
    }
    metrics.max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
    metrics.max_concurrent_requests = *std::max_element(concurrent.begin(), concurrent.end());
  }
  return metrics;
}

bool is_known_metric(const std::string& name) {
  for (const auto& m : kMetrics) {
    if (name == m.key) return true;
  }
  return false;
}

std::string percentile_word(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<int64_t>(p));
  return fmt::format("{}", p);
}

std::string format_summary(const BenchDescription& description, const BenchMetrics& metrics,
                           double duration_s, const std::vector<std::string>& selected_metrics) {
  std::string out = centred(" Serving Benchmark Result ", '=') + "\n";
  out += row("Successful requests:", metrics.completed);
  out += row("Failed requests:", metrics.failed);
  if (description.max_concurrency > 0)
    out += row("Maximum request concurrency:", description.max_concurrency);
  if (!std::isinf(description.request_rate))
    out += row("Request rate configured (RPS):", description.request_rate);
  out += row("Benchmark duration (s):", duration_s);
  out += row("Total input tokens:", metrics.total_input);
  out += row("Total generated tokens:", metrics.total_output);
  out += row("Request throughput (req/s):", metrics.request_throughput);
  if (metrics.request_goodput) out += row("Request goodput (req/s):", *metrics.request_goodput);
  out += row("Output token throughput (tok/s):", metrics.output_throughput);
  out += row("Peak output token throughput (tok/s):", metrics.max_output_tokens_per_s);
  out += row("Peak concurrent requests:", metrics.max_concurrent_requests);
  out += row("Total Token throughput (tok/s):", metrics.total_token_throughput);
  for (const auto& m : kMetrics) {
    if (!selected(selected_metrics, m.key)) continue;
    const LatencyStats& stats = metrics.*(m.stats);
    out += centred(m.header, '-') + "\n";
    out += row(fmt::format("Mean {} (ms):", m.name), stats.mean_ms);
    out += row(fmt::format("Median {} (ms):", m.name), stats.median_ms);
    for (const auto& [p, value] : stats.percentiles_ms) {
      out += row(fmt::format("P{} {} (ms):", percentile_word(p), m.name), value);
    }
  }
  out += std::string(kTableWidth, '=') + "\n";
  return out;
}

nlohmann::json result_json(const BenchDescription& description, const BenchMetrics& metrics,
                           double duration_s, const std::vector<RequestOutcome>& outcomes,
                           const std::vector<std::string>& selected_metrics, bool detailed) {
  nlohmann::json result = {
      {"date", description.date},
      {"endpoint_type", description.backend},
      {"backend", description.backend},
      {"label", description.label.empty() ? description.backend : description.label},
      {"endpoint", description.endpoint},
      {"model_id", description.model_id},
      {"tokenizer_id", description.tokenizer_id.empty() ? description.model_id : description.tokenizer_id},
      {"num_prompts", description.num_prompts},
      {"burstiness", description.burstiness},
      {"duration", duration_s},
      {"completed", metrics.completed},
      {"failed", metrics.failed},
      {"total_input_tokens", metrics.total_input},
      {"total_output_tokens", metrics.total_output},
      {"request_throughput", metrics.request_throughput},
      {"request_goodput", metrics.request_goodput ? nlohmann::json(*metrics.request_goodput) : nullptr},
      {"output_throughput", metrics.output_throughput},
      {"total_token_throughput", metrics.total_token_throughput},
      {"max_output_tokens_per_s", metrics.max_output_tokens_per_s},
      {"max_concurrent_requests", metrics.max_concurrent_requests},
  };
  if (std::isinf(description.request_rate)) {
    result["request_rate"] = "inf";
  } else {
    result["request_rate"] = description.request_rate;
  }
  if (description.max_concurrency > 0) {
    result["max_concurrency"] = description.max_concurrency;
  } else {
    result["max_concurrency"] = nullptr;
  }
  if (!description.ramp_up_strategy.empty()) {
    result["ramp_up_strategy"] = description.ramp_up_strategy;
    result["ramp_up_start_rps"] = description.ramp_up_start_rps;
    result["ramp_up_end_rps"] = description.ramp_up_end_rps;
  }
  if (!description.lora_modules.empty()) {
    result["lora_modules"] = description.lora_modules;
    result["lora_assignment"] = description.lora_assignment;
  }
  for (const auto& m : kMetrics) {
    if (!selected(selected_metrics, m.key)) continue;
    const LatencyStats& stats = metrics.*(m.stats);
    result[fmt::format("mean_{}_ms", m.key)] = stats.mean_ms;
    result[fmt::format("median_{}_ms", m.key)] = stats.median_ms;
    result[fmt::format("std_{}_ms", m.key)] = stats.std_ms;
    for (const auto& [p, value] : stats.percentiles_ms) {
      result[fmt::format("p{}_{}_ms", percentile_word(p), m.key)] = value;
    }
  }
  for (const auto& [key, value] : description.metadata.items()) result[key] = value;
  if (detailed) {
    auto& input_lens = result["input_lens"] = nlohmann::json::array();
    auto& output_lens = result["output_lens"] = nlohmann::json::array();
    auto& ttfts = result["ttfts"] = nlohmann::json::array();
    auto& itls = result["itls"] = nlohmann::json::array();
    auto& texts = result["generated_texts"] = nlohmann::json::array();
    auto& errors = result["errors"] = nlohmann::json::array();
    for (const auto& o : outcomes) {
      input_lens.push_back(o.prompt_len);
      output_lens.push_back(o.success ? o.output_tokens : 0);
      ttfts.push_back(o.ttft);
      itls.push_back(o.itl);
      texts.push_back(o.generated_text);
      errors.push_back(o.error);
    }
  }
  return result;
}

}  // namespace polylora::bench_client
