// engine/grammar_vocab.h: the structured-output engine's view of a tokenizer: the bytes each token id adds
// to the text, which ids stop and which are special (structured::Vocabulary).
// Must not: compile grammars (structured/ does) or hold request state.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace polylora {

// Ids up to model_vocab_size (the model's rows; ids the tokenizer lacks get no bytes and are never
// allowed). Byte-fallback tokens "<0xAB>" are their byte; others decode as in the middle of a text (no
// start-of-text space stripping).
std::shared_ptr<const structured::Vocabulary> grammar_vocab(const tokenizer::Tokenizer& tok,
                                                            int64_t model_vocab_size,
                                                            const std::vector<int32_t>& stop_ids);

}  // namespace polylora
