// tests/unit/bench_client/bench_client_test.cc: `polylora bench serve`'s library against an in-process fake
// OpenAI server (httplib::Server on an ephemeral port streaming SSE chunks with known delays), plus the
// pure parts: SSE parsing, percentiles, metrics, arrivals, adapter assignment, dataset, JSON keys.
// Must not: assert tight timings (the machine is shared); bounds are generous.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <fstream>
#include <cmath>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <thread>

#include "bench_client/metrics.h"
#include "bench_client/openai_client.h"
#include "bench_client/runner.h"
#include "bench_client/sse_parser.h"
#include "bench_client/workload.h"
#include "common/error.h"

namespace polylora::bench_client {
namespace {

using nlohmann::json;

constexpr int kNumChunks = 5;
constexpr int kFirstDelayMs = 60;
constexpr int kGapMs = 25;

// A fake OpenAI-compatible server. /v1/completions streams kNumChunks text chunks (first after
// kFirstDelayMs, then every kGapMs) and a usage chunk; /v1/chat/completions streams a role-only chunk then
// kNumChunks content chunks and no usage; model "broken-adapter" gets a 404; /fail/v1/completions always
// answers 500.
class FakeOpenAiServer {
 public:
  FakeOpenAiServer() {
    server_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"object", "list"}, {"data", {{{"id", "fake-model"}}, {{"id", "other"}}}}}.dump(),
                      "application/json");
    });
    server_.Post("/tokenize", [](const httplib::Request& req, httplib::Response& res) {
      auto body = json::parse(req.body);
      std::string text = body["prompt"];
      json tokens = json::array();
      size_t word = 0;
      for (size_t i = 0; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == ' ') tokens.push_back(100 + static_cast<int>(word++ % 40));
      }
      res.set_content(json{{"tokens", tokens}, {"count", tokens.size()}}.dump(), "application/json");
    });
    server_.Post("/fail/v1/completions", [](const httplib::Request&, httplib::Response& res) {
      res.status = 500;
      res.set_content(R"({"error": {"message": "boom", "type": "server_error"}})", "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      stream(req, res, /*chat=*/false);
    });
    server_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      stream(req, res, /*chat=*/true);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }

  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<json> bodies() {
    std::lock_guard lock(mutex_);
    return bodies_;
  }

 private:
  void stream(const httplib::Request& req, httplib::Response& res, bool chat) {
    json body = json::parse(req.body);
    body["_x_bench_header"] = req.get_header_value("X-Bench");
    {
      std::lock_guard lock(mutex_);
      bodies_.push_back(body);
    }
    if (body["model"] == "broken-adapter") {
      res.status = 404;
      res.set_content(R"({"error": {"message": "The model `broken-adapter` does not exist."}})",
                      "application/json");
      return;
    }
    int64_t prompt_tokens = 0;
    if (body.contains("prompt") && body["prompt"].is_array())
      prompt_tokens = static_cast<int64_t>(body["prompt"].size());
    res.set_chunked_content_provider(
        "text/event-stream", [chat, prompt_tokens](size_t, httplib::DataSink& sink) {
          auto send = [&](const json& chunk) {
            std::string line = "data: " + chunk.dump() + "\n\n";
            sink.write(line.data(), line.size());
          };
          std::this_thread::sleep_for(std::chrono::milliseconds(kFirstDelayMs));
          if (chat)
            send({{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}}}}});
          for (int i = 0; i < kNumChunks; ++i) {
            if (i) std::this_thread::sleep_for(std::chrono::milliseconds(kGapMs));
            if (chat) {
              send({{"choices", {{{"index", 0}, {"delta", {{"content", " tok"}}}}}}});
            } else {
              send({{"choices", {{{"index", 0}, {"text", " tok"}}}}});
            }
          }
          if (!chat) {
            send({{"choices", json::array()},
                  {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", kNumChunks}}}});
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        });
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<json> bodies_;
};

BenchConfig fake_config(const FakeOpenAiServer& server) {
  BenchConfig config;
  config.client.base_url = server.base_url();
  config.dataset.num_prompts = 8;
  config.dataset.input_len = 16;
  config.dataset.output_len = kNumChunks;
  config.max_concurrency = 4;
  config.percentiles = {50, 99};
  return config;
}

void quiet(const std::string&) {}

RandomDatasetConfig dataset_of(int64_t num_prompts, int64_t input_len, int64_t output_len,
                               double range_ratio = 0, uint64_t seed = 0) {
  RandomDatasetConfig config;
  config.num_prompts = num_prompts;
  config.input_len = input_len;
  config.output_len = output_len;
  config.range_ratio = range_ratio;
  config.seed = seed;
  return config;
}

TEST(SseParser, SplitsDataLinesAcrossChunkBoundaries) {
  std::vector<std::string> payloads;
  SseParser parser([&](std::string_view data) {
    payloads.emplace_back(data);
    return true;
  });
  std::string stream = ": comment\r\nevent: x\ndata: {\"a\":1}\r\n\ndata:{\"b\":2}\n\ndata: [DONE]";
  for (char c : stream) ASSERT_TRUE(parser.feed(std::string_view(&c, 1)));
  ASSERT_TRUE(parser.finish());
  EXPECT_EQ(payloads, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"}));
}

TEST(Percentile, MatchesNumpyLinearInterpolation) {
  EXPECT_DOUBLE_EQ(percentile({}, 99), 0.0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7.0);
  EXPECT_DOUBLE_EQ(percentile({4, 1, 3, 2}, 50), 2.5);
  std::vector<double> hundred(100);
  std::iota(hundred.begin(), hundred.end(), 1.0);
  EXPECT_NEAR(percentile(hundred, 99), 99.01, 1e-9);  // numpy.percentile(range(1, 101), 99)
  EXPECT_NEAR(percentile(hundred, 90), 90.1, 1e-9);
  EXPECT_DOUBLE_EQ(percentile(hundred, 0), 1.0);
  EXPECT_DOUBLE_EQ(percentile(hundred, 100), 100.0);
  LatencyStats stats = latency_stats({0.001, 0.002, 0.003}, {99});
  EXPECT_NEAR(stats.mean_ms, 2.0, 1e-9);
  EXPECT_NEAR(stats.median_ms, 2.0, 1e-9);
  EXPECT_NEAR(stats.std_ms, std::sqrt(2.0 / 3.0), 1e-9);
  ASSERT_EQ(stats.percentiles_ms.size(), 1u);
  EXPECT_NEAR(stats.percentiles_ms[0].second, 2.98, 1e-9);
  EXPECT_EQ(percentile_word(99), "99");
  EXPECT_EQ(percentile_word(99.9), "99.9");
}

TEST(Metrics, FollowVllmDefinitions) {
  std::vector<RequestOutcome> outcomes(3);
  outcomes[0].success = true;
  outcomes[0].prompt_len = 10;
  outcomes[0].output_tokens = 5;
  outcomes[0].ttft = 0.1;
  outcomes[0].latency = 0.5;
  outcomes[0].itl = {0.1, 0.1, 0.1, 0.1};
  outcomes[1].success = true;
  outcomes[1].prompt_len = 20;
  outcomes[1].output_tokens = 1;
  outcomes[1].start_time = 0.2;
  outcomes[1].ttft = 0.3;
  outcomes[1].latency = 0.3;
  outcomes[2].error = "HTTP 500: boom";
  outcomes[2].prompt_len = 30;
  BenchMetrics m = compute_metrics(outcomes, 2.0, {99});
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);
  EXPECT_EQ(m.total_output, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.0);
  EXPECT_NEAR(m.ttft.mean_ms, 200.0, 1e-9);
  EXPECT_NEAR(m.tpot.mean_ms, 100.0, 1e-9);  // (0.5 - 0.1) / 4; the 1-token request has no TPOT
  EXPECT_NEAR(m.itl.mean_ms, 100.0, 1e-9);
  EXPECT_NEAR(m.e2el.mean_ms, 400.0, 1e-9);
  EXPECT_NEAR(m.e2el.median_ms, 400.0, 1e-9);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 6.0);  // every chunk lands in the first second
  EXPECT_DOUBLE_EQ(m.max_concurrent_requests, 2.0);
}

TEST(Arrivals, PoissonMeanGapIsOneOverRate) {
  constexpr int64_t kNum = 20000;
  for (double burstiness : {1.0, 0.5, 4.0}) {
    auto times = arrival_times(kNum, 10.0, burstiness, 7);
    ASSERT_EQ(times.size(), static_cast<size_t>(kNum));
    EXPECT_EQ(times[0], 0.0);
    for (size_t i = 1; i < times.size(); ++i) ASSERT_GE(times[i], times[i - 1]);
    double mean_gap = times.back() / static_cast<double>(kNum - 1);
    EXPECT_NEAR(mean_gap, 0.1, 0.1 * 0.05) << "burstiness " << burstiness;
  }
  // Exponential gaps: the standard deviation equals the mean.
  auto times = arrival_times(kNum, 10.0, 1.0, 3);
  double squares = 0;
  for (size_t i = 1; i < times.size(); ++i) squares += std::pow(times[i] - times[i - 1] - 0.1, 2);
  EXPECT_NEAR(std::sqrt(squares / (kNum - 1)), 0.1, 0.1 * 0.05);
  EXPECT_EQ(arrival_times(100, 10.0, 1.0, 7), arrival_times(100, 10.0, 1.0, 7));
  for (double t : arrival_times(50, INFINITY, 1.0, 7)) EXPECT_EQ(t, 0.0);
  EXPECT_THROW(arrival_times(5, 0.0, 1.0, 7), Error);
}

TEST(Adapters, RoundRobinAndRandomAssignment) {
  RandomDatasetConfig dataset = dataset_of(3000, 4, 2);
  auto requests = make_random_requests(dataset, {}, "base");
  const std::vector<std::string> adapters = {"a", "b", "c"};
  EXPECT_FALSE(parse_adapter_assignment("sometimes"));
  EXPECT_EQ(parse_adapter_assignment("round-robin"), AdapterAssignment::kRoundRobin);

  assign_adapters(requests, {}, AdapterAssignment::kRoundRobin, 0);
  for (const auto& r : requests) ASSERT_EQ(r.model, "base");
  assign_adapters(requests, adapters, AdapterAssignment::kRoundRobin, 0);
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_EQ(requests[i].model, adapters[i % 3]);

  assign_adapters(requests, adapters, AdapterAssignment::kRandom, 11);
  std::map<std::string, int> counts;
  for (const auto& r : requests) ++counts[r.model];
  ASSERT_EQ(counts.size(), 3u);
  for (const auto& [name, count] : counts) EXPECT_NEAR(count, 1000, 150) << name;
  auto again = requests;
  assign_adapters(again, adapters, AdapterAssignment::kRandom, 11);
  for (size_t i = 0; i < requests.size(); ++i) ASSERT_EQ(again[i].model, requests[i].model);
  bool differs_from_round_robin = false;
  for (size_t i = 0; i < requests.size(); ++i)
    differs_from_round_robin |= requests[i].model != adapters[i % 3];
  EXPECT_TRUE(differs_from_round_robin);
}

TEST(Dataset, RandomLengthsAndPrompts) {
  RandomDatasetConfig exact = dataset_of(20, 32, 8, 0.0, 1);
  std::vector<int32_t> pool = {5, 6, 7};
  for (const auto& r : make_random_requests(exact, pool, "m")) {
    EXPECT_EQ(r.prompt_len, 32);
    EXPECT_EQ(r.output_len, 8);
    ASSERT_EQ(r.prompt_token_ids.size(), 32u);
    EXPECT_TRUE(r.prompt_text.empty());
    for (int32_t id : r.prompt_token_ids) EXPECT_TRUE(id >= 5 && id <= 7);
  }
  RandomDatasetConfig ranged = dataset_of(500, 100, 10, 0.5);
  std::set<int64_t> input_lens;
  for (const auto& r : make_random_requests(ranged, {}, "m")) {
    EXPECT_TRUE(r.prompt_len >= 50 && r.prompt_len <= 150) << r.prompt_len;
    EXPECT_TRUE(r.output_len >= 5 && r.output_len <= 15) << r.output_len;
    EXPECT_EQ(std::count(r.prompt_text.begin(), r.prompt_text.end(), ' ') + 1, r.prompt_len);
    input_lens.insert(r.prompt_len);
  }
  EXPECT_GT(input_lens.size(), 50u);
  ranged.range_ratio = 1.0;
  EXPECT_THROW(make_random_requests(ranged, {}, "m"), Error);
}

TEST(BaseUrl, SplitsHostAndPrefix) {
  auto a = parse_base_url("http://127.0.0.1:8000");
  EXPECT_EQ(a.scheme_host_port, "http://127.0.0.1:8000");
  EXPECT_EQ(a.path_prefix, "");
  auto b = parse_base_url("https://example.com/proxy/");
  EXPECT_EQ(b.scheme_host_port, "https://example.com");
  EXPECT_EQ(b.path_prefix, "/proxy");
  EXPECT_THROW(parse_base_url("127.0.0.1:8000"), Error);
  EXPECT_EQ(endpoint_kind("/v1/chat/completions"), EndpointKind::kChatCompletions);
  EXPECT_EQ(endpoint_kind("/v1/completions"), EndpointKind::kCompletions);
  EXPECT_FALSE(endpoint_kind("/v1/embeddings"));
}

TEST(FakeServer, CompletionsMetricsMatchTheStream) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.client.ignore_eos = true;
  BenchReport report = run_benchmark(config, quiet);
  const BenchMetrics& m = report.metrics;
  EXPECT_EQ(m.completed, 8);
  EXPECT_EQ(m.failed, 0);
  EXPECT_EQ(m.total_output, 8 * kNumChunks);
  EXPECT_EQ(m.total_input, 8 * 16);  // token-id prompts via /tokenize: exact input lengths
  EXPECT_EQ(report.description.model_id, "fake-model");
  for (const auto& o : report.outcomes) {
    ASSERT_TRUE(o.success) << o.error;
    EXPECT_EQ(o.itl.size(), static_cast<size_t>(kNumChunks - 1));
    EXPECT_EQ(o.generated_text, " tok tok tok tok tok");
    EXPECT_GE(o.latency, o.ttft);
  }
  // Generous bounds around the server's delays (60 ms to the first chunk, 25 ms between chunks).
  EXPECT_GE(m.ttft.mean_ms, kFirstDelayMs * 0.8);
  EXPECT_LT(m.ttft.mean_ms, 3000);
  EXPECT_GE(m.itl.mean_ms, kGapMs * 0.5);
  EXPECT_LT(m.itl.mean_ms, 1000);
  EXPECT_GE(m.tpot.mean_ms, kGapMs * 0.5);
  EXPECT_NEAR(m.tpot.mean_ms, m.itl.mean_ms, 1e-6);  // evenly spaced chunks: TPOT is the mean ITL
  EXPECT_GE(m.e2el.mean_ms, kFirstDelayMs + (kNumChunks - 1) * kGapMs * 0.8);
  EXPECT_LE(m.max_concurrent_requests, 8);
  EXPECT_GT(m.request_throughput, 0);
  EXPECT_NEAR(m.output_throughput, m.request_throughput * kNumChunks, 1e-9);

  auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 9u);  // the initial test request and the 8 of the run
  for (const auto& body : bodies) {
    EXPECT_EQ(body["model"], "fake-model");
    EXPECT_EQ(body["stream"], true);
    EXPECT_EQ(body["stream_options"]["include_usage"], true);
    EXPECT_EQ(body["max_tokens"], kNumChunks);
    EXPECT_EQ(body["ignore_eos"], true);
    ASSERT_TRUE(body["prompt"].is_array());
    EXPECT_EQ(body["prompt"].size(), 16u);
  }
}

TEST(FakeServer, ChatWithoutUsageCountsContentChunks) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.client.endpoint = "/v1/chat/completions";
  config.backend = "openai-chat";
  config.initial_test = false;
  BenchReport report = run_benchmark(config, quiet);
  EXPECT_EQ(report.metrics.completed, 8);
  EXPECT_EQ(report.metrics.total_output, 8 * kNumChunks);
  EXPECT_EQ(report.description.backend, "openai-chat");
  for (const auto& o : report.outcomes) EXPECT_EQ(o.itl.size(), static_cast<size_t>(kNumChunks - 1));
  for (const auto& body : server.bodies()) {
    EXPECT_FALSE(body.contains("ignore_eos"));
    ASSERT_TRUE(body["messages"].is_array());
    EXPECT_TRUE(body["messages"][0]["content"].is_string());
  }
}

TEST(FakeServer, ErrorsAreCountedWithTheirMessage) {
  FakeOpenAiServer server;
  ClientOptions client;
  client.base_url = server.base_url();
  client.endpoint = "/fail/v1/completions";
  auto requests = make_random_requests(dataset_of(6, 4, 2), {}, "fake-model");
  double duration_s = 0;
  auto outcomes = run_requests(client, requests, arrival_times(6, INFINITY, 1.0, 0), 0, duration_s);
  ASSERT_EQ(outcomes.size(), 6u);
  for (const auto& o : outcomes) {
    EXPECT_FALSE(o.success);
    EXPECT_NE(o.error.find("HTTP 500"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("boom"), std::string::npos) << o.error;
  }
  BenchMetrics m = compute_metrics(outcomes, duration_s, {99});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 6);
  EXPECT_EQ(m.ttft.mean_ms, 0.0);

  ClientOptions unreachable;
  unreachable.base_url = "http://127.0.0.1:1";
  RequestOutcome o = OpenAiClient(unreachable).send(requests[0]);
  EXPECT_FALSE(o.success);
  EXPECT_NE(o.error.find("transport error"), std::string::npos) << o.error;
}

TEST(FakeServer, LoraModulesRoundRobinWithAFailingAdapter) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.lora_modules = {"good-adapter", "broken-adapter"};
  config.initial_test = false;
  config.request_rate = 200;  // Poisson arrivals
  BenchReport report = run_benchmark(config, quiet);
  EXPECT_EQ(report.metrics.completed, 4);
  EXPECT_EQ(report.metrics.failed, 4);
  for (size_t i = 0; i < report.outcomes.size(); ++i) {
    const auto& o = report.outcomes[i];
    EXPECT_EQ(o.model, i % 2 == 0 ? "good-adapter" : "broken-adapter");
    EXPECT_EQ(o.success, i % 2 == 0) << o.error;
    if (!o.success) {
      EXPECT_NE(o.error.find("HTTP 404"), std::string::npos) << o.error;
    }
  }
}

TEST(Report, SummaryAndJsonUseVllmKeys) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.dataset.num_prompts = 4;
  config.initial_test = false;
  BenchReport report = run_benchmark(config, quiet);
  std::vector<std::string> selected = {"ttft", "tpot", "itl", "e2el"};
  std::string summary = format_summary(report.description, report.metrics, report.duration_s, selected);
  EXPECT_EQ(summary.rfind("============ Serving Benchmark Result ============\n", 0), 0u) << summary;
  for (const char* line :
       {"Successful requests:", "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
        "Request throughput (req/s):", "Output token throughput (tok/s):", "Total Token throughput (tok/s):",
        "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):", "P50 E2EL (ms):",
        "---------------Time to First Token----------------"}) {
    EXPECT_NE(summary.find(line), std::string::npos) << line << "\n" << summary;
  }
  EXPECT_EQ(summary.substr(summary.size() - 51), std::string(50, '=') + "\n");

  json result =
      result_json(report.description, report.metrics, report.duration_s, report.outcomes, selected, false);
  for (const char* key : {"date",
                          "backend",
                          "model_id",
                          "num_prompts",
                          "request_rate",
                          "max_concurrency",
                          "duration",
                          "completed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "output_throughput",
                          "total_token_throughput",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p99_ttft_ms",
                          "p50_ttft_ms",
                          "mean_tpot_ms",
                          "median_tpot_ms",
                          "p99_tpot_ms",
                          "mean_itl_ms",
                          "median_itl_ms",
                          "p99_itl_ms",
                          "mean_e2el_ms",
                          "median_e2el_ms",
                          "p99_e2el_ms"}) {
    EXPECT_TRUE(result.contains(key)) << key;
  }
  EXPECT_EQ(result["completed"], 4);
  EXPECT_EQ(result["total_output_tokens"], 4 * kNumChunks);
  EXPECT_EQ(result["request_rate"], "inf");
  EXPECT_EQ(result["max_concurrency"], 4);
  EXPECT_FALSE(result.contains("itls"));

  json only_ttft =
      result_json(report.description, report.metrics, report.duration_s, report.outcomes, {"ttft"}, true);
  EXPECT_TRUE(only_ttft.contains("p99_ttft_ms"));
  EXPECT_FALSE(only_ttft.contains("mean_itl_ms"));
  for (const char* key : {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"}) {
    ASSERT_TRUE(only_ttft.contains(key)) << key;
    EXPECT_EQ(only_ttft[key].size(), 4u) << key;
  }
}

std::string data_path(const std::string& name) { return std::string(POLYLORA_TEST_DATA) + "/bench/" + name; }

std::string write_temp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Defaults, IgnoreEosIsOffAsInVllm) {
  ClientOptions options;
  EXPECT_FALSE(options.ignore_eos);
  EXPECT_EQ(options.temperature, 0.0);
}

TEST(Dataset, ShareGptFirstTurnsFilteredAndOversampled) {
  DatasetOptions options;
  options.name = "sharegpt";
  options.path = data_path("sharegpt_tiny.json");
  options.num_prompts = 10;
  json data = json::parse(std::ifstream(options.path));
  std::map<std::string, std::string> completion_of;
  for (const auto& entry : data) {
    if (entry["conversations"].size() >= 2)
      completion_of[entry["conversations"][0]["value"]] = entry["conversations"][1]["value"];
  }
  auto requests = load_sharegpt(options, count_words, "m");
  ASSERT_EQ(requests.size(), 10u);
  std::set<std::string> prompts;
  for (const auto& r : requests) {
    ASSERT_TRUE(completion_of.count(r.prompt_text)) << r.prompt_text;
    EXPECT_NE(r.prompt_text, "Hi");  // prompt under 4 tokens: dropped as vLLM does
    EXPECT_EQ(r.prompt_len, count_words(r.prompt_text));
    EXPECT_EQ(r.output_len, count_words(completion_of[r.prompt_text]));
    EXPECT_EQ(r.model, "m");
    EXPECT_TRUE(r.prompt_token_ids.empty());
    prompts.insert(r.prompt_text);
  }
  EXPECT_EQ(prompts.size(), 10u);  // the 10 valid conversations, each once
  options.sharegpt_output_len = 7;
  options.num_prompts = 25;
  auto oversampled = load_sharegpt(options, count_words, "m");
  ASSERT_EQ(oversampled.size(), 25u);
  for (const auto& r : oversampled) EXPECT_EQ(r.output_len, 7);
  // Shuffled with the seed: same seed, same order; another seed, another order.
  options.num_prompts = 10;
  options.sharegpt_output_len.reset();
  auto again = load_sharegpt(options, count_words, "m");
  for (size_t i = 0; i < again.size(); ++i) EXPECT_EQ(again[i].prompt_text, requests[i].prompt_text);
  options.seed = 7;
  auto other = load_sharegpt(options, count_words, "m");
  bool differs = false;
  for (size_t i = 0; i < other.size(); ++i) differs |= other[i].prompt_text != requests[i].prompt_text;
  EXPECT_TRUE(differs);

  // Too long: a prompt over 1024 tokens, or prompt + output over 2048; a short output; kept: the last one.
  std::string long_prompt, long_output;
  for (int i = 0; i < 1100; ++i) long_prompt += "word ";
  for (int i = 0; i < 1500; ++i) long_output += "word ";
  json filtered = json::array();
  auto conv = [](const std::string& h, const std::string& g) {
    return json{{"conversations", {{{"from", "human"}, {"value", h}}, {{"from", "gpt"}, {"value", g}}}}};
  };
  filtered.push_back(conv(long_prompt, "a fine short answer here"));
  filtered.push_back(conv(long_output.substr(0, 5 * 900), long_output));
  filtered.push_back(conv("a prompt of enough words", "no"));
  filtered.push_back(conv("a prompt of enough words", "an answer of enough words"));
  options.path = write_temp("sharegpt_filtered.json", filtered.dump());
  options.num_prompts = 3;
  auto kept = load_sharegpt(options, count_words, "m");
  ASSERT_EQ(kept.size(), 3u);
  for (const auto& r : kept) EXPECT_EQ(r.output_len, 5);
  // With --sharegpt-output-len the short-output check is skipped (vLLM's skip_min_output_len_check).
  options.sharegpt_output_len = 2;
  std::set<int64_t> lens;
  for (const auto& r : load_sharegpt(options, count_words, "m")) lens.insert(r.prompt_len);
  EXPECT_EQ(lens, (std::set<int64_t>{5, 900}));  // 900 + 2 fits in 2048 now

  options.path = write_temp("not_sharegpt.json", R"({"conversations": []})");
  EXPECT_THROW(load_sharegpt(options, count_words, "m"), Error);
  options.path = data_path("missing.json");
  EXPECT_THROW(load_sharegpt(options, count_words, "m"), Error);
  options.path = "";
  EXPECT_THROW(load_sharegpt(options, count_words, "m"), Error);
}

TEST(Dataset, CustomJsonl) {
  DatasetOptions options;
  options.path = data_path("custom_tiny.jsonl");
  options.num_prompts = 5;
  auto requests = load_custom(options, count_words, "m");
  ASSERT_EQ(requests.size(), 5u);
  std::set<std::string> prompts;
  for (const auto& r : requests) {
    EXPECT_EQ(r.output_len, 256);  // vLLM's --custom-output-len default
    EXPECT_EQ(r.prompt_len, count_words(r.prompt_text));
    prompts.insert(r.prompt_text);
  }
  EXPECT_EQ(prompts.size(), 5u);
  EXPECT_TRUE(prompts.count("What is the capital of France and why is it famous?"));
  options.custom_output_len = 9;
  options.num_prompts = 12;
  auto more = load_custom(options, count_words, "m");
  ASSERT_EQ(more.size(), 12u);
  EXPECT_EQ(more[11].output_len, 9);
  options.path = write_temp("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n");
  EXPECT_THROW(load_custom(options, count_words, "m"), Error);
}

TEST(Dataset, SonnetLinesWithASharedPrefix) {
  DatasetOptions options;
  options.path = data_path("sonnet_tiny.txt");
  options.num_prompts = 6;
  options.sonnet_input_len = 60;
  options.sonnet_prefix_len = 20;
  options.sonnet_output_len = 11;
  auto requests = load_sonnet(options, count_words, "m");
  ASSERT_EQ(requests.size(), 6u);
  const std::string base = "Pick as many lines as you can from these poem lines:\n";
  // 11 base words; lines average about 8 words: round((20 - 11) / 8) = 1 prefix line.
  const std::string prefix = base + "Shall I compare thee to a summer's day?\n";
  for (const auto& r : requests) {
    EXPECT_EQ(r.prompt_text.rfind(prefix, 0), 0u) << r.prompt_text;
    EXPECT_LE(r.prompt_len, 60);
    EXPECT_GT(r.prompt_len, 30);
    EXPECT_EQ(r.output_len, 11);
  }
  options.sonnet_input_len = 5;  // not above the base prompt
  EXPECT_THROW(load_sonnet(options, count_words, "m"), Error);
}

TEST(Dataset, PrefixRepetitionSharesPrefixes) {
  DatasetOptions options;
  options.num_prompts = 12;
  options.prefix_repetition_prefix_len = 10;
  options.prefix_repetition_suffix_len = 6;
  options.prefix_repetition_num_prefixes = 3;
  options.prefix_repetition_output_len = 4;
  std::vector<int32_t> pool(200);
  std::iota(pool.begin(), pool.end(), 1);
  auto requests = make_prefix_repetition_requests(options, pool, "m");
  ASSERT_EQ(requests.size(), 12u);
  std::map<std::vector<int32_t>, int> prefixes;
  for (const auto& r : requests) {
    ASSERT_EQ(r.prompt_token_ids.size(), 16u);
    EXPECT_EQ(r.prompt_len, 16);
    EXPECT_EQ(r.output_len, 4);
    ++prefixes[std::vector<int32_t>(r.prompt_token_ids.begin(), r.prompt_token_ids.begin() + 10)];
  }
  ASSERT_EQ(prefixes.size(), 3u);
  for (const auto& [prefix, n] : prefixes) EXPECT_EQ(n, 4);
  auto words = make_prefix_repetition_requests(options, {}, "m");
  for (const auto& r : words) EXPECT_EQ(count_words(r.prompt_text), 16);
}

TEST(Dataset, RandomPrefixLen) {
  RandomDatasetConfig config = dataset_of(10, 5, 3, 0.0, 2);
  config.prefix_len = 8;
  std::vector<int32_t> pool(100);
  std::iota(pool.begin(), pool.end(), 0);
  auto requests = make_random_requests(config, pool, "m");
  for (const auto& r : requests) {
    ASSERT_EQ(r.prompt_token_ids.size(), 13u);
    EXPECT_EQ(r.prompt_len, 13);
    EXPECT_TRUE(std::equal(r.prompt_token_ids.begin(), r.prompt_token_ids.begin() + 8,
                           requests[0].prompt_token_ids.begin()));
  }
  for (const auto& r : make_random_requests(config, {}, "m")) EXPECT_EQ(count_words(r.prompt_text), 13);
}

TEST(Goodput, CountsRequestsWithinEverySlo) {
  EXPECT_THROW(parse_goodput({"ttft"}), Error);
  EXPECT_THROW(parse_goodput({"itl:5"}), Error);
  EXPECT_THROW(parse_goodput({"ttft:-1"}), Error);
  EXPECT_THROW(parse_goodput({"ttft:abc"}), Error);
  GoodputSlos slos = parse_goodput({"ttft:200", "tpot:50"});
  EXPECT_EQ(slos.size(), 2u);
  EXPECT_EQ(slos["ttft"], 200.0);
  auto outcome = [](double ttft, double latency, int64_t tokens, bool success = true) {
    RequestOutcome o;
    o.success = success;
    o.ttft = ttft;
    o.latency = latency;
    o.output_tokens = tokens;
    return o;
  };
  std::vector<RequestOutcome> outcomes = {
      outcome(0.1, 0.1 + 0.04 * 10, 11),  // ttft 100 ms, tpot 40 ms: good
      outcome(0.3, 0.3 + 0.04 * 10, 11),  // ttft too slow
      outcome(0.1, 0.1 + 0.06 * 10, 11),  // tpot too slow
      outcome(0.2, 5.0, 1),               // one token: tpot 0, ttft exactly at the limit: good
      outcome(0.01, 0.02, 2, false),      // failed: not counted
  };
  BenchMetrics m = compute_metrics(outcomes, 2.0, {99}, slos);
  ASSERT_TRUE(m.request_goodput);
  EXPECT_DOUBLE_EQ(*m.request_goodput, 1.0);  // 2 good requests / 2 s
  EXPECT_FALSE(compute_metrics(outcomes, 2.0, {99}).request_goodput);
  BenchMetrics e2el = compute_metrics(outcomes, 4.0, {99}, parse_goodput({"e2el:600"}));
  EXPECT_DOUBLE_EQ(*e2el.request_goodput, 0.25);  // only the first (0.5 s) of 4 requests, over 4 s
  BenchDescription d;
  json with = result_json(d, m, 2.0, outcomes, {"ttft"}, false);
  EXPECT_DOUBLE_EQ(with["request_goodput"].get<double>(), 1.0);
  EXPECT_TRUE(result_json(d, compute_metrics(outcomes, 2.0, {99}), 2.0, outcomes, {"ttft"}, false)["request_goodput"]
                  .is_null());
  EXPECT_NE(format_summary(d, m, 2.0, {"ttft"}).find("Request goodput (req/s):"), std::string::npos);
}

TEST(RampUp, LinearAndExponentialRates) {
  EXPECT_EQ(parse_ramp_up("linear"), RampUp::kLinear);
  EXPECT_EQ(parse_ramp_up("exponential"), RampUp::kExponential);
  EXPECT_FALSE(parse_ramp_up("step"));
  EXPECT_DOUBLE_EQ(ramp_up_rate(RampUp::kLinear, 1, 9, 0, 5), 1);
  EXPECT_DOUBLE_EQ(ramp_up_rate(RampUp::kLinear, 1, 9, 2, 5), 5);
  EXPECT_DOUBLE_EQ(ramp_up_rate(RampUp::kLinear, 1, 9, 4, 5), 9);
  EXPECT_DOUBLE_EQ(ramp_up_rate(RampUp::kExponential, 1, 16, 2, 5), 4);
  EXPECT_DOUBLE_EQ(ramp_up_rate(RampUp::kExponential, 1, 16, 4, 5), 16);
  // Gaps shrink as the rate grows: the mean gap of the first quarter is far above the last quarter's.
  auto times = ramp_up_arrival_times(4000, RampUp::kLinear, 10, 1000, 1.0, 3);
  ASSERT_EQ(times.size(), 4000u);
  EXPECT_EQ(times[0], 0.0);
  for (size_t i = 1; i < times.size(); ++i) EXPECT_GE(times[i], times[i - 1]);
  double first = times[1000] - times[0], last = times[3999] - times[2999];
  EXPECT_GT(first, 5 * last);
  // Linear from 10 to 1000 RPS: the expected total is sum of 1/rate(i) ≈ (n-1)/(end-start) * ln(end/start).
  double expected = 3999.0 / 990.0 * std::log(100.0);
  EXPECT_NEAR(times.back(), expected, expected * 0.15);
  auto from_zero = ramp_up_arrival_times(10, RampUp::kLinear, 0, 100, 1.0, 0);
  for (double t : from_zero) EXPECT_TRUE(std::isfinite(t));
  EXPECT_THROW(ramp_up_arrival_times(10, RampUp::kExponential, 0, 10, 1.0, 0), Error);
  EXPECT_THROW(ramp_up_arrival_times(10, RampUp::kLinear, 20, 10, 1.0, 0), Error);
}

TEST(FakeServer, HeadersSamplingWarmupsServedNameAndGoodput) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.dataset.num_prompts = 4;
  config.initial_test = false;
  config.num_warmups = 3;
  config.served_model_name = "served";
  config.client.headers = {{"X-Bench", "yes"}};
  config.client.top_p = 0.9;
  config.client.top_k = 20;
  config.client.min_p = 0.05;
  config.goodput = parse_goodput({"ttft:60000"});
  config.ramp_up = RampUp::kLinear;
  config.ramp_up_start_rps = 50;
  config.ramp_up_end_rps = 200;
  std::vector<size_t> progress;
  config.progress = [&](size_t done, size_t total) {
    EXPECT_EQ(total, 4u);
    progress.push_back(done);
  };
  BenchReport report = run_benchmark(config, quiet);
  EXPECT_EQ(report.metrics.completed, 4);
  EXPECT_EQ(progress, (std::vector<size_t>{1, 2, 3, 4}));
  ASSERT_TRUE(report.metrics.request_goodput);
  EXPECT_NEAR(*report.metrics.request_goodput, report.metrics.request_throughput, 1e-9);
  auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 7u);  // 3 warm-ups and 4 measured
  for (const auto& body : bodies) {
    EXPECT_EQ(body["model"], "served");
    EXPECT_EQ(body["_x_bench_header"], "yes");
    EXPECT_DOUBLE_EQ(body["top_p"].get<double>(), 0.9);
    EXPECT_EQ(body["top_k"], 20);
    EXPECT_DOUBLE_EQ(body["min_p"].get<double>(), 0.05);
    EXPECT_EQ(body["temperature"], 0.0);
    EXPECT_FALSE(body.contains("ignore_eos"));
  }
  EXPECT_EQ(report.description.model_id, "fake-model");
  EXPECT_EQ(report.description.ramp_up_strategy, "linear");
  report.description.label = "mylabel";
  report.description.metadata["gpu"] = "h200";
  json result = result_json(report.description, report.metrics, report.duration_s, report.outcomes, {"ttft"}, false);
  EXPECT_EQ(result["label"], "mylabel");
  EXPECT_EQ(result["endpoint_type"], "vllm");
  EXPECT_EQ(result["gpu"], "h200");
  EXPECT_EQ(result["ramp_up_strategy"], "linear");
  EXPECT_EQ(result["ramp_up_start_rps"], 50.0);
  EXPECT_TRUE(result["request_goodput"].is_number());
}

TEST(FakeServer, ShareGptThroughTheServersTokenize) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.datasets.name = "sharegpt";
  config.datasets.path = data_path("sharegpt_tiny.json");
  config.dataset.num_prompts = 10;
  config.initial_test = false;
  BenchReport report = run_benchmark(config, quiet);
  EXPECT_EQ(report.metrics.completed, 10);
  for (const auto& body : server.bodies()) EXPECT_TRUE(body["prompt"].is_string());
  config.datasets.name = "hf";
  EXPECT_THROW(run_benchmark(config, quiet), Error);
}

TEST(LocalTokenizer, CountsShareGptPrompts) {
  FakeOpenAiServer server;
  BenchConfig config = fake_config(server);
  config.tokenizer = std::string(POLYLORA_TEST_DATA) + "/models/qwen3-moe-tiny/tokenizer.json";
  config.datasets.name = "sharegpt";
  config.datasets.path = data_path("sharegpt_tiny.json");
  config.dataset.num_prompts = 3;
  config.initial_test = false;
  BenchReport report = run_benchmark(config, quiet);
  EXPECT_EQ(report.metrics.completed, 3);
  EXPECT_EQ(report.description.tokenizer_id, config.tokenizer);
  config.tokenizer = "/nonexistent/tokenizer.json";
  EXPECT_THROW(run_benchmark(config, quiet), Error);
}

}  // namespace
}  // namespace polylora::bench_client
