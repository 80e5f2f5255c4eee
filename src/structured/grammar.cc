// structured/grammar.cc: the vocabulary and its token trie, the compiler with its cache of compiled
// grammars, the per-request matcher, and the spec -> GBNF dispatch.
#include "structured/grammar.h"

#include <algorithm>
#include <list>
#include <map>
#include <mutex>
#include <numeric>

#include "common/error.h"
#include "structured/compiled_grammar.h"
#include "structured/json_schema.h"
#include "structured/rules.h"

namespace polylora::structured {

Vocabulary::~Vocabulary() = default;

std::shared_ptr<const Vocabulary> Vocabulary::create(std::vector<std::string> token_bytes,
                                                     std::vector<int32_t> stop_ids,
                                                     std::vector<int32_t> special_ids) {
  std::shared_ptr<Vocabulary> v(new Vocabulary());
  const size_t n = token_bytes.size();
  v->token_bytes_ = std::move(token_bytes);
  v->kind_.assign(n, 0);
  for (int32_t id : special_ids)
    if (id >= 0 && static_cast<size_t>(id) < n) v->kind_[static_cast<size_t>(id)] = 2;
  for (int32_t id : stop_ids)
    if (id >= 0 && static_cast<size_t>(id) < n) {
      v->kind_[static_cast<size_t>(id)] = 1;
      if (std::find(v->stop_ids_.begin(), v->stop_ids_.end(), id) == v->stop_ids_.end())
        v->stop_ids_.push_back(id);
    }
  // The trie of every normal, non-empty token, in preorder over the sorted byte strings.
  std::vector<int32_t> order;
  for (size_t i = 0; i < n; ++i)
    if (v->kind_[i] == 0 && !v->token_bytes_[i].empty()) order.push_back(static_cast<int32_t>(i));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const std::string& x = v->token_bytes_[static_cast<size_t>(a)];
    const std::string& y = v->token_bytes_[static_cast<size_t>(b)];
    return x != y ? x < y : a < b;
  });
  auto t = std::make_unique<Trie>();
  std::vector<int32_t> path;  // node ids along the current path
  std::vector<std::vector<int32_t>> tokens_at;
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& s = v->token_bytes_[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < s.size() && (*prev)[common] == s[common]) ++common;
    while (path.size() > common) {
      t->subtree_end[static_cast<size_t>(path.back())] = static_cast<int32_t>(t->byte.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(static_cast<int32_t>(t->byte.size()));
      t->byte.push_back(static_cast<uint8_t>(s[d]));
      t->depth.push_back(static_cast<uint16_t>(std::min<size_t>(d + 1, 65535)));
      t->subtree_end.push_back(0);
      tokens_at.emplace_back();
    }
    tokens_at[static_cast<size_t>(path.back())].push_back(id);
    t->max_depth = std::max(t->max_depth, s.size());
    prev = &s;
  }
  while (!path.empty()) {
    t->subtree_end[static_cast<size_t>(path.back())] = static_cast<int32_t>(t->byte.size());
    path.pop_back();
  }
  if (t->max_depth > 65535) fail("a token of {} bytes is too long for the grammar engine", t->max_depth);
  t->token_begin.push_back(0);
  for (const auto& ids : tokens_at) {
    t->token_ids.insert(t->token_ids.end(), ids.begin(), ids.end());
    t->token_begin.push_back(static_cast<int32_t>(t->token_ids.size()));
  }
  t->normal_mask.assign(mask_words(static_cast<int64_t>(n)), 0);
  for (int32_t id : t->token_ids) t->normal_mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  v->trie_ = std::move(t);
  return v;
}

bool Vocabulary::is_stop(int32_t id) const {
  return id >= 0 && id < size() && kind_[static_cast<size_t>(id)] == 1;
}

bool Vocabulary::is_special(int32_t id) const {
  return id >= 0 && id < size() && kind_[static_cast<size_t>(id)] == 2;
}

std::string gbnf_literal(std::string_view text) {
  std::string out = "\"";
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7F) {
      out += fmt::format("\\x{:02X}", c);
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string spec_to_gbnf(const GrammarSpec& spec) {
  switch (spec.kind) {
    case SpecKind::kJsonSchema:
      return json_schema_to_gbnf(spec.text, "root");
    case SpecKind::kJsonObject:
      return json_object_gbnf("root");
    case SpecKind::kRegex:
      return "root ::= " + regex_to_gbnf(spec.text) + "\n";
    case SpecKind::kChoice: {
      if (spec.choices.empty()) fail("choice: the list of choices is empty");
      std::string out = "root ::= ";
      for (size_t i = 0; i < spec.choices.size(); ++i)
        out += (i ? " | " : "") + gbnf_literal(spec.choices[i]);
      return out + "\n";
    }
    case SpecKind::kGrammar:
      return spec.text;
  }
  return {};
}

struct GrammarCompiler::Cache {
  std::mutex mu;
  size_t capacity = 0;
  std::list<std::string> lru;  // most recent first
  std::map<std::string, std::pair<std::shared_ptr<const CompiledGrammar>, std::list<std::string>::iterator>>
      map;
};

GrammarCompiler::GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached_grammars)
    : vocab_(std::move(vocab)), cache_(std::make_unique<Cache>()) {
  CHECK(vocab_ != nullptr);
  cache_->capacity = std::max<size_t>(1, max_cached_grammars);
}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) {
  std::string key = std::to_string(static_cast<int>(spec.kind)) + '\n' + spec.text;
  for (const std::string& c : spec.choices) key += '\0' + std::to_string(c.size()) + ':' + c;
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto it = cache_->map.find(key);
    if (it != cache_->map.end()) {
      cache_->lru.splice(cache_->lru.begin(), cache_->lru, it->second.second);
      return it->second.first;
    }
  }
  auto compiled = std::make_shared<const CompiledGrammar>(parse_gbnf(spec_to_gbnf(spec)), vocab_);
  std::lock_guard<std::mutex> lock(cache_->mu);
  auto it = cache_->map.find(key);
  if (it != cache_->map.end()) return it->second.first;
  cache_->lru.push_front(key);
  cache_->map[key] = {compiled, cache_->lru.begin()};
  while (cache_->map.size() > cache_->capacity) {
    cache_->map.erase(cache_->lru.back());
    cache_->lru.pop_back();
  }
  return compiled;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)) {
  CHECK(grammar_ != nullptr);
  history_.push_back(grammar_->start_state());
}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(const GrammarMatcher&) = default;
GrammarMatcher& GrammarMatcher::operator=(const GrammarMatcher&) = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

bool GrammarMatcher::accept_token(int32_t token_id) {
  if (terminated_) return false;
  const Vocabulary& v = grammar_->vocab();
  if (token_id < 0 || token_id >= v.size()) return false;
  if (v.is_stop(token_id)) {
    if (!grammar_->accepting(history_.back())) return false;
    terminated_ = true;
    history_.push_back(history_.back());
    return true;
  }
  if (v.is_special(token_id)) return false;
  const std::string& bytes = v.token_bytes(token_id);
  if (bytes.empty()) return false;
  int32_t next = grammar_->next(history_.back(), bytes);
  if (next == CompiledGrammar::kDead) return false;
  history_.push_back(next);
  return true;
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  int32_t next = grammar_->next(history_.back(), bytes);
  if (next == CompiledGrammar::kDead) return false;
  history_.push_back(next);
  return true;
}

void GrammarMatcher::fill_mask(std::span<uint32_t> mask) const {
  if (terminated_) {
    const size_t words = mask_words(grammar_->vocab().size());
    CHECK(mask.size() >= words);
    std::fill(mask.begin(), mask.begin() + static_cast<long>(words), 0u);
    for (int32_t id : grammar_->vocab().stop_ids()) mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
    return;
  }
  grammar_->fill_mask(history_.back(), mask);
}

bool GrammarMatcher::can_terminate() const {
  return terminated_ || grammar_->accepting(history_.back());
}

bool GrammarMatcher::is_terminated() const {
  return terminated_;
}

bool GrammarMatcher::must_terminate() const {
  return terminated_ || !grammar_->has_bytes(history_.back());
}

void GrammarMatcher::rollback(int64_t num_tokens) {
  CHECK_MSG(num_tokens >= 0 && num_tokens < static_cast<int64_t>(history_.size()),
            "rollback of {} tokens, {} accepted", num_tokens, history_.size() - 1);
  if (num_tokens > 0) terminated_ = false;  // the stop token, if any, was the last one accepted
  history_.resize(history_.size() - static_cast<size_t>(num_tokens));
}

void GrammarMatcher::reset() {
  history_.resize(1);
  terminated_ = false;
}

bool matches(const CompiledGrammar& grammar, std::string_view text) {
  int32_t s = grammar.next(grammar.start_state(), text);
  return s != CompiledGrammar::kDead && grammar.accepting(s);
}

}  // namespace polylora::structured
