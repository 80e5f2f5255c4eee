// config/hf_cache.cc: offline lookup of hub ids in the local Hugging Face cache.
#include "config/hf_cache.h"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace polylora {
namespace fs = std::filesystem;

std::string hf_hub_cache_dir() {
  if (const char* v = std::getenv("HF_HUB_CACHE"); v && *v) return v;
  if (const char* v = std::getenv("HUGGINGFACE_HUB_CACHE"); v && *v) return v;  // the older name
  if (const char* v = std::getenv("HF_HOME"); v && *v) return (fs::path(v) / "hub").string();
  if (const char* v = std::getenv("XDG_CACHE_HOME"); v && *v)
    return (fs::path(v) / "huggingface" / "hub").string();
  if (const char* v = std::getenv("HOME"); v && *v) return (fs::path(v) / ".cache/huggingface/hub").string();
  return "";
}

bool looks_like_hub_id(const std::string& spec) {
  if (spec.empty() || spec.front() == '/' || spec.front() == '.' || spec.front() == '~') return false;
  size_t slash = spec.find('/');
  if (slash != std::string::npos && (slash == 0 || slash + 1 == spec.size() || spec.find('/', slash + 1) != std::string::npos))
    return false;
  for (char c : spec)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' || c == '/')) return false;
  return spec.find("..") == std::string::npos;
}

namespace {

bool is_hex(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string repo_folder(const std::string& repo_id) {
  std::string f = "models--";
  for (char c : repo_id) {
    if (c == '/')
      f += "--";
    else
      f += c;
  }
  return f;
}

}  // namespace

std::optional<std::string> find_hf_snapshot(const std::string& cache_dir, const std::string& repo_id,
                                            const std::string& revision) {
  std::error_code ec;
  fs::path repo = fs::path(cache_dir) / repo_folder(repo_id);
  fs::path snapshots = repo / "snapshots";
  if (!fs::is_directory(snapshots, ec)) return std::nullopt;
  std::string rev = revision.empty() ? "main" : revision;
  // A ref (refs/main, refs/v1.0, refs/pr/1) names the commit.
  fs::path ref = repo / "refs" / rev;
  if (rev.find("..") == std::string::npos && fs::is_regular_file(ref, ec)) {
    std::ifstream in(ref);
    std::string hash;
    in >> hash;
    if (!hash.empty() && fs::is_directory(snapshots / hash, ec)) return (snapshots / hash).string();
    return std::nullopt;
  }
  // A commit hash (or a unique prefix of one) picks that snapshot.
  if (is_hex(rev) && rev.size() >= 7) {
    if (fs::is_directory(snapshots / rev, ec)) return (snapshots / rev).string();
    std::optional<std::string> found;
    for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
      std::string name = entry.path().filename().string();
      if (name.rfind(rev, 0) == 0 && entry.is_directory()) {
        if (found) return std::nullopt;  // ambiguous
        found = entry.path().string();
      }
    }
    return found;
  }
  return std::nullopt;
}

std::string resolve_model_path(const std::string& spec, const std::string& revision, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return spec;
  std::string cache = hf_hub_cache_dir();
  if (looks_like_hub_id(spec) && !cache.empty()) {
    if (auto snap = find_hf_snapshot(cache, spec, revision)) return *snap;
    if (fs::is_directory(fs::path(cache) / repo_folder(spec) / "snapshots", ec))
      fail("{} '{}' is in the Hugging Face cache at {} but not at revision '{}' (no refs/{} and no snapshot "
           "of that commit); polylora does not download",
           what, spec, cache, revision.empty() ? "main" : revision, revision.empty() ? "main" : revision);
  }
  fail("{} '{}' is neither a local directory nor in the Hugging Face cache at {}; polylora does not download",
       what, spec, cache.empty() ? "(no HF_HUB_CACHE, HF_HOME or HOME set)" : cache);
}

}  // namespace polylora
