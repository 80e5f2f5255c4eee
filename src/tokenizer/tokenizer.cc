// tokenizer/tokenizer.cc: loading a model's tokenizer files and running HF's encode/decode pipeline.
// Must not: depend on the engine or render chat templates.
#include "tokenizer/tokenizer.h"

#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "common/error.h"
#include "tokenizer/added_vocabulary.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer_json.h"
#include "tokenizer/unicode_util.h"

namespace polylora::tokenizer {

using Json = nlohmann::json;
namespace fs = std::filesystem;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  TokenMap added_by_content;
  AddedTokenMatcher raw_matcher;                // normalized == false
  AddedTokenMatcher normalized_matcher;         // normalized == true, matched on normalized text
  std::vector<uint8_t> special;                 // by id
  std::vector<int32_t> prefix_ids, suffix_ids;  // post-processor for a single sequence
  std::string bos_token, eos_token, pad_token, chat_template;
  bool add_bos_token = false;
  int32_t vocab_size = 0;

  void encode_normalized(std::string_view text, bool starts_input, std::vector<int32_t>& ids) const {
    PreTokens tokens;
    tokens.pieces.push_back(text);
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(tokens, starts_input);
    for (auto piece : tokens.pieces) {
      if (tokens.byte_level) {
        model->encode_byte_level_word(piece, ids);
      } else {
        model->encode_word(piece, ids);
      }
    }
  }

  void encode_segment(std::string_view segment, bool starts_input, std::vector<int32_t>& ids) const {
    std::string normalized;
    std::string_view view = segment;
    if (normalizer) {
      normalized.assign(segment);
      normalizer->normalize(normalized);
      view = normalized;
    }
    if (normalized_matcher.empty()) {
      encode_normalized(view, starts_input, ids);
      return;
    }
    for (const auto& part : normalized_matcher.split(view)) {
      if (part.token_id >= 0) {
        ids.push_back(part.token_id);
      } else {
        encode_normalized(view.substr(part.begin, part.end - part.begin), starts_input && part.begin == 0,
                          ids);
      }
    }
  }

  const std::string* token_of(int32_t id) const {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added[it->second].content;
    return model->id_to_token(id);
  }
};

namespace {

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string read_gzip_file(const fs::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) fail("cannot open {}", path.string());
  gzbuffer(file, 1 << 20);
  std::string out;
  std::vector<char> buffer(1 << 20);
  while (true) {
    int n = gzread(file, buffer.data(), static_cast<unsigned>(buffer.size()));
    if (n < 0) {
      int err = 0;
      std::string message = gzerror(file, &err);
      gzclose(file);
      fail("cannot decompress {}: {}", path.string(), message);
    }
    if (n == 0) break;
    out.append(buffer.data(), static_cast<size_t>(n));
  }
  gzclose(file);
  return out;
}

Json parse_json(std::string_view text, std::string_view what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    fail("{} is not valid JSON: {}", what, e.what());
  }
}

// A tokenizer_config.json token field: "text", {"content": "text", ...} or null.
std::string config_token(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  fail("tokenizer_config.json: '{}' must be a string or an object with 'content'", key);
}

std::string config_chat_template(const Json& config) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.value("name", "") == "default") return entry.at("template").get<std::string>();
    }
    if (!it->empty()) return (*it)[0].at("template").get<std::string>();
    return {};
  }
  fail("tokenizer_config.json: 'chat_template' must be a string or a list of {{name, template}}");
}

// Appends the ids a post-processor puts before and after a single sequence.
void parse_post_processor(const Json& config, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (config.is_null()) return;
  std::string type = config.value("type", "");
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& p : config.at("processors")) parse_post_processor(p, prefix, suffix);
    return;
  }
  if (type == "TemplateProcessing") {
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    const auto& specials = config.at("special_tokens");
    for (const auto& item : config.at("single")) {
      if (item.contains("Sequence")) {
        seen_sequence = true;
      } else if (item.contains("SpecialToken")) {
        std::string name = item["SpecialToken"].at("id").get<std::string>();
        if (!specials.contains(name))
          fail("tokenizer.json: TemplateProcessing uses undefined special token '{}'", name);
        for (const auto& id : specials[name].at("ids"))
          (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    }
    prefix.insert(prefix.begin(), before.begin(), before.end());
    suffix.insert(suffix.end(), after.begin(), after.end());
    return;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    prefix.insert(prefix.begin(), config.at("cls").at(1).get<int32_t>());
    suffix.push_back(config.at("sep").at(1).get<int32_t>());
    return;
  }
  fail(
      "tokenizer.json: post_processor type '{}' is not supported (supported: TemplateProcessing, ByteLevel, "
      "RobertaProcessing, BertProcessing, Sequence)",
      type);
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& dir) {
  fs::path root(dir);
  if (!fs::is_directory(root)) fail("tokenizer directory {} does not exist", dir);
  std::string tokenizer_json;
  if (fs::exists(root / "tokenizer.json")) {
    tokenizer_json = read_text_file(root / "tokenizer.json");
  } else if (fs::exists(root / "tokenizer.json.gz")) {
    tokenizer_json = read_gzip_file(root / "tokenizer.json.gz");
  } else {
    fail(
        "{} has no tokenizer.json (or tokenizer.json.gz); only Hugging Face fast-tokenizer files are "
        "supported",
        dir);
  }
  std::string config_json;
  if (fs::exists(root / "tokenizer_config.json"))
    config_json = read_text_file(root / "tokenizer_config.json");
  Tokenizer tokenizer = from_json(tokenizer_json, config_json);
  if (fs::exists(root / "chat_template.jinja")) {
    tokenizer.impl_->chat_template = read_text_file(root / "chat_template.jinja");
  }
  return tokenizer;
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  auto impl = std::make_unique<Impl>();
  TokenizerJson parsed = parse_tokenizer_json(tokenizer_json);
  const Json& root = parsed.root;
  if (!root.is_object() || !root.contains("model")) fail("tokenizer.json has no 'model' section");
  const Json& model = root["model"];
  std::string type = model.value("type", "");
  if (type.empty() && model.contains("merges")) type = "BPE";
  if (type != "BPE") {
    fail(
        "tokenizer.json: model type '{}' is not supported (only BPE tokenizers are; WordPiece, WordLevel and "
        "Unigram are not)",
        type);
  }
  try {
    BpeVocabulary vocabulary =
        parsed.vocabulary ? std::move(*parsed.vocabulary) : BpeVocabulary::from_json(model);
    impl->model = std::make_unique<BpeModel>(model, std::move(vocabulary));
    impl->normalizer = make_normalizer(root.value("normalizer", Json()));
    impl->pre_tokenizer = make_pre_tokenizer(root.value("pre_tokenizer", Json()));
    impl->decoder = make_decoder(root.value("decoder", Json()));
    parse_post_processor(root.value("post_processor", Json()), impl->prefix_ids, impl->suffix_ids);
  } catch (const Json::exception& e) {
    fail("tokenizer.json is malformed: {}", e.what());
  }

  int32_t vocab_size = impl->model->vocab_size();
  if (auto it = root.find("added_tokens"); it != root.end() && it->is_array()) {
    for (const auto& t : *it) {
      AddedToken token;
      try {
        token.id = t.at("id").get<int32_t>();
        token.content = t.at("content").get<std::string>();
        token.single_word = t.value("single_word", false);
        token.lstrip = t.value("lstrip", false);
        token.rstrip = t.value("rstrip", false);
        token.normalized = t.value("normalized", false);
        token.special = t.value("special", false);
      } catch (const Json::exception& e) {
        fail("tokenizer.json: malformed added token {}: {}", t.dump(), e.what());
      }
      if (token.id < 0) fail("tokenizer.json: added token '{}' has a negative id", token.content);
      vocab_size = std::max(vocab_size, token.id + 1);
      impl->added_by_id[token.id] = impl->added.size();
      impl->added_by_content[token.content] = token.id;
      impl->added.push_back(std::move(token));
    }
  }
  impl->vocab_size = vocab_size;
  impl->special.assign(static_cast<size_t>(vocab_size), 0);
  for (const auto& token : impl->added) {
    if (token.special) impl->special[static_cast<size_t>(token.id)] = 1;
    if (token.normalized && impl->normalizer) {
      std::string normalized = token.content;
      impl->normalizer->normalize(normalized);
      impl->normalized_matcher.add(std::move(normalized), token);
    } else {
      impl->raw_matcher.add(token.content, token);
    }
  }

  if (!config_json.empty()) {
    Json config = parse_json(config_json, "tokenizer_config.json");
    try {
      impl->bos_token = config_token(config, "bos_token");
      impl->eos_token = config_token(config, "eos_token");
      impl->pad_token = config_token(config, "pad_token");
      impl->chat_template = config_chat_template(config);
      bool has_bos_flag = config.contains("add_bos_token") && config["add_bos_token"].is_boolean();
      bool has_eos_flag = config.contains("add_eos_token") && config["add_eos_token"].is_boolean();
      impl->add_bos_token = has_bos_flag && config["add_bos_token"].get<bool>();
      if (has_bos_flag || has_eos_flag) {
        // As transformers' Llama-style tokenizers: the flags define the template around a sequence.
        auto lookup = [&](const std::string& token) -> std::optional<int32_t> {
          if (token.empty()) return std::nullopt;
          if (auto a = impl->added_by_content.find(token); a != impl->added_by_content.end())
            return a->second;
          return impl->model->token_to_id(token);
        };
        auto bos = lookup(impl->bos_token);
        auto eos = lookup(impl->eos_token);
        impl->prefix_ids.clear();
        impl->suffix_ids.clear();
        if (impl->add_bos_token && bos) impl->prefix_ids.push_back(*bos);
        if (has_eos_flag && config["add_eos_token"].get<bool>() && eos) impl->suffix_ids.push_back(*eos);
      } else {
        impl->add_bos_token =
            !impl->prefix_ids.empty() && !impl->bos_token.empty() &&
            impl->added_by_content.count(impl->bos_token) &&
            impl->prefix_ids.front() == impl->added_by_content.find(impl->bos_token)->second;
      }
    } catch (const Json::exception& e) {
      fail("tokenizer_config.json is malformed: {}", e.what());
    }
  }
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = impl_->prefix_ids;
  for (const auto& split : impl_->raw_matcher.split(text)) {
    if (split.token_id >= 0) {
      ids.push_back(split.token_id);
    } else {
      impl_->encode_segment(text.substr(split.begin, split.end - split.begin), split.begin == 0, ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix_ids.begin(), impl_->suffix_ids.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return decode_window(ids, skip_special_tokens, true);
}

std::string Tokenizer::decode_window(std::span<const int32_t> ids, bool skip_special_tokens,
                                     bool at_start) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    if (const std::string* token = impl_->token_of(id)) tokens.push_back(*token);
  }
  std::string text;
  if (!impl_->decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) text += ' ';
      text += tokens[i];
    }
    return text;
  }
  DecodeWindow window{at_start, false};
  impl_->decoder->decode_chain(tokens, window);
  for (const auto& t : tokens) text += t;
  return text;
}

int32_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* token = impl_->token_of(id);
  return token ? *token : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[static_cast<size_t>(id)];
}

bool Tokenizer::has_id(int32_t id) const {
  return impl_->token_of(id) != nullptr;
}

bool Tokenizer::is_byte_token(int32_t id) const {
  if (!impl_->decoder || !impl_->decoder->has_byte_fallback()) return false;
  const std::string* token = impl_->token_of(id);
  return token && parse_byte_token(*token) >= 0;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return impl_->bos_token.empty() ? std::nullopt : token_to_id(impl_->bos_token);
}
std::optional<int32_t> Tokenizer::eos_id() const {
  return impl_->eos_token.empty() ? std::nullopt : token_to_id(impl_->eos_token);
}
std::optional<int32_t> Tokenizer::pad_id() const {
  return impl_->pad_token.empty() ? std::nullopt : token_to_id(impl_->pad_token);
}
const std::string& Tokenizer::bos_token() const {
  return impl_->bos_token;
}
const std::string& Tokenizer::eos_token() const {
  return impl_->eos_token;
}
const std::string& Tokenizer::pad_token() const {
  return impl_->pad_token;
}
bool Tokenizer::add_bos_token() const {
  return impl_->add_bos_token;
}
const std::string& Tokenizer::chat_template() const {
  return impl_->chat_template;
}

}  // namespace polylora::tokenizer
