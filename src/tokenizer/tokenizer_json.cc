// tokenizer/tokenizer_json.cc: a SAX handler that builds the DOM for everything but model.vocab and
// model.merges, which it captures directly (a 27 MB o200k file would otherwise cost a second in DOM
// nodes alone).
// Must not: interpret the sections.
#include "tokenizer/tokenizer_json.h"

#include <array>
#include <climits>
#include <string>
#include <vector>

#include "common/error.h"

namespace polylora::tokenizer {
namespace {

using Json = nlohmann::json;

class CaptureSax {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  explicit CaptureSax(Json& root) : dom_(root, true) {}

  bool null() { return capture_ == kNone ? dom_.null() : unexpected("null"); }
  bool boolean(bool v) { return capture_ == kNone ? dom_.boolean(v) : unexpected("a boolean"); }
  bool number_integer(number_integer_t v) {
    if (capture_ == kVocab && depth_ == capture_depth_) return add_token(v);
    return capture_ == kNone ? dom_.number_integer(v) : unexpected("a number");
  }
  bool number_unsigned(number_unsigned_t v) {
    if (capture_ == kVocab && depth_ == capture_depth_) return add_token(static_cast<int64_t>(v));
    return capture_ == kNone ? dom_.number_unsigned(v) : unexpected("a number");
  }
  bool number_float(number_float_t v, const string_t& s) {
    return capture_ == kNone ? dom_.number_float(v, s) : unexpected("a number");
  }
  bool binary(binary_t& v) { return capture_ == kNone ? dom_.binary(v) : unexpected("binary"); }
  bool string(string_t& v) {
    if (capture_ == kMerges) {
      if (depth_ == capture_depth_) {
        size_t space = v.find(' ');
        if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
          fail("tokenizer.json: merge '{}' is not of the form 'left right'", v);
        }
        vocabulary_.merges.emplace_back(v.substr(0, space), v.substr(space + 1));
        return true;
      }
      if (depth_ == capture_depth_ + 1) {
        pair_.push_back(std::move(v));
        return true;
      }
    }
    return capture_ == kNone ? dom_.string(v) : unexpected("a string");
  }
  bool start_object(std::size_t n) {
    if (capture_ != kNone) return unexpected("an object");
    bool ok = dom_.start_object(n);
    ++depth_;
    if (depth_ == 3 && path_[1] == "model" && path_[2] == "vocab") begin_capture(kVocab);
    return ok;
  }
  bool key(string_t& k) {
    if (capture_ == kVocab) {
      key_ = std::move(k);
      return true;
    }
    if (capture_ != kNone) return unexpected("an object");
    if (depth_ < static_cast<int>(path_.size())) path_[depth_] = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (capture_ == kVocab && depth_ == capture_depth_) capture_ = kNone;
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (capture_ == kMerges && depth_ == capture_depth_) {
      ++depth_;
      pair_.clear();
      return true;
    }
    if (capture_ != kNone) return unexpected("an array");
    bool ok = dom_.start_array(n);
    ++depth_;
    if (depth_ == 3 && path_[1] == "model" && path_[2] == "merges") begin_capture(kMerges);
    return ok;
  }
  bool end_array() {
    if (capture_ == kMerges && depth_ == capture_depth_ + 1) {
      --depth_;
      if (pair_.size() != 2) fail("tokenizer.json: a merge must be a pair [\"left\", \"right\"]");
      vocabulary_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    if (capture_ == kMerges && depth_ == capture_depth_) capture_ = kNone;
    --depth_;
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& e) {
    fail("tokenizer.json is not valid JSON (at byte {} near '{}'): {}", position, last_token, e.what());
  }

  std::optional<BpeVocabulary> vocabulary() {
    if (!seen_vocab_ || !seen_merges_) return std::nullopt;
    return std::move(vocabulary_);
  }
  bool partially_captured() const { return seen_vocab_ != seen_merges_; }

 private:
  enum Capture { kNone, kVocab, kMerges };
  void begin_capture(Capture c) {
    capture_ = c;
    capture_depth_ = depth_;
    (c == kVocab ? seen_vocab_ : seen_merges_) = true;
  }
  bool add_token(int64_t id) {
    if (id < 0 || id > INT32_MAX) fail("tokenizer.json: token '{}' has an invalid id {}", key_, id);
    vocabulary_.tokens.emplace_back(std::move(key_), static_cast<int32_t>(id));
    return true;
  }
  bool unexpected(const char* what) {
    fail("tokenizer.json: unexpected {} inside model.{}", what, capture_ == kVocab ? "vocab" : "merges");
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  int depth_ = 0;
  std::array<std::string, 4> path_;  // the last key seen at depth 1..3
  Capture capture_ = kNone;
  int capture_depth_ = 0;
  bool seen_vocab_ = false, seen_merges_ = false;
  std::string key_;
  std::vector<std::string> pair_;
  BpeVocabulary vocabulary_;
};

}  // namespace

TokenizerJson parse_tokenizer_json(std::string_view text) {
  TokenizerJson out;
  CaptureSax sax(out.root);
  Json::sax_parse(text.begin(), text.end(), &sax);
  if (sax.partially_captured()) {
    // Not a BPE layout (e.g. WordPiece has a vocab but no merges): keep the plain document.
    out.root = Json::parse(text);
    return out;
  }
  out.vocabulary = sax.vocabulary();
  return out;
}

}  // namespace polylora::tokenizer
