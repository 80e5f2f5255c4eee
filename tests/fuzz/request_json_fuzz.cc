// fuzz-sources: src/server/[ajopqrs]*.cc src/structured/*.cc src/api/*.cc src/tokenizer/*.cc
//
// tests/fuzz/request_json_fuzz.cc: arbitrary bytes as the body of every JSON route the server parses
// (completions, chat completions, tokenize, detokenize, adapter load and unload), through the same code the
// HTTP server runs: the bounded body parser, then the route's request reader with the fixture model's
// tokenizer and chat template. The first byte picks the route. Refusals (polylora::Error) are expected;
// anything else escaping, a crash, or an error message that is not valid UTF-8 is a finding.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "common/error.h"
#include "common/utf8.h"
#include "server/admin_api.h"
#include "server/json_body.h"
#include "server/openai_api.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace polylora;
using namespace polylora::server;

namespace {

std::string data_dir() {
#ifdef POLYLORA_TEST_DATA
  return POLYLORA_TEST_DATA;
#else
  const char* env = std::getenv("POLYLORA_TEST_DATA");
  if (!env) {
    std::fprintf(stderr, "request_json_fuzz: set POLYLORA_TEST_DATA to the tests/data directory\n");
    std::abort();
  }
  return env;
#endif
}

struct Fixture {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(data_dir() + "/models/qwen3-moe-tiny");
  std::optional<ChatTemplate> tmpl;
  ParseContext ctx;
  Fixture() {
    if (!tok.chat_template().empty()) tmpl = ChatTemplate::compile(tok.chat_template());
    ctx.tokenizer = &tok;
    ctx.chat_template = tmpl ? &*tmpl : nullptr;
    ctx.served_model_names = {"base"};
    ctx.has_adapter = [](const std::string& name) { return name == "adapter"; };
    ctx.max_model_len = 512;
    ctx.vocab_size = 1024;
  }
};

void check_utf8(const char* what) {
  std::string s(what);
  if (sanitize_utf8(s) != s) {
    std::fprintf(stderr, "error message is not valid UTF-8: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  if (size == 0) return 0;
  std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  JsonLimits limits;
  limits.max_depth = 64;
  limits.max_keys_per_object = 1000;
  try {
    nlohmann::ordered_json j = parse_json_body(body, limits);
    switch (data[0] % 6) {
      case 0: {
        ParsedRequest p = parse_completion(j, f.ctx);
        for (const auto& r : p.prompts) r.sampling.validate(f.ctx.vocab_size);
        break;
      }
      case 1: {
        ParsedRequest p = parse_chat(j, f.ctx);
        for (const auto& r : p.prompts) r.sampling.validate(f.ctx.vocab_size);
        break;
      }
      case 2:
        tokenize_request(j, f.ctx);
        break;
      case 3:
        detokenize_request(j, f.ctx);
        break;
      case 4:
        load_adapter_request(j);
        break;
      case 5:
        unload_adapter_request(j);
        break;
    }
    // Responses are rendered with invalid UTF-8 replaced: never throws.
    dump_json(j);
  } catch (const Error& e) {
    check_utf8(e.what());
  }
  return 0;
}
