// tokenizer/tokenizer_json.h: fast reading of tokenizer.json. The big model.vocab and model.merges are
// streamed straight into a BpeVocabulary (SAX), everything else becomes a small JSON document.
// Must not: interpret the sections (the Tokenizer and its parts do).
#pragma once

#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_model.h"

namespace polylora::tokenizer {

struct TokenizerJson {
  nlohmann::json root;                      // model.vocab / model.merges are left empty when captured below
  std::optional<BpeVocabulary> vocabulary;  // set when model.vocab was an object and merges a list
};

// Throws polylora::Error when text is not valid JSON.
TokenizerJson parse_tokenizer_json(std::string_view text);

}  // namespace polylora::tokenizer
