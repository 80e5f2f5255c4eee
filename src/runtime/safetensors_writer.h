// runtime/safetensors_writer.h: the writing side of the safetensors format. A file is the 8-byte
// little-endian header length, the header JSON (each tensor's dtype, shape and data_offsets into the data
// section, plus optional __metadata__), padded with spaces to a multiple of 8 bytes as the reference
// implementation pads it, then the data section. Owns: that layout, and the sharded checkpoint's index
// (model.safetensors.index.json). Must not: produce tensor data (callers write it at the offsets given) or
// know about models. What it lays out is what safetensors.h's strict reader accepts.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace polylora {

struct TensorSpec {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;  // row-major; empty for a scalar
  uint64_t num_bytes() const;
};

struct SafetensorsLayout {
  std::string header;                  // the file's first header.size() bytes (length + JSON + padding)
  std::vector<uint64_t> file_offsets;  // where each tensor's data starts in the file, in the order given
  uint64_t file_size = 0;
};

// Tensors are placed in the order given, back to back. Throws polylora::Error on a duplicate or empty name,
// a negative dimension, or the reserved name __metadata__.
SafetensorsLayout layout_safetensors(std::span<const TensorSpec> tensors,
                                     const std::map<std::string, std::string>& metadata = {});

// The text of model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {tensor: file}}.
std::string safetensors_index_json(const std::map<std::string, std::string>& weight_map, uint64_t total_size);

}  // namespace polylora
