// tokenizer/bpe_model.cc: BPE vocabulary/merges loading and the merge loop, matching HF tokenizers'
// BPE::merge_word (lowest rank first, leftmost on ties).
// Must not: split text into pre-tokens or handle added tokens.
#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <queue>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {

size_t StringHash::operator()(std::string_view s) const noexcept {
  // FNV-1a over 8-byte words, finished with a multiply-shift mix: fast for short tokens.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < s.size(); ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 0x100000001b3ull;
  h ^= h >> 32;
  h *= 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

void MergeTable::reserve(size_t n) {
  size_t cap = 16;
  int bits = 4;
  while (cap < n * 2) {
    cap <<= 1;
    ++bits;
  }
  entries_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  shift_ = 64 - bits;
  size_ = 0;
}

void MergeTable::insert(int32_t left, int32_t right, int32_t rank, int32_t new_id) {
  if ((size_ + 1) * 2 > entries_.size()) {
    std::vector<Entry> old = std::move(entries_);
    reserve(std::max<size_t>(16, (size_ + 1) * 2));
    for (const auto& e : old) {
      if (e.key != kEmpty)
        insert(static_cast<int32_t>(e.key >> 32), static_cast<int32_t>(e.key), e.rank, e.new_id);
    }
  }
  uint64_t key = pack(left, right);
  for (size_t i = slot(key);; i = (i + 1) & mask_) {
    Entry& e = entries_[i];
    if (e.key == key) return;  // the first (lowest-rank) merge of a pair wins, as in HF
    if (e.key == kEmpty) {
      e = Entry{key, rank, new_id};
      ++size_;
      return;
    }
  }
}

void FlatTokenMap::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{0, 0});
  size_t mask = cap - 1;
  for (const auto& s : old) {
    if (!s.index) continue;
    size_t i = s.hash & mask;
    while (slots_[i].index) i = (i + 1) & mask;
    slots_[i] = s;
  }
  keys_.reserve(n);
  values_.reserve(n);
}

bool FlatTokenMap::insert(std::string_view key, int32_t value) {
  if ((values_.size() + 1) * 2 > slots_.size()) reserve(std::max<size_t>(16, (values_.size() + 1) * 2));
  uint32_t hash = static_cast<uint32_t>(StringHash{}(key));
  size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  for (; slots_[i].index; i = (i + 1) & mask) {
    if (slots_[i].hash == hash && key_at(slots_[i].index - 1) == key) return false;
  }
  keys_.emplace_back(static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()));
  arena_.append(key);
  values_.push_back(value);
  slots_[i] = Slot{hash, static_cast<uint32_t>(values_.size())};
  return true;
}

const int32_t* FlatTokenMap::find(std::string_view key) const {
  if (slots_.empty()) return nullptr;
  uint32_t hash = static_cast<uint32_t>(StringHash{}(key));
  size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask; slots_[i].index; i = (i + 1) & mask) {
    if (slots_[i].hash == hash && key_at(slots_[i].index - 1) == key) return &values_[slots_[i].index - 1];
  }
  return nullptr;
}

BpeVocabulary BpeVocabulary::from_json(const nlohmann::json& model) {
  BpeVocabulary v;
  const auto& vocab = model.at("vocab");
  if (!vocab.is_object()) fail("tokenizer.json: model.vocab must be an object of token -> id");
  v.tokens.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer())
      fail("tokenizer.json: the id of token '{}' is not an integer", it.key());
    v.tokens.emplace_back(it.key(), it.value().get<int32_t>());
  }
  const auto& merges = model.at("merges");
  if (!merges.is_array()) fail("tokenizer.json: model.merges must be an array");
  v.merges.reserve(merges.size());
  for (const auto& m : merges) {
    if (m.is_string()) {
      const auto& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        fail("tokenizer.json: merge '{}' is not of the form 'left right'", s);
      }
      v.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      v.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail("tokenizer.json: merge #{} must be \"left right\" or [\"left\", \"right\"], got {}",
           v.merges.size(), m.dump());
    }
  }
  return v;
}

namespace {
std::string optional_string(const nlohmann::json& model, const char* key) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return {};
  return it->get<std::string>();
}
}  // namespace

BpeModel::BpeModel(const nlohmann::json& model, BpeVocabulary vocabulary) {
  vocab_.reserve(vocabulary.tokens.size());
  int32_t max_id = -1;
  for (const auto& [token, id] : vocabulary.tokens) {
    if (id < 0) fail("tokenizer.json: token '{}' has a negative id {}", token, id);
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  id_present_.assign(id_to_token_.size(), 0);
  for (auto& [token, id] : vocabulary.tokens) {
    if (!vocab_.insert(token, id)) continue;
    id_to_token_[static_cast<size_t>(id)] = std::move(token);
    id_present_[static_cast<size_t>(id)] = 1;
  }

  continuing_subword_prefix_ = optional_string(model, "continuing_subword_prefix");
  end_of_word_suffix_ = optional_string(model, "end_of_word_suffix");
  byte_fallback_ = model.value("byte_fallback", false);
  fuse_unk_ = model.value("fuse_unk", false);
  ignore_merges_ = model.value("ignore_merges", false);
  if (auto it = model.find("dropout"); it != model.end() && !it->is_null() && it->get<double>() > 0.0) {
    fail("tokenizer.json: BPE dropout is not supported for inference (dropout = {})", it->get<double>());
  }
  std::string unk = optional_string(model, "unk_token");
  if (!unk.empty()) {
    const int32_t* id = vocab_.find(unk);
    if (!id) fail("tokenizer.json: unk_token '{}' is not in the vocabulary", unk);
    unk_id_ = *id;
  }

  merges_.reserve(vocabulary.merges.size());
  size_t prefix_len = continuing_subword_prefix_.size();
  std::string merged;
  int32_t rank = 0;
  for (const auto& [left, right] : vocabulary.merges) {
    const int32_t* l = vocab_.find(left);
    const int32_t* r = vocab_.find(right);
    if (!l || !r) {
      fail("tokenizer.json: merge #{} ('{}' '{}') uses a token that is not in the vocabulary", rank, left,
           right);
    }
    merged.assign(left);
    merged.append(std::string_view(right).substr(std::min(prefix_len, right.size())));
    const int32_t* n = vocab_.find(merged);
    if (!n) fail("tokenizer.json: merge #{} result '{}' is not in the vocabulary", rank, merged);
    merges_.insert(*l, *r, rank, *n);
    ++rank;
  }

  // Byte-level fast path tables.
  const auto& chars = byte_level_chars();
  all_bytes_present_ = continuing_subword_prefix_.empty() && end_of_word_suffix_.empty();
  for (int b = 0; b < 256; ++b) {
    const int32_t* id = vocab_.find(chars[b]);
    byte_ids_[b] = id ? *id : -1;
    if (byte_ids_[b] < 0) all_bytes_present_ = false;
  }
  if (all_bytes_present_ && ignore_merges_) {
    raw_vocab_.reserve(vocab_.size());
    for (int32_t id = 0; id < vocab_size(); ++id) {
      if (!id_present_[static_cast<size_t>(id)]) continue;
      const std::string& token = id_to_token_[static_cast<size_t>(id)];
      std::string raw;
      bool ok = true;
      for (size_t i = 0; i < token.size() && ok;) {
        int b = byte_level_byte(utf8_next(token, i));
        ok = b >= 0;
        raw.push_back(static_cast<char>(b));
      }
      if (ok) raw_vocab_.insert(raw, id);
    }
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  const int32_t* id = vocab_.find(token);
  if (!id) return std::nullopt;
  return *id;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !id_present_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::push_unknown_char(std::string_view ch, std::vector<int32_t>& symbols,
                                 bool& last_was_unk) const {
  if (byte_fallback_) {
    std::vector<int32_t> bytes;
    for (unsigned char b : ch) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      const int32_t* id = vocab_.find(std::string_view(name, 6));
      if (!id) break;
      bytes.push_back(*id);
    }
    if (bytes.size() == ch.size()) {
      symbols.insert(symbols.end(), bytes.begin(), bytes.end());
      last_was_unk = false;
      return;
    }
  }
  if (!unk_id_) return;  // HF drops characters it cannot represent when there is no unk token
  if (fuse_unk_ && last_was_unk) return;
  symbols.push_back(*unk_id_);
  last_was_unk = true;
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int32_t* id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool last_was_unk = false;
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    size_t len = utf8_char_len(word, i);
    if (len == 0) len = 1;
    std::string_view ch = word.substr(i, len);
    bool first = i == 0, last = i + len == word.size();
    i += len;
    std::string_view key = ch;
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      piece.clear();
      if (!first) piece += continuing_subword_prefix_;
      piece += ch;
      if (last) piece += end_of_word_suffix_;
      key = piece;
    }
    if (const int32_t* id = vocab_.find(key)) {
      symbols.push_back(*id);
      last_was_unk = false;
    } else {
      push_unknown_char(ch, symbols, last_was_unk);
    }
  }
  merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeModel::encode_byte_level_word(std::string_view raw, std::vector<int32_t>& out) const {
  if (raw.empty()) return;
  if (!all_bytes_present_) {
    const auto& chars = byte_level_chars();
    std::string mapped;
    for (unsigned char c : raw) mapped += chars[c];
    encode_word(mapped, out);
    return;
  }
  if (ignore_merges_) {
    if (const int32_t* id = raw_vocab_.find(raw)) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) symbols[i] = byte_ids_[static_cast<unsigned char>(raw[i])];
  merge_symbols(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeModel::merge_symbols(std::vector<int32_t>& symbols) const {
  size_t n = symbols.size();
  if (n < 2) return;
  constexpr size_t kScanLimit = 48;
  if (n <= kScanLimit) {
    // Small words: repeatedly merge the lowest-rank (then leftmost) adjacent pair.
    std::array<int32_t, kScanLimit> ranks, new_ids;
    auto rank_at = [&](size_t i) {
      const auto* e = merges_.find(symbols[i], symbols[i + 1]);
      ranks[i] = e ? e->rank : INT32_MAX;
      new_ids[i] = e ? e->new_id : -1;
    };
    for (size_t i = 0; i + 1 < n; ++i) rank_at(i);
    while (n > 1) {
      size_t best = 0;
      for (size_t i = 1; i + 1 < n; ++i) {
        if (ranks[i] < ranks[best]) best = i;
      }
      if (ranks[best] == INT32_MAX) break;
      symbols[best] = new_ids[best];
      for (size_t i = best + 1; i + 1 < n; ++i) symbols[i] = symbols[i + 1];
      for (size_t i = best + 1; i + 2 < n; ++i) {
        ranks[i] = ranks[i + 1];
        new_ids[i] = new_ids[i + 1];
      }
      --n;
      if (best > 0) rank_at(best - 1);
      if (best + 1 < n) rank_at(best);
    }
    symbols.resize(n);
    return;
  }
  // Long words: linked list of symbols plus a min-heap of candidate merges (HF's Word::merge_all).
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    if (const auto* e = merges_.find(symbols[pos], symbols[next[pos]])) heap.push({e->rank, pos, e->new_id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || next[c.pos] < 0) continue;
    int32_t right = next[c.pos];
    const auto* e = merges_.find(symbols[c.pos], symbols[right]);
    if (!e || e->new_id != c.new_id) continue;
    symbols[c.pos] = c.new_id;
    alive[right] = 0;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[k++] = symbols[i];
  symbols.resize(k);
}

}  // namespace polylora::tokenizer
