// lora/adapter_resolver.h: loading on first use (vLLM's lora_filesystem_resolver): a request naming an
// adapter that is not registered finds it as DIR/<name>/ under --lora-resolver-dir (or
// VLLM_LORA_RESOLVER_CACHE_DIR with VLLM_PLUGINS=lora_filesystem_resolver).
// Owns: the name check (a plain directory name), the existence check (lstat: nothing followed), and the
// loader that reads DIR/<name> through load_peft_adapter_confined with DIR as the only allowed directory
// (no '..', no symbolic link anywhere below DIR, only regular files; its messages name
// --lora-resolver-dir).
// Must not: register anything (the engine hands the loader to the AdapterRegistry, whose loader thread
// runs it), read outside DIR, or follow a link.
#pragma once

#include <optional>
#include <string>

#include "config/model_config.h"
#include "lora/adapter.h"
#include "lora/adapter_registry.h"

namespace polylora {

class AdapterResolver {
 public:
  // Error (kInvalid) when `dir` is not an existing directory (as vLLM refuses a bad
  // VLLM_LORA_RESOLVER_CACHE_DIR at start).
  explicit AdapterResolver(std::string dir);

  // A name that can only mean a directory directly inside DIR: not empty, not "." or "..", no '/', '\\',
  // NUL or other control character, at most 255 bytes. Anything else is never looked up.
  static bool plain_name(const std::string& name);
  // DIR/<name> when the name is plain and an entry of that name exists in DIR (a symbolic link counts as
  // existing, so that its load is refused with a message rather than reported missing); nullopt: not
  // there (the request is a 404, as vLLM's "The model `x` does not exist.").
  std::optional<std::string> locate(const std::string& name) const;
  // Reads DIR/<name> (name plain) confined to DIR: every problem is a polylora::Error (kInvalid) naming
  // the adapter and the file, and --lora-resolver-dir where the confinement refused it.
  AdapterRegistry::Loader loader(const std::string& name, const ModelConfig& config,
                                 const LoraLimits& limits) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace polylora
