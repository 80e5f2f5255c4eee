// engine/text_stream.cc: detokenized text, stop strings and holdback of one sequence.
#include "engine/text_stream.h"

#include <algorithm>

namespace polylora {
namespace {

// Largest position <= pos that starts a UTF-8 character.
size_t utf8_boundary(const std::string& s, size_t pos) {
  while (pos > 0 && pos < s.size() && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

TextStream::TextStream(const tokenizer::Tokenizer* tokenizer, bool skip_special_tokens,
                       std::vector<std::string> stops, bool include_stop_str_in_output)
    : stops_(std::move(stops)), include_stop_(include_stop_str_in_output) {
  if (tokenizer) detok_ = std::make_unique<tokenizer::IncrementalDetokenizer>(*tokenizer, skip_special_tokens);
  for (const auto& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
}

void TextStream::push(int32_t token) {
  if (detok_) text_ += detok_->push(token);
}

std::optional<std::string> TextStream::find_stop() {
  if (stops_.empty()) return std::nullopt;
  // Search only where a new match can be: the new text plus the longest stop string's tail.
  const size_t new_len = text_.size() - std::min(text_.size(), emitted_);
  const size_t from = text_.size() > new_len + max_stop_len_ ? text_.size() - new_len - max_stop_len_ : 0;
  size_t best = std::string::npos;
  const std::string* hit = nullptr;
  for (const auto& s : stops_) {
    const size_t min_start = min_tokens_text_ + 1 > s.size() ? min_tokens_text_ + 1 - s.size() : 0;
    const size_t pos = text_.find(s, std::max(from, min_start));
    if (pos != std::string::npos && pos < best) {
      best = pos;
      hit = &s;
    }
  }
  if (!hit) return std::nullopt;
  text_.resize(include_stop_ ? best + hit->size() : best);
  emitted_ = std::min(emitted_, text_.size());
  return *hit;
}

void TextStream::flush() {
  if (detok_) text_ += detok_->flush();
}

size_t TextStream::end_for(bool finished) const {
  if (finished || max_stop_len_ <= 1) return text_.size();
  return utf8_boundary(text_, text_.size() > max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0);
}

std::string TextStream::take_new(bool finished) {
  const size_t end = end_for(finished);
  if (end <= emitted_) return {};
  std::string out = text_.substr(emitted_, end - emitted_);
  emitted_ = end;
  return out;
}

}  // namespace polylora
