// tokenizer/detokenizer.h: incremental (streaming) detokenization of generated ids.
// Owns: the per-request decode state (prefix/read offsets, as vLLM/TGI) that turns one id at a time into
// text pieces which are always whole UTF-8 characters and concatenate to exactly Tokenizer::decode.
// Must not: own the Tokenizer (it borrows one that must outlive it) or know about stop strings.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace polylora::tokenizer {

class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Adds one id; returns the text that became final (possibly "").
  std::string push(int32_t id);
  // Returns whatever is still held back (an incomplete character at the end of the stream). The
  // detokenizer can continue to be used afterwards.
  std::string flush();

  std::span<const int32_t> ids() const { return ids_; }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // kept ids (special ids dropped when skipping them)
  size_t prefix_offset_ = 0;  // start of the decode window
  size_t read_offset_ = 0;    // ids before this are already emitted
  std::string prefix_text_;   // decode of ids_[prefix_offset_, read_offset_)
};

}  // namespace polylora::tokenizer
