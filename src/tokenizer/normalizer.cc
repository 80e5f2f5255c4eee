// tokenizer/normalizer.cc: the normalizer types of HF tokenizers, as HF applies them.
// Must not: split text or know about vocabularies.
#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "common/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {
namespace {

using Json = nlohmann::json;

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& s : steps_) s->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class FormNormalizer final : public Normalizer {
 public:
  explicit FormNormalizer(NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = unicode_normalize(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = unicode_lowercase(text); }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!is_unicode_whitespace(utf8_next(text, pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!is_unicode_whitespace(utf8_next(text, pos))) break;
        end = start;
      }
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    for (size_t i = 0; i < text.size();) {
      char32_t cp = utf8_next(text, i);
      if (utf8proc_category(static_cast<utf8proc_int32_t>(cp)) != UTF8PROC_CATEGORY_MN) utf8_append(out, cp);
    }
    text = std::move(out);
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    auto matches = pattern_.find_all(text);
    if (matches.empty()) return;
    std::string out;
    size_t prev = 0;
    for (auto [b, e] : matches) {
      out.append(text, prev, b - prev);
      out += content_;
      prev = e;
    }
    out.append(text, prev);
    text = std::move(out);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& config) {
  if (config.is_null()) return nullptr;
  std::string type = config.value("type", "");
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& c : config.at("normalizers")) {
      if (auto n = make_normalizer(c)) steps.push_back(std::move(n));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "NFC") return std::make_unique<FormNormalizer>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<FormNormalizer>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<FormNormalizer>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<FormNormalizer>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(config.value("strip_left", true),
                                             config.value("strip_right", true));
  }
  if (type == "StripAccents") return std::make_unique<StripAccentsNormalizer>();
  if (type == "Replace") {
    return std::make_unique<ReplaceNormalizer>(make_pattern(config.at("pattern")),
                                               config.at("content").get<std::string>());
  }
  if (type == "Prepend") return std::make_unique<PrependNormalizer>(config.at("prepend").get<std::string>());
  fail(
      "tokenizer.json: normalizer type '{}' is not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, "
      "Lowercase, Strip, StripAccents, Replace, Prepend)",
      type);
}

}  // namespace polylora::tokenizer
