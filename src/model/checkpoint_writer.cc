// model/checkpoint_writer.cc: random checkpoints in Hugging Face's layout (see checkpoint_writer.h).
#include "model/checkpoint_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/error.h"
#include "config/model_config.h"
#include "model/arch/arch.h"
#include "runtime/safetensors_writer.h"

namespace polylora {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kShardBytes = 5'000'000'000;  // Hugging Face's default max_shard_size ("5GB")

uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Shard {
  std::string file_name;
  std::vector<TensorSpec> specs;
  std::vector<float> fills;  // per tensor: the centre of its values
  std::vector<ExpectedTensor::Quantized> quantized;  // per tensor: MXFP4 codes or scales (U8), or neither
  SafetensorsLayout layout;
  int fd = -1;
};

// One write: `bytes` of tensor `tensor_idx` of shard `shard_idx`, starting `offset` bytes into its data.
struct Piece {
  size_t shard_idx = 0;
  size_t tensor_idx = 0;
  uint64_t offset = 0;
  size_t bytes = 0;
  uint64_t key = 0;  // seeds its values
};

// Fills `bytes` (a whole number of elements) with fill + uniform(-scale, scale) values of `dtype`; MXFP4
// parts with random codes, or every scale byte kDummyMxfp4Scale.
void generate(std::byte* out, size_t bytes, DType dtype, float fill, float scale, uint64_t key,
              ExpectedTensor::Quantized quantized) {
  uint64_t state = mix(key);
  switch (quantized) {
    case ExpectedTensor::Quantized::kNo:
      break;
    case ExpectedTensor::Quantized::kMxfp4Codes:
      for (size_t i = 0; i < bytes; i += 8) {
        const uint64_t r = mix(state++);
        std::memcpy(out + i, &r, std::min<size_t>(8, bytes - i));
      }
      return;
    case ExpectedTensor::Quantized::kMxfp4Scales:
      std::memset(out, kDummyMxfp4Scale, bytes);
      return;
  }
  const size_t esize = dtype_size(dtype), n = bytes / esize;
  constexpr float kInv16 = 1.0f / 32768.0f;
  auto value = [&](uint32_t u16) {
    return fill + (static_cast<float>(u16) * kInv16 - 1.0f + kInv16 / 2) * scale;
  };
  size_t i = 0;
  while (i < n) {
    const uint64_t r = mix(state++);
    for (int k = 0; k < 4 && i < n; ++k, ++i) {
      const float v = value(static_cast<uint32_t>((r >> (16 * k)) & 0xffff));
      switch (dtype) {
        case DType::kBF16: {
          const uint16_t b = f32_to_bf16(v);
          std::memcpy(out + i * 2, &b, 2);
          break;
        }
        case DType::kF16: {
          const uint16_t h = f32_to_f16(v);
          std::memcpy(out + i * 2, &h, 2);
          break;
        }
        case DType::kF32:
          std::memcpy(out + i * 4, &v, 4);
          break;
        case DType::kI32:
        case DType::kI64:
        case DType::kU8:
        case DType::kI8:
          fail("checkpoints are written as BF16, F16 or F32, not {}", dtype_name(dtype));
      }
    }
  }
}

void write_all(int fd, const std::byte* data, size_t bytes, uint64_t offset, const std::string& path) {
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = ::pwrite(fd, data + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot write {}: {}", path, std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) fail("cannot write {}", path.string());
}

}  // namespace

CheckpointWriteStats write_random_checkpoint(const std::string& config_dir, const std::string& out_dir,
                                             const CheckpointWriteOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  switch (options.dtype) {
    case DType::kBF16:
    case DType::kF16:
    case DType::kF32:
      break;
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      fail("checkpoints are written as BF16, F16 or F32, not {}", dtype_name(options.dtype));
  }
  const fs::path src(config_dir), dst(out_dir);
  const ModelConfig cfg = ModelConfig::from_file((src / "config.json").string());
  const std::vector<ExpectedTensor> tensors = arch::expected_tensors(cfg);

  std::error_code ec;
  fs::create_directories(dst, ec);
  if (!fs::is_directory(dst)) fail("cannot create the output directory {}: {}", out_dir, ec.message());
  if (fs::equivalent(src, dst, ec)) fail("--out {} is the config directory itself; write elsewhere", out_dir);
  // Replace an earlier checkpoint there (stale shards would be read with the new index).
  for (const auto& entry : fs::directory_iterator(dst)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() &&
        (entry.path().extension() == ".safetensors" || name == "model.safetensors.index.json"))
      fs::remove(entry.path());
  }
  for (const auto& entry : fs::directory_iterator(src)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || entry.path().extension() == ".safetensors" ||
        name == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), dst / name, fs::copy_options::overwrite_existing);
  }

  // Shards: tensors in the order the loader reads them, cut into shards of about equal size.
  uint64_t total = 0;
  auto dtype_of = [&](const ExpectedTensor& t) {
    return t.quantized == ExpectedTensor::Quantized::kNo ? options.dtype : DType::kU8;
  };
  for (const ExpectedTensor& t : tensors) total += TensorSpec{t.name, dtype_of(t), t.shape}.num_bytes();
  const int num_shards =
      std::max<int>(1, options.num_shards > 0 ? options.num_shards
                                              : static_cast<int>((total + kShardBytes - 1) / kShardBytes));
  std::vector<Shard> shards(static_cast<size_t>(num_shards));
  {
    uint64_t done = 0;
    size_t s = 0;
    for (const ExpectedTensor& t : tensors) {
      TensorSpec spec{t.name, dtype_of(t), t.shape};
      // Move on once this shard holds its share (the last shard takes the rest).
      while (s + 1 < shards.size() && !shards[s].specs.empty() &&
             done >= total / static_cast<uint64_t>(num_shards) * (s + 1))
        ++s;
      done += spec.num_bytes();
      shards[s].specs.push_back(std::move(spec));
      shards[s].fills.push_back(t.is_vector ? t.fill : 0.0f);
      shards[s].quantized.push_back(t.quantized);
    }
  }
  shards.erase(std::remove_if(shards.begin(), shards.end(), [](const Shard& sh) { return sh.specs.empty(); }),
               shards.end());
  std::map<std::string, std::string> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    Shard& sh = shards[s];
    sh.file_name = shards.size() == 1
                       ? "model.safetensors"
                       : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    sh.layout = layout_safetensors(sh.specs, {{"format", "pt"}});
    for (const TensorSpec& spec : sh.specs) weight_map[spec.name] = sh.file_name;
  }

  // Pieces of at most chunk_bytes (whole elements), written by many threads.
  const size_t chunk = std::max<size_t>(options.chunk_bytes, 4096) / 4 * 4;
  std::vector<Piece> pieces;
  for (size_t s = 0; s < shards.size(); ++s) {
    for (size_t t = 0; t < shards[s].specs.size(); ++t) {
      const uint64_t bytes = shards[s].specs[t].num_bytes();
      for (uint64_t off = 0; off < bytes; off += chunk)
        pieces.push_back(
            {s, t, off, static_cast<size_t>(std::min<uint64_t>(chunk, bytes - off)),
             options.seed * 0x2545f4914f6cdd1dull ^ mix(s * 1'000'003 + t) ^ (off / chunk) * 0x9e37ull});
    }
  }
  CheckpointWriteStats stats;
  stats.num_tensors = tensors.size();
  stats.num_files = shards.size();
  for (Shard& sh : shards) {
    const fs::path path = dst / sh.file_name;
    sh.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (sh.fd < 0) {
      int err = errno;
      for (Shard& other : shards)
        if (other.fd >= 0) ::close(other.fd);
      fail("cannot create {}: {}", path.string(), std::strerror(err));
    }
    stats.bytes += sh.layout.file_size;
  }

  std::atomic<size_t> next{0};
  std::atomic<bool> abort{false};
  std::mutex mu;
  std::exception_ptr error;
  auto worker = [&](bool headers) {
    std::vector<std::byte> buf(chunk);
    try {
      if (headers)
        for (const Shard& sh : shards)
          write_all(sh.fd, reinterpret_cast<const std::byte*>(sh.layout.header.data()),
                    sh.layout.header.size(), 0, (dst / sh.file_name).string());
      for (size_t i = next++; i < pieces.size() && !abort; i = next++) {
        const Piece& p = pieces[i];
        const Shard& sh = shards[p.shard_idx];
        generate(buf.data(), p.bytes, sh.specs[p.tensor_idx].dtype, sh.fills[p.tensor_idx], options.scale, p.key,
                 sh.quantized[p.tensor_idx]);
        write_all(sh.fd, buf.data(), p.bytes, sh.layout.file_offsets[p.tensor_idx] + p.offset,
                  (dst / sh.file_name).string());
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      abort = true;
    }
  };
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int num_threads = std::max(1, std::min<int>(options.num_threads > 0 ? options.num_threads : hw,
                                                    static_cast<int>(std::max<size_t>(pieces.size(), 1))));
  std::vector<std::thread> threads;
  for (int i = 0; i < num_threads; ++i) threads.emplace_back(worker, i == 0);
  for (std::thread& t : threads) t.join();
  for (Shard& sh : shards) {
    struct stat st {};
    if (!error && (::fstat(sh.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != sh.layout.file_size)) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::make_exception_ptr(
          Error(fmt::format("{} has {} bytes after writing, not {}", (dst / sh.file_name).string(),
                            static_cast<uint64_t>(st.st_size), sh.layout.file_size)));
    }
    if (::close(sh.fd) != 0 && !error)
      error = std::make_exception_ptr(
          Error(fmt::format("cannot write {}: {}", (dst / sh.file_name).string(), std::strerror(errno))));
    sh.fd = -1;
  }
  if (error) std::rethrow_exception(error);
  if (shards.size() > 1)
    write_text(dst / "model.safetensors.index.json", safetensors_index_json(weight_map, total));
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace polylora
