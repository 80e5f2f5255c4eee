// lora/adapter_resolver.cc: the filesystem resolver (see adapter_resolver.h).
#include "lora/adapter_resolver.h"

#include <sys/stat.h>

#include <filesystem>

#include "common/error.h"

namespace polylora {

namespace fs = std::filesystem;

AdapterResolver::AdapterResolver(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  if (dir_.empty() || !fs::is_directory(dir_, ec))
    fail("--lora-resolver-dir (VLLM_LORA_RESOLVER_CACHE_DIR) must be an existing directory, got '{}'", dir_);
}

bool AdapterResolver::plain_name(const std::string& name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (c == '/' || c == '\\' || u < 0x20 || u == 0x7f) return false;
  }
  return true;
}

std::optional<std::string> AdapterResolver::locate(const std::string& name) const {
  if (!plain_name(name)) return std::nullopt;
  std::string path = (fs::path(dir_) / name).string();
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return path;
}

AdapterRegistry::Loader AdapterResolver::loader(const std::string& name, const ModelConfig& config,
                                                const LoraLimits& limits) const {
  CHECK_MSG(plain_name(name), "the resolver was asked to load a name that is not plain");
  return [dir = dir_, name, config, limits]() -> std::shared_ptr<LoraAdapter> {
    try {
      // Relative to DIR, the only allowed directory: one component, opened beneath DIR with no link
      // followed (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or the O_NOFOLLOW walk).
      std::shared_ptr<LoraAdapter> adapter = load_peft_adapter_confined({dir}, name, name, config, limits);
      adapter->path = (fs::path(dir) / name).string();
      return adapter;
    } catch (const Error& e) {
      // The confined loader speaks of --lora-allowed-dirs; here the directory is --lora-resolver-dir.
      std::string message = e.what();
      const std::string from = "--lora-allowed-dirs", to = "--lora-resolver-dir";
      for (size_t at = message.find(from); at != std::string::npos; at = message.find(from, at + to.size()))
        message.replace(at, from.size(), to);
      throw Error(message, e.kind());
    }
  };
}

}  // namespace polylora
