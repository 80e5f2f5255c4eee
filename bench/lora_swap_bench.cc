// bench/lora_swap_bench.cc: `polylora_bench lora-swap`: what swapping an adapter into a device slot costs
// (issue 17's swap figure) on a model's shapes from config.json, without serving: LoraStacks with 2 slots,
// two random adapters (random_adapter.h), asynchronous uploads alternating them into slot 0, timed by the
// upload thread (LoraStacks::upload_timing: start to end of each copy), two ways:
//   staging  host images off: every swap converts the FP32 host copy through the fill threads' staging
//   image    host images on, each adapter's image made once (when it left the slot): every swap copies out
//            of its image (upload_timing().from_image counts them; the run fails if any swap did not)
// beside the backend's plain host-to-device rate from page-locked memory (Backend::alloc_host +
// copy_to_device of one 256 MiB block) and the single-thread memcpy rate of plain host memory (medians,
// machine_limits.h's time_per_call) and the memcpy rate of 8 threads, all in the same run. --threads 1,2,4,8
// repeats both swap ways with that many fill threads (LoraStacks::set_upload_threads; a fresh LoraStacks
// each). Prints one line per figure and, with --json-out, a JSON object.
// Must not: start an engine or a server.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "bench_command.h"
#include "common/error.h"
#include "config/model_config.h"
#include "machine_limits.h"
#include "model/lora_stacks.h"
#include "random_adapter.h"

namespace polylora::bench {
namespace {

int run_lora_swap_bench(int argc, char** argv) {
  CLI::App app{"Adapter swap into a device slot: staging path against host images",
               "polylora_bench lora-swap"};
  std::string config_dir, device = "cuda", json_path;
  std::vector<int64_t> thread_counts = {8};
  int64_t rank = 16, swaps = 8;
  bool no_experts = false;
  app.add_option("--config", config_dir, "Folder with config.json")->required();
  app.add_option("--device", device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--rank", rank, "LoRA rank")->check(CLI::Range(1, 512));
  app.add_option("--swaps", swaps, "Timed swaps per way")->check(CLI::Range(1, 1000));
  app.add_flag("--no-experts", no_experts, "Adapters on q/k/v/o only");
  app.add_option("--threads", thread_counts, "Comma-separated fill-thread counts, each a run of its own")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--json-out", json_path, "Also write the results as JSON here");
  CLI11_PARSE(app, argc, argv);
  const ModelConfig c = ModelConfig::from_file(config_dir + "/config.json");
  BackendOptions bo;
  bo.device = device == "cuda" ? DeviceKind::kCuda : DeviceKind::kCpu;
  bo.weight_dtype = DType::kBF16;
  std::unique_ptr<Backend> be = make_backend(bo);
  std::fprintf(stderr, "lora-swap on %s: generating two rank-%ld adapters...\n", be->name().c_str(),
               static_cast<long>(rank));
  std::shared_ptr<const LoraAdapter> ad[2] = {random_adapter(c, "a1", 1001, rank, !no_experts),
                                              random_adapter(c, "a2", 1002, rank, !no_experts)};
  nlohmann::json out = {{"device", be->name()},
                        {"config", config_dir},
                        {"rank", rank},
                        {"swaps", swaps},
                        {"runs", nlohmann::json::array()}};
  int64_t missed = 0;
  for (int64_t threads : thread_counts) {
    LoraStacks st(*be, c);
    st.reserve(2, rank);
    st.set_upload_threads(static_cast<size_t>(threads));
    auto swap = [&](int i) {
      st.begin_upload(0, ad[i % 2]);
      st.finish_upload(0);
    };
    // Staging: images off.
    st.set_host_image_budget(0);
    swap(0);  // the fill threads' staging buffers are made on the first upload: not timed
    auto t_before = st.upload_timing();
    for (int i = 1; i <= swaps; ++i) swap(i);
    auto t_after = st.upload_timing();
    const double staged_s = (t_after.seconds - t_before.seconds) / static_cast<double>(swaps);
    const double bytes = static_cast<double>(t_after.bytes - t_before.bytes) / static_cast<double>(swaps);
    // Images: on; one swap each way makes both images (the adapter leaving the slot gets its image).
    st.set_host_image_budget(size_t{1} << 40);
    swap(0);
    swap(1);
    swap(0);
    st.wait_host_images();
    t_before = st.upload_timing();
    for (int i = 1; i <= swaps; ++i) swap(i);
    st.wait_host_images();
    t_after = st.upload_timing();
    const int64_t imaged = t_after.from_image - t_before.from_image;
    missed += swaps - imaged;
    const double image_s = (t_after.seconds - t_before.seconds) / static_cast<double>(swaps);
    std::printf(
        "%ld fill threads: %.1f MB in the stacks' %s per swap; staging path %.2f ms (%.1f GB/s); image path "
        "%.2f ms (%.1f GB/s; %ld of %ld swaps out of an image)\n",
        static_cast<long>(threads), bytes / 1e6, std::string(dtype_name(st.dtype())).c_str(), staged_s * 1e3,
        bytes / staged_s / 1e9, image_s * 1e3, bytes / image_s / 1e9, static_cast<long>(imaged),
        static_cast<long>(swaps));
    std::fflush(stdout);
    out["stack_dtype"] = dtype_name(st.dtype());
    out["adapter_MB"] = bytes / 1e6;
    out["runs"].push_back({{"threads", threads},
                           {"staging_ms", staged_s * 1e3},
                           {"image_ms", image_s * 1e3},
                           {"image_swaps", imaged}});
  }
  // The limits beside them: page-locked host to device, one block; plain host memcpy, one thread.
  const size_t block = size_t{256} << 20;
  void* dev = be->alloc(block);
  void* pinned = be->alloc_host(block);
  std::memset(pinned, 1, block);
  const double pinned_gbps = static_cast<double>(block) / time_per_call([&] {
                               be->copy_to_device(dev, pinned, block);
                               be->synchronize();
                             }) /
                             1e9;
  be->free_host(pinned);
  be->free(dev);
  std::vector<std::byte> a(block, std::byte{1}), b(block);
  const double memcpy_gbps =
      static_cast<double>(block) / time_per_call([&] { std::memcpy(b.data(), a.data(), block); }) / 1e9;
  // The same block by 8 threads (each an eighth), as the fill threads copy.
  const double memcpy8_gbps =
      static_cast<double>(block) / time_per_call([&] {
        std::vector<std::thread> ts;
        const size_t part = block / 8;
        for (size_t k = 0; k < 8; ++k)
          ts.emplace_back([&, k] { std::memcpy(b.data() + k * part, a.data() + k * part, part); });
        for (std::thread& t : ts) t.join();
      }) /
      1e9;
  std::printf(
      "page-locked host-to-device copy: %.1f GB/s; plain host memcpy: %.1f GB/s one thread, %.1f GB/s 8 "
      "threads\n",
      pinned_gbps, memcpy_gbps, memcpy8_gbps);
  out["pinned_h2d_GBps"] = pinned_gbps;
  out["memcpy_GBps"] = memcpy_gbps;
  out["memcpy8_GBps"] = memcpy8_gbps;
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  if (missed > 0) {
    std::fprintf(stderr, "lora-swap: %ld image-path swaps did not copy out of an image\n",
                 static_cast<long>(missed));
    return 1;
  }
  return 0;
}

BenchRegistrar reg("lora-swap", "Adapter swap into a device slot: staging path against host images",
                   run_lora_swap_bench);

}  // namespace
}  // namespace polylora::bench
