// structured/grammar.h: the constrained-decoding engine's public API: grammar specs (JSON Schema, regex,
// choice, GBNF grammar, any JSON object) compiled once per vocabulary and cached by spec, and a per-request
// matcher that follows the generated tokens and says which tokens may come next.
// Must not: include JSON-library, HTTP, engine or CUDA headers (the server passes schema text as a string).
//
// How to use it (one compiler per tokenizer, shared by every request of a server):
//
//   auto vocab = structured::Vocabulary::create(token_bytes, stop_ids, special_ids);  // once, at start
//   structured::GrammarCompiler compiler(vocab);
//   std::shared_ptr<const CompiledGrammar> g =
//       compiler.compile({SpecKind::kJsonSchema, schema_text});     // throws polylora::Error (400) naming
//                                                                   // the problem; cached by (kind, text)
//   structured::GrammarMatcher m(g);                                // one per generated sequence
//   std::vector<uint32_t> mask(structured::mask_words(vocab->size()));
//   m.fill_mask(mask);                      // bit i of word i/32 set: token i may be sampled next
//   ... sample token t from the allowed ones ...
//   m.accept_token(t);                      // false (state unchanged) when t was not allowed
//   m.is_terminated();                      // a stop token was accepted: the output is complete
//   m.can_terminate();                      // the text so far is a complete match (stop tokens allowed)
//   m.rollback(k);                          // undo the last k accepted tokens (speculative decoding)
//
// Composing grammars (tool calls, Responses' text.format): json_schema_to_gbnf() turns a schema into GBNF
// rules whose start rule has the name you give, so a caller can write, e.g. for hermes tool calls,
//   root ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " args "}\n</tool_call>"
//   <rules of json_schema_to_gbnf(schema, "args")>
// and compile it as SpecKind::kGrammar. gbnf_literal() quotes text as a GBNF string literal.
//
// Semantics: the grammar matches the whole output (regexes and patterns are anchored at both ends). The
// matcher works on UTF-8 bytes, so a token may end inside a multi-byte character. Stop tokens are allowed
// exactly when the text so far is a complete match; once nothing but stopping is possible, only stop
// tokens are allowed. Other special tokens are never allowed. See docs/structured-outputs.md.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace polylora::structured {

// The bytes of every token of a vocabulary (what the token adds to the decoded text; special tokens
// included), and which ids stop generation (EOS and friends) or are special (never allowed by a grammar).
class Vocabulary {
 public:
  static std::shared_ptr<const Vocabulary> create(std::vector<std::string> token_bytes,
                                                  std::vector<int32_t> stop_ids,
                                                  std::vector<int32_t> special_ids);
  int64_t size() const { return static_cast<int64_t>(token_bytes_.size()); }
  const std::string& token_bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool is_stop(int32_t id) const;
  bool is_special(int32_t id) const;

  // Internal: the token trie, built once (structured/token_trie.h).
  struct Trie;
  const Trie& trie() const { return *trie_; }
  ~Vocabulary();

 private:
  Vocabulary() = default;
  std::vector<std::string> token_bytes_;
  std::vector<int32_t> stop_ids_;
  std::vector<uint8_t> kind_;  // per id: 0 normal, 1 stop, 2 special (never allowed)
  std::unique_ptr<Trie> trie_;
};

enum class SpecKind {
  kJsonSchema,  // text: a JSON Schema (the JSON text)
  kJsonObject,  // any JSON object (text unused)
  kRegex,       // text: a regular expression (ECMAScript/Python subset), matched in full
  kChoice,      // choices: exactly one of these strings
  kGrammar,     // text: a GBNF grammar with a `root` rule
};

struct GrammarSpec {
  SpecKind kind = SpecKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
};

// Words of a token bitmask over a vocabulary of `vocab_size` ids.
inline size_t mask_words(int64_t vocab_size) {
  return static_cast<size_t>((vocab_size + 31) / 32);
}

class CompiledGrammar;  // immutable rules plus a thread-safe cache of states, transitions and masks

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached_grammars = 256);
  ~GrammarCompiler();
  // Compiled once per (kind, text, choices), least recently used evicted. Throws polylora::Error
  // (ErrorKind::kInvalid) naming the problem: a schema keyword not supported, a syntax error with its
  // position, an undefined rule, left recursion.
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec);
  const std::shared_ptr<const Vocabulary>& vocab() const { return vocab_; }

 private:
  struct Cache;
  std::shared_ptr<const Vocabulary> vocab_;
  std::unique_ptr<Cache> cache_;
};

// The spec as GBNF text (for composing, logging and tests). Throws like compile().
std::string spec_to_gbnf(const GrammarSpec& spec);
// A JSON Schema as GBNF rules; the rule matching the schema is named `root_name`, helper rules are
// prefixed with it (so several schemas can share one grammar).
std::string json_schema_to_gbnf(std::string_view schema_json, std::string_view root_name = "root");
// A regex as a GBNF expression (no rule definitions needed).
std::string regex_to_gbnf(std::string_view regex);
// `text` as a GBNF string literal, quotes included.
std::string gbnf_literal(std::string_view text);

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&);  // a copy follows the same grammar from the same state
  GrammarMatcher& operator=(const GrammarMatcher&);
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  // Advances by one token; false (and the state unchanged) when the token is not allowed now.
  bool accept_token(int32_t token_id);
  // Advances by raw bytes (tests, forced prefixes); false (state unchanged) when they do not fit.
  bool accept_bytes(std::string_view bytes);
  // Sets bit (id % 32) of mask[id / 32] for every allowed id and clears every other bit; mask has at
  // least mask_words(vocab size) words. After termination only stop tokens are set.
  void fill_mask(std::span<uint32_t> mask) const;
  bool can_terminate() const;  // the text so far is a complete match
  bool is_terminated() const;  // a stop token was accepted
  // True when no byte can follow (the only way on is a stop token).
  bool must_terminate() const;
  // Undoes the last num_tokens accepted tokens (at most as many as were accepted).
  void rollback(int64_t num_tokens);
  void reset();
  int64_t num_accepted_tokens() const { return static_cast<int64_t>(history_.size()) - 1; }
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<int32_t> history_;  // DFA state after each accepted token; [0] the start state
  bool terminated_ = false;
};

// Whole-text check, without tokens: does `text` match the grammar completely?
bool matches(const CompiledGrammar& grammar, std::string_view text);

}  // namespace polylora::structured
