// tokenizer/decoder.h: the `decoder` section of tokenizer.json (ByteLevel, ByteFallback, Fuse, Strip,
// Replace, Metaspace, BPEDecoder, Sequence): token strings -> text, as HF's decode_chain does.
// Must not: look up ids (the Tokenizer passes token strings) or keep streaming state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace polylora::tokenizer {

// Where the decoded tokens sit in the whole sequence. A window that does not start the sequence
// (incremental detokenization) must not get start-of-text treatment (Strip of the leading space,
// Metaspace's first-token rule).
struct DecodeWindow {
  bool at_start = true;
  // Element 0 of the current token list continues text that began before the window (set once a
  // decoder has fused tokens into one string).
  bool first_is_partial = false;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeWindow& window) const = 0;
  // True when a ByteFallback step is part of the chain (byte tokens decode together).
  virtual bool has_byte_fallback() const { return false; }
};

// Builds the decoder of a tokenizer.json `decoder` value; nullptr for null. Throws polylora::Error for
// an unsupported type.
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config);

// Parses a byte-fallback token "<0xAB>"; -1 when token is not one.
int parse_byte_token(std::string_view token);

}  // namespace polylora::tokenizer
