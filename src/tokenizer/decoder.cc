// tokenizer/decoder.cc: HF tokenizers' decoders, step for step (including their quirks, such as
// ByteFallback's one U+FFFD per byte of an invalid run).
// Must not: look up ids or keep streaming state.
#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {

int parse_byte_token(std::string_view token) {
  if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    int d = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

namespace {

using Json = nlohmann::json;

void fuse(std::vector<std::string>& tokens, DecodeWindow& window) {
  std::string joined;
  for (const auto& t : tokens) joined += t;
  tokens.assign(1, std::move(joined));
  window.first_is_partial = !window.at_start;
}

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow& window) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      size_t start = bytes.size();
      bool ok = true;
      for (size_t i = 0; i < t.size() && ok;) {
        int b = byte_level_byte(utf8_next(t, i));
        ok = b >= 0;
        bytes.push_back(static_cast<char>(b));
      }
      if (!ok) {
        bytes.resize(start);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
    window.first_is_partial = !window.at_start;
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  bool has_byte_fallback() const override { return true; }
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow&) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_len = 0;
    auto flush = [&] {
      if (run_len == 0) return;
      if (is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_len; ++i) out.emplace_back(kReplacementChar);
      }
      run.clear();
      run_len = 0;
    };
    for (auto& t : tokens) {
      int b = parse_byte_token(t);
      if (b >= 0) {
        run.push_back(static_cast<char>(b));
        ++run_len;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow& window) const override {
    fuse(tokens, window);
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow& window) const override {
    for (size_t t = 0; t < tokens.size(); ++t) {
      std::string& token = tokens[t];
      std::vector<std::pair<size_t, char32_t>> chars;  // (byte offset, code point)
      for (size_t i = 0; i < token.size();) {
        size_t at = i;
        chars.emplace_back(at, utf8_next(token, i));
      }
      size_t start_cut = 0;
      if (!(t == 0 && window.first_is_partial)) {
        for (size_t i = 0; i < start_ && i < chars.size() && chars[i].second == content_; ++i)
          start_cut = i + 1;
      }
      size_t stop_cut = chars.size();
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        size_t index = chars.size() - i - 1;
        if (chars[index].second != content_) break;
        stop_cut = index;
      }
      if (stop_cut <= start_cut) {
        token.clear();
        continue;
      }
      size_t begin = start_cut < chars.size() ? chars[start_cut].first : token.size();
      size_t end = stop_cut < chars.size() ? chars[stop_cut].first : token.size();
      token = token.substr(begin, end - begin);
    }
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow&) const override {
    for (auto& token : tokens) {
      auto matches = pattern_.find_all(token);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [b, e] : matches) {
        out.append(token, prev, b - prev);
        out += content_;
        prev = e;
      }
      out.append(token, prev);
      token = std::move(out);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow& window) const override {
    for (size_t t = 0; t < tokens.size(); ++t) {
      // As HF: in the sequence's first token every replacement character is dropped.
      bool drop = t == 0 && strip_first_ && window.at_start && !window.first_is_partial;
      std::string out;
      const std::string& token = tokens[t];
      for (size_t pos = 0; pos < token.size();) {
        if (token.compare(pos, replacement_.size(), replacement_) == 0) {
          if (!drop) out += ' ';
          pos += replacement_.size();
        } else {
          out += token[pos++];
        }
      }
      tokens[t] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow&) const override {
    for (size_t t = 0; t < tokens.size(); ++t) {
      std::string out;
      std::string_view with = t + 1 == tokens.size() ? "" : " ";
      const std::string& token = tokens[t];
      for (size_t pos = 0; pos < token.size();) {
        if (!suffix_.empty() && token.compare(pos, suffix_.size(), suffix_) == 0) {
          out += with;
          pos += suffix_.size();
        } else {
          out += token[pos++];
        }
      }
      tokens[t] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, DecodeWindow& window) const override {
    for (const auto& s : steps_) s->decode_chain(tokens, window);
  }
  bool has_byte_fallback() const override {
    for (const auto& s : steps_) {
      if (s->has_byte_fallback()) return true;
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& config) {
  if (config.is_null()) return nullptr;
  std::string type = config.value("type", "");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& c : config.at("decoders")) {
      if (auto d = make_decoder(c)) steps.push_back(std::move(d));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    std::string content = config.at("content").get<std::string>();
    size_t pos = 0;
    char32_t c = content.empty() ? U' ' : utf8_next(content, pos);
    return std::make_unique<StripDecoder>(c, config.value("start", size_t{0}),
                                          config.value("stop", size_t{0}));
  }
  if (type == "Replace") {
    return std::make_unique<ReplaceDecoder>(make_pattern(config.at("pattern")),
                                            config.at("content").get<std::string>());
  }
  if (type == "Metaspace") {
    bool strip_first = true;
    if (config.contains("prepend_scheme")) {
      strip_first = config["prepend_scheme"].get<std::string>() != "never";
    } else {
      strip_first = config.value("add_prefix_space", true);
    }
    return std::make_unique<MetaspaceDecoder>(config.value("replacement", std::string("\u2581")),
                                              strip_first);
  }
  if (type == "BPEDecoder")
    return std::make_unique<BpeSuffixDecoder>(config.value("suffix", std::string("</w>")));
  fail(
      "tokenizer.json: decoder type '{}' is not supported (supported: Sequence, ByteLevel, ByteFallback, "
      "Fuse, "
      "Strip, Replace, Metaspace, BPEDecoder)",
      type);
}

}  // namespace polylora::tokenizer
