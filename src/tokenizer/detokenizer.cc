// tokenizer/detokenizer.cc: streaming decode with a prefix window (vLLM's prefix/read offsets) plus two
// guards that make the pieces add up to the full decode: text is released only when it ends in a
// complete character, and never while a run of byte-fallback tokens may still grow.
// Must not: own the Tokenizer or know about stop strings.
#include "tokenizer/detokenizer.h"

#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_tokens_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  // Ids that decode to nothing are left out entirely: kept, they would split a byte-fallback run that
  // the full decode sees as one.
  if (!tokenizer_->has_id(id) || (skip_special_tokens_ && tokenizer_->is_special(id))) return {};
  ids_.push_back(id);
  // A byte-fallback run decodes as a whole (one U+FFFD per byte if invalid), so wait for its end.
  if (tokenizer_->is_byte_token(id)) return {};
  std::span<const int32_t> window(ids_.data() + prefix_offset_, ids_.size() - prefix_offset_);
  std::string text = tokenizer_->decode_window(window, skip_special_tokens_, prefix_offset_ == 0);
  if (text.size() <= prefix_text_.size() || text.ends_with(kReplacementChar) ||
      !text.starts_with(prefix_text_)) {
    return {};
  }
  std::string piece = text.substr(prefix_text_.size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  std::span<const int32_t> prefix(ids_.data() + prefix_offset_, read_offset_ - prefix_offset_);
  prefix_text_ = tokenizer_->decode_window(prefix, skip_special_tokens_, prefix_offset_ == 0);
  return piece;
}

std::string IncrementalDetokenizer::flush() {
  if (read_offset_ == ids_.size()) return {};
  std::span<const int32_t> window(ids_.data() + prefix_offset_, ids_.size() - prefix_offset_);
  std::string text = tokenizer_->decode_window(window, skip_special_tokens_, prefix_offset_ == 0);
  size_t common = 0;
  while (common < text.size() && common < prefix_text_.size() && text[common] == prefix_text_[common])
    ++common;
  std::string piece = text.substr(common);
  prefix_offset_ = read_offset_ = ids_.size();
  prefix_text_.clear();
  return piece;
}

}  // namespace polylora::tokenizer
