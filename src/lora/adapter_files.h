// lora/adapter_files.h: opens an adapter directory and the files in it, either trusted (startup
// --lora-modules: symbolic links followed) or confined to --lora-allowed-dirs (run-time loads).
// Owns: lexical path normalisation and the allowed-directory check, openat2 (RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) with an O_NOFOLLOW component walk where openat2 is missing,
// the regular-file and size checks, and bounded reads through the descriptor that was checked.
// Must not: parse file contents, know about models, or re-open anything by path after a check.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace polylora {

// An owned file descriptor (closed on destruction), movable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// An open adapter directory.
struct AdapterDir {
  UniqueFd fd;           // the directory itself (O_PATH)
  std::string display;   // its path as the caller gave it, for messages
  bool confined = true;  // files inside are opened without following any symbolic link
};

// An open regular file of an adapter, checked no larger than the cap it was opened with.
struct AdapterFile {
  UniqueFd fd;
  uint64_t size = 0;
  std::string display;  // "<dir>/<file>"
};

// Opens `dir` as given (symbolic links followed: the operator named it). Errors name adapter `name`:
// "directory ... does not exist", "... is not a directory".
AdapterDir open_adapter_dir(const std::string& dir, const std::string& name);

// Opens `path` only if it lies inside one of `allowed_dirs` with no symbolic link on the way. An
// absolute `path` must lie lexically (after folding '.' and '..') under an allowed directory (as given, or
// as it resolves); a relative one is looked up in each allowed directory in order, and the first in which
// it exists is used. Errors (polylora::Error kInvalid) name the adapter and the path:
//   "adapter 'x': <path> is outside the directories allowed by --lora-allowed-dirs"
//   "adapter 'x': <path> is a symbolic link; adapters must be regular files inside --lora-allowed-dirs"
//   "adapter 'x': directory <path> does not exist" / "... is not a directory"
AdapterDir open_adapter_dir_confined(const std::vector<std::string>& allowed_dirs, const std::string& path,
                                     const std::string& name);

// Opens `file` (a plain name) in `dir` for reading: O_NONBLOCK, so a FIFO never blocks the open, then
// fstat: it must be a regular file of at most `max_bytes`. nullopt when it does not exist. Errors:
// "adapter 'x': <dir>/<file> is a symbolic link; ...", "... is not a regular file",
// "... is larger than N bytes (it has M)".
std::optional<AdapterFile> open_adapter_file(const AdapterDir& dir, const std::string& file,
                                             uint64_t max_bytes, const std::string& name);

// All of `file`'s bytes, read through its descriptor. Error when it shrank while being read.
std::string read_adapter_file(const AdapterFile& file, const std::string& name);

// Whether `file` exists in `dir` (not following a symbolic link); for hints in messages only.
bool adapter_file_exists(const AdapterDir& dir, const std::string& file);

// Tests only: makes the confined opener behave as if openat2 returned ENOSYS (the O_NOFOLLOW walk).
void set_openat2_disabled_for_testing(bool disabled);

}  // namespace polylora
