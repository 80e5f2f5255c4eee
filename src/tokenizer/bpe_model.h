// tokenizer/bpe_model.h: the BPE model of tokenizer.json: vocabulary, ranked merges, and the merge loop
// that turns one pre-token into ids (byte_fallback, unk/fuse_unk, ignore_merges, subword affixes).
// Must not: split text into pre-tokens or handle added tokens (the Tokenizer does).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace polylora::tokenizer {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Open-addressing string -> id map with the keys packed in one buffer (fast to build and probe for
// vocabularies of 200k+ tokens).
class FlatTokenMap {
 public:
  void reserve(size_t n);
  // Keeps the existing value when key is already present; returns whether it inserted.
  bool insert(std::string_view key, int32_t value);
  const int32_t* find(std::string_view key) const;
  size_t size() const { return values_.size(); }

 private:
  struct Slot {
    uint32_t hash;
    uint32_t index;  // 1 + index into keys_/values_; 0 marks an empty slot
  };
  std::string_view key_at(uint32_t index) const {
    return std::string_view(arena_).substr(keys_[index].first, keys_[index].second);
  }
  std::vector<Slot> slots_;
  std::vector<std::pair<uint32_t, uint32_t>> keys_;  // (offset, length) in arena_
  std::vector<int32_t> values_;
  std::string arena_;
};

// The vocabulary and merges of a BPE model, as read from tokenizer.json.
struct BpeVocabulary {
  std::vector<std::pair<std::string, int32_t>> tokens;
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  // Reads model.vocab and model.merges (both merge spellings) from a parsed "model" object.
  static BpeVocabulary from_json(const nlohmann::json& model);
};

// Open-addressing map from a pair of symbol ids to (merge rank, merged id).
class MergeTable {
 public:
  struct Entry {
    uint64_t key;
    int32_t rank;
    int32_t new_id;
  };
  void reserve(size_t n);
  void insert(int32_t left, int32_t right, int32_t rank, int32_t new_id);
  const Entry* find(int32_t left, int32_t right) const {
    uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  size_t slot(uint64_t key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_); }
  std::vector<Entry> entries_{Entry{kEmpty, 0, 0}};
  size_t mask_ = 0;
  int shift_ = 63;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // `options` is tokenizer.json's "model" object with type BPE (its vocab and merges are taken from
  // `vocabulary`). Throws polylora::Error when malformed.
  BpeModel(const nlohmann::json& options, BpeVocabulary vocabulary);

  // Appends the ids of one pre-token (text in the model's alphabet) to out.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // Same for a pre-token given as raw bytes that stand for their GPT-2 byte-level characters.
  void encode_byte_level_word(std::string_view raw, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when id is not in the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  size_t num_merges() const { return merges_.size(); }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  void merge_symbols(std::vector<int32_t>& symbols) const;
  void push_unknown_char(std::string_view ch, std::vector<int32_t>& symbols, bool& last_was_unk) const;

  FlatTokenMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> id_present_;
  MergeTable merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  // Byte-level fast path: raw byte -> id of its alphabet character (-1 when absent), and the vocabulary
  // keyed by raw bytes (for ignore_merges).
  std::array<int32_t, 256> byte_ids_{};
  bool all_bytes_present_ = false;
  FlatTokenMap raw_vocab_;
};

}  // namespace polylora::tokenizer
