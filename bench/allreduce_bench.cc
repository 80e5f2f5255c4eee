// bench/allreduce_bench.cc: `polylora_bench allreduce`: the collectives tensor parallelism runs each step,
// timed through the communicators the model uses (NCCL over the visible GPUs on the ranks' backend streams;
// the CPU group on --device cpu; staged through host memory where NCCL cannot run), as nccl-tests reports
// them: time per all_reduce, algorithm bandwidth (bytes / time) and bus bandwidth (algbw · 2(n−1)/n, the
// link rate the ring needs). With --config, each decode batch's collectives per step for that model (an
// all_reduce of [batch, hidden] f32 after the embedding and after each layer's attention and MLP, and the
// LM head's all_gather of [batch, vocab / n]) are timed at their real sizes: the all-reduce time per step
// that issue 20's check holds against the measured bus bandwidth.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_command.h"
#include "common/error.h"
#include "config/model_config.h"
#include "model/staged_communicator.h"
#include "runtime/communicator.h"
#include "runtime/rank_threads.h"
#ifdef POLYLORA_HAVE_NCCL
#include "runtime/cuda/nccl_communicator.h"
#endif

namespace polylora::bench {
namespace {

std::vector<int64_t> parse_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

// The ranks' backends, threads (the model's RankThreads: one per rank, with its CPU group) and
// communicators for one run.
struct Group {
  std::vector<std::shared_ptr<Backend>> backends;  // [rank]
  std::unique_ptr<RankThreads> threads;
  std::vector<std::unique_ptr<StagedCommunicator>> staged;
#ifdef POLYLORA_HAVE_NCCL
  std::unique_ptr<NcclCommunicatorGroup> nccl;
#endif
  std::vector<Communicator*> comms;
  std::string kind;
};

Group make_group(bool cuda, int n, bool staged) {
  Group g;
  BackendOptions bo;
  bo.device = cuda ? DeviceKind::kCuda : DeviceKind::kCpu;
  std::shared_ptr<Backend> first = make_backend(bo);
  g.backends.push_back(first);
  for (int r = 1; r < n; ++r) g.backends.push_back(first->make_peer(r));
  g.threads = std::make_unique<RankThreads>(n);
  if (!cuda) {
    for (int r = 0; r < n; ++r) g.comms.push_back(&g.threads->communicator(r));
    g.kind = "CPU group (threads)";
    return g;
  }
#ifdef POLYLORA_HAVE_NCCL
  if (!staged) {
    std::vector<int> devices;
    std::vector<cudaStream_t> streams;
    for (int r = 0; r < n; ++r) {
      devices.push_back(r);
      streams.push_back(static_cast<cudaStream_t>(g.backends[static_cast<size_t>(r)]->queue_handle()));
    }
    g.nccl = std::make_unique<NcclCommunicatorGroup>(devices, streams);
    for (int r = 0; r < n; ++r) g.comms.push_back(&g.nccl->communicator(r));
    g.kind = "NCCL";
    return g;
  }
#endif
  for (int r = 0; r < n; ++r) {
    g.staged.push_back(std::make_unique<StagedCommunicator>(g.threads->communicator(r),
                                                            *g.backends[static_cast<size_t>(r)]));
    g.comms.push_back(g.staged.back().get());
  }
  g.kind = "staged through host memory";
  return g;
}

// Seconds per collective of `bytes` (f32 elements), all_reduce or all_gather (bytes per rank), after
// warm-ups.
double time_collective(Group& g, size_t bytes, bool gather, int iters) {
  const int n = static_cast<int>(g.comms.size());
  const size_t count = std::max<size_t>(1, bytes / sizeof(float));
  std::vector<void*> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Backend& be = *g.backends[static_cast<size_t>(r)];
    send[static_cast<size_t>(r)] = be.alloc(count * sizeof(float));
    recv[static_cast<size_t>(r)] = be.alloc(count * sizeof(float) * (gather ? static_cast<size_t>(n) : 1));
  }
  std::vector<double> seconds(static_cast<size_t>(n), 0.0);
  g.threads->run([&](int r) {
    Communicator& c = *g.comms[static_cast<size_t>(r)];
    auto once = [&] {
      if (gather)
        c.all_gather(send[static_cast<size_t>(r)], recv[static_cast<size_t>(r)], count, DType::kF32);
      else
        c.all_reduce(send[static_cast<size_t>(r)], recv[static_cast<size_t>(r)], count, DType::kF32,
                     ReduceOp::kSum);
    };
    for (int i = 0; i < 3; ++i) once();
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) once();
    c.barrier();  // waits for the queued collectives (NCCL: on the device)
    seconds[static_cast<size_t>(r)] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  for (int r = 0; r < n; ++r) {
    g.backends[static_cast<size_t>(r)]->free(send[static_cast<size_t>(r)]);
    g.backends[static_cast<size_t>(r)]->free(recv[static_cast<size_t>(r)]);
  }
  return *std::max_element(seconds.begin(), seconds.end()) / iters;
}

int run_allreduce_bench(int argc, char** argv) {
  CLI::App app{"Collectives of tensor parallelism: time and bus bandwidth", "polylora_bench allreduce"};
  std::string device = "cuda", sizes_text = "65536,1048576,16777216,268435456", config_dir,
              batches_text = "1,64", json_path;
  int tp = 0, iters = 20;
  bool staged = false;
  app.add_option("--device", device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--tensor-parallel-size", tp, "Ranks (-tp; default: every visible GPU; 2 on the CPU)");
  app.add_option("--sizes", sizes_text, "Message sizes in bytes (per rank), comma-separated");
  app.add_option("--iters", iters, "Collectives timed per size")->check(CLI::PositiveNumber);
  app.add_option("--config", config_dir, "A model's config dir: time its decode steps' collectives");
  app.add_option("--batches", batches_text, "Decode batch sizes for --config");
  app.add_flag("--staged", staged, "On GPUs, the collectives through host memory instead of NCCL");
  app.add_option("--json-out", json_path, "Write the results as JSON here");
  std::vector<std::string> args;  // vLLM's -tp spelling (CLI11 takes one-letter short names only)
  for (int i = argc - 1; i >= 1; --i)
    args.push_back(std::string(argv[i]) == "-tp" ? "--tensor-parallel-size" : argv[i]);
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const bool cuda = device == "cuda";
  if (tp == 0) tp = cuda ? std::max(1, cuda_device_count()) : 2;
  if (cuda && tp > cuda_device_count()) fail("-tp {} needs {} GPUs; {} visible", tp, tp, cuda_device_count());
  Group g = make_group(cuda, tp, staged);
  const double bus = tp > 1 ? 2.0 * (tp - 1) / tp : 1.0;
  nlohmann::json out = {{"device", g.backends[0]->name()},
                        {"ranks", tp},
                        {"communicator", g.kind},
                        {"all_reduce", nlohmann::json::array()},
                        {"steps", nlohmann::json::array()}};
  std::fprintf(stderr, "%d ranks, %s, on %s\n", tp, g.kind.c_str(), g.backends[0]->name().c_str());
  for (int64_t bytes : parse_list(sizes_text)) {
    const double s = time_collective(g, static_cast<size_t>(bytes), false, iters);
    const double algbw = static_cast<double>(bytes) / s / 1e9;
    std::fprintf(stderr, "all_reduce %12lld bytes: %10.1f us, algbw %7.2f GB/s, busbw %7.2f GB/s\n",
                 static_cast<long long>(bytes), s * 1e6, algbw, algbw * bus);
    out["all_reduce"].push_back(
        {{"bytes", bytes}, {"us", s * 1e6}, {"algbw_GBps", algbw}, {"busbw_GBps", algbw * bus}});
  }
  if (!config_dir.empty()) {
    const ModelConfig c = ModelConfig::from_file(config_dir + "/config.json");
    const int64_t W = (c.vocab_size + tp - 1) / tp;
    for (int64_t b : parse_list(batches_text)) {
      const size_t hidden_bytes = static_cast<size_t>(b * c.hidden_size) * sizeof(float);
      const int64_t reduces = 1 + 2 * c.num_layers;  // embedding, then attention and MLP of every layer
      const double ar = time_collective(g, hidden_bytes, false, iters);
      const double ag = time_collective(g, static_cast<size_t>(b * W) * sizeof(float), true, iters);
      const double step = ar * static_cast<double>(reduces) + ag;
      const double algbw = static_cast<double>(hidden_bytes) / ar / 1e9;
      std::fprintf(
          stderr,
          "%s batch %lld: %lld all_reduces of %zu bytes (%.1f us each, busbw %.2f GB/s) + logits all_gather "
          "%.1f us = %.1f us of collectives per decode step\n",
          c.model_type.c_str(), static_cast<long long>(b), static_cast<long long>(reduces), hidden_bytes,
          ar * 1e6, algbw * bus, ag * 1e6, step * 1e6);
      out["steps"].push_back({{"model", c.model_type},
                              {"batch", b},
                              {"all_reduces", reduces},
                              {"all_reduce_bytes", hidden_bytes},
                              {"all_reduce_us", ar * 1e6},
                              {"all_reduce_busbw_GBps", algbw * bus},
                              {"all_gather_us", ag * 1e6},
                              {"collective_us_per_step", step * 1e6}});
    }
  }
  const std::string text = out.dump(2);
  if (!json_path.empty()) std::ofstream(json_path) << text << "\n";
  std::printf("%s\n", text.c_str());
  return 0;
}

BenchRegistrar reg("allreduce", "Tensor parallelism's collectives: time, algbw and busbw (NCCL or CPU)",
                   run_allreduce_bench);

}  // namespace
}  // namespace polylora::bench
