// bench/lora_swap_bench.cc: `polylora_bench lora-swap`: what swapping an adapter into a device slot costs
// (issue 17's swap figure) on a model's shapes from config.json, without serving: LoraStacks with 2 slots,
// two random adapters (random_adapter.h), asynchronous uploads alternating them into slot 0, timed by the
// upload thread (LoraStacks::upload_timing: start to end of each copy), two ways:
//   staging  host images off: every swap converts the FP32 host copy through the fill threads' staging
//   image    host images on, each adapter's image made once (when it left the slot): every swap copies out
//            of its image (upload_timing().from_image counts them; the run fails if any swap did not)
// beside the backend's plain host-to-device rate from page-locked memory (Backend::alloc_host +
// copy_to_device of one 256 MiB block) and the single-thread memcpy rate of plain host memory (medians,
// machine_limits.h's time_per_call), both in the same run. Prints one line per figure and, with
// --json-out, a JSON object.
// Must not: start an engine or a server.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
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
  int64_t rank = 16, swaps = 8;
  bool no_experts = false;
  app.add_option("--config", config_dir, "Folder with config.json")->required();
  app.add_option("--device", device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--rank", rank, "LoRA rank")->check(CLI::Range(1, 512));
  app.add_option("--swaps", swaps, "Timed swaps per way")->check(CLI::Range(1, 1000));
  app.add_flag("--no-experts", no_experts, "Adapters on q/k/v/o only");
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
  LoraStacks st(*be, c);
  st.reserve(2, rank);
  auto swap = [&](int i) {
    st.begin_upload(0, ad[i % 2]);
    st.finish_upload(0);
  };
  nlohmann::json out = {{"device", be->name()},
                        {"config", config_dir},
                        {"rank", rank},
                        {"stack_dtype", dtype_name(st.dtype())},
                        {"swaps", swaps}};
  // Staging: images off.
  st.set_host_image_budget(0);
  swap(0);  // the fill threads' staging buffers are made on the first upload: not timed
  auto t_before = st.upload_timing();
  for (int i = 1; i <= swaps; ++i) swap(i);
  auto t_after = st.upload_timing();
  const double staged_s = (t_after.seconds - t_before.seconds) / static_cast<double>(swaps);
  const double bytes = static_cast<double>(t_after.bytes - t_before.bytes) / static_cast<double>(swaps);
  std::printf("adapter: %.1f MB in the stacks' %s per swap\n", bytes / 1e6,
              std::string(dtype_name(st.dtype())).c_str());
  std::printf("staging path: %.2f ms per swap, %.1f GB/s\n", staged_s * 1e3, bytes / staged_s / 1e9);
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
  const double image_s = (t_after.seconds - t_before.seconds) / static_cast<double>(swaps);
  std::printf(
      "image path: %.2f ms per swap, %.1f GB/s (%ld of %ld swaps out of an image; %ld images, %.1f MB)\n",
      image_s * 1e3, bytes / image_s / 1e9, static_cast<long>(imaged), static_cast<long>(swaps),
      static_cast<long>(st.host_images()), static_cast<double>(st.host_image_bytes()) / 1e6);
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
  std::printf("page-locked host-to-device copy: %.1f GB/s; plain host memcpy (one thread): %.1f GB/s\n",
              pinned_gbps, memcpy_gbps);
  out["adapter_MB"] = bytes / 1e6;
  out["staging_ms"] = staged_s * 1e3;
  out["image_ms"] = image_s * 1e3;
  out["image_swaps"] = imaged;
  out["pinned_h2d_GBps"] = pinned_gbps;
  out["memcpy_GBps"] = memcpy_gbps;
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  if (imaged != swaps) {
    std::fprintf(stderr, "lora-swap: %ld of %ld swaps did not copy out of an image\n",
                 static_cast<long>(swaps - imaged), static_cast<long>(swaps));
    return 1;
  }
  return 0;
}

BenchRegistrar reg("lora-swap", "Adapter swap into a device slot: staging path against host images",
                   run_lora_swap_bench);

}  // namespace
}  // namespace polylora::bench
