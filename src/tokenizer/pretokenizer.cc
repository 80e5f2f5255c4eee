// tokenizer/pretokenizer.cc: HF's pre-tokenizers with HF's split behaviours (Removed, Isolated,
// MergedWithPrevious, MergedWithNext, Contiguous; invert).
// Must not: know about vocabularies or merges.
#include "tokenizer/pretokenizer.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "common/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {

void PreTokens::materialize_byte_level() {
  if (!byte_level) return;
  const auto& chars = byte_level_chars();
  for (auto& p : pieces) {
    std::string mapped;
    mapped.reserve(p.size() * 2);
    for (unsigned char c : p) mapped += chars[c];
    p = keep(std::move(mapped));
  }
  byte_level = false;
}

namespace {

using Json = nlohmann::json;

// GPT-2's pre-tokenization pattern (ByteLevel with use_regex).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

SplitBehavior parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  fail("tokenizer.json: unknown split behavior '{}'", name);
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Splits `piece` at `matches` (sorted, non-overlapping) the way HF's NormalizedString::split does and
// appends the non-empty parts to `out`.
void split_piece(std::string_view piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<std::string_view>& out) {
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) spans.push_back({prev, b, invert});
    spans.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != piece.size()) spans.push_back({prev, piece.size(), invert});

  std::vector<std::pair<size_t, size_t>> parts;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const auto& s : spans) parts.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.is_match) parts.emplace_back(s.begin, s.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !parts.empty()) {
          parts.back().first = it->begin;
        } else {
          parts.emplace_back(it->begin, it->end);
        }
        previous_match = it->is_match;
      }
      std::reverse(parts.begin(), parts.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !parts.empty()) {
          parts.back().second = s.end;
        } else {
          parts.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    }
  }
  for (auto [b, e] : parts) {
    if (e > b) out.push_back(piece.substr(b, e - b));
  }
}

class RegexSplit final : public PreTokenizer {
 public:
  RegexSplit(Regex pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(PreTokens& tokens, bool) const override {
    tokens.materialize_byte_level();
    apply(tokens);
  }
  // Splits without mapping bytes (used by ByteLevel, whose regex runs on the raw text).
  void apply(PreTokens& tokens) const {
    std::vector<std::string_view> out;
    out.reserve(tokens.pieces.size() * 4);
    for (auto piece : tokens.pieces) split_piece(piece, pattern_.find_all(piece), behavior_, invert_, out);
    tokens.pieces = std::move(out);
  }

 private:
  Regex pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex) : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      split_ = std::make_unique<RegexSplit>(Regex(kGpt2Pattern), SplitBehavior::kIsolated, false);
  }
  void pre_tokenize(PreTokens& tokens, bool) const override {
    tokens.materialize_byte_level();
    if (add_prefix_space_) {
      for (auto& p : tokens.pieces) {
        if (p.empty() || p[0] != ' ') p = tokens.keep(" " + std::string(p));
      }
    }
    if (split_) split_->apply(tokens);
    tokens.byte_level = true;
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<RegexSplit> split_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(PreTokens& tokens, bool first_segment) const override {
    tokens.materialize_byte_level();
    std::vector<std::string_view> out;
    for (size_t i = 0; i < tokens.pieces.size(); ++i) {
      std::string_view piece = tokens.pieces[i];
      std::string s;
      s.reserve(piece.size() + replacement_.size());
      for (char c : piece) {
        if (c == ' ') {
          s += replacement_;
        } else {
          s += c;
        }
      }
      bool prepend =
          scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && first_segment && i == 0);
      if (prepend && !s.starts_with(replacement_)) s.insert(0, replacement_);
      std::string_view kept = tokens.keep(std::move(s));
      if (!split_) {
        out.push_back(kept);
        continue;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t pos = kept.find(replacement_); pos != std::string_view::npos;
           pos = kept.find(replacement_, pos + replacement_.size())) {
        matches.emplace_back(pos, pos + replacement_.size());
      }
      split_piece(kept, matches, SplitBehavior::kMergedWithNext, false, out);
    }
    tokens.pieces = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void pre_tokenize(PreTokens& tokens, bool first_segment) const override {
    for (const auto& s : steps_) s->pre_tokenize(tokens, first_segment);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

PrependScheme parse_prepend_scheme(const Json& config) {
  if (config.contains("prepend_scheme")) {
    std::string s = config["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    fail("tokenizer.json: unknown Metaspace prepend_scheme '{}'", s);
  }
  return config.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& config) {
  if (config.is_null()) return nullptr;
  std::string type = config.value("type", "");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& c : config.at("pretokenizers")) {
      if (auto p = make_pre_tokenizer(c)) steps.push_back(std::move(p));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    return std::make_unique<RegexSplit>(make_pattern(config.at("pattern")),
                                        parse_behavior(config.at("behavior").get<std::string>()),
                                        config.value("invert", false));
  }
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevelPreTokenizer>(config.value("add_prefix_space", true),
                                                   config.value("use_regex", true));
  }
  if (type == "Metaspace") {
    return std::make_unique<MetaspacePreTokenizer>(config.value("replacement", std::string("\u2581")),
                                                   parse_prepend_scheme(config), config.value("split", true));
  }
  if (type == "Whitespace") {
    return std::make_unique<RegexSplit>(Regex(R"(\w+|[^\w\s]+)"), SplitBehavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<RegexSplit>(Regex(R"(\s+)"), SplitBehavior::kRemoved, false);
  }
  if (type == "Digits") {
    bool individual = config.value("individual_digits", false);
    return std::make_unique<RegexSplit>(Regex(individual ? R"(\p{N})" : R"(\p{N}+)"),
                                        SplitBehavior::kIsolated, false);
  }
  if (type == "Punctuation") {
    return std::make_unique<RegexSplit>(Regex(R"([\p{P}!-/:-@\[-`{-~])"),
                                        parse_behavior(config.value("behavior", std::string("Isolated"))),
                                        false);
  }
  fail(
      "tokenizer.json: pre_tokenizer type '{}' is not supported (supported: Sequence, Split, ByteLevel, "
      "Metaspace, Whitespace, WhitespaceSplit, Digits, Punctuation)",
      type);
}

}  // namespace polylora::tokenizer
