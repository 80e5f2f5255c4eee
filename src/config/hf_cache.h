// config/hf_cache.h: resolving Hugging Face hub ids (`org/name`) to snapshot directories of the local
// Hugging Face cache, offline (polylora never downloads). The cache layout (huggingface_hub's):
//   <cache>/models--org--name/refs/<revision>      a file holding a commit hash
//   <cache>/models--org--name/snapshots/<hash>/    the files (symlinks into ../../blobs/)
// The cache is $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub.
#pragma once

#include <optional>
#include <string>

namespace polylora {

// The hub cache directory from the environment (see above); "" when neither HF_* nor HOME is set.
std::string hf_hub_cache_dir();

// True for text shaped like a hub id: `org/name` or `name` with no path syntax that makes it a path
// (not absolute, not starting with `.` or `~`, at most one `/`).
bool looks_like_hub_id(const std::string& spec);

// The snapshot directory of `repo_id` at `revision` (a ref name such as "main", a tag, or a commit hash,
// full or a unique prefix of at least 7 characters) in `cache_dir`; nullopt when absent.
std::optional<std::string> find_hf_snapshot(const std::string& cache_dir, const std::string& repo_id,
                                            const std::string& revision);

// `spec` as given to --model / --lora-modules / --tokenizer: an existing local directory is returned
// as is; otherwise a hub id is looked up in the cache (hf_hub_cache_dir()). Throws polylora::Error
// ("model 'org/name' is neither a local directory nor in the Hugging Face cache at <path>; polylora does
// not download") when neither. `what` is "model", "adapter" or "tokenizer".
std::string resolve_model_path(const std::string& spec, const std::string& revision, const std::string& what);

}  // namespace polylora
