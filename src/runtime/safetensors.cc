// runtime/safetensors.cc: file mapping, strict safetensors header validation, sharded checkpoints.
// Owns: turning untrusted bytes into TensorInfo views that are proven to lie inside the mapping.
// Must not: copy tensor data, interpret tensor names, or read a byte it has not bounds-checked.
#include "runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/utf8.h"

namespace polylora {

namespace {

using Json = nlohmann::json;

constexpr size_t kHeaderLengthBytes = 8;
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // real headers are a few MB at most
constexpr int kMaxJsonDepth = 64;                  // real headers nest 3 deep (header, entry, shape)
constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kSingleFileName = "model.safetensors";
constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

struct StrictJson {
  Json value;
  std::vector<std::string> top_keys;  // keys of the top-level object, in document order
};

// Parses `text`, rejecting a key repeated within one object (nlohmann would silently keep the last
// one). `what` names the document in messages; `top_noun` names what a top-level key is ("tensor").
StrictJson parse_strict_json(std::string_view text, const std::string& what, std::string_view top_noun) {
  StrictJson out;
  std::vector<std::set<std::string, std::less<>>> open_objects;  // keys seen so far, innermost last
  std::string current_top;
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
        if (depth >= kMaxJsonDepth)
          fail("{} nests objects and arrays deeper than {} levels", what, kMaxJsonDepth);
        open_objects.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (open_objects.empty()) break;
        if (!open_objects.back().insert(key).second) {
          if (open_objects.size() == 1) fail("{}: {} '{}' appears twice", what, top_noun, key);
          fail("{}: key '{}' appears twice in the object under '{}'", what, key, current_top);
        }
        if (open_objects.size() == 1) {
          current_top = key;
          out.top_keys.push_back(key);
        }
        break;
      }
      case Json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          fail("{} nests objects and arrays deeper than {} levels", what, kMaxJsonDepth);
        break;
      case Json::parse_event_t::array_end:
      case Json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    out.value = Json::parse(text.begin(), text.end(), callback);
  } catch (const Json::exception& e) {
    fail("{} is not valid JSON: {}", what, sanitize_utf8(e.what()));  // e.what() quotes the input
  }
  if (!out.value.is_object()) fail("{} is not a JSON object", what);
  return out;
}

// A short rendering of an untrusted value for messages: a scalar, or an array of them one level deep.
// Never nlohmann's dump() on a whole value: it recurses, and a header can nest arrays millions deep.
std::string brief(const Json& v) {
  auto scalar = [](const Json& s) -> std::string {
    if (s.is_array()) return "[...]";
    if (s.is_object()) return "{...}";
    return clip_utf8(s.dump());
  };
  if (!v.is_array()) return scalar(v);
  std::string out = "[";
  size_t i = 0;
  for (const Json& e : v) {
    if (i > 0) out += ", ";
    if (i++ == 8) {
      out += "...";
      break;
    }
    out += scalar(e);
  }
  return out + "]";
}

// A non-negative JSON integer, or nullopt (negative, fractional, too large or not a number).
std::optional<uint64_t> as_unsigned(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return static_cast<uint64_t>(v.get<int64_t>());
  return std::nullopt;
}

std::string allowed_list(std::span<const DType> allowed) {
  std::string s;
  for (DType d : allowed) {
    if (!s.empty()) s += ", ";
    s += dtype_name(d);
  }
  return s;
}

[[noreturn]] void fail_tensor(const std::string& name, const std::string& file, std::string_view what) {
  fail("tensor '{}' in {}: {}", name, file, what);
}

struct Range {
  uint64_t begin = 0;
  uint64_t end = 0;
  size_t tensor_idx = 0;
};

// file_offset: where the data section starts in the file.
TensorInfo parse_entry(const std::string& name, const Json& entry, std::span<const std::byte> data_section,
                       uint64_t file_offset, const std::string& file, std::span<const DType> allowed,
                       Range& range) {
  if (!entry.is_object()) fail_tensor(name, file, "its header entry is not a JSON object");
  TensorInfo info;
  info.name = name;
  info.file = file;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) fail_tensor(name, file, "its header entry has no 'dtype'");
  if (!dtype_it->is_string()) fail_tensor(name, file, "'dtype' is not a string");
  const auto& dtype_str = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_name(dtype_str);
  if (!dtype || std::find(allowed.begin(), allowed.end(), *dtype) == allowed.end()) {
    fail("tensor '{}' in {} has dtype {}, which is not supported (supported: {})", name, file,
         clip_utf8(dtype_str), allowed_list(allowed));
  }
  info.dtype = *dtype;

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) fail_tensor(name, file, "its header entry has no 'shape'");
  if (!shape_it->is_array()) fail_tensor(name, file, "'shape' is not an array");
  uint64_t numel = 1;
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_integer())
      fail_tensor(name, file,
                  fmt::format("'shape' {} has an entry that is not an integer", brief(*shape_it)));
    if (dim.is_number_unsigned() ? dim.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                                 : dim.get<int64_t>() < 0) {
      fail_tensor(name, file,
                  fmt::format("'shape' {} has a negative or out-of-range dimension", brief(*shape_it)));
    }
    auto d = static_cast<uint64_t>(dim.get<int64_t>());
    if (__builtin_mul_overflow(numel, d, &numel) || numel > static_cast<uint64_t>(INT64_MAX)) {
      fail_tensor(name, file,
                  fmt::format("'shape' {} has more elements than fit in 64 bits", brief(*shape_it)));
    }
    info.shape.push_back(static_cast<int64_t>(d));
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) fail_tensor(name, file, "its header entry has no 'data_offsets'");
  const Json& offsets = *offsets_it;
  if (!offsets.is_array() || offsets.size() != 2)
    fail_tensor(name, file, "'data_offsets' is not an array of two integers");
  std::optional<uint64_t> begin = as_unsigned(offsets[0]);
  std::optional<uint64_t> end = as_unsigned(offsets[1]);
  if (!begin || !end)
    fail_tensor(name, file,
                fmt::format("'data_offsets' {} are not two non-negative integers", brief(offsets)));
  if (*begin > *end)
    fail_tensor(name, file, fmt::format("'data_offsets' {} end before they begin", brief(offsets)));
  if (*end > data_section.size()) {
    fail_tensor(name, file,
                fmt::format("'data_offsets' {} go past the end of the data section ({} bytes)",
                            brief(offsets), data_section.size()));
  }
  uint64_t num_bytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(info.dtype)), &num_bytes) ||
      num_bytes != *end - *begin) {
    fail_tensor(name, file,
                fmt::format("shape {} of {} needs {} x {} bytes, but 'data_offsets' {} span {} bytes",
                            brief(*shape_it), dtype_str, numel, dtype_size(info.dtype), brief(offsets),
                            *end - *begin));
  }
  info.data = data_section.data() + *begin;
  info.num_bytes = static_cast<size_t>(num_bytes);
  info.file_offset = file_offset + *begin;
  range.begin = *begin;
  range.end = *end;
  return info;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot map {}: not a regular file", path);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {  // mmap rejects length 0; an empty file maps to (nullptr, 0)
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("cannot map {} ({} bytes): {}", path, size_, std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path,
                                                       std::span<const DType> allowed_dtypes) {
  auto mapping = std::make_unique<MappedFile>(path);
  auto file = parse(std::span<const std::byte>(mapping->data(), mapping->size()), path, allowed_dtypes);
  file->mapping_ = std::move(mapping);
  return file;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open_fd(int fd, const std::string& display_name,
                                                          uint64_t max_bytes,
                                                          std::span<const DType> allowed_dtypes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat {}: {}", display_name, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{} is not a regular file", display_name);
  auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) fail("{} is larger than {} bytes (it has {})", display_name, max_bytes, size);
  auto bytes = std::unique_ptr<std::byte[]>(new std::byte[size > 0 ? size : 1]);
  uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, bytes.get() + done, static_cast<size_t>(std::min<uint64_t>(size - done, 1 << 30)),
                        static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("cannot read {}: {}", display_name, std::strerror(errno));
    if (n == 0) fail("{} changed while being read: it has {} bytes, not {}", display_name, done, size);
    done += static_cast<uint64_t>(n);
  }
  auto file =
      parse(std::span<const std::byte>(bytes.get(), static_cast<size_t>(size)), display_name, allowed_dtypes);
  file->owned_ = std::move(bytes);
  return file;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(std::span<const std::byte> bytes,
                                                        const std::string& name,
                                                        std::span<const DType> allowed_dtypes) {
  if (bytes.size() < kHeaderLengthBytes) {
    fail("{} is not a safetensors file: it has {} bytes, fewer than the 8-byte header length", name,
         bytes.size());
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), sizeof(header_len));
  if constexpr (std::endian::native == std::endian::big) header_len = __builtin_bswap64(header_len);
  if (header_len > kMaxHeaderBytes) {
    fail("{} is not a safetensors file: header length {} is over the {} byte limit", name, header_len,
         kMaxHeaderBytes);
  }
  if (header_len > bytes.size() - kHeaderLengthBytes) {
    fail(
        "{} is truncated or not a safetensors file: header length {} goes past the end of the file ({} "
        "bytes)",
        name, header_len, bytes.size());
  }
  std::string_view header_text(reinterpret_cast<const char*>(bytes.data()) + kHeaderLengthBytes,
                               static_cast<size_t>(header_len));
  std::span<const std::byte> data_section =
      bytes.subspan(kHeaderLengthBytes + static_cast<size_t>(header_len));

  StrictJson header = parse_strict_json(header_text, fmt::format("header of {}", name), "tensor");

  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->path_ = name;
  std::vector<Range> ranges;
  for (const std::string& key : header.top_keys) {
    const Json& entry = header.value.at(key);
    if (key == kMetadataKey) {
      if (!entry.is_object()) fail("{}: '__metadata__' is not a JSON object", name);
      for (const auto& [meta_key, meta_value] : entry.items()) {
        if (!meta_value.is_string()) {
          fail("{}: '__metadata__' entry '{}' is not a string (it is {})", name, meta_key, brief(meta_value));
        }
        file->metadata_[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    Range range;
    range.tensor_idx = file->tensors_.size();
    file->tensors_.push_back(
        parse_entry(key, entry, data_section, kHeaderLengthBytes + header_len, name, allowed_dtypes, range));
    ranges.push_back(range);
    file->index_.emplace(key, range.tensor_idx);
  }

  // The spec wants contiguous ranges; we accept gaps (harmless: nothing reads them) and reject only
  // overlaps, checked after sorting by begin, so an out-of-order header is fine unless ranges share bytes.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range& prev = ranges[i - 1];
    const Range& cur = ranges[i];
    if (cur.begin < prev.end) {
      fail("tensor '{}' in {} overlaps tensor '{}': data_offsets [{}, {}] and [{}, {}]",
           file->tensors_[cur.tensor_idx].name, name, file->tensors_[prev.tensor_idx].name, cur.begin,
           cur.end, prev.begin, prev.end);
    }
  }
  return file;
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Checkpoint Checkpoint::open_file(const std::string& path, std::span<const DType> allowed_dtypes) {
  Checkpoint ckpt;
  ckpt.location_ = path;
  auto file = std::shared_ptr<SafetensorsFile>(SafetensorsFile::open(path, allowed_dtypes));
  for (const TensorInfo& t : file->tensors()) ckpt.by_name_.emplace(t.name, &t);
  ckpt.files_.push_back(std::move(file));
  return ckpt;
}

Checkpoint Checkpoint::open_fd(int fd, const std::string& display_name, uint64_t max_bytes,
                               std::span<const DType> allowed_dtypes) {
  Checkpoint ckpt;
  ckpt.location_ = display_name;
  auto file =
      std::shared_ptr<SafetensorsFile>(SafetensorsFile::open_fd(fd, display_name, max_bytes, allowed_dtypes));
  for (const TensorInfo& t : file->tensors()) ckpt.by_name_.emplace(t.name, &t);
  ckpt.files_.push_back(std::move(file));
  return ckpt;
}

Checkpoint Checkpoint::open_dir(const std::string& dir, std::span<const DType> allowed_dtypes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("checkpoint directory {} does not exist or is not a directory", dir);
  fs::path root(dir);
  Checkpoint ckpt;
  ckpt.location_ = dir;

  // Adds every tensor of `file`, rejecting a name already found in another file.
  auto add_file = [&](std::shared_ptr<SafetensorsFile> file) {
    for (const TensorInfo& t : file->tensors()) {
      auto [it, inserted] = ckpt.by_name_.emplace(t.name, &t);
      if (!inserted) {
        fail("checkpoint {}: tensor '{}' appears in both {} and {}", dir, t.name, it->second->file, t.file);
      }
    }
    ckpt.files_.push_back(std::move(file));
  };

  if (fs::path single = root / kSingleFileName; fs::exists(single, ec)) {
    add_file(SafetensorsFile::open(single.string(), allowed_dtypes));
    return ckpt;
  }

  if (fs::path index_path = root / kIndexFileName; fs::exists(index_path, ec)) {
    std::string index_name = index_path.string();
    std::ifstream in(index_path, std::ios::binary);
    if (!in) fail("cannot read checkpoint index {}", index_name);
    std::stringstream text;
    text << in.rdbuf();
    StrictJson index = parse_strict_json(text.str(), fmt::format("checkpoint index {}", index_name), "key");
    auto map_it = index.value.find("weight_map");
    if (map_it == index.value.end() || !map_it->is_object()) {
      fail("checkpoint index {} has no 'weight_map' object (tensor name -> shard file)", index_name);
    }
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;  // shard file name -> opened file
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        fail("checkpoint index {}: shard of tensor '{}' is not a string (it is {})", index_name, tensor,
             brief(shard));
      }
      const auto& shard_name = shard.get_ref<const std::string&>();
      fs::path rel(shard_name);
      if (shard_name.empty() || rel.is_absolute() ||
          std::find(rel.begin(), rel.end(), fs::path("..")) != rel.end()) {
        fail("checkpoint index {}: shard '{}' of tensor '{}' is not a file name inside {}", index_name,
             shard_name, tensor, dir);
      }
      if (shards.count(shard_name)) continue;
      fs::path shard_path = root / rel;
      if (!fs::is_regular_file(shard_path, ec)) {
        fail("checkpoint index {} names shard {} (for tensor '{}'), but {} does not exist", index_name,
             shard_name, tensor, shard_path.string());
      }
      shards.emplace(shard_name, SafetensorsFile::open(shard_path.string(), allowed_dtypes));
    }
    for (auto& [shard_name, file] : shards) add_file(file);
    for (const auto& [tensor, shard] : map_it->items()) {
      const auto& shard_name = shard.get_ref<const std::string&>();
      const SafetensorsFile& file = *shards.at(shard_name);
      if (file.find(tensor) != nullptr) continue;
      const TensorInfo* elsewhere = ckpt.find(tensor);
      if (elsewhere != nullptr) {
        fail("checkpoint index {} puts tensor '{}' in shard {}, but it is in {}", index_name, tensor,
             shard_name, elsewhere->file);
      }
      fail("checkpoint index {} puts tensor '{}' in shard {}, but that shard has no such tensor", index_name,
           tensor, file.path());
    }
    return ckpt;
  }

  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") found.push_back(entry.path());
  }
  if (found.empty()) {
    fail("no checkpoint in {}: expected {}, {} or other *.safetensors files", dir, kSingleFileName,
         kIndexFileName);
  }
  std::sort(found.begin(), found.end());
  for (const fs::path& p : found) add_file(SafetensorsFile::open(p.string(), allowed_dtypes));
  return ckpt;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (t == nullptr) fail("checkpoint {} has no tensor '{}'", location_, name);
  return *t;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(by_name_.size());
  for (const auto& [name, info] : by_name_) out.push_back(name);
  return out;
}

}  // namespace polylora
