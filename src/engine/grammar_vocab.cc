// engine/grammar_vocab.cc: token id -> bytes for the structured-output engine.
#include "engine/grammar_vocab.h"

#include <string>

namespace polylora {

std::shared_ptr<const structured::Vocabulary> grammar_vocab(const tokenizer::Tokenizer& tok,
                                                            int64_t model_vocab_size,
                                                            const std::vector<int32_t>& stop_ids) {
  std::vector<std::string> bytes(static_cast<size_t>(model_vocab_size));
  std::vector<int32_t> special;
  for (int32_t id = 0; id < model_vocab_size; ++id) {
    if (!tok.has_id(id)) continue;
    if (tok.is_special(id)) {
      special.push_back(id);
      continue;
    }
    if (tok.is_byte_token(id)) {
      const std::string t = tok.id_to_token(id);  // "<0xAB>"
      if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') {
        bytes[static_cast<size_t>(id)] =
            std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
        continue;
      }
    }
    const int32_t one[1] = {id};
    bytes[static_cast<size_t>(id)] = tok.decode_window(one, false, false);
  }
  return structured::Vocabulary::create(std::move(bytes), stop_ids, std::move(special));
}

}  // namespace polylora
