// tests/unit/test_util.h: helpers for tests: temporary directories and writing small safetensors files.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace polylora::testing_util {

inline std::filesystem::path make_temp_dir(const std::string& tag) {
  static std::mt19937_64 rng(std::random_device{}());
  auto dir = std::filesystem::temp_directory_path() / ("polylora-" + tag + "-" + std::to_string(rng()));
  std::filesystem::create_directories(dir);
  return dir;
}

struct RawTensor {
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline RawTensor f32_tensor(std::vector<int64_t> shape, float value = 0.01f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  RawTensor t{"F32", shape, std::vector<uint8_t>(static_cast<size_t>(n) * 4)};
  for (int64_t i = 0; i < n; ++i) std::memcpy(t.bytes.data() + i * 4, &value, 4);
  return t;
}

// Writes a valid safetensors file with the tensors in map order.
inline void write_safetensors(const std::filesystem::path& path,
                              const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  uint64_t len = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

inline void write_json(const std::filesystem::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2);
}

inline std::string data_dir() {
  return POLYLORA_TEST_DATA;
}

}  // namespace polylora::testing_util
