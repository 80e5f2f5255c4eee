// bench_client/runner.cc: see runner.h.
#include "bench_client/runner.h"

#include <sys/resource.h>

#include <fmt/format.h>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <mutex>
#include <set>
#include <thread>

#include "common/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace polylora::bench_client {
namespace {

using Clock = std::chrono::steady_clock;

// One socket per in-flight request: lift the soft open-file limit to the hard one.
void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

std::string now_date() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &local);
  return buffer;
}

// Distinct token ids of the random word list, as the server's tokenizer (or the local one) encodes them;
// empty when neither is available.
std::vector<int32_t> probe_token_pool(OpenAiClient& client, const std::string& model,
                                      const tokenizer::Tokenizer* local) {
  std::string text;
  for (const auto& word : random_words()) text += (text.empty() ? "" : " ") + word;
  auto ids = local ? std::optional(local->encode(text, false)) : client.tokenize(model, text);
  if (!ids) return {};
  std::set<int32_t> unique(ids->begin(), ids->end());
  return {unique.begin(), unique.end()};
}

// --tokenizer: a model folder, or a tokenizer.json(.gz) file (its folder is loaded).
std::unique_ptr<tokenizer::Tokenizer> load_tokenizer(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (!std::filesystem::exists(p, ec))
    fail("--tokenizer {}: no such file or folder (give a tokenizer.json or a model folder)", path);
  std::string dir = std::filesystem::is_directory(p, ec) ? path : p.parent_path().string();
  if (dir.empty()) dir = ".";
  if (!std::filesystem::is_directory(p, ec) && p.filename() != "tokenizer.json" &&
      p.filename() != "tokenizer.json.gz") {
    std::ifstream in(path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::from_json(buffer.str()));
  }
  return std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(dir));
}

}  // namespace

std::vector<RequestOutcome> run_requests(const ClientOptions& client,
                                         const std::vector<BenchRequest>& requests,
                                         const std::vector<double>& arrivals, int64_t max_concurrency,
                                         double& duration_s,
                                         const std::function<void(size_t num_done)>& on_done) {
  CHECK(requests.size() == arrivals.size());
  OpenAiClient validate(client);  // bad options fail here, not inside a worker thread
  raise_open_file_limit();
  std::vector<RequestOutcome> outcomes(requests.size());
  std::mutex mutex;
  std::condition_variable work_ready, slot_free;
  std::deque<size_t> queue;
  size_t num_idle = 0, num_in_flight = 0, num_done = 0;
  bool closing = false;
  std::vector<std::thread> workers;
  auto start = Clock::now();

  auto worker = [&] {
    OpenAiClient connection(client);
    std::unique_lock lock(mutex);
    while (true) {
      ++num_idle;
      work_ready.wait(lock, [&] { return closing || !queue.empty(); });
      --num_idle;
      if (queue.empty()) return;
      size_t idx = queue.front();
      queue.pop_front();
      lock.unlock();
      double sent_at = std::chrono::duration<double>(Clock::now() - start).count();
      RequestOutcome outcome;
      try {
        outcome = connection.send(requests[idx]);
      } catch (const std::exception& e) {
        outcome.model = requests[idx].model;
        outcome.error = e.what();
      }
      outcome.start_time = sent_at;
      lock.lock();
      outcomes[idx] = std::move(outcome);
      --num_in_flight;
      ++num_done;
      if (on_done) on_done(num_done);
      slot_free.notify_one();
    }
  };

  for (size_t i = 0; i < requests.size(); ++i) {
    std::this_thread::sleep_until(
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[i])));
    std::unique_lock lock(mutex);
    if (max_concurrency > 0) {
      slot_free.wait(lock, [&] { return num_in_flight < static_cast<size_t>(max_concurrency); });
    }
    ++num_in_flight;
    queue.push_back(i);
    if (queue.size() > num_idle) workers.emplace_back(worker);
    work_ready.notify_one();
  }
  {
    std::unique_lock lock(mutex);
    slot_free.wait(lock, [&] { return num_in_flight == 0; });
    closing = true;
  }
  work_ready.notify_all();
  for (auto& thread : workers) thread.join();
  duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  return outcomes;
}

BenchReport run_benchmark(const BenchConfig& config, const LogFn& log) {
  for (const auto& metric : config.selected_metrics) {
    if (!is_known_metric(metric))
      fail("--percentile-metrics: unknown metric '{}' (use ttft,tpot,itl,e2el)", metric);
  }
  for (double p : config.percentiles) {
    if (!(p > 0 && p < 100)) fail("--metric-percentiles: {} is not in (0, 100)", p);
  }
  if (config.max_concurrency < 0)
    fail("--max-concurrency must not be negative (got {})", config.max_concurrency);
  auto kind = endpoint_kind(config.client.endpoint);
  if (!kind)
    fail("--endpoint '{}' is not supported: use /v1/completions or /v1/chat/completions",
         config.client.endpoint);

  OpenAiClient client(config.client);
  std::string model = config.model;
  if (model.empty()) {
    auto ids = client.list_models();
    if (ids.empty()) fail("GET /v1/models listed no model; pass --model");
    model = ids.front();
  }
  std::unique_ptr<tokenizer::Tokenizer> local;
  if (!config.tokenizer.empty()) local = load_tokenizer(config.tokenizer);
  const std::string& request_model = config.served_model_name.empty() ? model : config.served_model_name;
  const std::string& dataset = config.datasets.name;
  bool synthetic = dataset == "random" || dataset == "prefix_repetition" || dataset == "burstgpt";

  std::vector<int32_t> token_pool;
  if (synthetic && (config.use_tokenize || local) && *kind == EndpointKind::kCompletions)
    token_pool = probe_token_pool(client, request_model, local.get());
  // How text prompts are counted: the local tokenizer, else POST /tokenize, else one token per word.
  bool server_tokenize = !synthetic && !local && config.use_tokenize && client.tokenize(request_model, "probe").has_value();
  TokenCountFn count = [&](const std::string& text) -> int64_t {
    if (local) return static_cast<int64_t>(local->encode(text, true).size());
    if (server_tokenize) {
      auto ids = client.tokenize(request_model, text);
      if (ids) return static_cast<int64_t>(ids->size());
    }
    return count_words(text);
  };
  if (synthetic) {
    log(token_pool.empty() ? "Prompts: random words (no tokenizer, or a chat endpoint)"
                           : fmt::format("Prompts: random token ids ({} distinct ids from {})", token_pool.size(),
                                         local ? "--tokenizer" : "POST /tokenize"));
  } else {
    log(fmt::format("Prompts: {} dataset {}; tokens counted with {}", dataset, config.datasets.path,
                    local ? "--tokenizer" : server_tokenize ? "POST /tokenize" : "one token per word"));
  }

  DatasetOptions options = config.datasets;
  options.num_prompts = config.dataset.num_prompts;
  options.seed = config.dataset.seed;
  std::vector<BenchRequest> requests;
  if (dataset == "random") {
    requests = make_random_requests(config.dataset, token_pool, request_model);
  } else if (dataset == "sharegpt") {
    requests = load_sharegpt(options, count, request_model);
  } else if (dataset == "custom") {
    requests = load_custom(options, count, request_model);
  } else if (dataset == "sonnet") {
    requests = load_sonnet(options, count, request_model);
  } else if (dataset == "prefix_repetition") {
    requests = make_prefix_repetition_requests(options, token_pool, request_model);
  } else if (dataset == "burstgpt") {
    requests = load_burstgpt(options, token_pool, request_model);
  } else {
    fail("--dataset-name '{}' is not supported (random, sharegpt, custom, sonnet, prefix_repetition, burstgpt)",
         dataset);
  }
  // vLLM applies the tokenizer's chat template (one user message, generation prompt) to sonnet prompts on
  // the completions backends, and to custom prompts unless --custom-skip-chat-template (here on the
  // completions backends only: a chat endpoint applies the server's). It needs a local --tokenizer here.
  bool template_wanted = *kind == EndpointKind::kCompletions &&
                         (dataset == "sonnet" || (dataset == "custom" && !options.custom_skip_chat_template));
  if (template_wanted && local && !local->chat_template().empty()) {
    ChatTemplate tmpl = ChatTemplate::compile(local->chat_template());
    for (auto& r : requests) {
      ChatTemplateInputs in;
      in.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", r.prompt_text}}});
      in.add_generation_prompt = true;
      if (local->bos_id()) in.bos_token = local->id_to_token(*local->bos_id());
      in.eos_token = local->eos_token();
      r.prompt_text = tmpl.render(in);
      r.prompt_len = count(r.prompt_text);
    }
    log("Prompts: the tokenizer's chat template applied, as vLLM does for this dataset");
  } else if (template_wanted) {
    log("Prompts: sent without a chat template (vLLM applies the tokenizer's: give --tokenizer to do the same)");
  }
  assign_adapters(requests, config.lora_modules, config.lora_assignment, config.dataset.seed);
  std::vector<double> arrivals =
      config.ramp_up ? ramp_up_arrival_times(static_cast<int64_t>(requests.size()), *config.ramp_up,
                                             config.ramp_up_start_rps, config.ramp_up_end_rps, config.burstiness,
                                             config.dataset.seed)
                     : arrival_times(static_cast<int64_t>(requests.size()), config.request_rate,
                                     config.burstiness, config.dataset.seed);

  if (config.initial_test) {
    log("Starting initial single prompt test run...");
    RequestOutcome test = client.send(requests.front());
    if (!test.success) {
      fail(
          "the initial test request to {}{} failed ({}); check --model, --endpoint, --lora-modules and "
          "--api-key",
          config.client.base_url, config.client.endpoint, test.error);
    }
    log("Initial test run completed. Starting main benchmark run...");
  }
  if (config.num_warmups < 0) fail("--num-warmups must not be negative (got {})", config.num_warmups);
  if (config.num_warmups > 0) {
    log(fmt::format("Warming up with {} requests...", config.num_warmups));
    std::vector<BenchRequest> warmups(static_cast<size_t>(config.num_warmups), requests.front());
    double warmup_s = 0;
    run_requests(config.client, warmups, std::vector<double>(warmups.size(), 0.0), config.max_concurrency,
                 warmup_s);
    log("Warmup run completed.");
  }
  if (config.ramp_up) {
    log(fmt::format("Ramp-up strategy: {} from {} to {} RPS", config.ramp_up == RampUp::kLinear ? "linear" : "exponential",
                    config.ramp_up_start_rps, config.ramp_up_end_rps));
  }
  log(fmt::format("Traffic request rate: {}",
                  std::isinf(config.request_rate) ? "inf" : fmt::format("{}", config.request_rate)));
  log(fmt::format("Burstiness factor: {} ({})", config.burstiness,
                  config.burstiness == 1.0 ? "Poisson process" : "Gamma distribution"));
  log(fmt::format("Maximum request concurrency: {}",
                  config.max_concurrency > 0 ? std::to_string(config.max_concurrency) : "None"));

  BenchReport report;
  size_t num_requests = requests.size();
  size_t report_every = std::max<size_t>(1, num_requests / 10);
  report.outcomes = run_requests(config.client, requests, arrivals, config.max_concurrency, report.duration_s,
                                 [&](size_t num_done) {
                                   if (config.progress) {
                                     config.progress(num_done, num_requests);
                                   } else if (num_done % report_every == 0 || num_done == num_requests) {
                                     log(fmt::format("  {}/{} requests done", num_done, num_requests));
                                   }
                                 });
  report.metrics = compute_metrics(report.outcomes, report.duration_s, config.percentiles, config.goodput);

  auto& d = report.description;
  d.backend = config.backend;
  d.model_id = model;
  d.tokenizer_id = config.tokenizer.empty() ? model : config.tokenizer;
  if (config.ramp_up) {
    d.ramp_up_strategy = *config.ramp_up == RampUp::kLinear ? "linear" : "exponential";
    d.ramp_up_start_rps = config.ramp_up_start_rps;
    d.ramp_up_end_rps = config.ramp_up_end_rps;
  }
  d.endpoint = config.client.endpoint;
  d.num_prompts = static_cast<int64_t>(num_requests);
  d.request_rate = config.request_rate;
  d.burstiness = config.burstiness;
  d.max_concurrency = config.max_concurrency;
  d.lora_modules = config.lora_modules;
  switch (config.lora_assignment) {
    case AdapterAssignment::kRoundRobin:
      d.lora_assignment = "round-robin";
      break;
    case AdapterAssignment::kRandom:
      d.lora_assignment = "random";
      break;
  }
  d.date = now_date();
  return report;
}

}  // namespace polylora::bench_client
