// tokenizer/added_vocabulary.h: the `added_tokens` of tokenizer.json and how HF finds them in text:
// leftmost-longest matching before pre-tokenization, with single_word/lstrip/rstrip, raw-text matching
// for normalized=false tokens and normalized-text matching for normalized=true ones.
// Must not: normalize or pre-tokenize (the Tokenizer does and passes the results in).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace polylora::tokenizer {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// A part of a text: either an added token (token_id >= 0) or plain text [begin, end).
struct TextSplit {
  size_t begin = 0;
  size_t end = 0;
  int32_t token_id = -1;
};

// Finds a fixed set of added tokens in text (one matcher: either raw or normalized tokens).
class AddedTokenMatcher {
 public:
  // `patterns` are the strings to find (the token content, or its normalized form).
  void add(std::string pattern, const AddedToken& token);
  bool empty() const { return patterns_.empty(); }
  // Splits text into added tokens and the plain text between them (non-empty parts, in order).
  std::vector<TextSplit> split(std::string_view text) const;

 private:
  struct Pattern {
    std::string text;
    AddedToken token;
  };
  std::vector<Pattern> patterns_;
  // Pattern indices by first byte, longest first.
  std::array<std::vector<uint32_t>, 256> by_first_byte_;
};

}  // namespace polylora::tokenizer
