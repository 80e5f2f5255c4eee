// engine/text_stream.h: one sequence's output text: incremental detokenization, stop strings (as vLLM's
// detokenizer: matched only where a match ends in the text of tokens after the first min_tokens, the
// earliest match wins, the text is cut before it or after it with include_stop_str_in_output) and the
// holdback of a tail that could still become a stop string, so no stop string is ever partly streamed.
// Must not: decide token stops or lengths (engine/stop_rules.h).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace polylora {

class TextStream {
 public:
  // tokenizer may be null: no text (and no stop strings: the engine refuses them without a tokenizer).
  TextStream(const tokenizer::Tokenizer* tokenizer, bool skip_special_tokens, std::vector<std::string> stops,
             bool include_stop_str_in_output);
  bool has_text() const { return detok_ != nullptr; }
  // Appends the text of the next output token.
  void push(int32_t token);
  // The text so far is that of the first min_tokens tokens: no stop string may end in it.
  void mark_min_tokens() { min_tokens_text_ = text_.size(); }
  // The earliest stop string that now ends after the min_tokens mark, searched only where a new match can
  // be; on a match the text is cut (the stop string kept with include_stop_str_in_output).
  std::optional<std::string> find_stop();
  // At the end of a sequence not stopped by a stop string: whatever the detokenizer still holds.
  void flush();
  // The text not yet returned; while `finished` is false, without a tail that could still begin a stop
  // string (cut at a UTF-8 character boundary).
  std::string take_new(bool finished);
  // Whether take_new(finished) would return something.
  bool has_new(bool finished) const { return end_for(finished) > emitted_; }
  const std::string& text() const { return text_; }

 private:
  size_t end_for(bool finished) const;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok_;
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  size_t max_stop_len_ = 0;
  std::string text_;
  size_t min_tokens_text_ = 0;
  size_t emitted_ = 0;
};

}  // namespace polylora
