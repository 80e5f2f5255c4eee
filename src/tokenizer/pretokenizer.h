// tokenizer/pretokenizer.h: the `pre_tokenizer` section of tokenizer.json (Split, ByteLevel, Metaspace,
// Whitespace, WhitespaceSplit, Digits, Punctuation, Sequence): one normalized segment -> pre-tokens.
// Must not: know about vocabularies or merges.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace polylora::tokenizer {

// The pre-tokens of one segment: views into the segment or into `arena` (for rewritten pieces).
struct PreTokens {
  std::vector<std::string_view> pieces;
  std::deque<std::string> arena;
  // True when the pieces are still raw bytes that the ByteLevel step has yet to map to its alphabet;
  // the BPE model maps them itself (a fast path that avoids building the mapped strings).
  bool byte_level = false;

  std::string_view keep(std::string s) { return arena.emplace_back(std::move(s)); }
  // Maps pending raw-byte pieces to the byte-level alphabet (before a step that needs real strings).
  void materialize_byte_level();
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // first_segment: the segment starts at offset 0 of the input (Metaspace prepend_scheme "first").
  virtual void pre_tokenize(PreTokens& tokens, bool first_segment) const = 0;
};

// Builds the pre-tokenizer of a tokenizer.json `pre_tokenizer` value; nullptr for null. Throws
// polylora::Error for an unsupported type.
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& config);

}  // namespace polylora::tokenizer
