// fuzz-sources: src/tokenizer/[abdnpru]*.cc src/tokenizer/tokenizer*.cc
// tests/fuzz/tokenizer_fuzz.cc: arbitrary bytes (invalid UTF-8 included) through encode, decode and the
// streaming detokenizer of the byte-level and SentencePiece test tokenizers, plus the bytes read as ids.
// Checks: byte-level round trips are exact for valid UTF-8, every streamed piece is valid UTF-8, and the
// pieces add up to the full decode. Tokenizer data: POLYLORA_TEST_DATA, else $POLYLORA_TEST_DATA.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_util.h"

using polylora::tokenizer::IncrementalDetokenizer;
using polylora::tokenizer::Tokenizer;

namespace {

std::string data_dir() {
#ifdef POLYLORA_TEST_DATA
  return POLYLORA_TEST_DATA;
#else
  const char* env = std::getenv("POLYLORA_TEST_DATA");
  if (!env) {
    std::fprintf(stderr, "tokenizer_fuzz: set POLYLORA_TEST_DATA to the tests/data directory\n");
    std::abort();
  }
  return env;
#endif
}

const std::vector<Tokenizer>& tokenizers() {
  static const std::vector<Tokenizer> all = [] {
    std::vector<Tokenizer> t;
    t.push_back(Tokenizer::load(data_dir() + "/tokenizers/tiny-bytelevel"));
    t.push_back(Tokenizer::load(data_dir() + "/tokenizers/tiny-sentencepiece"));
    return t;
  }();
  return all;
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tokenizer_fuzz: %s\n", what);
    std::abort();
  }
}

void stream_and_compare(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (int32_t id : ids) {
    std::string piece = detok.push(id);
    check(polylora::tokenizer::is_valid_utf8(piece), "streamed piece is not valid UTF-8");
    streamed += piece;
  }
  std::string rest = detok.flush();
  check(polylora::tokenizer::is_valid_utf8(rest), "flushed piece is not valid UTF-8");
  streamed += rest;
  check(streamed == tok.decode(ids, skip_special), "streamed text differs from the full decode");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto& all = tokenizers();
  for (size_t t = 0; t < all.size(); ++t) {
    const Tokenizer& tok = all[t];
    try {
      std::vector<int32_t> ids = tok.encode(text, (size & 1) != 0);
      for (int32_t id : ids) check(id >= 0 && id < tok.vocab_size(), "encode produced an out-of-range id");
      std::string decoded = tok.decode(ids);
      check(polylora::tokenizer::is_valid_utf8(decoded), "decode produced invalid UTF-8");
      if (t == 0 && (size & 1) == 0) {
        // Byte-level BPE is lossless up to the repair of invalid UTF-8.
        check(decoded == polylora::tokenizer::utf8_lossy(text), "byte-level round trip is not exact");
      }
      stream_and_compare(tok, ids, false);
      stream_and_compare(tok, ids, true);
      // The same bytes read as arbitrary ids (any id, including unknown ones).
      std::vector<int32_t> raw_ids;
      for (size_t i = 0; i + 1 < size && raw_ids.size() < 256; i += 2) {
        raw_ids.push_back(static_cast<int32_t>((data[i] << 8 | data[i + 1]) % (tok.vocab_size() + 8)));
      }
      stream_and_compare(tok, raw_ids, (size & 2) != 0);
    } catch (const polylora::Error&) {
      // A rejected input is fine; a crash or a failed check is not.
    }
  }
  return 0;
}
