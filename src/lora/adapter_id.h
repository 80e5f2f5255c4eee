// lora/adapter_id.h: the strong identity of a registered adapter (header only, so the KV cache and the
// scheduler can carry it without linking lora/).
// Owns: AdapterId, a load version that the registry (lora/adapter_registry.h) hands out once per
// registration; an adapter removed and registered again under the same name gets a new version, so a
// prefix-cache block or a device slot of the old weights is never taken for the new ones.
// Must not: hold state; the name and weights of an id live in the registry.
#pragma once

#include <compare>
#include <cstdint>
#include <functional>

namespace polylora {

struct AdapterId {
  uint64_t version = 0;  // 0: the base model (no adapter)
  bool base() const { return version == 0; }
  explicit operator bool() const { return version != 0; }
  auto operator<=>(const AdapterId&) const = default;
};

}  // namespace polylora

template <>
struct std::hash<polylora::AdapterId> {
  size_t operator()(const polylora::AdapterId& id) const noexcept { return std::hash<uint64_t>()(id.version); }
};
