// apps/cmd_generate.cc: `polylora generate`: offline generation through the engine (the same path as
// the server). Prompts as token ids (--prompt-ids, printing the generated ids comma-separated, one line
// per prompt) or text (--prompt, printing the generated text), or --requests FILE.jsonl (one request per
// line: prompt or prompt_ids, adapter, max_tokens and any sampling field; one JSON line out per request,
// in input order, with output_ids, text, finish_reason and, when asked, logprobs / prompt_logprobs).
// The CLI's default temperature is 0 (greedy); requests in a file use vLLM's defaults unless they say.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/command.h"
#include "apps/engine_flags.h"
#include "common/error.h"
#include "common/log.h"
#include "config/cli_values.h"
#include "server/openai_api.h"
#include "server/request_json.h"

namespace polylora::apps {
namespace {

using nlohmann::json;

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || v < 0 || v > INT32_MAX)
      fail("--prompt-ids: '{}' is not a non-negative integer (expected e.g. 1,2,3)", item);
    ids.push_back(static_cast<int32_t>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return ids;
}

struct Collected {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::string> text;
  std::vector<std::string> finish;
  std::vector<std::optional<StopReason>> stop_reason;
  std::vector<std::vector<LogprobEntry>> logprobs;
  std::vector<std::optional<LogprobEntry>> prompt_logprobs;
  std::optional<std::string> error;
  int64_t num_prompt_tokens = 0, num_cached_tokens = 0;
};

int run_generate(int argc, char** argv) {
  CLI::App app{"Offline generation through the engine", "polylora generate"};
  ModelFlags mf;
  EngineConfig ec;
  add_model_flags(app, mf, true);
  add_engine_flags(app, ec, mf);
  std::string adapter, requests_path;
  std::vector<std::string> prompt_ids, prompts;
  SamplingParams sp;
  sp.temperature = 0.0;
  int64_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;
  int64_t seed = -1, logprobs = -1, prompt_logprobs = -1;
  app.add_option("--adapter", adapter,
                 "Adapter name for --prompt/--prompt-ids prompts (default: base model)");
  app.add_option("--prompt-ids", prompt_ids, "Prompt token ids, comma-separated (repeatable)");
  app.add_option("--prompt", prompts, "Text prompt (repeatable; needs a tokenizer)");
  app.add_option("--requests", requests_path, "JSONL file of requests");
  app.add_option("--max-tokens", max_tokens, "Tokens to generate")->capture_default_str();
  app.add_option("--temperature", sp.temperature, "0 = greedy (the default here)")->capture_default_str();
  app.add_option("--top-p", sp.top_p);
  app.add_option("--top-k", sp.top_k);
  app.add_option("--min-p", sp.min_p);
  app.add_option("--seed", seed);
  app.add_option("--presence-penalty", sp.presence_penalty);
  app.add_option("--frequency-penalty", sp.frequency_penalty);
  app.add_option("--repetition-penalty", sp.repetition_penalty);
  app.add_option("--min-tokens", sp.min_tokens);
  app.add_option("--n", sp.n, "Sequences per prompt");
  app.add_option("--stop", stop, "Stop string (repeatable)");
  app.add_option("--stop-token-ids", stop_token_ids, "Stop token ids")->delimiter(',');
  app.add_flag("--ignore-eos", sp.ignore_eos);
  app.add_option("--logprobs", logprobs, "Top alternatives per generated token");
  app.add_option("--prompt-logprobs", prompt_logprobs, "Top alternatives per prompt token");
  try {
    // vLLM's multi-letter short flags (-tp, -q, ...) become their long names first, as for serve.
    std::vector<std::string> args = normalize_vllm_args({argv + 1, argv + argc});
    std::reverse(args.begin(), args.end());  // CLI11 takes a vector last argument first
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  finish_model_flags(mf, ec);
  if (prompt_ids.empty() && prompts.empty() && requests_path.empty())
    fail("nothing to generate: give --prompt-ids, --prompt or --requests");
  sp.max_tokens = max_tokens;
  sp.stop = stop;
  sp.stop_token_ids = stop_token_ids;
  if (seed >= 0) sp.seed = static_cast<uint64_t>(seed);
  if (logprobs >= 0) sp.logprobs = logprobs;
  if (prompt_logprobs >= 0) sp.prompt_logprobs = prompt_logprobs;

  LoadedEngine le = load_engine(mf, ec);
  Engine& engine = *le.engine;
  std::vector<Collected> results;
  std::vector<int> kinds;  // 0: ids line, 1: text line, 2: JSON line
  auto submit = [&](EngineRequest req, int kind) {
    size_t index = results.size();
    req.request_id = std::to_string(index);
    results.emplace_back();
    kinds.push_back(kind);
    try {
      engine.add_request(std::move(req));
    } catch (const Error& e) {
      if (kind != 2) throw;
      results[index].error = e.what();
    }
  };
  for (const auto& p : prompt_ids) {
    EngineRequest r;
    r.prompt_ids = parse_ids(p);
    r.sampling = sp;
    r.adapter = adapter;
    submit(std::move(r), 0);
  }
  for (const auto& p : prompts) {
    if (!le.tokenizer)
      fail("--prompt needs a tokenizer (tokenizer.json in the model directory, or --tokenizer)");
    EngineRequest r;
    r.prompt_ids = le.tokenizer->encode(p, true);
    r.sampling = sp;
    r.adapter = adapter;
    submit(std::move(r), 1);
  }
  if (!requests_path.empty()) {
    std::ifstream in(requests_path);
    if (!in) fail("--requests: cannot open {}", requests_path);
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      EngineRequest r;
      std::string problem;
      try {
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
        if (!j.is_object()) fail("each line must be a JSON object");
        SamplingParams rp;  // vLLM defaults, then the line's fields
        rp.max_tokens = 16;
        server::read_sampling_fields(j, rp);
        r.sampling = rp;
        if (j.contains("prompt_ids")) {
          if (!j["prompt_ids"].is_array()) fail("'prompt_ids' must be a list of token ids");
          for (const auto& v : j["prompt_ids"]) {
            if (!v.is_number_integer()) fail("'prompt_ids' must be a list of integer token ids");
            r.prompt_ids.push_back(v.get<int32_t>());
          }
        } else if (j.contains("prompt") && j["prompt"].is_string()) {
          if (!le.tokenizer) fail("'prompt' needs a tokenizer; give prompt_ids");
          r.prompt_ids = le.tokenizer->encode(j["prompt"].get<std::string>(), true);
        } else {
          fail("each request needs 'prompt' (a string) or 'prompt_ids'");
        }
        if (j.contains("adapter") && !j["adapter"].is_null()) {
          if (!j["adapter"].is_string()) fail("'adapter' must be a string");
          r.adapter = j["adapter"].get<std::string>();
        }
        if (j.contains("cache_salt") && j["cache_salt"].is_string())
          r.cache_salt = j["cache_salt"].get<std::string>();
        if (j.contains("priority") && j["priority"].is_number_integer())
          r.priority = j["priority"].get<int64_t>();
      } catch (const json::exception& e) {
        problem = std::string("line is not valid JSON: ") + e.what();
      } catch (const Error& e) {
        problem = e.what();
      }
      if (!problem.empty()) {
        results.emplace_back();
        kinds.push_back(2);
        results.back().error = fmt::format("line {}: {}", line_no, problem);
        continue;
      }
      submit(std::move(r), 2);
    }
  }

  while (engine.has_unfinished()) {
    for (RequestOutput& out : engine.step()) {
      Collected& c = results[std::stoul(out.request_id)];
      c.num_prompt_tokens = out.num_prompt_tokens;
      c.num_cached_tokens = out.num_cached_tokens;
      if (!out.prompt_logprobs.empty()) c.prompt_logprobs = out.prompt_logprobs;
      for (auto& so : out.sequences) {
        size_t i = static_cast<size_t>(so.index);
        if (c.ids.size() <= i) {
          c.ids.resize(i + 1);
          c.text.resize(i + 1);
          c.finish.resize(i + 1);
          c.stop_reason.resize(i + 1);
          c.logprobs.resize(i + 1);
        }
        c.ids[i].insert(c.ids[i].end(), so.new_token_ids.begin(), so.new_token_ids.end());
        c.text[i] += so.new_text;
        c.logprobs[i].insert(c.logprobs[i].end(), so.new_logprobs.begin(), so.new_logprobs.end());
        if (so.finish_reason) {
          c.finish[i] = finish_reason_name(*so.finish_reason);
          c.stop_reason[i] = so.stop_reason;
        }
      }
    }
  }
  for (size_t k = 0; k < results.size(); ++k) {
    const Collected& c = results[k];
    if (kinds[k] == 0 || kinds[k] == 1) {
      for (size_t i = 0; i < c.ids.size(); ++i) {
        if (kinds[k] == 0) {
          std::string line;
          for (size_t t = 0; t < c.ids[i].size(); ++t) line += (t ? "," : "") + std::to_string(c.ids[i][t]);
          std::printf("%s\n", line.c_str());
        } else {
          std::printf("%s\n", c.text[i].c_str());
        }
      }
      continue;
    }
    json j;
    if (c.error) {
      j = {{"error", *c.error}};
    } else {
      auto seq_json = [&](size_t i) {
        json s = {{"output_ids", c.ids[i]}, {"text", c.text[i]}, {"finish_reason", c.finish[i]}};
        if (c.stop_reason[i]) s["stop_reason"] = server::stop_reason_json(c.stop_reason[i]);
        if (!c.logprobs[i].empty()) {
          s["logprobs"] = json::array();
          for (const auto& e : c.logprobs[i]) s["logprobs"].push_back(server::logprob_entry_json(e));
        }
        return s;
      };
      j = seq_json(0);
      if (c.ids.size() > 1) {
        j["outputs"] = json::array();
        for (size_t i = 0; i < c.ids.size(); ++i) j["outputs"].push_back(seq_json(i));
      }
      j["num_prompt_tokens"] = c.num_prompt_tokens;
      j["num_cached_tokens"] = c.num_cached_tokens;
      if (!c.prompt_logprobs.empty()) {
        j["prompt_logprobs"] = json::array();
        for (const auto& e : c.prompt_logprobs)
          j["prompt_logprobs"].push_back(e ? server::logprob_entry_json(*e) : json(nullptr));
      }
    }
    std::printf("%s\n", j.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  }
  auto st = engine.stats();
  spdlog::info("done: {} prompt tokens, {} generated, prefix cache {}/{} tokens hit, {} preemptions",
               st.prompt_tokens, st.generation_tokens, st.prefix_hits, st.prefix_queries, st.num_preemptions);
  return 0;
}

Registrar reg("generate",
              "Offline generation through the engine (token ids, text or a JSONL file of requests)",
              run_generate);

}  // namespace
}  // namespace polylora::apps
