// tokenizer/tokenizer.h: the public tokenizer of a model directory (tokenizer.json or tokenizer.json.gz,
// tokenizer_config.json, chat_template.jinja): text <-> token ids, as Hugging Face tokenizers does.
// Owns: loading, the encode pipeline (added tokens -> normalizer -> pre-tokenizer -> BPE -> post-processor)
// and decoding. Supports BPE models (byte-level and SentencePiece-style).
// Must not: depend on the engine, or render chat templates (tokenizer/jinja does).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace polylora::tokenizer {

class Tokenizer {
 public:
  // Loads dir/tokenizer.json (or dir/tokenizer.json.gz), plus dir/tokenizer_config.json and
  // dir/chat_template.jinja when present. Throws polylora::Error with the reason on failure.
  static Tokenizer load(const std::string& dir);
  // From in-memory contents (config_json may be empty).
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Invalid UTF-8 in text is replaced by U+FFFD first. Added tokens are always recognised; the
  // post-processor (BOS/EOS) runs only when add_special_tokens is true. Thread-safe.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Unknown ids are skipped, as HF does. Thread-safe.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // Decodes a window ids of a longer sequence; at_start says whether the window begins the sequence
  // (used by IncrementalDetokenizer so that start-of-text rules apply only once).
  std::string decode_window(std::span<const int32_t> ids, bool skip_special_tokens, bool at_start) const;

  // One past the largest id (model vocabulary and added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of id ("" when the id is unknown).
  std::string id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // True when id has a token (decode skips ids that have none).
  bool has_id(int32_t id) const;
  // True when the decoder merges runs of <0xNN> byte tokens (SentencePiece byte fallback).
  bool is_byte_token(int32_t id) const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  const std::string& bos_token() const;  // "" when not configured
  const std::string& eos_token() const;
  const std::string& pad_token() const;
  bool add_bos_token() const;
  // From chat_template.jinja, else tokenizer_config.json "chat_template" (a string, or the "default"
  // entry of a list of {name, template}); "" when the model ships none.
  const std::string& chat_template() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace polylora::tokenizer
