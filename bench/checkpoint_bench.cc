// bench/checkpoint_bench.cc: cold-start tools for real-size checkpoints.
//   polylora_bench write-checkpoint --config DIR --out DIR [--shards N]: a random checkpoint with the tensor
//     names and shapes the loader reads for DIR/config.json (model/checkpoint_writer.h);
//   polylora_bench read-files DIR|FILE...: reads the checkpoint files with several threads (pread into
//     plain memory) and reports the rate: the "time it takes to read the checkpoint files" that
//     scripts/cold_start.sh holds start-up against;
//   polylora_bench load-weights --model DIR: Model::load alone (its log has the read/copy split), with the
//     staged loader's knobs, for tuning them.
// Must not: hold loader logic (it calls the library).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "bench_command.h"
#include "common/error.h"
#include "common/log.h"
#include "model/checkpoint_writer.h"
#include "model/model.h"

namespace polylora::bench {
namespace {

namespace fs = std::filesystem;

int run_write_checkpoint(int argc, char** argv) {
  CLI::App app{"Write a checkpoint of random values for a config.json", "polylora_bench write-checkpoint"};
  std::string config_dir, out_dir, dtype = "bf16";
  CheckpointWriteOptions o;
  app.add_option("--config", config_dir, "Directory with config.json (its other files are copied along)")
      ->required();
  app.add_option("--out", out_dir, "Output model directory")->required();
  app.add_option("--shards", o.num_shards, "Safetensors files (0: one per ~5 GB; 1: model.safetensors)")
      ->capture_default_str();
  app.add_option("--dtype", dtype, "bf16 | f16 | f32")
      ->check(CLI::IsMember({"bf16", "f16", "f32"}))
      ->capture_default_str();
  app.add_option("--scale", o.scale, "Values uniform in [-scale, scale] (vectors: around their fill)")
      ->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--threads", o.num_threads, "Writer threads (0: hardware threads)")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.dtype = dtype == "f32" ? DType::kF32 : dtype == "f16" ? DType::kF16 : DType::kBF16;
  CheckpointWriteStats st = write_random_checkpoint(config_dir, out_dir, o);
  std::printf("wrote %.2f GB (%zu tensors, %zu safetensors files) to %s in %.1f s (%.2f GB/s)\n",
              static_cast<double>(st.bytes) / 1e9, st.num_tensors, st.num_files, out_dir.c_str(), st.seconds,
              static_cast<double>(st.bytes) / 1e9 / std::max(st.seconds, 1e-9));
  return 0;
}

struct ReadFile {
  std::string path;
  uint64_t size = 0;
  int fd = -1;
};

int run_read_files(int argc, char** argv) {
  CLI::App app{"Read checkpoint files with several threads and report the rate", "polylora_bench read-files"};
  std::vector<std::string> inputs;
  int threads = 8;
  size_t chunk_mib = 32;
  bool json = false;
  app.add_option("paths", inputs, "Model directory (its *.safetensors) or files")->required();
  app.add_option("--threads", threads, "Reader threads")->capture_default_str();
  app.add_option("--chunk-mib", chunk_mib, "Bytes per read, MiB")->capture_default_str();
  app.add_flag("--json", json, "One JSON line: bytes, seconds, gb_per_s, threads");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::vector<ReadFile> files;
  for (const std::string& in : inputs) {
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(in))
        if (e.is_regular_file() && e.path().extension() == ".safetensors") found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      for (auto& f : found) files.push_back({f});
    } else {
      files.push_back({in});
    }
  }
  if (files.empty()) fail("no *.safetensors files in {}", inputs.front());
  struct Piece {
    size_t file = 0;
    uint64_t offset = 0;
    size_t bytes = 0;
  };
  const size_t chunk = std::max<size_t>(chunk_mib, 1) << 20;
  std::vector<Piece> pieces;
  uint64_t total = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    ReadFile& f = files[i];
    f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (f.fd < 0) fail("cannot open {}: {}", f.path, std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) fail("cannot stat {}", f.path);
    f.size = static_cast<uint64_t>(st.st_size);
    total += f.size;
    for (uint64_t off = 0; off < f.size; off += chunk)
      pieces.push_back({i, off, static_cast<size_t>(std::min<uint64_t>(chunk, f.size - off))});
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  threads = std::max(1, threads);
  // Buffers made (and their pages touched) before the clock starts: only the reads are timed.
  std::vector<std::vector<std::byte>> bufs(static_cast<size_t>(threads), std::vector<std::byte>(chunk));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      std::vector<std::byte>& buf = bufs[static_cast<size_t>(t)];
      for (size_t i = next++; i < pieces.size(); i = next++) {
        const Piece& p = pieces[i];
        size_t done = 0;
        while (done < p.bytes) {
          ssize_t n = ::pread(files[p.file].fd, buf.data() + done, p.bytes - done,
                              static_cast<off_t>(p.offset + done));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            failed = true;
            return;
          }
          done += static_cast<size_t>(n);
        }
      }
    });
  for (auto& t : pool) t.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (ReadFile& f : files) ::close(f.fd);
  if (failed) fail("a read failed (a file changed while being read?)");
  const double gbs = static_cast<double>(total) / 1e9 / std::max(seconds, 1e-9);
  if (json)
    std::printf("{\"bytes\": %llu, \"seconds\": %.4f, \"gb_per_s\": %.3f, \"threads\": %d, \"files\": %zu}\n",
                static_cast<unsigned long long>(total), seconds, gbs, threads, files.size());
  else
    std::printf("read %.2f GB (%zu files) in %.3f s with %d threads: %.2f GB/s\n",
                static_cast<double>(total) / 1e9, files.size(), seconds, threads, gbs);
  return 0;
}

int run_load_weights(int argc, char** argv) {
  CLI::App app{"Load a model's weights (Model::load) and report the time", "polylora_bench load-weights"};
  std::string model_dir, device = "auto", path = "auto";
  ModelLoadOptions lo;
  size_t buffer_mib = lo.upload.buffer_bytes >> 20;
  app.add_option("--model", model_dir, "Model directory")->required();
  app.add_option("--device", device, "cpu | cuda | auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--path", path, "auto | staged | per-tensor")
      ->check(CLI::IsMember({"auto", "staged", "per-tensor"}))
      ->capture_default_str();
  app.add_option("--threads", lo.upload.num_threads, "Reader threads (0: default)")->capture_default_str();
  app.add_option("--buffers", lo.upload.num_buffers, "Staging buffers (0: default)")->capture_default_str();
  app.add_option("--buffer-mib", buffer_mib, "Bytes per staging buffer, MiB")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  init_logging();
  lo.upload.buffer_bytes = std::max<size_t>(buffer_mib, 1) << 20;
  lo.upload.path = path == "staged"       ? UploadPath::kStaged
                   : path == "per-tensor" ? UploadPath::kPerTensor
                                          : UploadPath::kAuto;
  BackendOptions bo;
  bo.device = device == "cpu"    ? DeviceKind::kCpu
              : device == "cuda" ? DeviceKind::kCuda
                                 : (cuda_device_count() > 0 ? DeviceKind::kCuda : DeviceKind::kCpu);
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<Backend> backend = make_backend(bo);
  const double backend_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto model = Model::load(model_dir, lo, backend);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("backend %s up in %.2f s; Model::load done %.2f s after start (%.2f GB of parameters)\n",
              backend->name().c_str(), backend_s, total_s,
              static_cast<double>(model->weights().num_bytes) / 1e9);
  return 0;
}

BenchRegistrar write_reg("write-checkpoint", "random checkpoint with the real tensor names for a config.json",
                         run_write_checkpoint);
BenchRegistrar read_reg("read-files", "parallel read rate of checkpoint files (cold-start baseline)",
                        run_read_files);
BenchRegistrar load_reg("load-weights", "time Model::load (read/copy split in its log)", run_load_weights);

}  // namespace
}  // namespace polylora::bench
