// structured/compiled_grammar.cc: the pushdown automaton (stacks of rule positions, interned; tail calls
// reuse the caller's frame so repetition keeps stacks flat), its lazy DFA over bytes, and token masks by
// a pruned walk of the token trie, cached per state.
#include "structured/compiled_grammar.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace polylora::structured {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h;
}

}  // namespace

CompiledGrammar::CompiledGrammar(Rules rules, std::shared_ptr<const Vocabulary> vocab)
    : rules_(std::move(rules)), vocab_(std::move(vocab)) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> tops, visited;
  bool accept = false;
  const Rule& root = rules_.rules[static_cast<size_t>(rules_.root)];
  for (size_t a = 0; a < root.alts.size(); ++a)
    close(rules_.root, static_cast<int32_t>(a), 0, -1, tops, accept, visited);
  start_ = intern_state(std::move(tops), accept);
  if (start_ == kDead) fail("grammar: it matches nothing");
}

int32_t CompiledGrammar::intern_node(int32_t rule, int32_t alt, int32_t pos, int32_t parent) const {
  uint64_t h = mix(
      mix(mix(mix(0, static_cast<uint64_t>(rule)), static_cast<uint64_t>(alt)), static_cast<uint64_t>(pos)),
      static_cast<uint64_t>(parent + 1));
  std::vector<int32_t>& bucket = node_index_[h];
  for (int32_t id : bucket) {
    const Node& n = nodes_[static_cast<size_t>(id)];
    if (n.rule == rule && n.alt == alt && n.pos == pos && n.parent == parent) return id;
  }
  auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back({rule, alt, pos, parent});
  bucket.push_back(id);
  return id;
}

// Expands the position (rule, alt, pos) with continuation `parent` (a node positioned at the rule
// reference that will resume, or -1 for the end of the whole match) into stack tops at byte sets.
void CompiledGrammar::close(int32_t rule, int32_t alt, int32_t pos, int32_t parent,
                            std::vector<int32_t>& tops, bool& accept, std::vector<int32_t>& visited) const {
  while (true) {
    const Sequence& seq = rules_.rules[static_cast<size_t>(rule)].alts[static_cast<size_t>(alt)];
    if (static_cast<size_t>(pos) == seq.size()) {
      if (parent < 0) {
        accept = true;
        return;
      }
      const Node p = nodes_[static_cast<size_t>(parent)];
      rule = p.rule;
      alt = p.alt;
      pos = p.pos + 1;
      parent = p.parent;
      continue;
    }
    int32_t id = intern_node(rule, alt, pos, parent);
    if (std::find(visited.begin(), visited.end(), id) != visited.end()) return;
    visited.push_back(id);
    const Element& e = seq[static_cast<size_t>(pos)];
    if (e.kind == Element::kBytes) {
      tops.push_back(id);
      return;
    }
    // A reference in tail position resumes where this rule would: the caller's frame is reused.
    int32_t cont = static_cast<size_t>(pos) + 1 == seq.size() ? parent : id;
    const Rule& callee = rules_.rules[static_cast<size_t>(e.value)];
    for (size_t a = 0; a < callee.alts.size(); ++a)
      close(e.value, static_cast<int32_t>(a), 0, cont, tops, accept, visited);
    return;
  }
}

int32_t CompiledGrammar::intern_state(std::vector<int32_t> tops, bool accept) const {
  std::sort(tops.begin(), tops.end());
  tops.erase(std::unique(tops.begin(), tops.end()), tops.end());
  if (tops.empty() && !accept) return kDead;
  uint64_t h = accept ? 1 : 2;
  for (int32_t t : tops) h = mix(h, static_cast<uint64_t>(t));
  std::vector<int32_t>& bucket = state_index_[h];
  for (int32_t id : bucket) {
    const State& s = states_[static_cast<size_t>(id)];
    if (s.accept == accept && s.nodes == tops) return id;
  }
  auto id = static_cast<int32_t>(states_.size());
  State s;
  s.nodes = std::move(tops);
  s.accept = accept;
  states_.push_back(std::move(s));
  bucket.push_back(id);
  return id;
}

int32_t CompiledGrammar::step_locked(int32_t state, uint8_t byte) const {
  if (state < 0) return kDead;
  {
    State& st = states_[static_cast<size_t>(state)];
    if (st.next) {
      int32_t n = (*st.next)[byte];
      if (n != -2) return n;
    } else {
      st.next = std::make_unique<std::array<int32_t, 256>>();
      st.next->fill(-2);
    }
  }
  std::vector<int32_t> tops, visited;
  bool accept = false;
  const std::vector<int32_t> from = states_[static_cast<size_t>(state)].nodes;  // copy: states_ may grow
  for (int32_t id : from) {
    const Node n = nodes_[static_cast<size_t>(id)];
    const Element& e = rules_.rules[static_cast<size_t>(n.rule)]
                           .alts[static_cast<size_t>(n.alt)][static_cast<size_t>(n.pos)];
    if (!rules_.byte_sets[static_cast<size_t>(e.value)].test(byte)) continue;
    close(n.rule, n.alt, n.pos + 1, n.parent, tops, accept, visited);
  }
  int32_t next = intern_state(std::move(tops), accept);
  (*states_[static_cast<size_t>(state)].next)[byte] = next;
  return next;
}

int32_t CompiledGrammar::next(int32_t state, uint8_t byte) const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_locked(state, byte);
}

int32_t CompiledGrammar::next(int32_t state, std::string_view bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (char c : bytes) {
    state = step_locked(state, static_cast<uint8_t>(c));
    if (state == kDead) break;
  }
  return state;
}

bool CompiledGrammar::accepting(int32_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state >= 0 && states_[static_cast<size_t>(state)].accept;
}

bool CompiledGrammar::has_bytes(int32_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  return state >= 0 && !states_[static_cast<size_t>(state)].nodes.empty();
}

size_t CompiledGrammar::num_states() const {
  std::lock_guard<std::mutex> lock(mu_);
  return states_.size();
}

size_t CompiledGrammar::num_cached_masks() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const State& s : states_) n += s.mask_ready;
  return n;
}

// Walks the trie in preorder; walk_states_[d] is the DFA state after the first d bytes of the current
// node's path. A dead prefix skips its whole subtree.
void CompiledGrammar::compute_mask_locked(int32_t state) const {
  const Vocabulary::Trie& trie = vocab_->trie();
  std::vector<int32_t> allowed;
  walk_states_.assign(trie.max_depth + 1, kDead);
  walk_states_[0] = state;
  const auto num_nodes = static_cast<int32_t>(trie.byte.size());
  for (int32_t k = 0; k < num_nodes;) {
    const size_t d = trie.depth[static_cast<size_t>(k)];
    int32_t s = step_locked(walk_states_[d - 1], trie.byte[static_cast<size_t>(k)]);
    if (s == kDead) {
      k = trie.subtree_end[static_cast<size_t>(k)];
      continue;
    }
    walk_states_[d] = s;
    for (int32_t i = trie.token_begin[static_cast<size_t>(k)];
         i < trie.token_begin[static_cast<size_t>(k) + 1]; ++i)
      allowed.push_back(trie.token_ids[static_cast<size_t>(i)]);
    ++k;
  }
  State& st = states_[static_cast<size_t>(state)];  // states_ may have grown during the walk
  const size_t num_normal = trie.token_ids.size();
  const size_t words = mask_words(vocab_->size());
  const size_t num_rejected = num_normal - allowed.size();
  st.ids.clear();
  st.bits.clear();
  if (allowed.size() <= words || allowed.size() <= num_rejected) {
    st.form = State::MaskForm::kAllowed;
    std::sort(allowed.begin(), allowed.end());
    st.ids = std::move(allowed);
  } else {
    std::vector<uint32_t> bits(words, 0);
    for (int32_t id : allowed) bits[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    if (num_rejected <= words) {
      st.form = State::MaskForm::kRejected;
      for (int32_t id : trie.token_ids)
        if (!(bits[static_cast<size_t>(id) >> 5] >> (id & 31) & 1u)) st.ids.push_back(id);
    } else {
      st.form = State::MaskForm::kBits;
      st.bits = std::move(bits);
    }
  }
  st.mask_ready = true;
}

void CompiledGrammar::fill_mask(int32_t state, std::span<uint32_t> mask) const {
  const size_t words = mask_words(vocab_->size());
  CHECK_MSG(mask.size() >= words, "token mask of {} words for a vocabulary of {}", mask.size(),
            vocab_->size());
  std::lock_guard<std::mutex> lock(mu_);
  std::memset(mask.data(), 0, words * sizeof(uint32_t));
  if (state < 0) return;
  if (!states_[static_cast<size_t>(state)].mask_ready) compute_mask_locked(state);
  const State& st = states_[static_cast<size_t>(state)];
  auto set = [&](int32_t id) { mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31); };
  switch (st.form) {
    case State::MaskForm::kAllowed:
      for (int32_t id : st.ids) set(id);
      break;
    case State::MaskForm::kRejected:
      std::memcpy(mask.data(), vocab_->trie().normal_mask.data(), words * sizeof(uint32_t));
      for (int32_t id : st.ids) mask[static_cast<size_t>(id) >> 5] &= ~(1u << (id & 31));
      break;
    case State::MaskForm::kBits:
      std::memcpy(mask.data(), st.bits.data(), words * sizeof(uint32_t));
      break;
  }
  if (st.accept)
    for (int32_t id : vocab_->stop_ids()) set(id);
}

}  // namespace polylora::structured
