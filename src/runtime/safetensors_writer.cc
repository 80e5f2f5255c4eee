// runtime/safetensors_writer.cc: safetensors headers and checkpoint indexes (see safetensors_writer.h).
#include "runtime/safetensors_writer.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"

namespace polylora {

uint64_t TensorSpec::num_bytes() const {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

SafetensorsLayout layout_safetensors(std::span<const TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> names;
  uint64_t offset = 0;
  std::vector<uint64_t> begins;
  begins.reserve(tensors.size());
  for (const TensorSpec& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") fail("cannot write a tensor named '{}'", t.name);
    if (!names.insert(t.name).second) fail("tensor '{}' is listed twice", t.name);
    for (int64_t d : t.shape)
      if (d < 0) fail("tensor '{}' has a negative dimension", t.name);
    const uint64_t bytes = t.num_bytes();
    header[t.name] = {
        {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    begins.push_back(offset);
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  SafetensorsLayout layout;
  const uint64_t len = json.size();  // little-endian on every platform polylora builds for
  layout.header.resize(8);
  for (int i = 0; i < 8; ++i)
    layout.header[static_cast<size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  layout.header += json;
  const uint64_t data_start = layout.header.size();
  for (uint64_t b : begins) layout.file_offsets.push_back(data_start + b);
  layout.file_size = data_start + offset;
  return layout;
}

std::string safetensors_index_json(const std::map<std::string, std::string>& weight_map,
                                   uint64_t total_size) {
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_size}};
  index["weight_map"] = weight_map;
  return index.dump(2) + "\n";
}

}  // namespace polylora
