// bench/sampling_bench.cc: `polylora_bench sampling`: the device sampler (worker/device_sampler.h) checked
// against the CPU Sampler on the same logits, then timed: per batch size (default 1, 16, 64, 256 rows at
// vocab 201088) and per mode (greedy; temperature + top_k + top_p with logprobs; top_p alone; min_p),
// microseconds per call end to end (launch + wait: host preparation, upload, kernels, download) and GPU
// time per call of back-to-back launches. A failed check exits with status 1 before any timing.
// Must not: hold sampling logic (it drives DeviceSampler and Sampler only).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_command.h"
#include "worker/device_sampler.h"
#include "worker/sampler.h"

namespace polylora::bench {
namespace {

struct Mode {
  std::string name;
  SamplingParams params;
};

std::vector<Mode> modes(int64_t logprobs) {
  std::vector<Mode> m;
  SamplingParams greedy;
  greedy.temperature = 0.0;
  m.push_back({"greedy", greedy});
  SamplingParams full;
  full.temperature = 0.8;
  full.top_k = 50;
  full.top_p = 0.9;
  full.logprobs = logprobs;
  m.push_back({"topk+topp+logprobs", full});
  SamplingParams top_p;
  top_p.temperature = 1.0;
  top_p.top_p = 0.95;
  m.push_back({"topp", top_p});
  SamplingParams min_p;
  min_p.temperature = 0.7;
  min_p.min_p = 0.05;
  m.push_back({"minp", min_p});
  return m;
}

// Logits with a long right tail, as a language model's: normal noise plus a few strong candidates.
std::vector<float> make_logits(int64_t rows, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(rows * vocab));
  for (float& x : v) x = normal(rng);
  for (int64_t r = 0; r < rows; ++r)
    for (int k = 0; k < 32; ++k)
      v[static_cast<size_t>(r * vocab + static_cast<int64_t>(rng() % vocab))] += 8.0f;
  return v;
}

struct Check {
  int64_t rows = 0, differ = 0, bad_logprobs = 0;
};

Check check(Backend& be, DeviceSampler& ds, const float* dev, const std::vector<float>& host, int64_t rows,
            int64_t vocab, const SamplingParams& params, const std::vector<std::vector<int32_t>>& outputs) {
  std::vector<DeviceSampleRow> drows;
  for (int64_t r = 0; r < rows; ++r)
    drows.push_back({&params, {}, outputs[r], {}, 1234 + static_cast<uint64_t>(r), {}});
  ds.launch(dev, drows);
  const auto got = ds.wait();
  Sampler sampler(vocab);
  std::vector<float> row(static_cast<size_t>(vocab));
  Check c;
  c.rows = rows;
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(host.begin() + r * vocab, host.begin() + (r + 1) * vocab, row.begin());
    SamplerRow sr{row.data(), &params, {}, outputs[r], {}, 1234 + static_cast<uint64_t>(r)};
    const SampleResult ref = sampler.sample_row(sr);
    if (ref.token != got[r].token) {
      ++c.differ;
      continue;
    }
    if (!params.logprobs) continue;
    bool ok = std::fabs(ref.logprob - got[r].logprob) <= 1e-4f && ref.rank == got[r].rank &&
              ref.top.size() == got[r].top.size();
    for (size_t j = 0; ok && j < ref.top.size(); ++j)
      ok =
          ref.top[j].id == got[r].top[j].id && std::fabs(ref.top[j].logprob - got[r].top[j].logprob) <= 1e-4f;
    c.bad_logprobs += !ok;
  }
  return c;
}

int run_sampling_bench(int argc, char** argv) {
  CLI::App app{"Device sampler: checked against the CPU Sampler, then timed", "polylora_bench sampling"};
  std::string device = "cuda", rows_text = "1,16,64,256";
  int64_t vocab = 201088, logprobs = 5, iters = 200;
  app.add_option("--device", device, "cuda | cpu")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--vocab", vocab, "Vocabulary size");
  app.add_option("--rows", rows_text, "Comma-separated batch sizes");
  app.add_option("--logprobs", logprobs, "Top log-probs of the topk+topp mode");
  app.add_option("--iters", iters, "Timed calls per measurement");
  std::string kernels = "both", mode_filter;
  app.add_option("--kernels", kernels,
                 "fused | phases | both (CUDA: one cooperative kernel or one per phase)")
      ->check(CLI::IsMember({"fused", "phases", "both"}));
  app.add_option("--mode", mode_filter, "Time only this mode (greedy, topk+topp+logprobs, topp, minp)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<int64_t> batches;
  std::stringstream ss(rows_text);
  for (std::string item; std::getline(ss, item, ',');) batches.push_back(std::stoll(item));
  const int64_t max_rows = *std::max_element(batches.begin(), batches.end());

  BackendOptions bo;
  bo.device = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  std::unique_ptr<Backend> be = make_backend(bo);
  DeviceSampler ds(*be, vocab, max_rows, 20);
  std::fprintf(stderr, "sampling on %s: vocab %ld, up to %ld rows, %.1f MB of device memory\n",
               be->name().c_str(), static_cast<long>(vocab), static_cast<long>(max_rows),
               static_cast<double>(ds.device_bytes()) / 1e6);
  // Two logits sets, alternated while timing.
  std::vector<float> host[2] = {make_logits(max_rows, vocab, 1), make_logits(max_rows, vocab, 2)};
  float* dev[2];
  for (int i = 0; i < 2; ++i) {
    dev[i] = static_cast<float*>(be->alloc(host[i].size() * sizeof(float)));
    be->copy_to_device(dev[i], host[i].data(), host[i].size() * sizeof(float));
  }
  std::vector<std::vector<int32_t>> outputs(static_cast<size_t>(max_rows));
  for (int64_t r = 0; r < max_rows; ++r) outputs[r].assign(static_cast<size_t>(r % 17), 0);

  bool failed = false;
  for (const Mode& m : modes(logprobs))
    for (bool fused : {true, false}) {
      ds.set_fused_kernel(fused);
      const int64_t rows = std::min<int64_t>(max_rows, 256);
      const Check c = check(*be, ds, dev[0], host[0], rows, vocab, m.params, outputs);
      const double equal = 1.0 - static_cast<double>(c.differ) / static_cast<double>(c.rows);
      const bool ok = (m.params.greedy() ? c.differ == 0 : equal >= 0.99) && c.bad_logprobs == 0;
      std::printf("check %-20s %-6s rows %4ld: %ld token(s) differ, %ld logprob mismatch(es): %s\n",
                  m.name.c_str(), fused ? "fused" : "phases", static_cast<long>(c.rows),
                  static_cast<long>(c.differ), static_cast<long>(c.bad_logprobs), ok ? "ok" : "FAILED");
      failed |= !ok;
    }
  if (failed) return 1;

  std::printf("\n%-20s %-7s %6s %14s %14s\n", "mode", "kernels", "rows", "us/call e2e", "us/call gpu");
  std::vector<bool> variants;
  if (kernels != "phases") variants.push_back(true);
  if (kernels != "fused") variants.push_back(false);
  for (const Mode& m : modes(logprobs)) {
    if (!mode_filter.empty() && m.name != mode_filter) continue;
    for (bool fused : variants)
      for (int64_t rows : batches) {
        ds.set_fused_kernel(fused);
        std::vector<DeviceSampleRow> drows;
        for (int64_t r = 0; r < rows; ++r)
          drows.push_back({&m.params, {}, outputs[r], {}, 99 + static_cast<uint64_t>(r), {}});
        for (int i = 0; i < 10; ++i) {
          ds.launch(dev[i & 1], drows);
          ds.wait();
        }
        auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < iters; ++i) {
          ds.launch(dev[i & 1], drows);
          ds.wait();
        }
        const double e2e =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
        be->gpu_timer_start();
        for (int64_t i = 0; i < iters; ++i) ds.launch(dev[i & 1], drows);
        const double gpu = be->gpu_timer_stop() / iters;
        ds.wait();
        std::printf("%-20s %-7s %6ld %14.1f %14.1f\n", m.name.c_str(), fused ? "fused" : "phases",
                    static_cast<long>(rows), e2e * 1e6, gpu * 1e6);
        std::fflush(stdout);
      }
  }
  for (float* p : dev) be->free(p);
  return 0;
}

BenchRegistrar reg("sampling", "Device sampler vs the CPU Sampler, then us per call at 1..256 rows",
                   run_sampling_bench);

}  // namespace
}  // namespace polylora::bench
