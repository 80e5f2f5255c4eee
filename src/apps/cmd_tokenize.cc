// apps/cmd_tokenize.cc: `polylora tokenize`: encode text (--text, or --jsonl lines on stdin), decode ids
// (--decode), or measure single-threaded encode throughput (--bench FILE, printed as JSON).
// Must not: hold tokenizer logic (it only turns flags into Tokenizer calls).
#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "apps/command.h"
#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace polylora::apps {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t begin = item.find_first_not_of(" \t"), end = item.find_last_not_of(" \t");
    if (begin == std::string::npos) continue;
    item = item.substr(begin, end - begin + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX) {
      fail("--decode: '{}' is not a token id (expected e.g. 1,2,3)", item);
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::string join_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  return out;
}

int run_bench(const tokenizer::Tokenizer& tok, const std::string& path, double min_seconds, bool add_special,
              double load_seconds) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("--bench: cannot open {}", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t num_tokens = tok.encode(text, add_special).size();  // warm-up
  size_t iterations = 0;
  auto start = Clock::now();
  double seconds = 0;
  do {
    num_tokens = tok.encode(text, add_special).size();
    ++iterations;
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
  } while (seconds < min_seconds);
  nlohmann::json result = {
      {"file", path},
      {"bytes", text.size()},
      {"tokens", num_tokens},
      {"iterations", iterations},
      {"seconds", seconds},
      {"threads", 1},
      {"load_seconds", load_seconds},
      {"mb_per_s", static_cast<double>(text.size()) * static_cast<double>(iterations) / seconds / 1e6},
      {"tokens_per_s", static_cast<double>(num_tokens) * static_cast<double>(iterations) / seconds},
  };
  std::printf("%s\n", result.dump().c_str());
  return 0;
}

int run_tokenize(int argc, char** argv) {
  CLI::App app{"Encode text to token ids or decode ids to text", "polylora tokenize"};
  std::string dir, text, decode_ids, bench_file;
  bool jsonl = false, add_special = false, skip_special = false;
  double bench_seconds = 3.0;
  app.add_option("--tokenizer", dir, "Directory with tokenizer.json (or .gz) and tokenizer_config.json")
      ->required();
  auto* text_opt = app.add_option("--text", text, "Text to encode; prints comma-separated ids");
  auto* decode_opt = app.add_option("--decode", decode_ids, "Comma-separated ids to decode; prints the text");
  auto* jsonl_opt =
      app.add_flag("--jsonl", jsonl, "Encode one JSON string per stdin line; print a JSON array each");
  auto* bench_opt =
      app.add_option("--bench", bench_file, "Measure single-threaded encode throughput of FILE");
  app.add_option("--bench-seconds", bench_seconds, "Minimum duration of --bench")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--add-special-tokens", add_special, "Apply the post-processor (e.g. BOS) when encoding");
  app.add_flag("--skip-special-tokens", skip_special, "Leave special tokens out when decoding");
  text_opt->excludes(decode_opt)->excludes(jsonl_opt)->excludes(bench_opt);
  decode_opt->excludes(jsonl_opt)->excludes(bench_opt);
  jsonl_opt->excludes(bench_opt);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!*text_opt && !*decode_opt && !jsonl && !*bench_opt) {
    fail("give one of --text, --decode, --jsonl or --bench (see --help)");
  }

  auto load_start = Clock::now();
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir);
  double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();

  if (*bench_opt) return run_bench(tok, bench_file, bench_seconds, add_special, load_seconds);
  if (*text_opt) {
    std::printf("%s\n", join_ids(tok.encode(text, add_special)).c_str());
    return 0;
  }
  if (*decode_opt) {
    std::string out = tok.decode(parse_id_list(decode_ids), skip_special);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    return 0;
  }
  std::string line;
  size_t line_number = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (line.empty()) continue;
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("--jsonl: line {} is not JSON: {}", line_number, e.what());
    }
    if (!value.is_string()) fail("--jsonl: line {} is not a JSON string", line_number);
    std::string ids = "[" + join_ids(tok.encode(value.get_ref<const std::string&>(), add_special)) + "]\n";
    std::fwrite(ids.data(), 1, ids.size(), stdout);
  }
  return 0;
}

const Registrar kRegistrar("tokenize", "Encode text to token ids or decode ids (tokenizer.json)",
                           run_tokenize);

}  // namespace
}  // namespace polylora::apps
