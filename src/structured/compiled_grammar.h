// structured/compiled_grammar.h: a compiled grammar (internal to structured/): the byte-level rules run
// as a pushdown automaton whose sets of stacks are interned as states of a lazily built DFA over bytes;
// each state caches its byte transitions and, once computed, its token mask (a walk of the vocabulary's
// token trie that prunes every subtree whose prefix is dead). The cache makes masks of repeated states
// (inside a string, between properties) a copy. Thread-safe: one mutex guards the caches.
// Must not: know about requests or samplers.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"
#include "structured/rules.h"

namespace polylora::structured {

// Token trie in preorder: node k's subtree is [k, subtree_end[k]); tokens ending at k are
// token_ids[token_begin[k] .. token_begin[k + 1]).
struct Vocabulary::Trie {
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;  // 1 for children of the root
  std::vector<int32_t> subtree_end;
  std::vector<int32_t> token_begin;  // size num_nodes + 1
  std::vector<int32_t> token_ids;
  size_t max_depth = 0;
  std::vector<uint32_t> normal_mask;  // bitmask of every id in the trie (mask_words(vocab size) words)
};

class CompiledGrammar {
 public:
  static constexpr int32_t kDead = -1;
  CompiledGrammar(Rules rules, std::shared_ptr<const Vocabulary> vocab);

  int32_t start_state() const { return start_; }
  // The state after one byte (kDead when the byte cannot come next).
  int32_t next(int32_t state, uint8_t byte) const;
  int32_t next(int32_t state, std::string_view bytes) const;
  bool accepting(int32_t state) const;  // the text so far is complete
  bool has_bytes(int32_t state) const;  // some byte may follow
  void fill_mask(int32_t state, std::span<uint32_t> mask) const;
  const Vocabulary& vocab() const { return *vocab_; }
  const Rules& rules() const { return rules_; }
  // Statistics for tests and the benchmark.
  size_t num_states() const;
  size_t num_cached_masks() const;

 private:
  struct Node {
    int32_t rule, alt, pos, parent;
  };
  struct State {
    std::vector<int32_t> nodes;  // stack tops at a byte-set element, sorted
    bool accept = false;
    std::unique_ptr<std::array<int32_t, 256>> next;  // -2: not computed yet
    bool mask_ready = false;
    // The mask without stop tokens: a list of allowed ids, a list of rejected ids (of the trie's), or the
    // whole bitmask, whichever is small.
    enum class MaskForm : uint8_t { kAllowed, kRejected, kBits } form = MaskForm::kAllowed;
    std::vector<int32_t> ids;
    std::vector<uint32_t> bits;
  };
  int32_t intern_node(int32_t rule, int32_t alt, int32_t pos, int32_t parent) const;
  void close(int32_t rule, int32_t alt, int32_t pos, int32_t parent, std::vector<int32_t>& tops, bool& accept,
             std::vector<int32_t>& visited) const;
  int32_t intern_state(std::vector<int32_t> tops, bool accept) const;
  int32_t step_locked(int32_t state, uint8_t byte) const;
  void compute_mask_locked(int32_t state) const;

  Rules rules_;
  std::shared_ptr<const Vocabulary> vocab_;
  int32_t start_ = kDead;
  mutable std::mutex mu_;
  mutable std::vector<Node> nodes_;
  mutable std::unordered_map<uint64_t, std::vector<int32_t>> node_index_;  // hash -> node ids
  mutable std::vector<State> states_;
  mutable std::unordered_map<uint64_t, std::vector<int32_t>> state_index_;
  mutable std::vector<int32_t> walk_states_;  // scratch for the trie walk
};

}  // namespace polylora::structured
