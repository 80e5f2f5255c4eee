// lora/adapter_files.cc: confined opening of adapter directories and files (see adapter_files.h).
// Owns: the openat2 call and its O_NOFOLLOW fallback, the allowed-directory check, fstat checks, preads.
// Must not: follow a symbolic link in confined mode, open a file in a way that can block (FIFOs), or read
// anything through a path after its descriptor was checked.
#include "lora/adapter_files.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "common/error.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

namespace polylora {
namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_openat2_disabled{false};
std::atomic<bool> g_openat2_missing{false};  // set once the kernel answered ENOSYS

constexpr int kDirFlags = O_PATH | O_DIRECTORY | O_CLOEXEC;
constexpr int kFileFlags = O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC;

std::string strerror_of(int err) {
  return std::strerror(err);
}

// Splits on '/', drops empty and "." components, folds ".." into its parent. nullopt when a ".." would
// climb above the start.
std::optional<std::vector<std::string>> normalise(std::string_view path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    std::string_view part = path.substr(i, j - i);
    if (part == "..") {
      if (out.empty()) return std::nullopt;
      out.pop_back();
    } else if (!part.empty() && part != ".") {
      out.emplace_back(part);
    }
    i = j + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end; ++k) {
    if (!out.empty()) out += '/';
    out += parts[k];
  }
  return out;
}

bool starts_with(const std::vector<std::string>& path, const std::vector<std::string>& prefix) {
  if (prefix.size() > path.size()) return false;
  for (size_t k = 0; k < prefix.size(); ++k)
    if (path[k] != prefix[k]) return false;
  return true;
}

// openat2 beneath `base` with no symbolic links, or the component walk. Returns the fd or -errno.
int open_beneath(int base, const std::vector<std::string>& parts, int flags) {
  std::string rel = parts.empty() ? "." : join(parts, 0, parts.size());
  if (!g_openat2_disabled && !g_openat2_missing) {
    open_how how{};
    how.flags = static_cast<uint64_t>(flags);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    for (int attempt = 0; attempt < 8; ++attempt) {
      long fd = ::syscall(SYS_openat2, base, rel.c_str(), &how, sizeof(how));
      if (fd >= 0) return static_cast<int>(fd);
      if (errno == EAGAIN || errno == EINTR) continue;  // a concurrent rename; the kernel asks to retry
      if (errno != ENOSYS) return -errno;
      g_openat2_missing = true;
      break;
    }
    if (!g_openat2_missing) return -EAGAIN;
  }
  // Fallback: one component per openat, none followed. No component is "." or ".." (normalised), so the
  // walk cannot leave `base`.
  UniqueFd current;
  int dir = base;
  if (parts.empty()) {
    int fd = ::openat(base, ".", flags);
    return fd >= 0 ? fd : -errno;
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    bool last = k + 1 == parts.size();
    bool want_dir = !last || (flags & O_DIRECTORY) != 0;
    // A directory component is opened O_PATH | O_NOFOLLOW (which opens a symbolic link itself rather than
    // failing) and then judged by fstat on that very descriptor, so the verdict cannot race a rename.
    int fd = ::openat(dir, parts[k].c_str(), want_dir ? O_PATH | O_NOFOLLOW | O_CLOEXEC : flags | O_NOFOLLOW);
    if (fd < 0) return -errno;
    UniqueFd opened(fd);
    struct stat st {};
    if (::fstat(fd, &st) != 0) return -errno;
    if (S_ISLNK(st.st_mode)) return -ELOOP;
    if (want_dir && !S_ISDIR(st.st_mode)) return -ENOTDIR;
    current = std::move(opened);
    dir = current.get();
    if (last) return current.release();
  }
  return -ENOENT;
}

// The first symbolic link along `parts` under `base` (for the message only; not a security check).
std::string first_symlink(int base, const std::vector<std::string>& parts, const std::string& base_display) {
  for (size_t k = 1; k <= parts.size(); ++k) {
    struct stat st {};
    std::string prefix = join(parts, 0, k);
    if (::fstatat(base, prefix.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) break;
    if (S_ISLNK(st.st_mode)) return (fs::path(base_display) / prefix).string();
  }
  return (fs::path(base_display) / join(parts, 0, parts.size())).string();
}

[[noreturn]] void fail_open(int err, const std::string& name, int base, const std::vector<std::string>& parts,
                            const std::string& base_display, const std::string& display, bool is_dir) {
  switch (err) {
    case ELOOP:
      fail("adapter '{}': {} is a symbolic link; adapters must be regular files inside --lora-allowed-dirs",
           name, first_symlink(base, parts, base_display));
    case EXDEV:
      fail("adapter '{}': {} is outside the directories allowed by --lora-allowed-dirs", name, display);
    case ENOENT:  // a 404 on the HTTP routes, as vLLM's "No adapter found"
      if (is_dir)
        fail_with(ErrorKind::kNotFound, "adapter '{}': No adapter found: directory {} does not exist", name,
                  display);
      fail("adapter '{}': {} is missing", name, display);
    case ENOTDIR:
      fail("adapter '{}': {} is not a directory", name, display);
    default:
      fail("adapter '{}': cannot open {}: {}", name, display, strerror_of(err));
  }
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

void set_openat2_disabled_for_testing(bool disabled) {
  g_openat2_disabled = disabled;
}

AdapterDir open_adapter_dir(const std::string& dir, const std::string& name) {
  if (dir.empty()) fail("adapter '{}': the adapter path is empty", name);
  if (dir.find('\0') != std::string::npos) fail("adapter '{}': the adapter path contains a NUL byte", name);
  int fd = ::open(dir.c_str(), kDirFlags);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT)
      fail_with(ErrorKind::kNotFound, "adapter '{}': No adapter found: directory {} does not exist", name,
                dir);
    if (err == ENOTDIR) fail("adapter '{}': {} is not a directory", name, dir);
    fail("adapter '{}': cannot open directory {}: {}", name, dir, strerror_of(err));
  }
  return AdapterDir{UniqueFd(fd), dir, false};
}

AdapterDir open_adapter_dir_confined(const std::vector<std::string>& allowed_dirs, const std::string& path,
                                     const std::string& name) {
  if (allowed_dirs.empty())
    fail("adapter '{}': loading adapters at run time needs --lora-allowed-dirs; no directory is allowed",
         name);
  if (path.empty()) fail("adapter '{}': the adapter path is empty", name);
  if (path.find('\0') != std::string::npos) fail("adapter '{}': the adapter path contains a NUL byte", name);
  auto outside = [&]() -> void {
    fail("adapter '{}': {} is outside the directories allowed by --lora-allowed-dirs", name, path);
  };
  std::optional<std::vector<std::string>> parts = normalise(path);
  if (!parts) outside();  // a ".." climbs above the root or above the allowed directory

  // Each candidate: an allowed directory and the path relative to it.
  auto open_allowed = [&](const std::string& allowed) {
    return UniqueFd(::open(allowed.c_str(), kDirFlags));
  };
  auto open_in = [&](const UniqueFd& base, const std::string& allowed, const std::vector<std::string>& rel,
                     bool* missing) -> std::optional<AdapterDir> {
    int fd = open_beneath(base.get(), rel, kDirFlags);
    if (fd >= 0) return AdapterDir{UniqueFd(fd), path, true};
    if (missing != nullptr && -fd == ENOENT) {
      *missing = true;
      return std::nullopt;
    }
    fail_open(-fd, name, base.get(), rel, allowed, path, true);
  };

  if (path[0] == '/') {
    for (const std::string& allowed : allowed_dirs) {
      std::error_code ec;
      fs::path absolute = fs::absolute(allowed, ec);
      if (ec) continue;
      std::vector<std::vector<std::string>> prefixes;
      if (auto lexical = normalise(absolute.string())) prefixes.push_back(*lexical);
      fs::path resolved = fs::canonical(absolute, ec);
      if (!ec)
        if (auto real = normalise(resolved.string())) prefixes.push_back(*real);
      for (const auto& prefix : prefixes) {
        if (!starts_with(*parts, prefix)) continue;
        UniqueFd base = open_allowed(allowed);
        if (!base.valid())
          fail("adapter '{}': allowed directory {} cannot be opened: {}", name, allowed, strerror_of(errno));
        std::vector<std::string> rel(parts->begin() + static_cast<long>(prefix.size()), parts->end());
        return *open_in(base, allowed, rel, nullptr);
      }
    }
    outside();
  }
  for (const std::string& allowed : allowed_dirs) {
    UniqueFd base = open_allowed(allowed);
    if (!base.valid()) continue;
    bool missing = false;
    if (auto dir = open_in(base, allowed, *parts, &missing)) return std::move(*dir);
  }
  fail_with(
      ErrorKind::kNotFound,
      "adapter '{}': No adapter found: directory {} does not exist in any of the directories allowed by "
      "--lora-allowed-dirs",
      name, path);
}

std::optional<AdapterFile> open_adapter_file(const AdapterDir& dir, const std::string& file,
                                             uint64_t max_bytes, const std::string& name) {
  AdapterFile out;
  out.display = (fs::path(dir.display) / file).string();
  int fd = -1;
  if (dir.confined) {
    fd = open_beneath(dir.fd.get(), {file}, kFileFlags);
    if (fd < 0) {
      if (-fd == ENOENT) return std::nullopt;
      fail_open(-fd, name, dir.fd.get(), {file}, dir.display, out.display, false);
    }
  } else {
    fd = ::openat(dir.fd.get(), file.c_str(), kFileFlags);
    if (fd < 0) {
      int err = errno;
      if (err == ENOENT) return std::nullopt;
      fail("adapter '{}': cannot open {}: {}", name, out.display, strerror_of(err));
    }
  }
  out.fd = UniqueFd(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("adapter '{}': cannot stat {}: {}", name, out.display, strerror_of(errno));
  if (!S_ISREG(st.st_mode))
    fail("adapter '{}': {} is not a regular file; adapters must be regular files", name, out.display);
  out.size = static_cast<uint64_t>(st.st_size);
  if (out.size > max_bytes)
    fail("adapter '{}': {} is larger than {} bytes (it has {})", name, out.display, max_bytes, out.size);
  return out;
}

std::string read_adapter_file(const AdapterFile& file, const std::string& name) {
  std::string out(static_cast<size_t>(file.size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::pread(file.fd.get(), out.data() + done, out.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("adapter '{}': cannot read {}: {}", name, file.display, strerror_of(errno));
    if (n == 0)
      fail("adapter '{}': {} changed while being read (it has {} bytes, not {})", name, file.display, done,
           out.size());
    done += static_cast<size_t>(n);
  }
  return out;
}

bool adapter_file_exists(const AdapterDir& dir, const std::string& file) {
  struct stat st {};
  return ::fstatat(dir.fd.get(), file.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

}  // namespace polylora
