// bench/structured_bench.cc: `polylora_bench structured`: token-mask time of the structured-output engine
// (structured/grammar.h) per generated token, on a real tokenizer (default o200k) and a JSON Schema of 20
// properties. Generates --sequences outputs token by token (a random allowed token each step, closing
// tokens favoured so outputs end) and times GrammarMatcher::fill_mask + accept_token per step; prints p50,
// p99 and max, separately for the first sequence (cold: states met for the first time walk the token trie)
// and the rest (warm: cached masks), plus the vocabulary and compile times.
// Must not: hold grammar logic (it drives the public API only).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench_command.h"
#include "engine/grammar_vocab.h"
#include "structured/compiled_grammar.h"
#include "structured/grammar.h"
#include "tokenizer/tokenizer.h"

namespace polylora::bench {
namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::string schema_20() {
  const char* types[] = {
      R"({"type": "string", "maxLength": 24})",
      R"({"type": "integer", "minimum": 0, "maximum": 100000})",
      R"({"type": "number"})",
      R"({"type": "boolean"})",
      R"({"enum": ["red", "green", "blue", "other"]})",
      R"({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "maxItems": 4})",
      R"({"type": "string", "format": "date-time"})",
      R"({"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]})"};
  std::string s = R"({"type": "object", "properties": {)";
  std::string req;
  for (int i = 0; i < 20; ++i) {
    s += (i ? ", " : "") + std::string("\"field_") + std::to_string(i) + "\": " + types[i % 8];
    if (i % 4 != 3) req += (req.empty() ? "" : ", ") + std::string("\"field_") + std::to_string(i) + "\"";
  }
  return s + "}, \"required\": [" + req + "], \"additionalProperties\": false}";
}

void report(const char* label, std::vector<double> v) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) {
    return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
  };
  std::printf("%-6s tokens %6zu  mask+accept per token: p50 %8.1f us  p99 %9.1f us  max %9.1f us\n", label,
              v.size(), pct(0.5), pct(0.99), v.back());
}

int run(int argc, char** argv) {
  CLI::App app("structured-output mask time per token");
  std::string dir = std::string(POLYLORA_SOURCE_DIR) + "/tests/data/tokenizers/o200k";
  int sequences = 20;
  uint64_t seed = 1;
  app.add_option("--tokenizer", dir, "tokenizer directory");
  app.add_option("--sequences", sequences, "outputs to generate (the first is the cold one)");
  app.add_option("--seed", seed, "random choices");
  CLI11_PARSE(app, argc, argv);

  auto tok = tokenizer::Tokenizer::load(dir);
  auto t0 = Clock::now();
  std::vector<int32_t> stops;
  if (tok.eos_id()) stops.push_back(*tok.eos_id());
  auto vocab = grammar_vocab(tok, tok.vocab_size(), stops);
  if (vocab->stop_ids().empty()) {  // o200k ships no EOS: use its <|endoftext|>
    if (auto id = tok.token_to_id("<|endoftext|>")) vocab = grammar_vocab(tok, tok.vocab_size(), {*id});
  }
  const double vocab_us = us_since(t0);
  structured::GrammarCompiler compiler(vocab);
  const std::string schema = schema_20();
  t0 = Clock::now();
  auto grammar = compiler.compile({structured::SpecKind::kJsonSchema, schema, {}});
  const double compile_us = us_since(t0);
  std::printf("vocabulary %lld tokens (trie built in %.1f ms), 20-property schema compiled in %.2f ms\n",
              static_cast<long long>(vocab->size()), vocab_us / 1000, compile_us / 1000);

  std::mt19937_64 rng(seed);
  std::vector<uint32_t> mask(structured::mask_words(vocab->size()));
  std::vector<double> cold, warm;
  size_t total_bytes = 0;
  for (int s = 0; s < sequences; ++s) {
    structured::GrammarMatcher m(grammar);
    for (int step = 0; step < 4000 && !m.is_terminated(); ++step) {
      auto t = Clock::now();
      m.fill_mask(mask);
      const double fill = us_since(t);
      // A stand-in for the model: a random allowed token, tokens opening with a closing byte favoured.
      std::vector<int32_t> allowed, closing;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        if (!(mask[static_cast<size_t>(id) >> 5] >> (id & 31) & 1u)) continue;
        allowed.push_back(id);
        const std::string& b = vocab->token_bytes(id);
        if (vocab->is_stop(id) || (!b.empty() && (b[0] == '"' || b[0] == ',' || b[0] == '}' || b[0] == ']')))
          closing.push_back(id);
      }
      if (allowed.empty()) {
        std::printf("error: the mask allows nothing\n");
        return 1;
      }
      const auto& pool = !closing.empty() && rng() % 2 ? closing : allowed;
      const int32_t id = pool[rng() % pool.size()];
      t = Clock::now();
      if (!m.accept_token(id)) {
        std::printf("error: an allowed token was refused\n");
        return 1;
      }
      (s == 0 ? cold : warm).push_back(fill + us_since(t));
      if (!vocab->is_stop(id)) total_bytes += vocab->token_bytes(id).size();
    }
  }
  report("cold", cold);
  report("warm", warm);
  std::vector<double> all = cold;
  all.insert(all.end(), warm.begin(), warm.end());
  report("all", all);
  std::printf("%d sequences, %zu bytes of JSON in all, %zu DFA states, %zu cached masks\n", sequences,
              total_bytes, grammar->num_states(), grammar->num_cached_masks());
  return 0;
}

BenchRegistrar reg("structured",
                   "structured-output token-mask time per token (o200k, 20-property JSON Schema)", run);

}  // namespace
}  // namespace polylora::bench
