// tokenizer/normalizer.h: the `normalizer` section of tokenizer.json (NFC/NFD/NFKC/NFKD, Lowercase,
// Strip, StripAccents, Replace, Prepend, Sequence) applied to one text segment.
// Must not: split text or know about vocabularies.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace polylora::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer of a tokenizer.json `normalizer` value; nullptr for null. Throws polylora::Error
// for an unsupported type.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& config);

}  // namespace polylora::tokenizer
