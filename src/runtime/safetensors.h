// runtime/safetensors.h: memory-mapped, zero-copy reader for safetensors checkpoints.
// Owns: mapping files, parsing and strictly validating their headers, and sharded checkpoints
// (model.safetensors.index.json). Tensor data is never copied: TensorInfo::data points into the mapping.
// Must not: know about models (names are opaque strings here) or CUDA.
//
// Why here and not in model/: both model/ (weights) and lora/ (adapters) read safetensors, and
// runtime/ owns host and device memory, which a file mapping is (see docs/design-changes.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"

namespace polylora {

// Dtypes an adapter checkpoint may hold; anything else is rejected by name.
inline constexpr DType kCheckpointDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
// Dtypes a model checkpoint may hold: the float dtypes, and U8 for quantized tensors (the MXFP4 expert
// blocks and scales of GPT-OSS; model/weight_loader.cc refuses U8 anywhere else, naming the tensor).
inline constexpr DType kModelCheckpointDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kU8};

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // row-major; empty for a scalar
  const void* data = nullptr;  // points into the file mapping (valid while the owning file is open)
  size_t num_bytes = 0;
  std::string file;          // path of the file holding it, for error messages (and the fast loader's reads)
  uint64_t file_offset = 0;  // where `data` starts in that file (header included), for pread

  int64_t numel() const;
  std::string shape_string() const;  // "[2, 3]"
};

// One read-only memory mapping of a whole file (RAII).
class MappedFile {
 public:
  // Throws polylora::Error naming the path when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file. Validation (each failure throws polylora::Error naming the file, and the
// tensor where there is one): file shorter than 8 bytes; header length past the end of the file;
// header not valid JSON, nested deeper than 64 levels, or not an object; entry missing
// dtype/shape/data_offsets or of the wrong JSON type; dtype not in `allowed_dtypes` (named, e.g. "tensor 'x'
// in f.safetensors has dtype I8, which is not supported (supported: F32, F16, BF16)"); negative shape
// dimensions or a shape product overflowing; data_offsets not [begin, end] with begin <= end; range outside
// the data section; shape x dtype size != end - begin; ranges overlapping (after sorting by begin; gaps and
// header order are accepted); duplicate names; `__metadata__` not an object of strings. Never reads outside
// the mapping.
class SafetensorsFile {
 public:
  static std::unique_ptr<SafetensorsFile> open(const std::string& path,
                                               std::span<const DType> allowed_dtypes = kCheckpointDTypes);
  // Reads the whole of an already-open file (the caller keeps `fd`; nothing is re-opened by path) into
  // memory and parses it with the same validation. Unlike open() it does not map the file, so a file
  // truncated while in use cannot fault (SIGBUS) the process. Errors name `display_name`: not a regular
  // file, larger than `max_bytes`, or changed (shorter) while being read.
  static std::unique_ptr<SafetensorsFile> open_fd(int fd, const std::string& display_name, uint64_t max_bytes,
                                                  std::span<const DType> allowed_dtypes = kCheckpointDTypes);
  // Parses an in-memory image (the same validation; used by open() and by the fuzz target).
  // `bytes` must outlive the returned object; `name` is used in error messages.
  static std::unique_ptr<SafetensorsFile> parse(std::span<const std::byte> bytes, const std::string& name,
                                                std::span<const DType> allowed_dtypes = kCheckpointDTypes);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const TensorInfo* find(std::string_view name) const;                 // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<MappedFile> mapping_;  // null when parsed from memory or read by open_fd()
  std::unique_ptr<std::byte[]> owned_;   // the file's bytes when read by open_fd()
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// A whole checkpoint directory: `model.safetensors`, or the shards listed by
// `model.safetensors.index.json` (its weight_map), or else every *.safetensors file in the directory
// (e.g. adapter_model.safetensors when opened with open_file()).
// Errors: no checkpoint in the directory; index not valid JSON / no weight_map; a shard missing;
// a tensor listed in the index absent from its shard or found in another one; a name in two shards.
class Checkpoint {
 public:
  static Checkpoint open_dir(const std::string& dir,
                             std::span<const DType> allowed_dtypes = kCheckpointDTypes);
  static Checkpoint open_file(const std::string& path,
                              std::span<const DType> allowed_dtypes = kCheckpointDTypes);
  // One file from an open descriptor (SafetensorsFile::open_fd); `display_name` is its location.
  static Checkpoint open_fd(int fd, const std::string& display_name, uint64_t max_bytes,
                            std::span<const DType> allowed_dtypes = kCheckpointDTypes);

  const TensorInfo* find(std::string_view name) const;  // nullptr if absent
  // Throws polylora::Error "checkpoint <dir> has no tensor '<name>'".
  const TensorInfo& get(std::string_view name) const;
  std::vector<std::string> names() const;  // sorted
  const std::string& location() const { return location_; }

 private:
  std::string location_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*, std::less<>> by_name_;
};

}  // namespace polylora
