// tokenizer/added_vocabulary.cc: added-token matching as HF's AddedVocabulary::find_matches.
// Must not: normalize or pre-tokenize.
#include "tokenizer/added_vocabulary.h"

#include <algorithm>

#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {

void AddedTokenMatcher::add(std::string pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  uint32_t index = static_cast<uint32_t>(patterns_.size());
  unsigned char first = static_cast<unsigned char>(pattern[0]);
  patterns_.push_back({std::move(pattern), token});
  auto& bucket = by_first_byte_[first];
  bucket.push_back(index);
  std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
    return patterns_[a].text.size() > patterns_[b].text.size();
  });
}

namespace {

bool is_word_char(char32_t cp) {
  return cp == '_' || is_unicode_alnum(cp);
}

char32_t last_char(std::string_view s) {
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return utf8_next(s, start);
}

}  // namespace

std::vector<TextSplit> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<TextSplit> splits;
  if (patterns_.empty()) {
    if (!text.empty()) splits.push_back({0, text.size(), -1});
    return splits;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<unsigned char>(text[pos])];
    const Pattern* found = nullptr;
    for (uint32_t index : bucket) {
      const Pattern& p = patterns_[index];
      if (text.compare(pos, p.text.size(), p.text) == 0) {
        found = &p;
        break;
      }
    }
    if (!found) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + found->text.size();
    const AddedToken& token = found->token;
    if (start < start_offset) {  // swallowed by the previous token's rstrip
      pos = stop;
      continue;
    }
    if (token.single_word) {
      bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      size_t after = stop;
      bool stop_ok = stop == text.size() || !is_word_char(utf8_next(text, after));
      if (!start_ok || !stop_ok) {  // as HF, the search resumes after the rejected match
        pos = stop;
        continue;
      }
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t prev = new_start - 1;
        while (prev > 0 && (static_cast<unsigned char>(text[prev]) & 0xC0) == 0x80) --prev;
        size_t p = prev;
        if (!is_unicode_whitespace(utf8_next(text, p))) break;
        new_start = prev;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t p = stop;
        if (!is_unicode_whitespace(utf8_next(text, p))) break;
        stop = p;
      }
    }
    if (start_offset < start) splits.push_back({start_offset, start, -1});
    splits.push_back({start, stop, token.id});
    start_offset = stop;
    pos = stop;
  }
  if (start_offset < text.size()) splits.push_back({start_offset, text.size(), -1});
  return splits;
}

}  // namespace polylora::tokenizer
